"""Where the plugin's recorded time and the independent check disagree: the same case timed both
ways, alternately, with each kernel's own duration under each way's flush.

For each case (op, backend, dtype, params) and each of `--rounds` rounds:

- plugin:       sampler.measure(..., "profiler", "cold"): what a row records;
- independent:  benchmarks/acceptance/independent_check.py's call_times_us (its Triton read between calls);
- per kernel:   one torch.profiler session per flush kind (the plugin's int64 sum, the check's
                Triton read, none), each call inside a record_function range: the median duration
                of every kernel the call ran, so a disagreement is pinned to the kernel it lives in.

    python3 benchmarks/probes/check_disagreement.py --json OUT/disagree.json             # the cases below
    python3 benchmarks/probes/check_disagreement.py --case 'gemm_rowwise torch fp8:bf16 m=4096 n=6144 k=4096'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))  # independent_check
import independent_check as ic  # noqa: E402

from pytest_opperf.catalog import load_builtin  # noqa: E402
from pytest_opperf.measure import inputs, sampler  # noqa: E402
from pytest_opperf.measure.stats import StoppingRule  # noqa: E402

CASES = [
    "attention_decode torch bf16 batch=8 kv_len=32768 heads_q=28 heads_kv=4 head_dim=128",
    "gemm_rowwise torch fp8:bf16 m=4096 n=6144 k=4096",
    "cross_entropy torch_compile bf16:fp32 tokens=16 vocab=152064",
    "gemm torch bf16 m=4096 n=4096 k=4096",
]
RULE = StoppingRule(target_rel=0.005, min_samples=50, max_samples=2000, budget_s=2.0)


def parse(text: str) -> tuple:
    """'op backend dtype_in[:dtype_out] name=value ...' -> (op, backend, dtype_in, dtype_out, params)."""
    op, backend, dtype, *params = text.split()
    p = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (x.split("=", 1) for x in params)}
    dtype_in, _, dtype_out = dtype.partition(":")
    return op, backend, dtype_in, dtype_out or dtype_in, p


def build(text: str, device):
    op, backend, dtype, dtype_out, p = parse(text)
    row = {"backend": backend, "dtype_in": dtype, "dtype_out": dtype_out, "knobs": "", **p}
    return ic.rebuild(op, row, list(p), device)


def per_kernel(fn, args, flush, calls: int) -> dict:
    """Kernel name -> median duration (us) over `calls` calls, each after `flush` (None: hot)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if flush is not None:
                flush()
            with record_function("opperf_disagreement_call"):
                fn(*args)
        torch.cuda.synchronize()
    durations = defaultdict(list)
    for e in prof.events():
        if e.name == "opperf_disagreement_call":
            for k in _kernels(e):
                durations[k.name[:90]].append(k.duration)
    return {name: round(statistics.median(v), 2) for name, v in durations.items()}


def _kernels(event) -> list:
    out = list(getattr(event, "kernels", []))
    for child in event.cpu_children:
        out += _kernels(child)
    return out


def run(cases: list, rounds: int, calls: int) -> list:
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    load_builtin()
    sep = ic.Separator(device, True, l2)
    plugin_flush = inputs.Flusher(device, l2)
    out = []
    for text in cases:
        fn, args = build(text, device)
        entry = {"case": text, "plugin_us": [], "independent_us": [], "kernels": {}}
        with torch.inference_mode():
            for _ in range(rounds):
                m = sampler.measure(inputs.Workload(fn, args), device, "profiler", "cold", RULE, cache_bytes=l2)
                entry["plugin_us"].append(round(m.stats.median, 2))
                entry["independent_us"].append(round(statistics.median(ic.call_times_us(fn, args, sep, calls)), 2))
            for label, flush in (("plugin flush", plugin_flush), ("check flush", sep), ("hot", None)):
                entry["kernels"][label] = per_kernel(fn, args, flush, calls)
        out.append(entry)
        print(f"{text}\n  plugin {entry['plugin_us']}  independent {entry['independent_us']}", flush=True)
        names = list(dict.fromkeys(k for v in entry["kernels"].values() for k in v))
        for name in names:
            cells = "  ".join(f"{entry['kernels'][label].get(name, '-'):>9}" for label in entry["kernels"])
            print(f"    {cells}  {name}", flush=True)
        del fn, args
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="'op backend dtype k=v ...' (repeatable; default: CASES)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_disagreement: needs a CUDA GPU", file=sys.stderr)
        return 2
    print("per kernel, median us: plugin flush (int64 sum), check flush (Triton read), hot")
    rows = run(a.case or CASES, a.rounds, a.calls)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
