"""``opperf predict``: one row per configuration, each traced on meta, imported and priced.

For each configuration (batch x prefill x tp; the model traced once per shape) the trace goes to
``OUTPUT/<model>/b<B>-p<P>-d<D>-tp<T>/`` (``trace.json.gz``, its capture, ``profile.db`` in the form
``opperf import`` writes, the replay configs under ``replay/``), so ``opperf sequence``, ``--replace``,
``opperf replay-report`` and the replay sweeps read it as they read a profile. The answer names, per
phase, the predicted step time, how it was priced (see price.py), the share of each kind of price,
the costliest calls, and every assumption the trace made (attention kernel, expert routing, dtype,
the prefill's logits, the depth).

A config traced at its own depth is cut to the shortest prefix that holds each distinct layer once
(depth.py) and its calls counted per layer of the model. Per configuration the answer then gives what
a serving engineer reads: TTFT (the prefill step), TPOT (the mean decode step), the time for D output
tokens (TTFT + (D - 1) TPOT), output tokens/s over that time and per GPU, ranked by tokens/s per GPU,
and whether each meets ``--slo``. The times are device time: kernels back to back, as a CUDA graph
replays them, without an eager loop's host overhead.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.reading.signature import ProfileError


@dataclass(frozen=True)
class Ask:
    """What the user asked for, besides the configurations."""

    spec: str
    decode: int
    dtype: Optional[str] = None
    layers: Optional[int] = None
    attention: str = "auto"
    measure: bool = False
    measure_device: str = "cuda"
    db: Optional[Path] = None
    device: Optional[str] = None        # hardware spec: roofline answers, the L2 of the cache states
    hardware: Optional[Path] = None
    from_profile: Optional[Path] = None
    output: Path = Path("predict")
    repeats: int = 3
    models_dir: Optional[Path] = None
    routing: str = "random"             # the experts' rows when no --from profile gives them: random, even
    logits: str = "last"                # the prefill's LM head: last (generate's logits_to_keep=1) or all
    output_tokens: Optional[int] = None  # D of the time for D output tokens (default: decode + 1)
    slo: Optional[dict] = None          # {"ttft": ms, "tpot": ms}: the configurations that meet it are marked


def configurations(batches: list, prefills: list, tps: list) -> list[tuple]:
    return [(b, p, t) for t in tps for b in batches for p in prefills]


def predict(ask: Ask, batches: list, prefills: list, tps: list, say=None, jobs: Optional[int] = None) -> dict:
    """Every configuration's answer, in one dict (see the module doc). JOBS: processes that trace and
    price configurations side by side when nothing is measured (default: this process's CPUs)."""
    from pytest_opperf.pipeline.predict import price, trace
    from pytest_opperf.pipeline.replay import lookup

    say = say or (lambda text: None)
    check(ask)
    if jobs is not None and jobs < 1:
        raise ProfileError(f"--jobs={jobs}: expected 1 or more")
    factors = price.Factors(ask.from_profile) if ask.from_profile and ask.db else None
    experts = trace.ROUTING[ask.routing]()
    if ask.from_profile:
        shares = price.expert_shares(ask.from_profile)
        if shares:
            experts = trace.Shares(shares, str(ask.from_profile))
    built, depth = at_depth(ask, say)
    gc.freeze()  # torch's, transformers' and the model's objects: a trace's parse no longer rescans them
    answer = {"model": built.name, "source": built.source, "dtype": built.dtype, "decode": ask.decode,
              "layers": ask.layers, "depth": depth.said() if depth is not None else None,
              "output_tokens": _tokens(ask), "slo": ask.slo, "notes": built.notes, "configurations": []}
    todo = configurations(batches, prefills, tps)
    table = lookup.Table(ask.db, ask.device, ask.hardware) if ask.db is not None else None  # read once for all
    shared = _Shared(ask, say, built, depth, experts, factors, l2_mb(ask, table.device if table else None),
                     len(todo), table)
    try:
        answer["configurations"] = _each(shared, list(enumerate(todo, 1)), jobs)
    finally:
        gc.unfreeze()  # a caller's process (a test session) collects as before
    return answer


@dataclass
class _Shared:
    """What every configuration of one predict shares (inherited by forked workers)."""

    ask: Ask
    say: object
    built: object             # the model of one rank (tp 1)
    depth: object             # depth.Found of a config at its own depth, else None
    experts: object
    factors: object
    l2: Optional[float]
    total: int
    table: object             # lookup.Table of --db, else None

    def __post_init__(self):
        self.ranked = {1: self.built}  # ranks -> the model of one rank
        self.styles: dict = {1: {}}


def _each(shared: _Shared, todo: list, jobs: Optional[int]) -> list:
    """The rows of TODO ((n, (batch, prefill, tp)) each), in order: here, or over JOBS forked processes
    where nothing is measured on a device (a trace and its pricing take seconds of one CPU each)."""
    import multiprocessing
    import os

    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(jobs, len(todo))
    if jobs < 2 or shared.ask.measure or "fork" not in multiprocessing.get_all_start_methods():
        return [_configuration(shared, n, config) for n, config in todo]
    global _SHARED
    _SHARED = shared  # forked workers inherit it: the model, the table read so far, the routing
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_plain_signals) as pool:
            return list(pool.map(_in_worker, todo))
    except BrokenProcessPool:
        raise ProfileError("a process pricing configurations ended before its answer (killed: out of memory?); "
                           "--jobs 1 prices them one by one in this process") from None
    finally:
        _SHARED = None


