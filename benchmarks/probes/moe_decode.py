"""Why Mixtral's decode grouped GEMMs read slower in the sequence replay than in the model.

Issue 68 (H200, 2026-11-29): Mixtral-8x7B's decode gate/up ``aten::_grouped_mm`` [2, 4096] x
[8, 4096, 28672] (2 tokens' rows to 2 experts) took 178 us a call profiled in the model and 234 us
in sequence, with the same kernels and the captured offsets. This probe takes the call's own
tensors from a real decode step (transformers' MixtralForCausalLM at Mixtral-8x7B's widths, 2
layers, random weights, grouped_mm experts, bf16) and times the same call (torch.profiler, median
of --reps) with one thing changed at a time: the weight a fresh N(0, 1) tensor of the same strides
(as the replay makes it), the weight a copy of the model's (same values, new memory), the input
N(0, 1), the offsets sending the rows to two other experts. Also the model's own decode step
profiled, its grouped GEMMs' times as the profile reads them.

    python3 benchmarks/probes/moe_decode.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            with torch.profiler.record_function("call"):
                fn()
        torch.cuda.synchronize()
    us = []
    for e in prof.events():
        if e.name == "call" and str(e.device_type).endswith("CPU"):
            us.append(sum(k.duration for k in e.kernels) + sum(k.duration for c in e.cpu_children for k in c.kernels))
    return round(statistics.median(us), 2) if us else float("nan")


def main() -> int:
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    config = transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                                        vocab_size=32000, num_hidden_layers=2)
    config._attn_implementation = "sdpa"
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.MixtralForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    seen: list = []

    class Keep(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            if "_grouped_mm" in str(func):
                seen.append((a[0], a[1], a[2] if len(a) > 2 else (kw or {}).get("offs")))
            return out

    import inspect

    word = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(0, 32000, (1, 1024), device="cuda")
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        kept = {word: out.get("cache") if out.get("cache") is not None else out.get("past_key_values")}
        for _ in range(2):  # warm
            model(input_ids=nxt, use_cache=True, **kept)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with Keep():
                model(input_ids=nxt, use_cache=True, **kept)
            torch.cuda.synchronize()
    profiled = [round(e.device_time, 2) for e in prof.events() if not str(e.device_type).endswith("CPU")
                and "device_kernel" in e.name]
    x, w, offs = seen[0]  # layer 0's gate/up
    gm = torch._grouped_mm
    fresh_w = torch.randn(w.untyped_storage().nbytes() // 2, device="cuda", dtype=torch.bfloat16) \
        .as_strided(w.shape, w.stride())
    copy_w = torch.empty_like(w).copy_(w)
    noise = torch.randn_like(x)
    other = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2], device="cuda", dtype=offs.dtype)
    result = {"device": torch.cuda.get_device_name(0), "offsets": offs.tolist(), "x": list(x.shape),
              "w": [list(w.shape), list(w.stride())], "in the model's decode step (profile)": profiled,
              "model's tensors": timed(lambda: gm(x, w, offs=offs), args.reps),
              "weight N(0,1), same strides (the replay's)": timed(lambda: gm(x, fresh_w, offs=offs), args.reps),
              "weight copied (same values, new memory)": timed(lambda: gm(x, copy_w, offs=offs), args.reps),
              "input N(0,1)": timed(lambda: gm(noise, w, offs=offs), args.reps),
              "rows to experts 1 and 7": timed(lambda: gm(x, w, offs=other), args.reps)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
