#!/usr/bin/env bash
# One device call: README's main command on the GPU (every shipped config), then the GPU tests.
# Logs and the database land in $OUT. Usage: bash benchmarks/acceptance/gpu_main.sh [benches|tests]...
set -uo pipefail
OUT=${OUT:-/tmp/opperf-out}; mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
    benches) timeout 540 python3 -m pytest benches/ -p no:cacheprovider -q -rfEs --opperf-summary=1000 2>&1 | tee "$OUT/benches.log" | grep -v "^SKIPPED" | tail -60
             cp results/*.db "$OUT/" 2>/dev/null
             for db in results/*.db; do python3 benchmarks/acceptance/check_floors.py "$db" | tee -a "$OUT/floors.log" | tail -12; done ;;
    tests) timeout 500 python3 -m pytest tests/ -p no:cacheprovider -q -rfE -n 8 -m "not exclusive_gpu" 2>&1 | tee "$OUT/tests.log" | tail -40
           # Timings compared against each other: alone on the GPU.
           timeout 120 python3 -m pytest tests/ -p no:cacheprovider -q -rfE -m exclusive_gpu 2>&1 | tee "$OUT/tests-exclusive.log" | tail -5 ;;
  esac
done
