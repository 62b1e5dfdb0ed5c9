"""A built plan (plan.py) run on the device, in the calls' recorded order: each call's time where it ran.

The whole sequence runs once to warm up, then REPEATS times under torch.profiler, each call in a
``record_function`` range (with record_shapes, as the profile was taken): a call's time is the
device time of the kernels its ops launched (a profile of device kernels: see device_us), or the
CPU time of the ops inside the range (a CPU profile), as import took it.

What-if: a plan that whatif.py transformed (``--backend OP=BACKEND``, ``--replace``) runs a second
time, repetition by repetition alternating with the first; summary.py reports the step time per
phase before and after.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay.plan import Plan

RANGE = "opperf.sequence#"


@dataclass
class Outcome:
    """What a sequence run measured: per position, the time of each timed repetition (us)."""

    plan: Plan
    times: dict                    # mode ("base", "what-if") -> {position: [us per repetition]}
    device: str
    repeats: int
    kernels: dict = field(default_factory=dict)  # position -> the kernels it ran (base, first repetition)
    links: tuple = (0, 0)          # (links fed their producer's output, links that found none fit) in the warm-up


def run(p: Plan, device, repeats: int = 3, what_if: bool = False, say=None) -> Outcome:
    """Warm up, then time REPEATS repetitions of the sequence (and of the what-if's, alternating)."""
    import torch

    say = say or (lambda text: None)
    if not p.calls:
        raise ProfileError("no call of the profile can be replayed here (see the signatures left out)")
    if repeats < 1:
        raise ProfileError(f"--repeats={repeats}: expected 1 or more")
    modes = ["base", "what-if"] if what_if else ["base"]
    kernel = device.type != "cpu"
    fed = [0, 0]
    for mode in modes:
        _once(p, mode, False, torch, device, fed=fed if mode == "base" else None)
    say(f"  warmed up: {len(p.calls)} calls{' in each arrangement' if what_if else ''}; {fed[0]} inputs fed "
        f"the output that wrote them{f', {fed[1]} found it of another dtype or too small (their own inputs)' if fed[1] else ''}")
    with torch.profiler.profile(activities=_activities(device, torch), record_shapes=True) as prof:
        for r in range(repeats):
            for mode in modes:
                _once(p, mode, True, torch, device, tag=f"{modes.index(mode)}.")
            say(f"  repetition {r + 1} of {repeats} done")
    times = {m: defaultdict(list) for m in modes}
    names: dict = {}
    events = prof.events()
    # a kernel whose launch the profiler tied to no op of its range is seen inside the range's device-side copy
    inside = records.range_device_times(events, RANGE) if kernel else {}
    seen: dict = defaultdict(int)
    cpu_side = torch.autograd.DeviceType.CPU
    hosts = sorted((ev for ev in events if ev.name.startswith(RANGE) and ev.device_type == cpu_side),
                   key=lambda ev: ev.time_range.start)
    for ev in hosts:  # a range shows on the device too (its span there): the host's holds the calls
        name = ev.name
        m, _, position = name[len(RANGE):].partition(".")
        us = device_us(ev) if kernel else sum(ch.cpu_time_total for ch in ev.cpu_children)
        k, seen[name] = seen[name], seen[name] + 1
        if k < len(inside.get(name, ())):
            us = max(us, inside[name][k])
        times[modes[int(m)]][int(position)].append(float(us))
        if kernel and m == "0" and int(position) not in names:
            names[int(position)] = kernel_names(ev)
    return Outcome(p, {m: dict(t) for m, t in times.items()}, str(device), repeats, names, tuple(fed))


def device_us(ev) -> float:
    """The device time of the kernels (and copies, fills) launched inside a profiler event and the
    ops below it. Not FunctionEvent.device_time_total: a record_function range on CUDA gets, as a
    kernel of its own name, the span of its kernels on the device, gaps between them included (a
    range around an op of two kernels launched 10 us apart took 10 us more than they did), and that
    span then stands for everything below the range."""
    own = sum(k.duration for k in ev.kernels if not (ev.is_legacy and k.name == ev.name))
    return own + sum(device_us(ch) for ch in ev.cpu_children)


def kernel_names(ev) -> list:
    """The names of the kernels device_us counts, in order."""
    own = [k.name for k in ev.kernels if not (ev.is_legacy and k.name == ev.name)]
    return own + [n for ch in ev.cpu_children for n in kernel_names(ch)]


def _once(p: Plan, mode: str, timed: bool, torch, device, tag: str = "", fed: Optional[list] = None) -> None:
    outputs: dict = {}
    record = torch.profiler.record_function
    with torch.inference_mode():
        for c in p.calls:
            if mode == "what-if" and c.position in p.skipped:
                if c.position not in p.replacements:
                    continue
                c = p.replacements[c.position]
            args = c.args
            if c.links:
                args = list(args)
                for link in c.links:
                    view = _view(outputs.get(link.producer), link.dtype, link.shape, link.stride)
                    if fed is not None:
                        fed[view is None] += 1
                    if view is None:
                        continue
                    if link.element is None:
                        args[link.argument] = view
                    else:
                        if args[link.argument] is c.args[link.argument]:
                            args[link.argument] = list(args[link.argument])
                        args[link.argument][link.element] = view
            fn = c.alt if (mode == "what-if" and c.alt is not None) else c.fn
            if timed:
                with record(f"{RANGE}{tag}{c.position}"):
                    out = fn(*args)
            else:
                out = fn(*args)
            if c.position in p.last_use:
                outputs[c.position] = _tensors(out, torch)
            for link in c.links:
                if p.last_use.get(link.producer) == c.position:
                    outputs.pop(link.producer, None)
    _synchronize(device, torch)


def _view(outs, dtype, shape, stride):
    """A tensor of SHAPE and STRIDE over the first output of DTYPE whose memory holds it."""
    if not outs:
        return None
    extent = 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0
    for t in outs:
        if t.dtype == dtype and t.untyped_storage().nbytes() // t.element_size() - t.storage_offset() >= extent:
            return t.as_strided(shape, stride, t.storage_offset())
    return None


def _tensors(out, torch) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o, torch)]
    return []


def _activities(device, torch) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    elif device.type != "cpu":
        extra = getattr(torch.profiler.ProfilerActivity, device.type.upper(), None) or \
            getattr(torch.profiler.ProfilerActivity, "PrivateUse1", None)
        if extra is not None:
            acts.append(extra)
    return acts


def _synchronize(device, torch) -> None:
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()
