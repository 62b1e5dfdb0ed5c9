#!/usr/bin/env bash
# Two simulated nodes on one GPU host: two torchrun launches (--nnodes=2, a c10d rendezvous on 127.0.0.1),
# each in its own copy of the checkout and on its half of the GPUs, as two hosts would run one sweep.
#
#   bash benchmarks/acceptance/torchrun_nodes.sh [pytest arguments]      # default: README's main command, benches/
#
# Then prints where the one database is, the rows per rank, the collective rows (group size, nodes,
# topology_tier, topology_link, time) and the wall time. Logs and the database go to $OUT.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
half=$((GPUS / 2))
[ "$half" -ge 1 ] || { echo "needs 2 GPUs or more"; exit 1; }
first=$(seq -s, 0 $((half - 1)))
second=$(seq -s, "$half" $((GPUS - 1)))
rm -rf /tmp/opperf-node-b && mkdir -p /tmp/opperf-node-b
tar --exclude=./results --exclude=./.git -cf - . | tar -xf - -C /tmp/opperf-node-b
rm -rf results/*.db /tmp/opperf-node-b/results/*.db
port=$((29500 + RANDOM % 1000))
args=("$@"); [ ${#args[@]} -eq 0 ] && args=(benches/)
launch() {  # GPUS_OF_NODE DIR LOG
  (cd "$2" && CUDA_VISIBLE_DEVICES=$1 timeout 540 torchrun --nnodes=2 --nproc-per-node="$half" --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:$port --rdzv-id=opperf-sim --max-restarts=0 -m pytest "${args[@]}" -p no:cacheprovider \
    > "$3" 2>&1)
}
start=$(date +%s.%N)
launch "$first" "$PWD" "$OUT/node_a.log" &
launch "$second" /tmp/opperf-node-b "$OUT/node_b.log" &
wait
end=$(date +%s.%N)
echo "two nodes x $half GPUs: wall $(python3 -c "print(f'{$end - $start:.1f}')") s"
for log in "$OUT"/node_*.log; do echo "--- $log"; grep -E "^opperf: |torchrun:|^rank [0-9]|passed|failed|ERROR" "$log" | tail -12; done
python3 - "$OUT" <<'PY'
import shutil, sqlite3, sys
from pathlib import Path
out = Path(sys.argv[1])
dbs = [p for p in [*Path("results").glob("*.db"), *Path("/tmp/opperf-node-b/results").glob("*.db")]]
print("databases:", [str(p) for p in dbs])
for db in dbs:
    shutil.copy(db, out / f"torchrun_{db.parent.parent.name or 'a'}_{db.name}")
    con = sqlite3.connect(db)
    tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")
              if t not in ("runs", "ceilings") and not t.startswith("_")]
    per_rank = {}
    for t in tables:
        cols = [c[1] for c in con.execute(f"pragma table_info([{t}])")]
        if "rank" not in cols:
            continue
        for rank, count in con.execute(f"select rank, count(*) from [{t}] group by rank"):
            per_rank[rank] = per_rank.get(rank, 0) + count
        if "topology_tier" in cols and t in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            for r in con.execute(f"select num_devices, num_nodes, topology_tier, topology_link, message_bytes, time_us "
                                 f"from [{t}] order by num_devices, message_bytes"):
                print(t, r)
    print("rows per rank:", dict(sorted(per_rank.items(), key=lambda kv: (kv[0] is None, kv[0]))))
PY
