#!/usr/bin/env bash
# README's main command serially, then with -n N (one xdist worker per GPU), each into its own
# results directory under $OUT; then the collective rows of both side by side: every row of the
# serial run must be in the -n run (same op, backend, group size, size and convention), with its time.
#
#   bash benchmarks/acceptance/collectives_xdist.sh [N]          # N: the workers (default: every GPU)
#   STEPS=xdist bash benchmarks/acceptance/collectives_xdist.sh   # only the -n run (the serial one is in $OUT already)
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=${1:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
for step in ${STEPS-serial xdist}; do
  args=(); [ "$step" = xdist ] && args=(-n "$N")
  start=$(date +%s)
  python3 -m pytest benches/ "${args[@]}" -p no:cacheprovider -q -rfE --opperf-results="$OUT/$step" \
    > "$OUT/main_$step.log" 2>&1
  echo "=== $step (${args[*]:-serial}): exit $?, $(( $(date +%s) - start )) s: $(tail -1 "$OUT/main_$step.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/main_$step.log" | head -20
done
python3 - "$OUT" <<'EOF'
import sqlite3, sys
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def collective_rows(folder):
    found = {}
    for db in Path(folder).glob("*.db"):
        con = sqlite3.connect(db)
        for op in OPS:
            try:
                for key in con.execute(f"select backend, num_devices, message_bytes, comm_convention, time_us, cv, "
                                       f"worker from [{op}]"):
                    found[(op, *key[:4])] = key[4:]
            except sqlite3.OperationalError:
                pass
    return found


out = Path(sys.argv[1])
serial, xdist = collective_rows(out / "serial"), collective_rows(out / "xdist")
missing = sorted(set(serial) - set(xdist))
ratios = sorted(xdist[k][0] / serial[k][0] for k in serial if k in xdist and serial[k][0])
print(f"collective rows: serial {len(serial)}, -n {len(xdist)}; of the serial rows missing under -n: {len(missing)}")
for key in missing[:20]:
    print("  missing:", key)
if ratios:
    mid = ratios[len(ratios) // 2]
    print(f"-n time / serial time over {len(ratios)} rows: median {mid:.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f}")
print("workers that ran collective rows under -n:", sorted({str(v[2]) for v in xdist.values()}))
EOF