_SHARED: Optional[_Shared] = None


def _plain_signals() -> None:
    """A forked worker does not keep its parent's handlers (a pytest session's SIGTERM handler would
    store that session's rows from the copy): SIGTERM and SIGINT end it."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _in_worker(item: tuple) -> dict:
    n, config = item
    return _configuration(_SHARED, n, config)


def _configuration(shared: _Shared, n: int, config: tuple) -> dict:
    """One configuration traced, imported and priced: its row of the answer. The cyclic collector runs
    once at its end, not whenever its ~10^6 allocations would trigger it."""
    from pytest_opperf.pipeline.predict.launches import collector_paused

    with collector_paused():
        row = _traced_and_priced(shared, n, config)
    gc.collect()
    return row


def _traced_and_priced(shared: _Shared, n: int, config: tuple) -> dict:
    from pytest_opperf.pipeline.predict import model, price, tp, trace

    ask, say = shared.ask, shared.say
    batch, prefill, ranks = config
    layers = shared.depth.traced if shared.depth is not None else ask.layers
    if ranks not in shared.ranked:  # one rank of RANKS: the model built again and split by its plan
        shared.ranked[ranks] = model.build(ask.spec, ask.dtype, layers, ask.models_dir)
        shared.styles[ranks] = tp.shard(shared.ranked[ranks].module, ranks)
    built = shared.ranked[ranks]
    if shared.total > 1:
        say(f"opperf predict: configuration {n} of {shared.total}: batch {batch}, prefill {prefill}, tp {ranks}")
    out = ask.output / safe(built.name) / f"b{batch}-p{prefill}-d{ask.decode}-tp{ranks}"
    t0 = time.monotonic()
    # Asked of this machine's GPU only where it measures: priced from rows, the answer is the same anywhere.
    traced = trace.record(built, batch, prefill, ask.decode, out, ask.attention, shared.experts, say, ask.logits,
                          ask_gpu=ask.measure)
    db = out / "profile.db"
    rows, sweeps = _import(traced.trace, db, shared.l2)
    weights = depth_weights(db, shared.depth)
    depth = shared.depth
    row = {"batch": batch, "prefill": prefill, "tp": ranks, "output": str(out), "profile": str(db),
           "signatures": len(rows), "aten_calls": traced.calls, "replay_sweeps": sweeps,
           "assumptions": {"attention": traced.attention, "experts": traced.experts, "logits": traced.logits,
                           "dtype": built.dtype,
                           **({"depth": depth.said()} if depth is not None else {}),
                           **({"tensor_parallel": _plan_said(ranks, shared.styles[ranks])} if ranks > 1 else {})},
           "seconds_trace": round(time.monotonic() - t0, 1), "priced": {}}
    _note(db, ask, row)
    if ask.measure:
        phases, how = price.sequence(db, ask.measure_device, ask.repeats, say, ask.db, ask.device, ask.hardware,
                                     weights=weights)
        row["priced"]["sequence"] = {"how": how, "phases": [p.as_dict() for p in phases]}
    if ask.db is not None:
        phases, how, held = price.rows(db, ask.db, ask.device, ask.hardware, weights=weights, table=shared.table)
        row["priced"]["rows"] = {"how": how, "phases": [p.as_dict() for p in phases], "held_out": held}
        if shared.factors is not None:
            phases, how, held = price.rows(db, ask.db, ask.device, ask.hardware, shared.factors, weights, shared.table)
            row["priced"]["context"] = {"how": how, "phases": [p.as_dict() for p in phases], "held_out": held}
    row["serving"] = serving(row, _tokens(ask), ask.slo)
    return row


def check(ask: Ask) -> None:
    """The options that need no trace, checked before any work starts: each refusal one line."""
    from pytest_opperf.pipeline.predict import trace

    if not ask.measure and ask.db is None:
        raise ProfileError("nothing to price the calls with: --measure (replayed in sequence on this machine's GPU) "
                           "or --db RESULTS (a results database's rows)")
    if ask.db is not None and not Path(ask.db).is_file():
        raise ProfileError(f"--db={ask.db}: no such results database (a sweep writes results/<device>.db)")
    if ask.from_profile is not None and not Path(ask.from_profile).is_file():
        raise ProfileError(f"--from={ask.from_profile}: no such profile database")
    trace.check_choices(attention=ask.attention, logits=ask.logits, routing=ask.routing)
    if ask.repeats < 1:
        raise ProfileError(f"--repeats={ask.repeats}: expected 1 or more")
    if ask.output_tokens is not None and ask.output_tokens < 1:
        raise ProfileError(f"--output-tokens={ask.output_tokens}: expected 1 or more")
    if ask.dtype:
        from pytest_opperf.pipeline.predict.model import checked_dtype

        checked_dtype(ask.dtype)
    if ask.measure:
        from pytest_opperf.pipeline.replay import plan, sequence

        plan.device_of(ask.measure_device, "cpu_op" if ask.measure_device == "cpu" else "kernel", "--measure-device")
        sequence.imposed_budget()


def at_depth(ask: Ask, say):
    """The model to trace and, for a config at its own depth, its layer patterns (depth.py): the model
    cut to the prefix that holds each pattern, checked to have the full model's first layers."""
    from pytest_opperf.pipeline.predict import depth, model

    built = model.build(ask.spec, ask.dtype, ask.layers, ask.models_dir)
    if ask.layers is not None or built.config is None or ":" in ask.spec and not Path(ask.spec).exists():
        return built, None
    found = depth.patterns(built.module, built.config)
    if found is None or not found.cut:
        return built, found
    cut = model.build(ask.spec, ask.dtype, found.traced, ask.models_dir)
    again = depth.patterns(cut.module, cut.config)
    if again is None or again.pattern != found.pattern[:found.traced]:
        say(f"opperf predict: the first {found.traced} layers cut from the config are not the model's: traced at "
            f"its full depth ({found.layers} layers)")
        return built, None
    say(f"opperf predict: {found.said()}")
    return cut, found


