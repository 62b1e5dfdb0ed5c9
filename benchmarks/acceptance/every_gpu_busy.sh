#!/usr/bin/env bash
# Issue 60's acceptance in one go on a host of 2 GPUs or more; everything lands in $OUT (or /tmp/every-gpu):
#   1. speed.py on every GPU: README's main command as it is, cold (forward), then with -n N (one
#      worker per GPU, collective groups on leased GPUs), then serially in reverse order (warm)
#   2. on a host of 4 GPUs or more, the same on 2 of them (CUDA_VISIBLE_DEVICES=0,1), warm: -n 2 ordered
#      by the first step's recorded times, then serially in reverse order
#   3. the GPU tests the issue names, and the scheduler's and collectives' tests, with -n 2 (SKIP_TESTS=1: not)
#   bash benchmarks/acceptance/every_gpu_busy.sh        (wheels in .whl/: ../shared/device/wheels.sh)
# A device call may end before it does: start it with setsid, and collect $OUT/done and
# $OUT/results.tgz later (a call brings back few files).
set -uo pipefail
OUT=${OUT:-/tmp/every-gpu}; mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
stamp() { echo "=== $1 $(date -u +%H:%M:%S)" | tee -a "$OUT/progress.log"; }
stamp start
nvidia-smi -L >> "$OUT/progress.log"; nvidia-smi topo -m >> "$OUT/progress.log" 2>&1
python3 -m compileall -q pytest_opperf benches >/dev/null 2>&1
SKIP=${SKIP:-dobench settle shards}
timeout 900 python3 benchmarks/acceptance/speed.py --main-forward --skip $SKIP --out "$OUT/all" \
  > "$OUT/speed_all.log" 2>&1
tail -22 "$OUT/speed_all.log" >> "$OUT/progress.log"
stamp speed-all
if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  CUDA_VISIBLE_DEVICES=0,1 timeout 900 python3 benchmarks/acceptance/speed.py --skip forward $SKIP --out "$OUT/two" \
    --history "$(ls "$OUT"/all/forward/*.db | head -1)" \
    > "$OUT/speed_two.log" 2>&1
  tail -22 "$OUT/speed_two.log" >> "$OUT/progress.log"
  stamp speed-two
fi
[ "${SKIP_TESTS:-0}" = 1 ] || timeout 500 python3 -m pytest tests/test_xdist_schedule.py tests/test_gate_noise.py tests/test_predict.py \
  tests/test_collective_bench.py tests/test_multigpu.py tests/test_ncclcalls.py -p no:cacheprovider -q -rfE -n 2 \
  > "$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log" >> "$OUT/progress.log"
stamp tests
(cd "$OUT" && tar czf results.tgz --ignore-failed-read all/speed.json two/speed.json all/*.log two/*.log *.log \
  all/*/*.db two/*/*.db 2>/dev/null)
touch "$OUT/done"
