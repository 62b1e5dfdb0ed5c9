"""A plain torch.distributed timing loop, written apart from the plugin, to check its collective rows.

nccl-tests' method: per size, warm-up calls, then `--iters` back-to-back calls between two CUDA
events on every rank; a rank's time is the loop over the iterations, and the reported time is
the slowest rank's (an all-reduce MAX of the per-rank times). algbw and busbw as nccl-tests.

    python3 benchmarks/collectives_plain.py --ranks 2 --json plain.json    # one process per GPU

Prints a markdown table; --json writes the rows ($OUT/collectives_plain.json by default when
$OUT is set).
"""

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}


def sizes(low: int, high: int) -> list[int]:
    out, s = [], low
    while s <= high:
        out.append(s)
        s *= 4
    return out


def rank_main(rank: int, world: int, args, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size in sizes(args.min_bytes, args.max_bytes):
            count = size // 2  # bf16
            x = torch.randn(count, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(count * world, device="cuda", dtype=torch.bfloat16) if op == "all_gather" else x
            call = (lambda: dist.all_gather_into_tensor(out, x)) if op == "all_gather" else (lambda: dist.all_reduce(x))
            for _ in range(args.warmup):
                call()
            iters = args.iters if size >= (1 << 24) else args.iters * 10
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            torch.cuda.synchronize()
            per_call_us = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device="cuda")
            dist.all_reduce(per_call_us, op=dist.ReduceOp.MAX)
            s = size * world if op == "all_gather" else size  # nccl-tests' size S
            algbw = s / (per_call_us.item() * 1e-6) / 1e9
            rows.append({"op": op, "message_bytes": size, "num_devices": world, "time_us": per_call_us.item(),
                         "algbw_gbps": algbw, "busbw_gbps": algbw * FACTORS[op](world), "iters": iters})
            del x, out
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    parser.add_argument("--min-bytes", type=int, default=1024)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--port", type=int, default=29511)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(args.ranks, args, args.port, queue), nprocs=args.ranks, start_method="spawn")
    rows = queue.get()
    print(f"plain torch.distributed loop, {args.ranks} ranks, bf16, CUDA events around {args.iters}+ calls, "
          f"max over ranks")
    print("| op | message_bytes | time_us | algbw GB/s | busbw GB/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['op']} | {r['message_bytes']} | {r['time_us']:.2f} | {r['algbw_gbps']:.2f} | {r['busbw_gbps']:.2f} |")
    path = args.json or os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "collectives_plain.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"rows: {path}")


if __name__ == "__main__":
    main()