def depth_weights(db: Path, found) -> Optional[dict]:
    from pytest_opperf.pipeline.predict import depth

    if found is None or not found.cut:
        return None
    weights = depth.weights(db, found)
    if not weights:
        raise ProfileError(f"{db}: its trace holds no module calls, so its layers cannot be counted: trace the "
                           f"whole model with --layers {found.layers}")
    return weights


def _tokens(ask: Ask) -> int:
    return ask.output_tokens or ask.decode + 1


def serving(row: dict, tokens: int, slo: Optional[dict] = None) -> dict:
    """What a serving engineer reads of a priced configuration: TTFT, TPOT (ms), the time for TOKENS
    output tokens, output tokens/s over it and per GPU, and whether SLO ({ttft, tpot} in ms) holds."""
    _, phases = headline(row)
    by = {p["phase"]: p["step_us"] / 1e3 for p in phases}
    ttft, tpot = by.get("prefill"), by.get("decode")
    if ttft is None or (tpot is None and tokens > 1):
        return {}
    total = ttft + (tokens - 1) * (tpot or 0.0)
    rate = row["batch"] * tokens / (total / 1e3) if total else None
    out = {"ttft_ms": ttft, "tpot_ms": tpot, "output_tokens": tokens, "time_ms": total, "tokens_per_s": rate,
           "tokens_per_s_per_gpu": rate / row["tp"] if rate else None}
    if slo:
        out["meets_slo"] = (ttft <= slo.get("ttft", float("inf"))
                            and (tpot is None or tpot <= slo.get("tpot", float("inf"))))
    return out


