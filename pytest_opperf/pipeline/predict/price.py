"""A traced step priced: three ways, each named in the answer.

- ``sequence`` (``--measure``): the traced calls replayed in their order on this machine's device, as
  ``opperf sequence`` replays a profile (inputs linked to the calls that wrote them, the L2 and the
  clocks as the model leaves them); each phase's step is its calls' time in the sequence.
- ``rows``: each call's time from a results database: the row the isolated replay of this very trace
  wrote (``opperf backfill``'s match), else ``opperf lookup``'s answer (a measured row of the same
  parameters, a log-log interpolation between measured neighbours, or the roofline bound). A call
  with none of these is unpriced: the answer says how many and which.
- ``context``: the rows' prices times the context factors (in-sequence / isolated time, per catalogue
  op and backend) of a profile of the same model that ``opperf sequence`` replayed (``--from``).

Every figure is per step: the prefill step, and the mean of the decode steps.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.mapping.rules import MAPPED
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay import lookup

KINDS = ("sequence", "replayed", lookup.MEASURED, lookup.INTERPOLATED, lookup.EXTRAPOLATED, lookup.ROOFLINE, "unpriced")


@dataclass
class Phase:
    """One phase of a priced step: its time and where the time came from."""

    phase: str
    steps: int
    calls: int                                  # calls a step (mean over the steps)
    step_us: float                              # predicted time of one step
    share: dict = field(default_factory=dict)   # kind -> share of step_us (unpriced: share of the calls)
    top: list = field(default_factory=list)     # the costliest signatures: op, shapes, count, total_us, kind
    unpriced: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"phase": self.phase, "steps": self.steps, "calls_per_step": self.calls, "step_us": self.step_us,
                "share": self.share, "top": self.top, "unpriced": self.unpriced[:10]}


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def sequence(profile_db: Path, device: str, repeats: int = 3, say=None, results_db: Optional[Path] = None,
             spec: Optional[str] = None, hardware: Optional[Path] = None,
             weights: Optional[dict] = None,
             budget: Optional[int] = None) -> tuple[list[Phase], str]:
    """The traced calls replayed in order on DEVICE; returns the phases and how they were run. The
    collectives of a tensor-parallel rank, which one device cannot replay, come from RESULTS_DB's
    rows where given (lookup), else stay unpriced. WEIGHTS: position -> the model's calls it stands
    for (depth.weights: a stand-in layer's call counts once per layer of its pattern). The inputs:
    per call where they fit BUDGET bytes (else OPPERF_MEMORY_BUDGET, else the device's free memory),
    else one set a signature, else a one-line ProfileError (sequence.replay)."""
    from pytest_opperf.pipeline.replay import plan as planning
    from pytest_opperf.pipeline.replay import sequence as seq
    from pytest_opperf.pipeline.replay import summary

    rows = profile.load(profile_db)
    calls = planning.load_calls(profile_db)
    dev = planning.device_of(device, "cpu_op" if device == "cpu" else "kernel")
    outcome, how = seq.replay(rows, calls, dev, repeats, say, str(profile_db), budget)
    plan = outcome.plan
    summary.write(profile_db, outcome, rows)
    by_id = {r["id"]: r for r in profile.load(profile_db)}  # with the kernels each ran in sequence
    times = summary.per_signature(outcome)
    collective = {s: _collective(by_id[s], results_db, spec, hardware) for s in by_id
                  if s not in times and by_id[s]["op"] in COLLECTIVES and results_db is not None}
    out = []
    for t in summary.phases(outcome, calls):
        steps = max(t.steps, 1)
        mine = [c for c in calls if (c["phase"] or "") == t.phase]
        counts = _counts(mine, weights)
        priced = {s: times[s] for s in counts if s in times}
        kind = {s: "sequence" for s in priced}
        for s in counts:
            if s not in priced and collective.get(s) is not None:
                priced[s], kind[s] = collective[s]
        replayed = t.sequence_us if weights is None else _weighted(outcome, mine, weights)
        step_us = replayed / steps + sum(priced[s] * counts[s] for s in priced if kind[s] != "sequence") / steps
        share: dict = defaultdict(float)
        for s in priced:
            share[kind[s]] += priced[s] * counts[s] / steps / step_us if step_us else 0.0
        unpriced = [s for s in counts if s not in priced and counts[s]]
        share["unpriced"] = sum(counts[s] for s in unpriced) / max(sum(counts.values()), 1)
        out.append(Phase(t.phase, t.steps, round(sum(counts.values()) / steps), step_us, dict(share),
                         _top(by_id, counts, priced, kind, steps),
                         [_named(by_id[s], plan.left_out.get(s, "not replayed")) for s in unpriced]))
    return out, f"in sequence on {dev} ({outcome.repeats} repetitions, {how})"


def _weighted(outcome, calls: list[dict], weights: dict) -> float:
    """The replayed calls' time in the sequence, each counted as the model's calls it stands for."""
    base = outcome.times["base"]
    return sum(weights.get(c["position"], 1) * sum(base[c["position"]]) / len(base[c["position"]])
               for c in calls if base.get(c["position"]))


def _collective(sig: dict, results_db: Path, spec: Optional[str], hardware: Optional[Path]) -> Optional[tuple]:
    """(us, kind) of a collective call from the results database's rows (its backend's)."""
    try:
        answer = lookup.lookup(results_db, sig["op"], json.loads(sig["params"]), sig["dtype"] or "bf16",
                               sig["backend"], spec, hardware)
    except (ProfileError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return answer.time_us, f"collective {answer.kind}"


def rows(profile_db: Path, results_db: Path, device: Optional[str] = None, hardware: Optional[Path] = None,
         factors: Optional["Factors"] = None, weights: Optional[dict] = None,
         table: Optional[lookup.Table] = None) -> tuple[list[Phase], str, dict]:
    """Each call priced from RESULTS_DB's rows (see the module doc); FACTORS: a profile's context factors;
    WEIGHTS: position -> the model's calls it stands for (depth.weights; default one each); TABLE: the
    database read once for many configurations. Returns the phases, how, and the held-out error of
    the kernel families the interpolated calls were read from (held_out)."""
    from pytest_opperf.pipeline.replay import backfill

    if not results_db.is_file():
        raise ProfileError(f"--db={results_db}: no such results database (a sweep writes results/<device>.db)")
    table = table or lookup.Table(results_db, device, hardware)
    filled = backfill.backfill(profile_db, results_db).filled
    sigs = profile.load(profile_db)
    by_id = {r["id"]: r for r in sigs}
    price: dict = {}
    kind: dict = {}
    answers = []
    for r in sigs:
        if r["status"] != MAPPED:
            continue
        if r.get("replayed_us") is not None:
            price[r["id"]], kind[r["id"]] = r["replayed_us"], "replayed"
            continue
        try:
            answer = table.answer(r["op"], json.loads(r["params"]), r["dtype"] or "bf16", r["backend"], r.get("cache"))
        except (ProfileError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
        price[r["id"]], kind[r["id"]] = answer.time_us, answer.kind
        answers.append(answer)
    if factors is not None:
        price = {s: us * factors.of(by_id[s]) for s, us in price.items()}
    from pytest_opperf.pipeline.replay.plan import load_calls

    calls = load_calls(profile_db)
    out = []
    for phase in _phases(calls):
        mine = [c for c in calls if (c["phase"] or "") == phase]
        steps = max(len({c["step"] for c in mine}), 1)
        counts = _counts(mine, weights)
        total = sum(price[s] * n for s, n in counts.items() if s in price)
        share: dict = defaultdict(float)
        for s, n in counts.items():
            if s in price and total:
                share[kind[s]] += price[s] * n / total
        unpriced = [s for s in counts if s not in price and counts[s]]
        share["unpriced"] = sum(counts[s] for s in unpriced) / max(sum(counts.values()), 1)
        out.append(Phase(phase, steps, round(sum(counts.values()) / steps), total / steps, dict(share),
                         _top(by_id, counts, price, kind, steps),
                         [_named(by_id[s], by_id[s].get("reason") or "no row, no neighbours, no roofline")
                          for s in unpriced]))
    how = f"from {results_db}'s rows ({filled} signatures replayed from this trace, the rest looked up)"
    if factors is not None:
        how += f", times the context factors of {factors.source}"
    return out, how, held_out(table.held_out(answers))


def held_out(errors: list) -> dict:
    """The held-out errors summed up: how many sizes, the median, 90th percentile and largest |error|."""
    if not errors:
        return {"sizes": 0}
    ranked = sorted(abs(e) for e in errors)
    return {"sizes": len(ranked), "median_abs": ranked[len(ranked) // 2], "p90_abs": ranked[int(0.9 * (len(ranked) - 1))],
            "max_abs": ranked[-1]}


class Factors:
    """Context factors of a sequence-replayed profile: in-sequence over isolated time, summed per
    catalogue op and backend (and over the whole profile, for an op it did not run)."""

    def __init__(self, profile_db: Path):
        self.source = str(profile_db)
        sums: dict = defaultdict(lambda: [0.0, 0.0])
        for r in profile.load(profile_db):
            if r.get("sequence_us") is None or not r.get("replayed_us"):
                continue
            for key in ((r["op"], r["backend"]), ("*", "*")):
                sums[key][0] += r["sequence_us"] * r["count"]
                sums[key][1] += r["replayed_us"] * r["count"]
        if ("*", "*") not in sums:
            raise ProfileError(f"--from={profile_db}: no signature with both an isolated and an in-sequence time: "
                               f"run opperf backfill and opperf sequence on it first")
        self.factor = {k: a / b for k, (a, b) in sums.items() if b}

    def of(self, sig: dict) -> float:
        return self.factor.get((sig["op"], sig["backend"]), self.factor[("*", "*")])


def expert_shares(profile_db: Path) -> dict:
    """experts -> each expert's share of the rows, over the grouped GEMMs of a profile's capture
    (their offsets, kept in each signature's parameters)."""
    totals: dict = {}
    for r in profile.load(profile_db):
        if not r["op_type"].endswith("_grouped_mm") or not r.get("params"):
            continue
        offsets = _offsets(json.loads(r["params"]))
        if not offsets:
            continue
        counts = [b - a for a, b in zip([0, *offsets[:-1]], offsets)]
        acc = totals.setdefault(len(counts), [0] * len(counts))
        for e, n in enumerate(counts):
            acc[e] += n * r["count"]
    return {e: [n / sum(acc) for n in acc] for e, acc in totals.items() if sum(acc)}


def _offsets(params: dict) -> list:
    """The offsets a grouped GEMM's replay parameters hold (``T:i32[E]=a,b,...`` in its arguments)."""
    for text in json.loads(params.get("args") or "[]") if isinstance(params.get("args"), str) else []:
        if isinstance(text, str) and text.startswith("T:i32[") and "=" in text:
            try:
                return [int(x) for x in text.split("=", 1)[1].split(",")]
            except ValueError:
                return []
    return []


def _phases(calls: list[dict]) -> list[str]:
    seen: list = []
    for c in calls:
        if (c["phase"] or "") not in seen:
            seen.append(c["phase"] or "")
    return seen


def _counts(calls: list[dict], weights: Optional[dict] = None) -> dict:
    """signature -> its calls (each counted as the model's calls it stands for, where WEIGHTS says)."""
    counts: dict = defaultdict(int)
    for c in calls:
        counts[c["signature"]] += weights.get(c["position"], 1) if weights else 1
    return counts


def _top(by_id: dict, counts: dict, price: dict, kind: dict, steps: int, n: int = 8) -> list:
    costly = sorted((s for s in counts if s in price), key=lambda s: -price[s] * counts[s])[:n]
    return [{"op_type": by_id[s]["op_type"], "shapes": by_id[s]["input_shapes"], "op": by_id[s]["op"],
             "backend": by_id[s]["backend"], "calls_per_step": counts[s] / steps, "us": price[s],
             "step_share_us": price[s] * counts[s] / steps, "kind": kind[s],
             "kernels": by_id[s].get("sequence_kernels") if kind[s] == "sequence" else by_id[s].get("replayed_kernels")}
            for s in costly]


def _named(sig: dict, why: str) -> dict:
    return {"op_type": sig["op_type"], "shapes": sig["input_shapes"], "why": why}
