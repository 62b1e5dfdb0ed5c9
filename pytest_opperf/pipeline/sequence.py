"""The profiled calls replayed in the order they ran: each signature's time in context.

The isolated replay (``pytest benches/`` on the import's configs) times each signature alone, in a
cache state chosen for it. In the model a kernel ran after other kernels: what they left in the L2
(and whether it is dirty), the clocks, the queue. ``opperf sequence PROFILE_DB`` runs the profile's
calls again in their recorded order (the ``calls`` table, calls.py) and times each one where it ran:

- each call is built as the isolated replay builds its signature's case (the op's ``inputs()``, the
  signature's backend), once: a call's inputs are made for it and kept for every repetition, and
  the calls of one signature in different steps share them (the k-th call of a signature in a step
  reads what the k-th call of every step reads: a layer's weight, decode after decode); with
  ``--inputs per-signature`` all calls of a signature share one set (less memory);
- an input the capture saw written by an earlier call (the ``links``) is that call's output, as it
  ran: the data flow, and so the L2, of the model; so is each tensor of a tensor list (the ``cat``
  of a KV cache reads the last step's ``cat`` and the new key). Only floating-point inputs are
  linked: an index or a mask keeps the contents its replay assumes. An output is kept until its
  last reader ran;
- the whole sequence runs once to warm up, then REPEATS times under torch.profiler, each call in a
  ``record_function`` range (with record_shapes, as the profile was taken): a call's time is the
  device time of the kernels its ops launched (a profile of device kernels: see device_us), or the
  CPU time of the ops inside the range (a CPU profile), as import took it.

Calls of signatures that are not mapped, or whose backend cannot run here, are left out, and so is
their time on both sides: the sums compare the same calls. Each replayed signature gets
``sequence_us`` (one call's mean time in the sequence) and ``context_factor`` (``sequence_us`` over
the isolated ``replayed_us``) in the profile database.

What-if: ``--backend OP=BACKEND`` (repeatable) runs the sequence a second time, repetition by
repetition alternating with the first, with every call of a signature mapped to OP on BACKEND
(checked once against the op's reference on the call's own inputs); the step time per phase is
reported before and after.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline import profile
from pytest_opperf.pipeline.mapping import MAPPED
from pytest_opperf.pipeline.signature import ProfileError, parse_shapes

RANGE = "opperf.sequence#"
INPUTS = ("per-call", "per-signature")


@dataclass
class Call:
    """One call of the sequence, ready to run."""

    position: int
    signature: int
    step: Optional[int]
    phase: str
    fn: object
    args: list                     # the call's own arguments (linked ones replaced when it runs)
    links: list                    # [Link]: the inputs that are an earlier call's output
    alt: object = None             # the what-if backend's callable, where it differs
    stands_for: Optional[tuple] = None  # a --replace stand-in: whatif.StandIn (what it runs, for which module)


@dataclass
class Plan:
    calls: list
    left_out: dict = field(default_factory=dict)   # signature id -> why its calls are not replayed
    last_use: dict = field(default_factory=dict)   # producer position -> the last position that reads it
    swapped: dict = field(default_factory=dict)    # signature id -> (op, backend before, backend after)
    # --replace: position -> the Call that stands for a module's calls there (its output's position);
    # the module's other calls do not run in the what-if
    replacements: dict = field(default_factory=dict)
    skipped: set = field(default_factory=set)
    replaced: dict = field(default_factory=dict)   # module class -> (op, backend, module calls replaced)

    @property
    def what_if(self) -> bool:
        return bool(self.swapped or self.replacements)


@dataclass
class Outcome:
    """What a sequence run measured: per position, the time of each timed repetition (us)."""

    plan: Plan
    times: dict                    # mode ("base", "what-if") -> {position: [us per repetition]}
    device: str
    repeats: int
    kernels: dict = field(default_factory=dict)  # position -> the kernels it ran (base, first repetition)
    links: tuple = (0, 0)          # (links fed their producer's output, links that found none fit) in the warm-up


def read_table(path: Path, table: str, order: str = "") -> list[dict]:
    """The rows of a profile database's TABLE (none where it has no such table)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            rows = [dict(r) for r in db.execute(f"SELECT * FROM [{table}] {order}")] if table in names else []
        db.close()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: not a profile database ({exc})") from None
    return rows


