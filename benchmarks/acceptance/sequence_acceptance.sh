#!/usr/bin/env bash
# The model's time in context on one GPU, in one go; everything lands in $OUT (or /tmp/seq-acc):
#   1. the GPU tests of the sequence replay and of the pipeline's CPU-profile replays
#   2. sequence_models.py --what-if: a what-if against a real swap (flash and memory-efficient SDPA)
#   3. README's main command (MAIN=1): the sweep on this GPU, to its end
#   4. sequence_models.py: ten transformers families, isolated and in-sequence sums against the profile
#      (SKIP_ISOLATED=1: in sequence only, without the replay sweeps)
#   bash benchmarks/acceptance/sequence_acceptance.sh       (wheels in .whl/)
# A device call may end before it does: start it with setsid and collect $OUT/done and
# $OUT/results.tgz later (a call brings back few files).
set -uo pipefail
OUT=${OUT:-/tmp/seq-acc}; mkdir -p "$OUT"
source benchmarks/acceptance/device_env.sh
stamp() { echo "=== $1 $(date -u +%H:%M:%S)" | tee -a "$OUT/progress.log"; }
stamp start
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader >> "$OUT/progress.log"
timeout 400 python3 -m pytest tests/test_sequence.py tests/test_pipeline_generic.py tests/test_pipeline_same.py \
  -p no:cacheprovider -q -rfE > "$OUT/tests.log" 2>&1
tail -6 "$OUT/tests.log" >> "$OUT/progress.log"
stamp tests
OUT="$OUT/whatif" timeout 600 python3 benchmarks/acceptance/sequence_models.py --what-if --prefill ${WHATIF_PREFILL:-4096} \
  > "$OUT/whatif.log" 2>&1
tail -40 "$OUT/whatif.log" >> "$OUT/progress.log"
stamp whatif
if [ "${MAIN:-0}" = 1 ]; then
  timeout 400 python3 -m pytest benches/ -p no:cacheprovider -q -rfE --opperf-summary=0 > "$OUT/main.log" 2>&1
  tail -4 "$OUT/main.log" >> "$OUT/progress.log"
  stamp main
fi
ISOLATED=$([ "${SKIP_ISOLATED:-0}" = 1 ] && echo --skip-isolated)
OUT="$OUT/families" timeout 1500 python3 benchmarks/acceptance/sequence_models.py $ISOLATED ${FAMILY_ARGS:-} \
  > "$OUT/families.log" 2>&1
grep -v "^\[transformers\]\|Warning\|warn(" "$OUT/families.log" | tail -30 >> "$OUT/progress.log"
stamp families
(cd "$OUT" && tar czf results.tgz --exclude='*.json.gz' --exclude='results' --exclude='*.db' --ignore-failed-read \
  *.log whatif families 2>/dev/null; tar czf dbs.tgz --ignore-failed-read $(find whatif families -name profile.db) families/qwen3/trace.json.gz \
  2>/dev/null)
touch "$OUT/done"