def parse_slo(text: Optional[str]) -> Optional[dict]:
    """``ttft=MS,tpot=MS`` (either or both) as {"ttft": ms, "tpot": ms}."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key.strip() not in ("ttft", "tpot") or ms <= 0 or key.strip() in out:
            raise ProfileError(f"--slo={text}: expected ttft=MS,tpot=MS (either or both, positive milliseconds)")
        out[key.strip()] = ms
    return out


def _plan_said(ranks: int, styles: dict) -> str:
    applied = ", ".join(f"{style} x{n}" for style, n in sorted(styles.items()))
    return (f"one of {ranks} ranks under the model's own tensor-parallel plan ({applied}); its collectives "
            f"priced from the collective rows at {ranks} GPUs")


def _import(path: Path, db: Path, l2_mb: Optional[float]) -> tuple[list[dict], list[dict]]:
    """The trace imported into DB, and its replay configs written beside it: the rows, and per cache
    state the sweep that measures the trace's calls into a results database (which --db then reads)."""
    from pytest_opperf.pipeline.mapping import configs, profile, tag

    rows = profile.import_profile(path, db, force=True, l2_mb=l2_mb)
    directory = db.parent / "replay"
    files = profile.write_replay_configs(rows, directory, str(path), profile.import_token(db))
    table = (directory / tag.TABLE).resolve()
    sweeps = [{"cache": cache, "command": f"{configs.pytest_command(written)} -p pytest_opperf.pipeline.tag "
                                          f"--opperf-signatures={table} --opperf-cache={cache}"}
              for cache, written in files.items()]
    return rows, sweeps


def _note(db: Path, ask: Ask, row: dict) -> None:
    """The configuration and its assumptions, kept in the profile database beside the calls."""
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE IF NOT EXISTS predicted (key TEXT PRIMARY KEY, value TEXT)")
        con.executemany("INSERT OR REPLACE INTO predicted VALUES (?, ?)",
                        [("model", ask.spec), ("batch", str(row["batch"])), ("prefill", str(row["prefill"])),
                         ("decode", str(ask.decode)), ("tp", str(row["tp"])),
                         ("assumptions", json.dumps(row["assumptions"]))])
    con.close()


def l2_mb(ask: Ask, db_device: Optional[str] = None) -> Optional[float]:
    """The L2 of the device the step is predicted for (its spec's), for each call's cache state:
    --device's; else, measuring, this machine's GPU's; else, priced from rows, the results database's
    (DB_DEVICE: the device its rows were measured on)."""
    from pytest_opperf.hardware.specs import SpecError, load_specs

    name = ask.device
    if name is None and ask.measure:
        import torch

        if torch.cuda.is_available():
            from pytest_opperf.hardware.specs import resolve_alias

            try:
                spec = resolve_alias(load_specs(ask.hardware), torch.cuda.get_device_name())
            except SpecError:
                return None
            return spec.l2_mbytes if spec is not None else None
    name = name or (None if ask.measure else db_device)  # measured here: this machine's states, as before
    if name is None:
        return None
    try:
        specs = load_specs(ask.hardware)
    except SpecError as exc:
        raise ProfileError(str(exc)) from None
    spec = specs.get(name)
    return spec.l2_mbytes if spec is not None else None


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:80] or "model"