def load_calls(path: Path) -> list[dict]:
    """The profile's calls in time order; a ProfileError when it has none (imported before opperf kept them)."""
    rows = read_table(path, "calls", "ORDER BY position")
    if not rows:
        raise ProfileError(f"{path}: holds no calls in time order (imported by an older opperf, or from Ascend "
                           f"kernel_details, which has no order): import the trace again (opperf import ... --force)")
    return rows


def plan(rows: list[dict], calls: list[dict], device, overrides: Optional[dict] = None,
         inputs: str = "per-call", seed: int = 0, say=None) -> Plan:
    """Every call of a replayable signature, built on DEVICE (a torch.device); whatif.stand_ins
    adds a --replace what-if's stand-ins to it."""
    import torch

    from pytest_opperf.catalog import load_builtin

    if inputs not in INPUTS:
        raise ProfileError(f"--inputs={inputs}: expected {' or '.join(INPUTS)}")
    load_builtin()
    say = say or (lambda text: None)
    overrides = overrides or {}
    by_id = {r["id"]: r for r in rows}
    built: dict = {}       # signature id -> (fn, alt, make(seed) -> args) or None
    out = Plan([])
    made: dict = {}        # inputs key -> arguments
    ordinal: dict = defaultdict(int)
    shared: dict = {}      # (op, dtype, shapes, strides, k-th such call in its step, argument) -> tensor
    alike: dict = defaultdict(int)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for c in calls:
        sig = by_id.get(c["signature"])
        if sig is None:
            continue
        if sig["id"] not in built:
            built[sig["id"]] = _built(sig, device, capability, overrides, out)
        if built[sig["id"]] is None:
            continue
        fn, alt, make = built[sig["id"]]
        key = (sig["id"],) if inputs == "per-signature" else (sig["id"], c["step"], ordinal[(sig["id"], c["step"])])
        ordinal[(sig["id"], c["step"])] += 1
        shape = (sig["op"], sig["dtype"], sig["input_shapes"], sig.get("input_strides") or "")
        kth = alike[(shape, c["step"])]
        alike[(shape, c["step"])] += 1
        if key not in made:
            try:
                made[key] = make(seed + c["position"])
            except Exception as exc:  # noqa: BLE001  (one signature's inputs must not end the run)
                out.left_out[sig["id"]] = f"its inputs could not be made ({_short(exc)})"
                built[sig["id"]] = None
                continue
            if inputs == "per-call":
                made[key] = _share(made[key], shared, (*shape, kth), torch)
            if len(made) % 500 == 0:
                say(f"  {len(made)} input sets made ({c['position'] + 1} of {len(calls)} calls)")
        args = list(made[key])
        out.calls.append(Call(c["position"], sig["id"], c["step"], c["phase"] or "", fn, args,
                              _links(sig, c, args, torch), alt))
    # Calls left out after an earlier call of theirs was planned (inputs that failed later): dropped.
    out.calls = [c for c in out.calls if c.signature not in out.left_out]
    planned = {c.position for c in out.calls}
    for c in out.calls:
        c.links = [link for link in c.links if link.producer in planned]
        for link in c.links:
            out.last_use[link.producer] = max(out.last_use.get(link.producer, -1), c.position)
    return out


def _share(args, shared: dict, key: tuple, torch) -> list:
    """ARGS with each floating-point tensor replaced by the one the first call of KEY made (the same
    op and shapes, the k-th such call of its step): signatures that differ only in what a capture
    recorded (an MoE layer's routing, step by step) read one layer's weights, as the model does, and
    hold one copy of them."""
    args = list(args)
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            args[j] = shared.setdefault((key, j), a)
    return args


