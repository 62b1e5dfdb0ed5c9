"""Why a large LM head reads faster in the sequence replay than in the model: its data, or its context.

Issue 68: Gemma-7B's LM head, ``aten::linear`` [1, 1024, 3072] x [256000, 3072] bf16, one kernel
both ways, read 2048-2113 us profiled in the model and 1882-1920 us in sequence (H200). A GEMM of
that size runs at the card's power limit, and the power a tensor core draws depends on the bits it
multiplies, so the same kernel can clock lower on one set of values than on another. The replay
draws N(0, 1) values; the model multiplies its own activations by its own weights.

This probe builds the model (transformers' GemmaForCausalLM at Gemma-7B's widths, 2 layers, random
weights as transformers initialises them, bf16), takes the LM head's input from a real prefill, and
times the same kernel on each pairing of the model's and N(0, 1) values, each in three contexts:
back to back, after 3 ms of other GEMMs (a model's layers), and after the GPU idled 50 ms. Kernel
time from torch.profiler; power and SM clock sampled by NVML beside it.

    python3 benchmarks/probes/lm_head_power.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch


class Sampler(threading.Thread):
    """NVML power (W) and SM clock (MHz) every ~2 ms while running."""

    def __init__(self):
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self.samples: list = []
        self.stop = threading.Event()

    def run(self):
        nv, h = self.nvml, self.handle
        while not self.stop.is_set():
            self.samples.append((time.perf_counter(), nv.nvmlDeviceGetPowerUsage(h) / 1000,
                                 nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
            time.sleep(0.002)

    def between(self, t0, t1) -> dict:
        got = [s for s in self.samples if t0 <= s[0] <= t1]
        if not got:
            return {}
        return {"power_w": round(statistics.mean(s[1] for s in got), 1),
                "sm_mhz": round(statistics.mean(s[2] for s in got)), "min_sm_mhz": min(s[2] for s in got)}


def model_values(prefill: int):
    """The LM head's input from a real prefill, and its weight: Gemma-7B's widths, 2 layers."""
    import transformers

    config = transformers.GemmaConfig(hidden_size=3072, intermediate_size=24576, num_attention_heads=16,
                                      num_key_value_heads=16, head_dim=256, vocab_size=256000, num_hidden_layers=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.GemmaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    seen = {}
    model.lm_head.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].detach().clone()))
    ids = torch.randint(0, config.vocab_size, (1, prefill), device="cuda")
    with torch.no_grad():
        model(input_ids=ids)
    torch.cuda.synchronize()
    w = model.lm_head.weight.detach().clone()
    del model
    torch.cuda.empty_cache()
    return seen["x"], w


def describe(t) -> dict:
    f = t.float()
    return {"mean": round(f.mean().item(), 4), "std": round(f.std().item(), 4),
            "zero_share": round((t == 0).float().mean().item(), 4)}


def timed(x, w, context: str, reps: int, sampler: Sampler) -> dict:
    """Median kernel time (us) of the LM head in CONTEXT, and power and clock around it."""
    fn = torch.nn.functional.linear
    load = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for _ in range(3):
        fn(x, w)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if context == "after layers":
                for _ in range(3):  # ~3 ms of other GEMMs, the model's layers before its head
                    torch.mm(*load)
            elif context == "after idle":
                torch.cuda.synchronize()
                time.sleep(0.05)
            with torch.profiler.record_function("head"):
                fn(x, w)
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    heads = [e for e in prof.events() if e.name == "head"]
    us = []
    for e in heads:
        ks = [k.duration for k in e.kernels] + [k.duration for ch in e.cpu_children for k in ch.kernels]
        if ks:
            us.append(sum(ks))
    if not us:  # a torch whose record_function ranges hold no kernels: the GEMM kernels themselves
        us = [e.device_time for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU
              and ("gemm" in e.name.lower() or "nvjet" in e.name.lower()) and e.device_time > 500]
    return {"us": round(statistics.median(us), 1), "n": len(us), **sampler.between(t0, t1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    mx, mw = model_values(args.prefill)
    x = mx.reshape(-1, mx.shape[-1])
    rx = torch.randn_like(x)
    rw = torch.randn_like(mw)
    data = {"model x, model w": (x, mw), "randn x, randn w (the replay's)": (rx, rw),
            "model x, randn w": (x, rw), "randn x, model w": (rx, mw),
            "randn x, 0.02 randn w": (rx, rw * 0.02)}
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "values": {"model x": describe(x), "model w": describe(mw)}, "times": {}}
    print(json.dumps(out["values"]))
    sampler = Sampler()
    sampler.start()
    for context in ("back to back", "after layers", "after idle"):
        for name, (a, b) in data.items():
            got = timed(a, b, context, args.reps, sampler)
            out["times"][f"{context} | {name}"] = got
            print(f"{context:13s} | {name:32s} {got}", flush=True)
    sampler.stop.set()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
