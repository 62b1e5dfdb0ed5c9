"""The gate's verdicts: the rules that tell a regression from noise, and the Gate that applies them.

A rule is a class with a `name` and one method, noise_rel(base, new), registered with @rule and
chosen by name (--opperf-gate-rule); judge() turns a baseline entry and a new measurement into
a verdict (plain data), and Gate judges records against a loaded baseline (gate/baseline.py).

>>> base = {"time_us": 100.0, "ci_rel": 0.01}
>>> RULES["ci"]().noise_rel(base, {"time_us": 108.0, "ci_rel": 0.01})  # (1.00 + 1.08) / 100
0.0208

A rule of one's own, registered for as long as it is needed:

>>> @rule
... class Strict(Rule):
...     name = "strict"
...     def noise_rel(self, base, new):
...         return 0.001
>>> judge({"time_us": 100.0, "runs": [100.0] * 3}, {"time_us": 101.0, "op": "add", "backend": "torch",
...       "dtype_in": "fp32", "dtype_out": "fp32", "params": {"n": 4}}, 0.005, "strict")["verdict"]
'regressed'
>>> unregister("strict").__name__
'Strict'
"""

from __future__ import annotations

import math
from typing import Optional

from pytest_opperf.gate import noise as noise_model
from pytest_opperf.gate.baseline import Baseline, case_key, case_name
from pytest_opperf.record import Record

Z95 = 1.96
MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median, in standard errors of a mean (normal data)
# Verdicts, in the order reports list them.
VERDICTS = ("regressed", "inconclusive", "improved", "noisy", "incomparable", "same", "new")


# --- the rules -------------------------------------------------------------------------------

RULES: dict[str, type["Rule"]] = {}


def rule(cls: type["Rule"]) -> type["Rule"]:
    """Register a Rule class under its `name` (a decorator); a name taken already is a ValueError."""
    if not cls.name:
        raise ValueError(f"rule {cls.__name__} has no name")
    held = RULES.get(cls.name, cls)
    # By qualified name, not identity: a module reloaded (its classes made anew) may register again.
    if (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"a rule named {cls.name!r} is registered already ({RULES[cls.name].__name__})")
    RULES[cls.name] = cls
    return cls


def unregister(name: str) -> type["Rule"]:
    """Remove the rule of that name (a test's, a user's), returning its class; KeyError if none."""
    return RULES.pop(name)


class Rule:
    """How much of a difference between two measurements is noise.

    noise_rel(base, new) -> the relative difference (to the baseline time) the two measurements
    cannot resolve, or None when they carry no spread to tell.
    """

    name = ""

    def noise_rel(self, base: dict, new: dict) -> Optional[float]:
        raise NotImplementedError


@rule
class MedianCiRule(Rule):
    """The 95% confidence intervals of the two medians must separate: |new - base| > base*ci_b + new*ci_n.

    ci is the relative half-width of the median's CI the sampler recorded (ci_rel); where it is
    missing (fewer than 8 samples), the normal approximation 1.96 * sqrt(pi/2) * cv / sqrt(samples).
    Separate intervals, not the interval of the difference (their hypot): a median's CI from
    autocorrelated samples is too narrow, and the views call a difference significant by the same test.
    """

    name = "ci"

    def noise_rel(self, base, new):
        parts = [(e["time_us"], median_ci_rel(e)) for e in (base, new)]
        known = [t * ci for t, ci in parts if ci is not None]
        if not known:
            return None
        return math.fsum(known) / base["time_us"]


@rule
class SpreadRule(Rule):
    """NVBench's compare: beyond the smaller relative standard deviation (cv) of the two runs."""

    name = "spread"

    def noise_rel(self, base, new):
        cvs = [e["cv"] for e in (base, new) if e.get("cv") is not None]
        return min(cvs) if cvs else None


@rule
class ThresholdRule(Rule):
    """The threshold alone (seed 002's rule; CodSpeed's): every difference is taken as real."""

    name = "threshold"

    def noise_rel(self, base, new):
        return 0.0


def median_ci_rel(entry: dict) -> Optional[float]:
    """The relative half-width of the median's 95% CI: recorded, else estimated from cv and samples."""
    if entry.get("ci_rel") is not None:
        return entry["ci_rel"]
    cv, n = entry.get("cv"), entry.get("samples")
    if cv is None or not n or n < 2:
        return None
    return Z95 * MEDIAN_SE * cv / math.sqrt(n)


# --- the verdict -----------------------------------------------------------------------------


