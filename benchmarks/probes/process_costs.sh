#!/usr/bin/env bash
# The once-a-process costs of a sweep, with and without torch's bytecode cache.
# Run from the repository root on a GPU machine, on fresh compile caches (about 3 minutes).
# The H100 image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without .pyc files: every
# process compiles torch from source until `compileall` writes them, as pip does at install.
set -u
SP=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
SEL="(test_add and 1048576) or (all_reduce and 65536) or (moe_gating and torch_compile)"
stage() {
  for i in 1 2; do /usr/bin/time -f "import torch %e s" python3 -c "import torch"; done
  python3 benchmarks/probes/first_call_cost.py; python3 benchmarks/probes/first_call_cost.py
  python3 -X importtime -c "import liger_kernel.transformers.functional" 2>&1 | sort -t'|' -k2 -n | tail -3
  PYTHONPATH=benchmarks/probes:${PYTHONPATH:-} python3 -m pytest benches/ -q -p session_end_stamps -p no:cacheprovider \
    --opperf-results=/tmp/process-costs -k "$SEL" 2>&1 | tail -2
  python3 benchmarks/probes/rank_group_cost.py cuda
}
echo "== as installed (sys.flags.dont_write_bytecode=$(python3 -c 'import sys; print(sys.flags.dont_write_bytecode)'))"
stage
/usr/bin/time -f "compileall %e s" python3 -m compileall -q -j 16 "$SP" > /dev/null
echo "== after compileall"
stage
python3 benchmarks/probes/first_call_after_profiler.py none
for i in 1 2; do
  python3 benchmarks/probes/first_call_after_profiler.py none; python3 benchmarks/probes/first_call_after_profiler.py prof
  TEARDOWN_CUPTI=0 python3 benchmarks/probes/first_call_after_profiler.py prof
done
