#!/usr/bin/env bash
# Collectives on the GPUs of one host, the plugin's conventions beside nccl-tests built on the machine.
#
#   bash benchmarks/acceptance/collectives_conventions.sh [GROUP_SIZES]     # e.g. "2 4" (default: 2 and every GPU)
#   SWEEPS=loop bash benchmarks/acceptance/collectives_conventions.sh          # the plugin's default convention only
#   ONE_THREAD=0 bash ...                                           # without nccl-tests' one-thread runs (-g n)
#   SWEEPS= bash ...                                                # nccl-tests only: the table then reads the
#                                                                   # collective rows already in $OUT/results
#
# Needs nccl-tests' source and ../shared/device/nccl-tests.sh copied into .anchors/ (carried to the
# GPU machine). For each group size: nccl-tests' (one thread per GPU, and one thread for all) all_reduce, all_gather, reduce_scatter and alltoall,
# bf16, 1 KiB to 1 GiB a rank (-f 4; all_gather's size is the gathered buffer), plain and with -G (CUDA
# graphs); then the plugin's sweep of the same four ops, both backends (torch_dist and nccl), with
# --opperf-comm-convention=loop (the default) and =graph; then benchmarks/acceptance/collectives_table.py prints the
# rows beside nccl-tests' and the CV of every row. Logs and databases in $OUT.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/nccl"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
SIZES=${1:-"2 $GPUS"}
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
for n in $SIZES; do
  for op in all_reduce all_gather reduce_scatter alltoall; do
    for graph in 0 10; do
      # all_gather's size is the gathered buffer: n x each rank's message_bytes (1 KiB to 1 GiB)
      lo=1024 hi=1073741824; [ "$op" = all_gather ] && lo=$((1024 * n)) hi=$((1073741824 * n))
      # one thread per GPU (-t n -g 1), each launching on its own GPU as the plugin's rank processes
      # do; and one thread driving every GPU (-g n), nccl-tests' usual form, for reference
      timeout 120 bash .anchors/nccl-tests.sh .anchors/nccl-tests "$op" 1 -t "$n" -b "$lo" -e "$hi" -f 4 -w 5 -n 20 \
        -G "$graph" > "$OUT/nccl/${op}_g${n}_G${graph}.txt" 2>&1 || echo "nccl-tests $op -t $n -G $graph failed"
      [ "${ONE_THREAD:-1}" = 0 ] || timeout 120 bash .anchors/nccl-tests.sh .anchors/nccl-tests "$op" "$n" -b "$lo" -e "$hi" \
        -f 4 -w 5 -n 20 -G "$graph" > "$OUT/nccl/one_thread_${op}_g${n}_G${graph}.txt" 2>&1 || echo "nccl-tests $op -g $n -G $graph failed"
    done
  done
done
echo "=== nccl-tests done $(date -u +%H:%M:%S)"
for convention in ${SWEEPS-loop graph}; do
  python3 -m pytest benches/test_collectives.py -k "all_reduce or all_gather or reduce_scatter or all_to_all" \
    -p no:cacheprovider -q --opperf-summary=0 --opperf-comm-convention=$convention --opperf-budget=0.5 \
    --opperf-results="$OUT/results" > "$OUT/sweep_$convention.log" 2>&1
  tail -4 "$OUT/sweep_$convention.log"
  echo "=== sweep $convention done $(date -u +%H:%M:%S)"
done
python3 benchmarks/acceptance/collectives_table.py "$OUT"
if [ "${ONE_THREAD:-1}" != 0 ]; then
  echo "=== against nccl-tests with one thread driving every GPU (-g n):"
  python3 benchmarks/acceptance/collectives_table.py "$OUT" one_thread_ | grep -E "^(nccl|torch_dist) "
fi