def headline(row: dict) -> tuple[str, list]:
    """The pricing a row's answer leads with: sequence, else context, else rows."""
    for way in ("sequence", "context", "rows"):
        if way in row["priced"]:
            return way, row["priced"][way]["phases"]
    return "", []


def ranked(answer: dict) -> list:
    """The configurations, the most output tokens/s per GPU first (unpriced ones last)."""
    return sorted(answer["configurations"], key=lambda r: -(r.get("serving", {}).get("tokens_per_s_per_gpu") or 0.0))


def text(answer: dict, top: int = 5) -> str:
    tokens = answer.get("output_tokens") or answer["decode"] + 1
    lines = [f"opperf predict {answer['model']} ({answer['source']}), {answer['dtype']}, {answer['decode']} decode "
             f"steps" + (f", first {answer['layers']} layers" if answer["layers"] else "")]
    if answer.get("depth"):
        lines.append(f"  depth: {answer['depth']}")
    lines += [f"  note: {n}" for n in answer["notes"]]
    slo = answer.get("slo")
    lines.append(f"  ranked by output tokens/s per GPU; D = {tokens} output tokens: TTFT + (D - 1) x TPOT; device "
                 f"time (kernels back to back, as under CUDA graphs), not an eager loop's host overhead")
    lines.append(f"  {'batch':>5} {'prefill':>7} {'tp':>3}  {'TTFT ms':>9} {'TPOT ms':>9} {f'{tokens} tok ms':>10} "
                 f"{'tok/s':>9} {'tok/s/GPU':>9}" + ("  SLO " if slo else "") + "  priced")
    for row in ranked(answer):
        way, _ = headline(row)
        s = row.get("serving") or {}
        cells = [_num(s.get(k)) for k in ("ttft_ms", "tpot_ms", "time_ms", "tokens_per_s", "tokens_per_s_per_gpu")]
        mark = ("  " + ("meets" if s.get("meets_slo") else "  -  ") + " ") if slo else ""
        lines.append(f"  {row['batch']:>5} {row['prefill']:>7} {row['tp']:>3}  {cells[0]:>9} {cells[1]:>9} "
                     f"{cells[2]:>10} {cells[3]:>9} {cells[4]:>9}{mark}  {way}")
    if slo:
        lines.append("  SLO: " + ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()))
    for row in answer["configurations"]:
        lines.append(f"batch {row['batch']}, prefill {row['prefill']}, tp {row['tp']}: {row['profile']}")
        for key, said in row["assumptions"].items():
            lines.append(f"  assumed {key}: {said}")
        for way, priced in row["priced"].items():
            lines.append(f"  {way}: {priced['how']}")
            held = priced.get("held_out") or {}
            if held.get("sizes"):
                lines.append(f"    interpolation's error on held-out rows: median {100 * held['median_abs']:.1f}%, 90th "
                             f"percentile {100 * held['p90_abs']:.1f}%, largest {100 * held['max_abs']:.1f}% over "
                             f"{held['sizes']} measured sizes of the kernel families it read (each estimated from its "
                             f"neighbours with itself left out: twice the grid's spacing)")
            for p in priced["phases"]:
                if p["phase"] not in ("prefill", "decode"):
                    continue
                shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in p["share"].items() if v)
                lines.append(f"    {p['phase']}: {p['step_us'] / 1e3:.4g} ms a step, {p['calls_per_step']} calls "
                             f"({shares})")
                for c in p["top"][:max(top, 0)]:
                    lines.append(f"      {c['step_share_us'] / 1e3:8.4g} ms  {c['op_type']} [{c['shapes'][:60]}] "
                                 f"x{c['calls_per_step']:g} -> {c['op']}/{c['backend']} [{c['kind']}]")
                for u in p["unpriced"][:3]:
                    lines.append(f"      unpriced: {u['op_type']} [{u['shapes'][:60]}]: {u['why']}")
    return "\n".join(lines)
