#!/usr/bin/env bash
# One device-tool call: set up, then run the named GPU steps; every log and JSON lands in $OUT.
#
#   bash benchmarks/acceptance/gpu_session.sh tests sweep fidelity
#
# Steps: tests (the whole suite), gputests (GPU-marked tests), benches (every bench), sweep (pytest
# benches/ -k gemm, rows -> results/), fidelity (benchmarks/probes/timer_fidelity.py), drift (gate on
# unchanged code), pipeline (the CUDA trace test, then benchmarks/acceptance/pipeline_models.py: the
# transformers families through opperf import -> replay -> backfill -> report), health (the device-health
# and clock warm-up GPU tests, then a serial GEMM sweep that must run to its end), calibrate (the GPU
# test of tests/test_calibrate.py: measured ceilings vs datasheet), tune (benchmarks/probes/tune_rmsnorm.py:
# Triton rmsnorm and softmax swept, best vs default, the tuned table read back), collectives
# (benchmarks/acceptance/collectives_conventions.sh: nccl-tests beside the plugin's loop and graph
# conventions, 1 KiB - 1 GiB; needs .anchors/).
# Needs the wheels of ../shared/device/wheels.sh in .whl/ (carry [".whl"]).
set -uo pipefail
OUT=${OUT:-/tmp/opperf-out}
mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"

for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
    tests)
      python3 -m pytest tests/ -q -p no:cacheprovider -rfE -n 8 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    gputests)
      python3 -m pytest tests/ -q -p no:cacheprovider -rfE -k "cuda or graph or gpu or profiler" 2>&1 | tee "$OUT/gputests.log" | tail -25 ;;
    sweep)
      python3 -m pytest benches/ -k gemm -p no:cacheprovider -q 2>&1 | tee "$OUT/sweep.log" | tail -40
      cp results/*.db "$OUT/" 2>/dev/null ;;
    fidelity)
      python3 benchmarks/probes/timer_fidelity.py --profiler-sweep --out "$OUT" 2>&1 | tee "$OUT/fidelity.log" | tail -60 ;;
    benches)
      python3 -m pytest benches/ -p no:cacheprovider -q -rs --opperf-summary=200 2>&1 | tee "$OUT/benches.log" | tail -30
      cp results/*.db "$OUT/" 2>/dev/null ;;
    drift)
      python3 benchmarks/probes/gate_drift.py --out /tmp/drift -k "gemm or add" --reruns 4 2>&1 | tee "$OUT/drift.log" | tail -20
      cp /tmp/drift/gate_drift.json "$OUT/" 2>/dev/null ;;
    health)
      python3 -m pytest tests/test_multigpu.py tests/test_clocks.py -v -p no:cacheprovider -rfEs \
        -k "gpu_errors or working_cuda or after_warmup" 2>&1 | tee "$OUT/health.log" | tail -25
      python3 -m pytest benches/ -k gemm -p no:cacheprovider -q -rf --opperf-results="$OUT/health-results" 2>&1 \
        | tee "$OUT/health-sweep.log" | tail -15 ;;
    calibrate)
      python3 -m pytest tests/test_calibrate.py -q -p no:cacheprovider -rfEs -k gpu 2>&1 | tee "$OUT/calibrate.log" | tail -8 ;;
    tune)
      OUT="$OUT/tune" python3 benchmarks/probes/tune_rmsnorm.py 2>&1 | tee "$OUT/tune.log" | tail -60 ;;
    pipeline)
      python3 -m pytest tests/test_pipeline_import.py -q -p no:cacheprovider -rfEs -k cuda 2>&1 | tail -5
      OUT="$OUT/pipeline" python3 benchmarks/acceptance/pipeline_models.py 2>&1 | tee "$OUT/pipeline.log" | tail -80 ;;
    collectives)
      OUT="$OUT/collectives" bash benchmarks/acceptance/collectives_conventions.sh 2>&1 | tee "$OUT/collectives.log" | tail -60 ;;
    *)
      echo "unknown step $step" ;;
  esac
done
nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active --format=csv
