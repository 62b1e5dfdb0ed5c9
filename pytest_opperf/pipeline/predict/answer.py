"""``opperf predict``: one row per configuration, each traced on meta, imported and priced.

For each configuration (batch x prefill x tp; the model traced once per shape) the trace goes to
``OUTPUT/<model>/b<B>-p<P>-d<D>-tp<T>/`` (``trace.json.gz``, its capture, ``profile.db`` in the form
``opperf import`` writes, the replay configs under ``replay/``), so ``opperf sequence``, ``--replace``,
``opperf replay-report`` and the replay sweeps read it as they read a profile. The answer names, per
phase, the predicted step time, how it was priced (see price.py), the share of each kind of price,
the costliest calls, and every assumption the trace made (attention kernel, expert routing, dtype).
"""

from __future__ import annotations

import json
import sqlite3
import time
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


def configurations(batches: list, prefills: list, tps: list) -> list[tuple]:
    return [(b, p, t) for t in tps for b in batches for p in prefills]


def predict(ask: Ask, batches: list, prefills: list, tps: list, say=None) -> dict:
    """Every configuration's answer, in one dict (see the module doc)."""
    from pytest_opperf.pipeline.predict import model, price, tp, trace

    say = say or (lambda text: None)
    if not ask.measure and ask.db is None:
        raise ProfileError("nothing to price the calls with: --measure (replayed in sequence on this machine's GPU) "
                           "or --db RESULTS (a results database's rows)")
    factors = price.Factors(ask.from_profile) if ask.from_profile and ask.db else None
    experts = trace.Even()
    if ask.from_profile:
        shares = price.expert_shares(ask.from_profile)
        if shares:
            experts = trace.Shares(shares, str(ask.from_profile))
    ranked = {1: model.build(ask.spec, ask.dtype, ask.layers, ask.models_dir)}  # ranks -> the model of one rank
    styles: dict = {1: {}}
    built = ranked[1]
    answer = {"model": built.name, "source": built.source, "dtype": built.dtype, "decode": ask.decode,
              "layers": ask.layers, "notes": built.notes, "configurations": []}
    l2 = _l2_mb(ask)
    for batch, prefill, ranks in configurations(batches, prefills, tps):
        if ranks not in ranked:  # one rank of RANKS: the model built again and split by its plan
            ranked[ranks] = model.build(ask.spec, ask.dtype, ask.layers, ask.models_dir)
            styles[ranks] = tp.shard(ranked[ranks].module, ranks)
        built = ranked[ranks]
        out = ask.output / _safe(built.name) / f"b{batch}-p{prefill}-d{ask.decode}-tp{ranks}"
        t0 = time.monotonic()
        traced = trace.record(built, batch, prefill, ask.decode, out, ask.attention, experts, say)
        db = out / "profile.db"
        rows, sweeps = _import(traced.trace, db, l2)
        row = {"batch": batch, "prefill": prefill, "tp": ranks, "output": str(out), "profile": str(db),
               "signatures": len(rows), "aten_calls": traced.calls, "replay_sweeps": sweeps,
               "assumptions": {"attention": traced.attention, "experts": traced.experts, "dtype": built.dtype,
                               **({"tensor_parallel": _plan_said(ranks, styles[ranks])} if ranks > 1 else {})},
               "seconds_trace": round(time.monotonic() - t0, 1), "priced": {}}
        _note(db, ask, row)
        if ask.measure:
            phases, how = price.sequence(db, ask.measure_device, ask.repeats, say, ask.db, ask.device, ask.hardware)
            row["priced"]["sequence"] = {"how": how, "phases": [p.as_dict() for p in phases]}
        if ask.db is not None:
            phases, how = price.rows(db, ask.db, ask.device, ask.hardware)
            row["priced"]["rows"] = {"how": how, "phases": [p.as_dict() for p in phases]}
            if factors is not None:
                phases, how = price.rows(db, ask.db, ask.device, ask.hardware, factors)
                row["priced"]["context"] = {"how": how, "phases": [p.as_dict() for p in phases]}
        answer["configurations"].append(row)
    return answer


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


def _l2_mb(ask: Ask) -> Optional[float]:
    """The L2 of the device the step is predicted for (its spec's), for each call's cache state."""
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
    if name is None:
        return None
    try:
        specs = load_specs(ask.hardware)
    except SpecError as exc:
        raise ProfileError(str(exc)) from None
    spec = specs.get(name)
    return spec.l2_mbytes if spec is not None else None


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:80] or "model"


def headline(row: dict) -> tuple[str, list]:
    """The pricing a row's answer leads with: sequence, else context, else rows."""
    for way in ("sequence", "context", "rows"):
        if way in row["priced"]:
            return way, row["priced"][way]["phases"]
    return "", []


def text(answer: dict, top: int = 5) -> str:
    lines = [f"opperf predict {answer['model']} ({answer['source']}), {answer['dtype']}, {answer['decode']} decode "
             f"steps" + (f", first {answer['layers']} layers" if answer["layers"] else "")]
    lines += [f"  note: {n}" for n in answer["notes"]]
    lines.append(f"  {'batch':>5} {'prefill':>7} {'tp':>3}  {'prefill step ms':>15} {'decode step ms':>14}  priced")
    for row in answer["configurations"]:
        way, phases = headline(row)
        by = {p["phase"]: p for p in phases}
        cells = [f"{by[ph]['step_us'] / 1e3:.4g}" if ph in by else "-" for ph in ("prefill", "decode")]
        lines.append(f"  {row['batch']:>5} {row['prefill']:>7} {row['tp']:>3}  {cells[0]:>15} {cells[1]:>14}  {way}")
    for row in answer["configurations"]:
        lines.append(f"batch {row['batch']}, prefill {row['prefill']}, tp {row['tp']}: {row['profile']}")
        for key, said in row["assumptions"].items():
            lines.append(f"  assumed {key}: {said}")
        for way, priced in row["priced"].items():
            lines.append(f"  {way}: {priced['how']}")
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
