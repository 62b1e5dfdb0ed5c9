#!/usr/bin/env bash
# Issue 51's acceptance in one go on a host of 2 GPUs or more; everything lands in $OUT (or /tmp/acc):
#   1. collectives_conventions.sh (nccl-tests' loop and -G beside the plugin's loop and graph rows)
#   2. README's main command, serially, then with -n 2
#   bash benchmarks/acceptance/collectives_acceptance.sh            (wheels in .whl/, nccl-tests in .anchors/)
# A device call may end before it does: start it with setsid and collect $OUT/done later, and
# $OUT/results.tgz (the logs, databases and JSON in one file: a call brings back few files).
set -uo pipefail
OUT=${OUT:-/tmp/acc}; mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
stamp() { echo "=== $1 $(date -u +%H:%M:%S)" | tee -a "$OUT/progress.log"; }
stamp start
OUT="$OUT/conv" ONE_THREAD=0 bash benchmarks/acceptance/collectives_conventions.sh 2 > "$OUT/conventions.log" 2>&1
stamp conventions
rm -rf results
timeout 400 python3 -m pytest benches/ -p no:cacheprovider -q -rfE --opperf-summary=0 > "$OUT/serial.log" 2>&1
tail -3 "$OUT/serial.log" >> "$OUT/progress.log"
stamp serial
timeout 400 python3 -m pytest benches/ -p no:cacheprovider -q -rfE -n 2 --opperf-summary=0 \
  --opperf-results="$OUT/n2" > "$OUT/n2.log" 2>&1
tail -3 "$OUT/n2.log" >> "$OUT/progress.log"
stamp n2
# One file to bring back: a device call returns a limited number of files from $OUT.
(cd "$OUT" && tar czf results.tgz --ignore-failed-read conv n2 *.log 2>/dev/null)
touch "$OUT/done"
