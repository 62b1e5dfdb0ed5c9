"""Machine drift: tell a slower machine from a slower kernel.

Two fixed kernels, a memory copy and a matrix multiply on seeded random data, are timed with
the session's timer in every process that runs cases: before its first case and after its
last. A baseline keeps their times (its `reference`, the last runs as for cases), so a run
knows how fast this machine is against the machine the baseline saw:

    factor = geometric mean over the kernels of (time now / median of the baseline's times)

The report also gives the median ratio of every judged case. The machine is said to have
drifted when the start factor, the end factor, the start-to-end change or the median case
ratio (of MIN_CASES cases or more) is off 1 by more than half the threshold. With
--opperf-normalize=reference, each case's time is divided by the factor (the start's for the
sweep, the end's for re-measurements)
before it is judged. The median case ratio is reported but never divided out: a library
update that slows every case would look the same, and it is a regression to report.

>>> factor({"timer": "cpu", "copy_us": 110.0, "gemm_us": 121.0}, {"timer": "cpu", "copy_us": [100.0], "gemm_us": [110.0]})
1.1
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from pytest_opperf.gate.noise import FIRST_RUNS, device_kind, reference_time

KERNELS = ("copy_us", "gemm_us")
# Sizes by device type. An accelerator's copy (128 MiB read, 128 MiB written) is well past its
# L2, and its bf16 GEMM keeps every SM busy; the CPU pair takes about a millisecond each.
SIZES = {"cpu": {"copy_elements": 2**21, "gemm": 256, "dtype": "float32"},
         "accelerator": {"copy_elements": 2**25, "gemm": 4096, "dtype": "bfloat16"}}
TARGET_REL = 0.005
BUDGET_S = 0.1  # per kernel, per timing: a whole run pays about four times this
MIN_SAMPLES = 10
NORMALIZE = ("off", "reference")
MIN_CASES = 5  # the median ratio of fewer judged cases says more about those cases than the machine
UNSTEADY = "unsteady"  # a baseline's reference key: why its timings do not describe the machine (unsteady())


def time_reference(device, timer_name: str, warmup_s: float = 0.02) -> dict:
    """Median times of the reference kernels on device, with the named timer (hot cache)."""
    import torch

    from pytest_opperf.measure import inputs, sampler
    from pytest_opperf.measure.stats import StoppingRule

    size = SIZES["cpu" if device.type == "cpu" else "accelerator"]
    dtype = getattr(torch, size["dtype"])
    gen = torch.Generator(device=device).manual_seed(0)
    n = size["gemm"]
    with torch.inference_mode():
        src = torch.rand(size["copy_elements"], generator=gen, device=device)
        dst = torch.empty_like(src)
        a = torch.rand(n, n, generator=gen, device=device).to(dtype)
        b = torch.rand(n, n, generator=gen, device=device).to(dtype)
        rule = StoppingRule(TARGET_REL, MIN_SAMPLES, 10_000, BUDGET_S)
        out = {"timer": timer_name}
        for name, work in (("copy_us", inputs.Workload(dst.copy_, (src,))), ("gemm_us", inputs.Workload(torch.mm, (a, b)))):
            m = sampler.measure(work, device, timer_name, "hot", rule, warmup_s=warmup_s, warmup_calls=3)
            out[name] = m.stats.median
    return out


def factor(now: Optional[dict], baseline: Optional[dict]) -> Optional[float]:
    """How much slower this machine runs the reference kernels than the baseline's did; None if
    unknown, or if the baseline's were timed on an unsteady machine (its ``unsteady`` mark)."""
    if not now or not baseline or now.get("timer") != baseline.get("timer") or baseline.get(UNSTEADY):
        return None
    ratios = [now[k] / reference_time(baseline[k]) for k in KERNELS if now.get(k) and baseline.get(k)]
    if not ratios:
        return None
    return math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios))


def uncertainty(factors: list, normalize: str) -> Optional[float]:
    """How far this machine's speed is known to be off the baseline's, relative: what a verdict must
    survive (rules.doubt). The largest of the reference factors' moves (start, end) and of the change
    between them; with --opperf-normalize=reference the factors are divided out, the change is not.
    None when nothing is known.

    >>> round(uncertainty([1.03, 0.98], "off"), 4), round(uncertainty([1.03, 0.98], "reference"), 4)
    (0.051, 0.051)
    >>> uncertainty([1.04], "reference"), uncertainty([None], "off")
    (None, None)
    """
    known = [f for f in factors if f]
    moves = [] if normalize == "reference" else list(known)
    if len(known) >= 2:
        moves.append(known[-1] / known[0])
    if not moves:
        return None
    return math.exp(max(abs(math.log(f)) for f in moves)) - 1


def slowest(factors: list, normalize: str) -> Optional[float]:
    """The most this machine was seen slower than the baseline's, as a factor (below 1: faster
    throughout): what a slowdown is divided by before it is judged under doubt (rules.doubt). The
    reference factors (start, end) and the change between them; with --opperf-normalize=reference
    the factors are divided out already, the change is not. None when nothing is known.

    >>> slowest([1.146, 1.028], "off"), round(slowest([0.828, 0.834], "off"), 4), slowest([1.1], "reference")
    (1.146, 1.0072, None)
    """
    known = [f for f in factors if f]
    moves = [] if normalize == "reference" else list(known)
    if len(known) >= 2:
        moves.append(known[-1] / known[0])
    return max(moves) if moves else None


