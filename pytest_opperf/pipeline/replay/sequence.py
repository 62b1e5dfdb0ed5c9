"""A built plan (plan.py) run on the device, in the calls' recorded order: each call's time where it ran.

The whole sequence runs once to warm up, then REPEATS times under torch.profiler, each call in a
``record_function`` range (with record_shapes, as the profile was taken): a call's time is the
device time of the kernels its ops launched (a profile of device kernels: see device_us), or the
CPU time of the ops inside the range (a CPU profile), as import took it.

What-if: a plan that whatif.py transformed (``--backend OP=BACKEND``, ``--replace``) runs a second
time, repetition by repetition alternating with the first; summary.py reports the step time per
phase before and after.

A call that raises in the warm-up is refused in one line naming it (an op the device has no kernel
for: the CPU's histc of an int tensor); running out of memory is the caller's to plan for (replay).
"""

from __future__ import annotations

import gc
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Union

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay.plan import INPUTS, Call, Needs, Plan, needs, plan, short

RANGE = "opperf.sequence#"
BUDGET_ENV = "OPPERF_MEMORY_BUDGET"
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# The reserve's (reserve) parts besides what a replay makes and keeps: cuBLAS/cuDNN handles and
# workspaces, the running call's own output and temporaries; the caching allocator's share.
LIBRARIES_BYTES = 2**30
ROUNDING = 0.10
# What torch says when the device's memory ran out: cuBLAS failing to create its handle (or cuDNN its
# workspace) is out of memory under another name.
OUT_OF_MEMORY = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_NOT_INITIALIZED")
WAYS = {"per-call": "per-call inputs", "per-signature": "one input set a signature"}


@dataclass
class Outcome:
    """What a sequence run measured: per position, the time of each timed repetition (us)."""

    plan: Plan
    times: dict                    # mode ("base", "what-if") -> {position: [us per repetition]}
    device: str
    repeats: int
    kernels: dict = field(default_factory=dict)  # position -> the kernels it ran (base, first repetition)
    links: tuple = (0, 0)          # (links fed their producer's output, links that found none fit) in the warm-up


def replay(rows: list[dict], calls: list[dict], device, repeats: int = 3, say=None, where: str = "the profile",
           budget: Optional[int] = None) -> tuple[Outcome, str]:
    """The calls planned and run in the first way of holding their inputs whose bytes (plan.needs,
    and the reserve) fit the budget (budget_of): per call, else one set a signature; and that way in
    words. A way that still runs out of memory while running gives way to the next; where none is
    left, a one-line ProfileError naming WHERE and the bytes needed and there."""
    say = say or (lambda text: None)
    held = needs(rows, calls, device)
    limit, there = budget_of(device, budget)
    need = {mode: held.inputs[mode] + reserve(held, mode) for mode in INPUTS}
    failed = ""
    for mode in [m for m in INPUTS if limit is None or need[m] <= limit]:
        outcome = _attempt(rows, calls, device, mode, repeats, say)
        if isinstance(outcome, Outcome):
            return outcome, _how(held, mode, there, failed)
        failed = outcome
        say(f"  {WAYS[mode]} ran out of memory on {device} ({failed})")
    least = min(INPUTS, key=need.get)
    said = f"ran out of memory ({failed}); it needs" if failed else "needs"
    raise ProfileError(f"{where}: the replay {said} {gigabytes(held.inputs[least])} for {WAYS[least]} "
                       f"(+{gigabytes(reserve(held, least))} reserve), {there}: a smaller batch or prompt, fewer "
                       f"--layers, or a larger device")


def reserve(held: Needs, mode: str) -> int:
    """What a replay holds besides its inputs: the more of what making one input set adds
    (Needs.making) and the outputs kept for a later reader at their peak (as _once keeps them);
    LIBRARIES_BYTES for cuBLAS/cuDNN handles and workspaces and the running call's own output and
    temporaries; and ROUNDING of the inputs and that peak for the caching allocator's rounding and
    the blocks it caches."""
    events = sorted([(made, 0, n) for made, _, n in held.kept] + [(last, 1, -n) for _, last, n in held.kept])
    live = kept = 0
    for _, _, n in events:  # at one position the output made there before those whose last reader it was
        live += n
        kept = max(kept, live)
    peak = max(kept, held.making)
    return peak + LIBRARIES_BYTES + int(ROUNDING * (held.inputs[mode] + peak))


def _how(held: Needs, mode: str, there: str, failed: str) -> str:
    """The answer's words for the way the inputs were held, and why (FAILED: how per-call ran out).

    >>> _how(Needs({"per-call": 93.1e9, "per-signature": 9e9}, []), "per-signature", "61.2 GB free on cuda:0", "")
    'one input set a signature (per-call inputs need 93.1 GB + 10.4 GB reserve, 61.2 GB free on cuda:0)'
    """
    per_call = f"{gigabytes(held.inputs['per-call'])} + {gigabytes(reserve(held, 'per-call'))} reserve"
    if mode == "per-call":
        return f"{WAYS[mode]} ({per_call}, {there})"
    why = f"ran out of memory ({failed}); they need" if failed else "need"
    return f"{WAYS[mode]} ({WAYS['per-call']} {why} {per_call}, {there})"


