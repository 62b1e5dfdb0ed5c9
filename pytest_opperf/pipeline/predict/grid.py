"""``opperf grid``: the replay cases a model needs over a range of configurations, swept once, so that
``opperf predict --db`` prices a configuration nobody measured from rows (lookup.Table).

The model is built on meta at its own depth (depth.py: each distinct layer once) and traced at each
configuration of the grid: batch x prompt for every batch of ``--batches`` and prompt of ``--prompts``
whose tokens (batch x prompt) are at most ``--max-tokens``, with one decode step after each prompt
(its KV length the prompt's + 1). Each trace is imported as ``opperf import`` imports a profile (each
call's cache state from the L2 of ``--device``), and the calls of every trace gathered as cases, each
once. Within a kernel family (families.py: a GEMM at one weight, attention at one head layout, a
memory-bound call of one form), cases closer along the family's one axis than ``--spacing`` (a
factor; its square along bytes, where the time is smoother) to a case kept are left out, the smallest and the largest always kept; attention keeps its
whole batch x length grid. Cases whose memory estimate exceeds ``--max-hbm-gb`` are left out and
counted. The cases are written as replay configs (one per op and cache state, under
``OUTPUT/<model>/replay/``) and run through pytest into the results database once.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_opperf.pipeline.reading.signature import ProfileError


@dataclass
class Planned:
    model: str
    configurations: list                          # (batch, prompt) traced
    cases: list = field(default_factory=list)    # profile-like rows, one a case kept
    gathered: int = 0                             # distinct cases before the spacing
    over_budget: int = 0                          # left out by --max-hbm-gb
    seconds: float = 0.0
    sweeps: list = field(default_factory=list)   # {"cache", "files", "command"}

    def said(self) -> str:
        per_op: dict = {}
        for r in self.cases:
            per_op[r["op"]] = per_op.get(r["op"], 0) + 1
        ops = ", ".join(f"{op} {n}" for op, n in sorted(per_op.items(), key=lambda kv: -kv[1]))
        return (f"{len(self.cases)} cases ({ops}) from {len(self.configurations)} configurations' "
                f"{self.gathered} distinct calls" + (f"; {self.over_budget} over --max-hbm-gb left out"
                                                     if self.over_budget else "") + f", in {self.seconds:.1f} s")


def sizes(text: str, option: str) -> list:
    """``LO:HI:N`` (N sizes from LO to HI, geometric, rounded) or ``A,B,C``; one line naming OPTION else.

    >>> sizes("1:64:7", "--batches"), sizes("1,3,5", "--batches")
    ([1, 2, 4, 8, 16, 32, 64], [1, 3, 5])
    """
    try:
        if ":" in text:
            lo, hi, n = (int(v) for v in text.split(":"))
            if not (0 < lo < hi and n >= 2):
                raise ValueError
            return sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)})
        values = sorted({int(v) for v in text.split(",") if v.strip()})
        if not values or values[0] <= 0:
            raise ValueError
        return values
    except ValueError:
        raise ProfileError(f"{option}={text}: expected LO:HI:N (N sizes from LO to HI, geometric, LO < HI, N >= 2) "
                           f"or comma-separated positive ints") from None


def configurations(batches: list, prompts: list, max_tokens: int) -> list:
    return [(b, p) for b in batches for p in prompts if b * p <= max_tokens]


def plan(ask, batches: list, prompts: list, max_tokens: int, spacing: float = 1.5, max_hbm_gb: float = 0.0,
         say=None) -> Planned:
    """Trace each configuration, gather its calls, keep the cases the spacing and the budget allow,
    and write their replay configs (see the module doc). ASK: answer.Ask (the model, dtype, depth,
    attention, routing, --device, --output)."""
    from pytest_opperf.pipeline.mapping import profile
    from pytest_opperf.pipeline.predict import answer, trace

    say = say or (lambda text: None)
    if spacing < 1:
        raise ProfileError(f"--spacing={spacing}: expected a factor of 1 or more")
    todo = configurations(batches, prompts, max_tokens)
    if not todo:
        raise ProfileError(f"--max-tokens={max_tokens}: no batch x prompt of the grid fits it")
    trace.check_choices(attention=ask.attention, logits=ask.logits, routing=ask.routing)
    t0 = time.monotonic()
    built, _ = answer.at_depth(ask, say)
    top = ask.output / answer.safe(built.name)
    l2 = answer.l2_mb(ask)
    gathered: dict = {}
    for n, (batch, prompt) in enumerate(todo, 1):
        out = top / "traces" / f"b{batch}-p{prompt}"
        traced = trace.record(built, batch, prompt, 1, out, ask.attention, trace.ROUTING[ask.routing](), None,
                              ask.logits, ask_gpu=False)  # the kernels predict --db traces, wherever it runs
        for r in profile.import_profile(traced.trace, out / "profile.db", force=True, l2_mb=l2):
            if r["status"] == "mapped":
                key = (r["op"], r["backend"], r["dtype"], r["params"], r.get("cache"), r.get("resident_inputs"))
                gathered.setdefault(key, r)
        say(f"opperf grid: traced {n} of {len(todo)} configurations (batch {batch}, prompt {prompt}): "
            f"{len(gathered)} distinct calls so far")
    kept, over = _budget(_spaced(list(gathered.values()), spacing), max_hbm_gb)
    planned = Planned(built.name, todo, kept, len(gathered), over)
    cases = [{**r, "id": i, "count": 1, "share": 0.0} for i, r in enumerate(kept, 1)]
    files = profile.write_replay_configs(cases, top / "replay", f"opperf grid {ask.spec}", "grid")
    planned.sweeps = [{"cache": cache, "files": [str(f) for f in written]} for cache, written in files.items()]
    planned.seconds = time.monotonic() - t0
    (top / "grid.json").write_text(json.dumps({"model": ask.spec, "configurations": todo, "cases": len(kept),
                                               "gathered": len(gathered), "over_budget": over,
                                               "sweeps": planned.sweeps}, indent=1))
    return planned


def _spaced(rows: list, spacing: float) -> list:
    """The cases kept: per kernel family with one axis, from the smallest up, each at least SPACING
    times the last kept along the axis, and the largest; every case of a family with more axes."""
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import OPS
    from pytest_opperf.pipeline.replay import families

    load_builtin()
    lines: dict = {}
    kept = []
    for r in rows:
        op = OPS.get(r["op"])
        ints = tuple(p for p in op.params if op.types.get(p, int) is int) if op else ()
        placed = families.place(r["op"], json.loads(r["params"]), ints)
        if placed is None or len(placed[1]) != 1:
            kept.append(r)
            continue
        key = (r["op"], r["backend"], r["dtype"], placed[0], placed[1])
        lines.setdefault(key, []).append((placed[2][0], r))
    for key, line in lines.items():
        line.sort(key=lambda vr: vr[0])
        last, step = None, spacing if key[-1] in (("m",), ("macs",)) else spacing ** 2
        for i, (value, r) in enumerate(line):
            if last is None or value >= last * step or i == len(line) - 1:
                kept.append(r)
                last = value
    return kept


def _budget(rows: list, max_hbm_gb: float) -> tuple:
    """The cases whose memory estimate fits MAX_HBM_GB (all where 0), and how many did not."""
    if max_hbm_gb <= 0:
        return rows, 0
    from pytest_opperf.catalog.registry import OPS, DTypes
    from pytest_opperf.dtypes import lookup
    from pytest_opperf.measure.budget import GB, case_bytes

    fits = []
    for r in rows:
        op = OPS[r["op"]]
        first, _, second = r["dtype"].partition("-")  # a label: "bf16", or input-output "int64-fp32"
        dt = DTypes(lookup(first), lookup(second or first))
        try:
            need = case_bytes(op, {**op.defaults, **json.loads(r["params"])}, dt)
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            need = 0.0
        if math.isfinite(need) and need <= max_hbm_gb * GB:
            fits.append(r)
    return fits, len(rows) - len(fits)


def check_sweep(db: Path, device: str, benches: Path) -> None:
    """The sweep's paths, checked before any trace: one line naming the option."""
    if not benches.is_dir():
        raise ProfileError(f"--benches {benches}: no such directory of bench tests (the project's benches/)")
    if db.suffix != ".db" or db.stem != device:
        raise ProfileError(f"--db {db}: the sweep writes rows to <results>/<device>.db; name it {device}.db")


def sweep(planned: Planned, db: Path, device: str, benches: Path, pytest_args: str = "",
          run: bool = True) -> list:
    """The pytest commands that measure the planned cases into DB (one per cache state), run one after
    another with pytest's progress on stderr unless RUN is false; (command, exit code) each."""
    import shlex
    import subprocess
    import sys

    from pytest_opperf.pipeline.predict.idealised import stderr_fd

    check_sweep(db, device, benches)
    done = []
    for s in planned.sweeps:
        ops = sorted({Path(f).stem for f in s["files"]})
        command = [sys.executable, "-m", "pytest", str(benches), "-p", "no:cacheprovider", "-q",
                   f"--device={device}", f"--opperf-results={db.parent}", f"--opperf-cache={s['cache']}",
                   "-m", " or ".join(ops), *[f"--opperf-config={f}" for f in s["files"]], *shlex.split(pytest_args)]
        code = subprocess.run(command, stdout=stderr_fd()).returncode if run else None
        done.append((command, code))
        s["command"] = shlex.join(command)
    return done