def combined(timings: list[Optional[dict]]) -> Optional[dict]:
    """One process's timings, or several processes' (xdist workers) as the median of each kernel."""
    timings = [t for t in timings if t]
    if not timings:
        return None
    timer = timings[0]["timer"]
    same = [t for t in timings if t["timer"] == timer]
    return {"timer": timer, **{k: statistics.median(t[k] for t in same) for k in KERNELS if all(k in t for t in same)}}


def baseline_entry(references: list[dict]) -> dict:
    """What a saved baseline keeps of this run: the start timings, one run, marked ``unsteady``
    with the reason when the machine was not steady while they were timed (see unsteady())."""
    start = combined([r.get("start") for r in references])
    if not start:
        return {}
    out = {"timer": start["timer"], **{k: [float(f"{start[k]:.6g}")] for k in KERNELS if k in start}}
    why = unsteady(references)
    return {**out, UNSTEADY: why} if why else out


def unsteady(references: list[dict]) -> Optional[str]:
    """Why the reference kernels' timings of a run do not describe the machine's own speed, or None.

    Each process times them twice, at its start and at its end. They are unsteady when either
    timing was contended (another process competed for the CPUs or the GPU: the contention
    probe, when --opperf-contention is on), or when the two differ by more than the run-to-run
    allowance of the device kind (gate.noise.FIRST_RUNS): the machine changed under the run.

    >>> unsteady([{"start": {"timer": "cpu", "copy_us": 100.0, "gemm_us": 50.0},
    ...            "end": {"timer": "cpu", "copy_us": 180.0, "gemm_us": 90.0}}])
    'the reference kernels ran 1.800x as long at the end of the run as at its start'
    >>> unsteady([{"start": {"timer": "cpu", "copy_us": 100.0, "gemm_us": 50.0, "contended": "cpu: others 1.9 of 2 cores"}}])
    'contended while timed at the start (cpu: others 1.9 of 2 cores)'
    """
    for reference in references:
        for when in ("start", "end"):
            seen = (reference.get(when) or {}).get("contended")
            if seen:
                return f"contended while timed at the {when} ({seen})"
    for reference in references:
        start, end = reference.get("start"), reference.get("end")
        moved = change(start, end)
        if moved is not None and abs(math.log(moved)) > math.log(1 + FIRST_RUNS[device_kind(start)]):
            return f"the reference kernels ran {moved:.3f}x as long at the end of the run as at its start"
    return None


def change(start: Optional[dict], end: Optional[dict]) -> Optional[float]:
    """How much longer the reference kernels ran at the end of a run than at its start; None if unknown."""
    if not start or not end:
        return None
    return factor(end, {k: [v] if k in KERNELS else v for k, v in start.items()})


def summary(baseline_reference: dict, processes: list[dict], verdicts: list[dict], threshold: float,
            normalize: str) -> dict:
    """What the report says about the machine: the factors, the median case ratio, whether it drifted."""
    start = combined([p.get("start") for p in processes])
    end = combined([p.get("end") for p in processes])
    f_start, f_end = factor(start, baseline_reference), factor(end, baseline_reference)
    during = change(start, end)
    raw = [v["ratio"] * (v.get("scale") or 1.0) for v in verdicts
           if v.get("ratio") is not None and v["verdict"] != "incomparable"]
    median_ratio = statistics.median(raw) if raw else None
    limit = 1 + threshold / 2
    signals = [("start", f_start), ("end", f_end), ("during", during)]
    if len(raw) >= MIN_CASES:
        signals.append(("cases", median_ratio))
    moved = [name for name, value in signals if value is not None and not 1 / limit <= value <= limit]
    return {"reference_start": start, "reference_end": end, "factor_start": f_start, "factor_end": f_end,
            "factor_during_run": during, "median_ratio": median_ratio, "judged": len(raw), "drifted": bool(moved),
            "moved": moved, "limit": limit, "normalize": normalize,
            "baseline_has_reference": bool(baseline_reference),
            "baseline_unsteady": (baseline_reference or {}).get(UNSTEADY)}


def lines(s: dict) -> list[str]:
    """The machine's lines of the gate report."""
    out = []
    if s["factor_start"] is not None:
        text = f"reference kernels (copy, gemm) ran {s['factor_start']:.3f}x their baseline time at the start"
        if s["factor_end"] is not None:
            text += f", {s['factor_end']:.3f}x at the end"
        out.append(text)
    elif s.get("baseline_unsteady"):
        out.append(f"the baseline's reference kernels were timed on an unsteady machine ({s['baseline_unsteady']}): "
                   f"this machine is not compared with it; save the baseline again on a quiet machine")
    elif s["reference_start"] and not s["baseline_has_reference"]:
        out.append("the baseline holds no reference timings: save it again to compare the machine")
    elif s["reference_start"]:
        out.append("the reference kernels were timed with another timer in the baseline: not compared")
    if s["factor_during_run"] is not None and "during" in s["moved"]:
        out.append(f"the reference kernels changed {s['factor_during_run']:.3f}x from the start to the end of the run")
    if s["median_ratio"] is not None:
        out.append(f"median ratio of the {s['judged']} judged cases: {s['median_ratio']:.3f}x")
    if s["drifted"]:
        verdict = (f"the machine drifted (beyond {s['limit'] - 1:.1%}): "
                   + ("cases were normalised by the reference factor" if s["normalize"] == "reference" else
                      "not normalised (--opperf-normalize=reference divides the reference factor out)"))
        out.append(verdict)
    return out
