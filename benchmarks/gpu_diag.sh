#!/usr/bin/env bash
# One device call for the open GPU failures: the failing GPU test files (logs to $OUT), then the
# per-tensor Triton fp8 quantizer under the profiler and the event timer side by side.
set -uo pipefail
OUT=${OUT:-/tmp/opperf-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || cat "$OUT/install.log"
timeout 300 python3 -m pytest -p no:cacheprovider -q -rfE -n 8 --tb=short "$@" 2>&1 | tee "$OUT/diag.log" | tail -80
for t in profiler event; do
  timeout 60 python3 -m pytest benches/ -p no:cacheprovider -q -k "quant_fp8 and triton and tensor" \
    --opperf-timer=$t --opperf-results=$OUT/$t >/dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import sqlite3, sys
for t in ("profiler", "event"):
    for db in __import__("glob").glob(f"{sys.argv[1]}/{t}/*.db"):
        for r in sqlite3.connect(db).execute("select m, n, granularity, time_us from quant_fp8 order by m"):
            print(t, *r)
PY
