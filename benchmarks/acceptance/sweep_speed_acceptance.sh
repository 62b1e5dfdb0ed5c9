#!/usr/bin/env bash
# Issue 52's acceptance in one go on a host of 2 GPUs or more; everything lands in $OUT (or /tmp/speed-acc):
#   1. speed.py: README's main command cold (forward), with -n N, serially in reverse order, then
#      do_bench on reverse's callables (settle and shards left out: issue 52 does not ask for them)
#   2. collectives_conventions.sh with the loop convention only: nccl-tests beside the nccl and
#      torch_dist rows, the CV of every row
#   3. the collective GPU tests (tests/test_collective_bench.py, test_ncclcalls.py, test_multigpu.py)
#   bash benchmarks/acceptance/sweep_speed_acceptance.sh    (wheels in .whl/, nccl-tests in .anchors/)
# A device call may end before it does: start it with setsid and collect $OUT/done later, and
# $OUT/results.tgz (the logs, databases and JSON in one file: a call brings back few files).
set -uo pipefail
OUT=${OUT:-/tmp/speed-acc}; mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
stamp() { echo "=== $1 $(date -u +%H:%M:%S)" | tee -a "$OUT/progress.log"; }
stamp start
python3 -m compileall -q pytest_opperf benches >/dev/null 2>&1
timeout 560 python3 benchmarks/acceptance/speed.py --main-forward --skip settle shards --do-bench-budget 30 \
  --out "$OUT/speed" > "$OUT/speed.log" 2>&1
tail -16 "$OUT/speed.log" >> "$OUT/progress.log"
stamp speed
OUT="$OUT/conv" ONE_THREAD=0 SWEEPS=loop timeout 300 bash benchmarks/acceptance/collectives_conventions.sh 2 \
  > "$OUT/conventions.log" 2>&1
stamp conventions
timeout 300 python3 -m pytest tests/test_collective_bench.py tests/test_ncclcalls.py tests/test_multigpu.py \
  -p no:cacheprovider -q -rfE > "$OUT/tests.log" 2>&1
tail -5 "$OUT/tests.log" >> "$OUT/progress.log"
stamp tests
# One file to bring back: a device call returns a limited number of files from $OUT.
(cd "$OUT" && tar czf results.tgz --ignore-failed-read speed conv *.log 2>/dev/null)
touch "$OUT/done"