def judge(base: Optional[dict], new: dict, threshold: float, rule_name: str, threshold_from: str = "",
          scale: Optional[float] = None, drift: Optional[float] = None, strict: bool = False,
          unknown: Optional[str] = None, slower: Optional[float] = None) -> dict:
    """The verdict on one case: plain data (it rides the test report across xdist).

    regressed: new/base > 1 + threshold, and the difference is beyond the noise;
    improved:  base/new > 1 + threshold, and beyond the noise; noisy: beyond the threshold but
    within the noise; same: within the threshold; incomparable: timer or cache differ; new: no baseline.
    The noise is the larger of the rule's (within-run) noise and the baseline's run-to-run
    allowance (gate.noise); the `threshold` rule takes neither. scale: the machine's drift
    (gate.drift) that the new time is divided by before it is compared.
    inconclusive: the measurement cannot be judged (doubt()): the case was contended while it was
    measured (new["contended"]), this machine's speed against the baseline's is unknown
    (`unknown`: why, e.g. the baseline's reference kernels were timed on an unsteady machine), or the
    machine drifted (`drift`, relative, beyond half the threshold; `slower`: the most it was seen
    slower than the baseline's, a factor, below 1 where it was faster throughout); a slowdown beyond
    what those can explain stands. `fails`: regressed, or inconclusive when `strict`.
    """
    out = {"key": case_key(new), "case": case_name(new), "verdict": "new", "time_us": new["time_us"],
           "base_time_us": None, "ratio": None, "threshold": threshold, "threshold_from": threshold_from,
           "noise_rel": None, "rule": rule_name, "notes": "", "runs": None, "run_noise_rel": None, "scale": scale,
           "reason": None, "fails": False}
    if base is None:
        return out
    notes = [f"{f} {base[f]} in the baseline, {new[f]} here" for f in ("timer", "cache")
             if base.get(f) and new.get(f) and base[f] != new[f]]
    incomparable = bool(notes)
    if base.get("backend_version") and new.get("backend_version") and base["backend_version"] != new["backend_version"]:
        notes.append(f"backend_version {base['backend_version']} in the baseline, {new['backend_version']} here")
    ratio = new["time_us"] / base["time_us"] / (scale or 1.0)
    noise = RULES[rule_name]().noise_rel(base, new)
    runs = len(noise_model.runs_of(base))
    run_noise, how = None, None
    if rule_name != "threshold":
        run_noise, how = noise_model.run_allowance(base)
        if noise is not None and noise >= run_noise:
            how = None  # the within-run noise decides: nothing to say about the runs
        noise = run_noise if noise is None else max(noise, run_noise)
    if scale is not None:
        notes.append(f"normalised by the machine's drift {scale:.3f}x")
    verdict = "incomparable" if incomparable else classify(ratio, threshold, noise)
    floor = noise_model.FIRST_RUNS[noise_model.device_kind(base)]
    reason = None if incomparable else doubt(new, ratio, threshold, noise, drift, verdict, unknown, floor, slower)
    if reason:
        verdict = "inconclusive"
        notes.insert(0, reason)
    if how and verdict in ("regressed", "noisy"):
        notes.append(how)
    out.update(base_time_us=base["time_us"], ratio=ratio, noise_rel=noise, verdict=verdict, notes="; ".join(notes),
               runs=runs, run_noise_rel=run_noise, reason=reason,
               fails=verdict == "regressed" or (verdict == "inconclusive" and strict))
    return out


def classify(ratio: float, threshold: float, noise: float) -> str:
    """regressed, improved, noisy or same, for a ratio to the baseline, a threshold and a noise allowance.

    >>> classify(1.08, 0.05, 0.02), classify(1.08, 0.05, 0.09), classify(1.04, 0.05, 0.0), classify(0.9, 0.05, 0.02)
    ('regressed', 'noisy', 'same', 'improved')
    """
    if ratio > 1 + threshold:
        return "regressed" if ratio - 1 > noise else "noisy"
    if ratio * (1 + threshold) < 1:
        return "improved" if 1 - ratio > noise else "noisy"
    return "same"


# Under doubt a slowdown stands only beyond DOUBT_MARGIN times its allowance (the baseline's
# run-to-run allowance; at least the device kind's default where contention or an unsteady baseline
# makes the baseline's own spread no guide), once the machine's seen slowness is divided out: on a
# shared 2-core runner unchanged small kernels pass the CPU's 50% alone, a 2x slowdown clears 1.75x.
DOUBT_MARGIN = 1.5
# ... but no doubt excuses a slowdown of 1.9x or more. The allowance grows with this run's own
# interval, and a loaded host widens that without moving the median (a paced 2x slowdown beside
# the GPU test suite: median 2.00x, interval 36%, allowance 74%: 1.5 x 74% excused it). Load only
# ever slows a case, so a slowdown this large is not the machine's doing unless the machine itself
# doubled the times, and a run on such a machine is better stopped than passed.
MAX_EXCUSE = 0.9


