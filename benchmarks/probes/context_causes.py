"""Why a small kernel reads slower or faster in one context than in another: each cause alone.

The kernels furthest from their profile in the sequence replay (issue 61) are small decode ones
(the KV cache's cat, the rotary mul, a routing softmax, SDPA) and a large prefill add. Each is timed
here (torch.profiler, the kernel's device time, median of --reps) with one thing changed at a time:

- inputs: ``hot`` (each written by a kernel just before) or ``cold`` (then 2x the L2 written over them);
- output: ``fresh`` (the allocator's block, whatever it held) or ``hot`` (an ``out=`` tensor just written);
- launch: ``idle`` (the GPU idle 200 us before the launch) or ``queued`` (behind a 30 us sleep kernel
  that touches no memory, so the launch waits in the queue as a kernel in a busy model does).

    python3 benchmarks/probes/context_causes.py [--json out.json]

Prints one line per op and condition: the median and the ratio to hot inputs, fresh output, queued.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def cases(dev):
    bf = torch.bfloat16
    hidden = 4096

    def t(*shape, dtype=bf):
        return torch.randn(*shape, device=dev, dtype=dtype)

    q = t(1, 1, 32, 128).transpose(1, 2)  # a decode query as the model has it: [1,32,1,128], head-major strides
    past, new = t(1, 8, 1024, 128), t(1, 1, 8, 128).transpose(1, 2)
    return {
        # name: (inputs, the call, the out= tensor's shape and dtype or None)
        "residual add [1,1024,4096]": ([t(1, 1024, hidden), t(1, 1024, hidden)], lambda a, b, out=None: torch.add(a, b, out=out),
                                       ((1, 1024, hidden), bf)),
        "rotary mul q*cos [1,32,1,128]": ([q, t(1, 1, 1, 128)], lambda a, b, out=None: torch.mul(a, b, out=out),
                                          ((1, 32, 1, 128), bf)),
        "kv cat [1,8,1024,128]+[1,8,1,128]": ([past, new], lambda a, b, out=None: torch.cat([a, b], dim=-2, out=out),
                                              ((1, 8, 1025, 128), bf)),
        "softmax fp32 [1,128]": ([t(1, 128, dtype=torch.float32)], lambda a, out=None: torch.softmax(a, -1), None),
        "silu [64,1536]": ([t(64, 1536)], lambda a, out=None: torch.nn.functional.silu(a) if out is None
                           else torch.ops.aten.silu.out(a, out=out), ((64, 1536), bf)),
        "layer_norm [1,4608]": ([t(1, 4608), t(4608), t(4608)],
                                lambda a, w, b, out=None: torch.nn.functional.layer_norm(a, (4608,), w, b), None),
        "sdpa decode q[1,32,1,128] kv[1,32,1024,128]": (
            [q, t(1, 32, 1024, 128), t(1, 32, 1024, 128)],
            lambda a, k, v, out=None: torch.nn.functional.scaled_dot_product_attention(a, k, v), None),
    }


def timed(prof_events, tag: str) -> float:
    from pytest_opperf.pipeline.replay.sequence import device_us

    cpu = torch.autograd.DeviceType.CPU
    return [device_us(e) for e in prof_events if e.name == tag and e.device_type == cpu]


def measure(name, inputs, fn, out_spec, reps: int, flush) -> dict:
    results = {}
    conditions = [(i, o, l) for i in ("hot", "cold") for o in ("fresh", "hot") for l in ("idle", "queued")
                  if not (o == "hot" and out_spec is None)]
    for warm in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            for cond in conditions:
                ins, outs, launch = cond
                out = torch.empty(*out_spec[0], device=inputs[0].device, dtype=out_spec[1]) if outs == "hot" else None
                for x in inputs:  # write every input in place: its lines now in the L2, dirty
                    x.mul_(1.0)
                if out is not None:
                    out.zero_()
                if ins == "cold":
                    flush.zero_()
                    if out is not None:
                        out.zero_()  # the output hot again, the inputs not
                if launch == "idle":
                    torch.cuda.synchronize()
                    time.sleep(200e-6)
                else:
                    torch.cuda._sleep(60_000)
                with torch.profiler.record_function(f"probe#{'/'.join(cond)}"):
                    fn(*inputs, out=out) if out is not None else fn(*inputs)
                torch.cuda.synchronize()
    events = prof.events()
    for cond in conditions:
        us = timed(events, f"probe#{'/'.join(cond)}")
        results["/".join(cond)] = statistics.median(us) if us else None
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
    flush = torch.empty(4 * l2 // 4, device=dev, dtype=torch.float32)
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "reps": args.reps,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ops": {}}
    with torch.inference_mode():
        for name, (inputs, fn, out_spec) in cases(dev).items():
            got = measure(name, inputs, fn, out_spec, args.reps, flush)
            report["ops"][name] = got
            base = got.get("hot/fresh/queued")
            print(name)
            for cond, us in got.items():
                ratio = f"{us / base:.3f}" if us and base else "-"
                print(f"  {cond:<18} {us:8.2f} us  x{ratio}" if us is not None else f"  {cond:<18} -")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