def _built(sig: dict, device, capability, overrides: dict, out: Plan):
    """(fn, what-if fn or None, make(seed) -> arguments) of a signature; None (and why, in
    out.left_out) when it is not replayed here."""
    import torch

    from pytest_opperf.catalog.registry import BACKENDS, OPS

    if sig["status"] != MAPPED:
        out.left_out[sig["id"]] = f"{sig['status']}: {sig.get('reason') or 'no rule maps it'}"
        return None
    op = OPS.get(sig["op"])
    backend = BACKENDS.get((sig["op"], sig["backend"]))
    if op is None or backend is None:
        out.left_out[sig["id"]] = f"{sig['op']}/{sig['backend']} is not registered here"
        return None
    dtypes = _dtypes(sig["dtype"])
    params = {**op.defaults, **json.loads(sig["params"])}
    why = backend.cannot_run(device.type, dtypes, capability, params)
    if why:
        out.left_out[sig["id"]] = f"{sig['op']}/{sig['backend']} cannot run here: {why}"
        return None
    alt = None
    if sig["op"] in overrides and overrides[sig["op"]] != sig["backend"]:
        other = BACKENDS[(sig["op"], overrides[sig["op"]])]
        why = other.cannot_run(device.type, dtypes, capability, params)
        if why:
            raise ProfileError(f"--backend {sig['op']}={other.name}: cannot run signature {sig['id']} "
                               f"({sig['op_type']} [{sig['input_shapes']}]) here: {why}")
        alt = other.fn
        out.swapped[sig["id"]] = (sig["op"], sig["backend"], other.name)

    def make(seed: int):
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.inference_mode():
            return op.inputs(params, dtypes, device, gen)

    return backend.fn, alt, make


def _dtypes(label: str):
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.dtypes import lookup

    first, _, second = (label or "").partition("-")
    return DTypes(lookup(first), lookup(second or first))


def _links(sig: dict, call: dict, args: list, torch) -> list:
    """[Link] of the call's linked inputs: floating-point tensors, alone or in a tensor list, whose
    slot the capture saw written by an earlier call."""
    if not call.get("links"):
        return []
    writers = json.loads(call["links"])
    where = slot_arguments(sig, args, torch)
    shapes, strides = parse_shapes(sig["input_shapes"]), parse_shapes(sig.get("input_strides") or "")
    out = []
    for slot, producer in enumerate(writers):
        k = where[slot] if slot < len(where) else None
        if producer is None or k is None:
            continue
        if isinstance(producer, list):  # a tensor list, element by element
            items = args[k] if isinstance(args[k], (list, tuple)) else ()
            if len(items) == len(producer):
                out.extend(Link.of(k, e, p, t, torch) for e, (p, t) in enumerate(zip(producer, items))
                           if p is not None and _floating(t, torch))
        elif _floating(args[k], torch):
            link = Link.of(k, None, producer, args[k], torch)
            recorded = strides[slot] if slot < len(strides) else None
            # A catalogue case makes dense inputs; where the model's input had the case's dims but
            # other strides (attention's q, k, v as views of [b, s, h, d]), the view takes the model's.
            if (slot < len(shapes) and shapes[slot] == link.shape and isinstance(recorded, tuple)
                    and len(recorded) == len(link.shape)):
                link = dataclasses.replace(link, stride=recorded)
            out.append(link)
    return out


@dataclass(frozen=True)
class Link:
    """Argument ``argument`` (element ``element`` of it, where it is a tensor list) is a view of
    DTYPE, SHAPE and STRIDE over what the call at ``producer`` returned."""

    argument: int
    element: Optional[int]
    producer: int
    dtype: object
    shape: tuple
    stride: tuple

    @classmethod
    def of(cls, argument: int, element: Optional[int], producer: int, t, torch) -> "Link":
        return cls(argument, element, producer, t.dtype, tuple(t.shape), tuple(t.stride()))