def doubt(new: dict, ratio: float, threshold: float, noise: float, drift: Optional[float], verdict: str,
          unknown: Optional[str] = None, floor: float = 0.0, slower: Optional[float] = None) -> Optional[str]:
    """Why a measurement cannot be judged (the verdict becomes inconclusive), or None.

    Doubts: the case was contended while measured; this machine's speed against the baseline's is
    unknown (`unknown` says why; it doubts a slowdown only); the machine drifted (its reference kernels, gate.drift) beyond
    half the threshold. Under any of them a regression stands only when, divided by how much slower
    the machine was seen (`slower`; else 1 + the drift: the worst case),
    it exceeds DOUBT_MARGIN times the noise allowance (at least `floor`, the device kind's
    default allowance, for the first two: contention and an unsteady baseline are beyond the
    baseline's spread), or MAX_EXCUSE whatever the allowance; any other verdict a doubt could
    change is inconclusive.

    >>> doubt({}, 1.07, 0.05, 0.01, 0.04, "regressed")
    'the machine drifted 4.0% (reference kernels): within that the verdict could be same; 1.070x is within 1.5 x its allowance of 5%'
    >>> doubt({}, 2.0, 0.05, 0.01, 0.04, "regressed") is None   # a 2x slowdown on a machine 4% slower
    True
    >>> doubt({}, 1.94, 0.05, 0.5, 0.208, "regressed", slower=1.007) is None   # 20.8% faster: no excuse
    True
    >>> doubt({"contended": 1, "contention": "cpu: others took 0.9 of 2 cores"}, 1.6, 0.05, 0.5, None, "regressed", None, 0.5)
    'contended while measured (cpu: others took 0.9 of 2 cores); 1.600x is within 1.5 x its allowance of 50%'
    >>> doubt({"contended": 1}, 2.0, 0.05, 0.5, None, "regressed", None, 0.5) is None   # beyond 1 + 1.5 x 50%
    True
    >>> doubt({"contended": 1}, 2.0, 0.05, 0.74, None, "regressed", None, 0.5) is None   # 1.5 x 74% excuses no 2x
    True
    """
    reasons = []
    if new.get("contended"):
        reasons.append(f"contended while measured ({new.get('contention') or 'no detail'})")
    if unknown and verdict == "regressed":  # an unknown speed doubts a slowdown; `same` is still same
        reasons.append(unknown)
    drifted = drift is not None and drift > threshold / 2
    if drifted:
        moved = {classify(ratio / (1 + drift), threshold, noise), classify(ratio * (1 + drift), threshold, noise)}
        other = sorted(moved - {verdict})
        if other:
            reasons.append(f"the machine drifted {drift:.1%} (reference kernels): within that the verdict could be "
                           f"{' or '.join(other)}")
    if verdict != "regressed" or not (reasons or drifted):
        return "; ".join(reasons) or None
    allowance = max(noise, floor if (new.get("contended") or unknown) else 0.0, threshold)
    divisor = slower if slower is not None else 1 + (drift if drifted else 0.0)
    if ratio / divisor - 1 > min(DOUBT_MARGIN * allowance, MAX_EXCUSE):
        return None  # beyond what the doubt can explain: it stands (and is re-measured)
    within = f"{ratio:.3f}x is within {DOUBT_MARGIN:g} x its allowance of {allowance:.0%}"
    if not reasons:
        return f"the machine drifted {drift:.1%} (reference kernels): {within} once that is divided out"
    return "; ".join(reasons) + f"; {within}"


class Gate:
    """A loaded baseline, the rule and the default threshold: judges records where they are measured."""

    def __init__(self, baseline: Baseline, rule_name: str, threshold: float,
                 threshold_from: str = "--opperf-max-regression", strict: bool = False):
        self.baseline = baseline
        self.rule = rule_name
        self.threshold = threshold
        self.threshold_from = threshold_from
        self.strict = strict  # an inconclusive case fails (--opperf-inconclusive=fail)

    def judge_record(self, record: dict, case_threshold: Optional[tuple[float, str]] = None,
                     scale: Optional[float] = None, drift: Optional[float] = None,
                     unknown: Optional[str] = None, slower: Optional[float] = None) -> dict:
        """The verdict on a measured record; case_threshold (from the config) overrides the default.
        unknown: why this machine's speed against the baseline's cannot be known (None: it can)."""
        threshold, source = case_threshold or (self.threshold, self.threshold_from)
        new = {**Record(record).to_baseline_entry(), "contended": record.get("contended"),
               "contention": record.get("contention")}
        return judge(self.baseline.entries.get(case_key(new)), new, threshold, self.rule, source, scale, drift,
                     self.strict, unknown, slower)

    def failure_message(self, verdict: dict) -> str:
        """What a failed test says: the case, both times, the ratio, the threshold and the rule."""
        if verdict["verdict"] == "inconclusive":
            ratio = "" if verdict["ratio"] is None else f" ({verdict['ratio']:.3f}x its baseline)"
            return (f"performance inconclusive, failed by --opperf-inconclusive=fail: {verdict['case']}{ratio}: "
                    f"{verdict['notes']}")
        noise = verdict["noise_rel"]
        beyond = f"beyond the noise of {noise:.1%}" if noise else "no noise allowance"
        text = (f"performance regression: {verdict['case']}: {verdict['time_us']:.4g} us against "
                f"{verdict['base_time_us']:.4g} us in {self.baseline.source}: {verdict['ratio']:.3f}x, more than the "
                f"{1 + verdict['threshold']:.4g}x allowed (max regression {pct(verdict['threshold'])} from "
                f"{verdict['threshold_from']}) and {beyond} (rule {verdict['rule']})")
        return text + (f"; {verdict['notes']}" if verdict["notes"] else "")


def pct(value: float) -> str:
    """5% for 0.05, 2.5% for 0.025."""
    return f"{value:.0%}" if abs(value * 100 - round(value * 100)) < 1e-9 else f"{value:.1%}"
