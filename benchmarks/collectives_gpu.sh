#!/usr/bin/env bash
# Collectives on the GPUs of one host: the plugin's rows and an independent plain loop, side by side.
#
#   bash benchmarks/collectives_gpu.sh            # from the checkout, on a machine with 1 or more GPUs
#
# With 2 GPUs or more: all_reduce and all_gather, bf16, 1 KiB to 1 GiB per rank on 2 ranks (and 8 where
# there are 8), through `pytest benches/test_collectives.py`, then benchmarks/collectives_plain.py (a
# nccl-tests-style loop written apart from the plugin), then a table of busbw at each size from both.
# With 1 GPU: the num_devices=1 cases (an NCCL group of one, asked for with --opperf-one-rank) and the
# GPU tests; the rest skip.
# About 2 minutes on 2 GPUs. Leaves the database, logs and JSON in $OUT (default: a temp dir).
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
# NVLink multicast (NVLS) stays off on the lent machines.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
ONE_RANK=""; [ "$GPUS" -lt 2 ] && ONE_RANK=--opperf-one-rank
nvidia-smi --query-gpu=index,name,driver_version --format=csv
nvidia-smi topo -m 2>&1 | tee "$OUT/topo.txt"
echo "=== GPU tests $(date -u +%H:%M:%S)"
python3 -m pytest tests/test_collective_bench.py -q -p no:cacheprovider -rfEs 2>&1 | tee "$OUT/tests.log" | tail -15
echo "=== plugin sweep $(date -u +%H:%M:%S)"
python3 -m pytest benches/test_collectives.py -k "all_reduce or all_gather" -p no:cacheprovider -q -rs \
  --opperf-results="$OUT/results" --opperf-summary=0 $ONE_RANK 2>&1 | tee "$OUT/sweep.log" | tail -15
if [ "$GPUS" -ge 2 ]; then
  echo "=== plain loop $(date -u +%H:%M:%S)"
  python3 benchmarks/collectives_plain.py --ranks 2 --json "$OUT/collectives_plain.json" 2>&1 | tee "$OUT/plain.log" | tail -30
fi
python3 - "$OUT" <<'PY'
import json, sqlite3, sys
from pathlib import Path
out = Path(sys.argv[1])
plain = {}
if (out / "collectives_plain.json").exists():
    plain = {(r["op"], r["message_bytes"], r["num_devices"]): r for r in json.loads((out / "collectives_plain.json").read_text())}
print("| op | n | message_bytes | plugin time_us | plugin busbw GB/s | busbw_util | plain time_us | plain busbw GB/s | cv | samples |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for db in sorted((out / "results").glob("*.db")):
    con = sqlite3.connect(db)
    for op in ("all_reduce", "all_gather"):
        try:
            found = con.execute(f"select num_devices, message_bytes, time_us, busbw_gbps, busbw_util, cv, samples "
                                f"from [{op}] order by num_devices, message_bytes").fetchall()
        except sqlite3.OperationalError:
            continue
        for n, size, t, busbw, util, cv, samples in found:
            p = plain.get((op, size, n))
            util_text = "-" if util is None else f"{util:.1%}"
            ptext = f"{p['time_us']:.2f} | {p['busbw_gbps']:.2f}" if p else "- | -"
            print(f"| {op} | {n} | {size} | {t:.2f} | {busbw:.2f} | {util_text} | {ptext} | {cv:.3f} | {samples} |")
PY
echo "=== done $(date -u +%H:%M:%S); files in $OUT"