def _floating(t, torch) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def slot_arguments(sig: dict, args: list, torch) -> list:
    """Per profiled input slot, the index of the case argument that is that input (None: not known).
    An ``aten`` case's arguments are the recorded ones, in order, after its overload; a catalogue
    op's tensor arguments of a slot's element count are the slots of that count, in order, where
    there are as many of each (q, k and v of one size are attention's three inputs in order)."""
    slots = parse_shapes(sig["input_shapes"])
    if sig["op"] == "aten":
        return [k + 1 if k + 1 < len(args) and _tensor_or_list(args[k + 1], torch) else None
                for k in range(len(slots))]
    tensors = [(k, a) for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out = []
    for j, s in enumerate(slots):
        if not isinstance(s, tuple):
            out.append(None)
            continue
        numel = _prod(s)
        matching = [k for k, a in tensors if a.numel() == numel]
        same = [i for i, x in enumerate(slots) if isinstance(x, tuple) and _prod(x) == numel]
        # as many arguments as slots of that size: in the same order (attention's q, k, v)
        out.append(matching[same.index(j)] if len(matching) == len(same) else None)
    return out


def _tensor_or_list(a, torch) -> bool:
    return isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple)) and bool(a)
                                           and all(isinstance(t, torch.Tensor) for t in a))


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
    cpu_side = torch.autograd.DeviceType.CPU
    for ev in prof.events():
        name = ev.name
        if not name.startswith(RANGE) or ev.device_type != cpu_side:
            continue  # a range shows on the device too (its span there): the host's holds the calls
        m, _, position = name[len(RANGE):].partition(".")
        us = device_us(ev) if kernel else sum(ch.cpu_time_total for ch in ev.cpu_children)
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


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    steps: int
    calls: int
    profiled_us: float      # the profile's time of the replayed calls
    sequence_us: float      # the same calls in the sequence (mean of the repetitions)
    what_if_us: Optional[float]
    all_profiled_us: float  # the profile's time of every call of the phase, replayed or not


def phases(outcome: Outcome, calls: list[dict]) -> list[PhaseTime]:
    """Per phase (in order of first call), the time of one repetition of its calls."""
    replayed = {c.position for c in outcome.plan.calls}
    base, alt = outcome.times["base"], outcome.times.get("what-if")
    order, acc = [], {}
    for c in calls:
        ph = c["phase"] or ""
        if ph not in acc:
            order.append(ph)
            acc[ph] = {"steps": set(), "calls": 0, "prof": 0.0, "seq": 0.0, "alt": 0.0, "all": 0.0}
        a = acc[ph]
        a["steps"].add(c["step"])
        a["all"] += c["profiled_us"]
        if c["position"] in replayed:
            a["calls"] += 1
            a["prof"] += c["profiled_us"]
            a["seq"] += _mean(base.get(c["position"]))
            if alt is not None:
                a["alt"] += _mean(alt.get(c["position"]))
    return [PhaseTime(ph, len(acc[ph]["steps"]), acc[ph]["calls"], acc[ph]["prof"], acc[ph]["seq"],
                      acc[ph]["alt"] if alt is not None else None, acc[ph]["all"]) for ph in order]


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


def per_signature(outcome: Outcome) -> dict:
    """signature id -> one call's mean time in the sequence (us), over its calls and the repetitions."""
    sums: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    base = outcome.times["base"]
    for c in outcome.plan.calls:
        for us in base.get(c.position, ()):
            sums[c.signature] += us
            counts[c.signature] += 1
    return {s: sums[s] / counts[s] for s in sums if counts[s]}


def write(path: Path, outcome: Outcome, rows: list[dict]) -> int:
    """sequence_us, sequence_kernels, context_factor, sequence_device, sequence_at of each replayed
    signature; and NULL for the others (a signature no longer replayed keeps no stale time).
    Returns rows written."""
    times = per_signature(outcome)
    seen: dict = defaultdict(lambda: defaultdict(int))
    for c in outcome.plan.calls:
        for name in outcome.kernels.get(c.position, ()):
            seen[c.signature][name] += 1
    replayed = {r["id"]: r.get("replayed_us") for r in rows}
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    updates = [(us, json.dumps(dict(seen[s])) if s in seen else None, us / replayed[s] if replayed.get(s) else None,
                outcome.device, now, s) for s, us in times.items()]
    try:
        with sqlite3.connect(path) as db:
            profile.upgrade(db)
            db.execute("UPDATE signatures SET sequence_us = NULL, sequence_kernels = NULL, context_factor = NULL, "
                       "sequence_device = NULL, sequence_at = NULL")
            db.executemany("UPDATE signatures SET sequence_us = ?, sequence_kernels = ?, context_factor = ?, "
                           "sequence_device = ?, sequence_at = ? WHERE id = ?", updates)
            db.execute("UPDATE calls SET sequence_us = NULL")
            db.executemany("UPDATE calls SET sequence_us = ? WHERE position = ?",
                           [(_mean(us), position) for position, us in outcome.times["base"].items() if us])
        db.close()
    except sqlite3.Error as exc:
        raise ProfileError(f"{path}: cannot write the in-sequence times ({exc})") from None
    return len(updates)


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def device_of(name: Optional[str], time_source: str):
    """The torch device to replay on: NAME, else cuda for a profile of device kernel times, else cpu."""
    import torch

    if name is None:
        if time_source == "kernel" and not torch.cuda.is_available():
            raise ProfileError("the profile holds device kernel times and this machine has no CUDA device: replay it "
                               "on the kind of device it was profiled on (--device NAME)")
        name = "cuda" if time_source == "kernel" else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ProfileError(f"--device={name}: not a torch device ({_short(exc)})") from None
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and not (module is not None and hasattr(module, "is_available") and module.is_available()):
        raise ProfileError(f"--device={name}: no such device on this machine")
    if device.type == "cpu" and time_source == "kernel":
        raise ProfileError(f"--device={name}: the profile holds device kernel times, a CPU has none to compare")
    return device