def budget_of(device, budget: Optional[int] = None) -> tuple[Optional[int], str]:
    """(bytes a replay may hold on DEVICE, that in words): BUDGET, else OPPERF_MEMORY_BUDGET, else the
    device's free memory (torch.<type>.mem_get_info); no limit on a CPU or where the backend cannot tell."""
    import torch

    if budget is not None:
        return budget, f"{gigabytes(budget)} allowed on {device} (budget={budget})"
    imposed = imposed_budget()
    if imposed is not None:
        return imposed, f"{gigabytes(imposed)} allowed on {device} ({BUDGET_ENV}={os.environ[BUDGET_ENV].strip()})"
    info = getattr(getattr(torch, device.type, None), "mem_get_info", None) if device.type != "cpu" else None
    if info is None:
        return None, f"no memory limit on {device}"
    release(device)  # what this process cached (an earlier configuration's replay) is free for this one
    free = int(info(device)[0])
    return free, f"{gigabytes(free)} free on {device}"


def imposed_budget() -> Optional[int]:
    """OPPERF_MEMORY_BUDGET's bytes, where set (a ProfileError naming it where it reads as none)."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    return parse_bytes(text, BUDGET_ENV) if text else None


def parse_bytes(text: str, where: str) -> int:
    """Bytes as users write them: a number, or one with a decimal (40GB) or binary (512MiB) unit; a
    ProfileError naming WHERE otherwise.

    >>> parse_bytes("1000", "X"), parse_bytes("40GB", "X"), parse_bytes("512MiB", "X"), parse_bytes("1.5 gib", "X")
    (1000, 40000000000, 536870912, 1610612736)
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]i?b|b)?\s*", text, re.IGNORECASE)
    number = float(found.group(1)) * UNITS[(found.group(2) or "").lower()] if found else 0
    if number < 1:
        raise ProfileError(f"{where}={text}: expected a number of bytes, bare or with a unit (40GB, 512MiB; KB, MB, "
                           f"GB, TB are powers of 1000, KiB, MiB, GiB, TiB of 1024)")
    return int(number)


def gigabytes(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def _attempt(rows: list[dict], calls: list[dict], device, inputs: str, repeats: int, say) -> Union[Outcome, str]:
    """The Outcome of the plan in INPUTS mode; where the device ran out of memory, why, once the
    plan's tensors are released."""
    try:
        return run(plan(rows, calls, device, inputs, 0, say), device, repeats, False, say)
    except RuntimeError as exc:
        if not _out_of_memory(exc):
            raise
        failed = short(exc)
    release(device)  # outside the except block: its traceback no longer holds the plan's tensors
    return failed


def _out_of_memory(exc: BaseException) -> bool:
    """Whether EXC says the device's memory ran out: torch.OutOfMemoryError, or a RuntimeError (an
    AcceleratorError among them) naming a library's failed allocation or "out of memory"."""
    import torch

    text = str(exc)
    named = any(code in text for code in OUT_OF_MEMORY) or "out of memory" in text.lower()
    return isinstance(exc, torch.OutOfMemoryError) or (isinstance(exc, RuntimeError) and named)


def release(device) -> None:
    """Give back the device memory no tensor holds: collect what only cycles held, and empty torch's
    cache on DEVICE (where its backend has one)."""
    import torch

    gc.collect()
    empty_cache = getattr(getattr(torch, device.type, None), "empty_cache", None)
    if device.type != "cpu" and empty_cache is not None:
        empty_cache()


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
                    view = _view(outputs.get(link.producer), link)
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
            elif mode == "base":
                out = _first(fn, args, c, p, device)
            else:
                out = fn(*args)
            if c.position in p.last_use:
                outputs[c.position] = _tensors(out, torch)
            for link in c.links:
                if p.last_use.get(link.producer) == c.position:
                    outputs.pop(link.producer, None)
    _synchronize(device, torch)


def _first(fn, args: list, c: Call, p: Plan, device):
    """A call's first run: an error of its own is a one-line ProfileError naming the call (out of
    memory aside: replay plans for it)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001  (whatever the op raised, it is this call's)
        if _out_of_memory(exc):
            raise
        op_type, shapes, dtype = p.names.get(c.signature, (f"signature {c.signature}", "?", "?"))
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ProfileError(f"{op_type} [{shapes}] ({dtype}) at call {c.position} cannot run on {device}: "
                           f"{type(exc).__name__}: {first}") from None


def _view(outs, link):
    """A view of the LINK's dtype, shape and stride over the first output of that dtype whose memory holds it."""
    if not outs:
        return None
    for t in outs:
        room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
        if t.dtype == link.dtype and room >= link.extent:
            return t.as_strided(link.shape, link.stride, t.storage_offset())
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
