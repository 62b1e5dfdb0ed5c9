#!/usr/bin/env bash
# The model's time in context on one GPU, in one go; everything lands in $OUT (or /tmp/seq-acc).
# STEPS (default "tests whatif families"; add main for README's main command):
#   tests     the GPU tests of the sequence replay and of the pipeline's CPU-profile replays
#   whatif    whatif_models.py: SDPA flash -> memory-efficient at two prompt lengths
#             (WHATIF_PREFILLS, default 2048,4096), and the eager norm -> a Triton one
#   main      README's main command: the sweep on this GPU, to its end
#   families  sequence_models.py --widths published: twelve families at a checkpoint's widths,
#             in sequence against the profile (FAMILY_ARGS: e.g. "--family llama3_8b")
#   bash benchmarks/acceptance/sequence_acceptance.sh       (wheels in .whl/)
# A device call may end before it does: start it with setsid and collect $OUT/done and the
# summaries later (a call brings back few files).
set -uo pipefail
OUT=${OUT:-/tmp/seq-acc}; mkdir -p "$OUT"
STEPS=${STEPS:-tests whatif families}
source benchmarks/acceptance/device_env.sh
stamp() { echo "=== $1 $(date -u +%H:%M:%S)" | tee -a "$OUT/progress.log"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp start
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader >> "$OUT/progress.log"
git log --oneline -1 >> "$OUT/progress.log" 2>/dev/null
if has tests; then
  timeout 400 python3 -m pytest tests/test_sequence.py tests/test_pipeline_generic.py tests/test_pipeline_same.py \
    -p no:cacheprovider -q -rfE > "$OUT/tests.log" 2>&1
  tail -6 "$OUT/tests.log" >> "$OUT/progress.log"
  stamp tests
fi
if has whatif; then
  OUT="$OUT/whatif" timeout 900 python3 benchmarks/acceptance/whatif_models.py \
    --prefills ${WHATIF_PREFILLS:-2048,4096} ${WHATIF_ARGS:-} > "$OUT/whatif.log" 2>&1
  cp "$OUT/whatif/whatif_summary.json" "$OUT/" 2>/dev/null
  grep -v "^\[transformers\]\|Warning\|warn(" "$OUT/whatif.log" | tail -60 >> "$OUT/progress.log"
  stamp whatif
fi
if has main; then
  timeout 400 python3 -m pytest benches/ -p no:cacheprovider -q -rfE --opperf-summary=0 > "$OUT/main.log" 2>&1
  tail -4 "$OUT/main.log" >> "$OUT/progress.log"
  stamp main
fi
if has families; then
  OUT="$OUT/families" timeout 1800 python3 benchmarks/acceptance/sequence_models.py --widths published \
    --prefill ${PREFILL:-1024} --decode 8 --skip-isolated ${FAMILY_ARGS:-} > "$OUT/families.log" 2>&1
  cp "$OUT/families/sequence_summary.json" "$OUT/" 2>/dev/null
  grep -v "^\[transformers\]\|Warning\|warn(" "$OUT/families.log" | tail -30 >> "$OUT/progress.log"
  stamp families
fi
touch "$OUT/done"