def summary(path: Path, rows: list[dict], p: Plan, outcome: Outcome, table: list, what_if: bool,
            written: int) -> str:
    """The run in lines: the calls replayed, the time per phase and step, the signatures left out."""
    by_id = {r["id"]: r for r in rows}
    total = sum(r["profiled_total_us"] for r in rows) or 1.0
    left = sum(by_id[s]["profiled_total_us"] for s in p.left_out if s in by_id)
    lines = [f"opperf sequence: {len(p.calls)} calls of {written} signatures replayed in their order on "
             f"{outcome.device}, {outcome.repeats} repetitions; {len(p.left_out)} signatures left out "
             f"({100 * left / total:.1f}% of the profiled time)"]
    head = f"  {'phase':<12} {'steps':>5} {'calls':>6} {'profiled us/step':>17} {'in-sequence':>12} {'ratio':>7}"
    if outcome.times.get("what-if") is not None:
        head += f" {'what-if':>12} {'change':>8} {'predicted step':>15}"
    lines.append(head)
    all_rows = table + ([PhaseTime("(all)", sum(t.steps for t in table), sum(t.calls for t in table),
                                   sum(t.profiled_us for t in table), sum(t.sequence_us for t in table),
                                   None if table[0].what_if_us is None else sum(t.what_if_us for t in table),
                                   sum(t.all_profiled_us for t in table))] if len(table) > 1 else [])
    for t in all_rows:
        steps = max(t.steps, 1)
        ratio = t.sequence_us / t.profiled_us if t.profiled_us else float("nan")
        line = (f"  {t.phase or '(none)':<12} {t.steps:>5} {t.calls:>6} {t.profiled_us / steps:>17.1f} "
                f"{t.sequence_us / steps:>12.1f} {ratio:>7.3f}")
        if t.what_if_us is not None:
            change = (t.what_if_us - t.sequence_us) / t.sequence_us if t.sequence_us else float("nan")
            predicted = (t.all_profiled_us + t.what_if_us - t.sequence_us) / steps
            line += f" {t.what_if_us / steps:>12.1f} {100 * change:>+7.2f}% {predicted:>15.1f}"
        lines.append(line)
    if what_if:
        swapped = [f"{op} {a} -> {b}" for op, a, b in sorted({v for v in p.swapped.values()})]
        swapped += [f"{cls} -> {op} on {backend} ({n} module calls)" for cls, (op, backend, n) in p.replaced.items()]
        lines.append("  what-if: " + "; ".join(swapped) +
                     f" ({len(p.swapped)} signatures); predicted step = the profile's step (every call) + "
                     f"what-if - in-sequence")
    reasons: dict = defaultdict(float)
    for s, why in p.left_out.items():
        reasons[why.split(":")[0]] += by_id[s]["profiled_total_us"] if s in by_id else 0.0
    for why, us in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"  left out: {why} ({100 * us / total:.1f}% of the profiled time)")
    lines.append(f"  sequence_us and context_factor of {written} signatures -> {path} (opperf replay-report shows them)")
    return "\n".join(lines)
