"""When a difference between two rows is one: the rule every view uses before it calls a backend
faster, draws a speedup bar in colour or names a winner.

Two rows differ significantly when their medians' 95% confidence intervals do not overlap (the
gap exceeds both intervals) and neither row is unstable (its `unstable` column: its median did not
reproduce, measure/stats.py) nor contended (the machine was busy with other work during the case;
the `contended` column, where the run recorded it). A row without a CI (too few samples) cannot
support a claim either. A wide row (a large `cv`) is judged by its CI, which its spread widens.
Everything else is shown as "not significant": a grey bar, a "~" before the ratio; in words,
"cannot judge: unstable (median drift +8.0%)" where a row forbids any verdict (unstable, contended, no CI:
a gap of any size could be noise), and "no significant difference" only where both rows were
measured well and their intervals overlap.

>>> fast = {"time_us": 10.0, "ci_rel": 0.01, "cv": 0.02}
>>> slow = {"time_us": 12.0, "ci_rel": 0.01, "cv": 0.02}
>>> why_not(fast, slow) is None, why_not(fast, {**slow, "unstable": 1, "median_drift": 0.08})
(True, 'unstable (median drift +8.0%)')
>>> ratio_text(1.2, None), ratio_text(20.09, "unstable (median drift +8.0%)")
('1.20x', '~20.09x')
>>> verdict_text("unstable (median drift +8.0%)"), verdict_text(OVERLAP)
('cannot judge: unstable (median drift +8.0%)', 'no significant difference')
"""

from __future__ import annotations

from typing import Optional

MARK = "~"  # before a ratio that is not significant
NOTE = (f"{MARK}: not significant: the medians' 95% confidence intervals overlap, or a row is unstable "
        f"(its median moved between the halves of its samples), contended or without a CI")
OVERLAP = "the confidence intervals overlap"  # the one reason that is a verdict: no difference


def why_not(a: dict, b: dict) -> Optional[str]:
    """Why the difference between rows a and b is not significant; None when it is."""
    for row in (a, b):
        reason = _unfit(row)
        if reason:
            return reason
    fast, slow = sorted((a, b), key=lambda r: r["time_us"])
    if fast["time_us"] * (1 + fast["ci_rel"]) >= slow["time_us"] * (1 - slow["ci_rel"]):
        return OVERLAP
    return None


def verdict_text(reason: str) -> str:
    """In words, for a pair why_not gave `reason` for: "no significant difference" only where the
    intervals overlap; otherwise no verdict can be drawn, and the words say why."""
    return "no significant difference" if reason == OVERLAP else f"cannot judge: {reason}"


def significant(a: dict, b: dict) -> bool:
    return why_not(a, b) is None


def _unfit(row: dict) -> Optional[str]:
    """Why one row cannot support a comparison: unstable, contended, no CI; None when it can."""
    if row.get("unstable"):
        drift = row.get("median_drift")
        return f"unstable (median drift {drift:+.1%})" if drift is not None else "unstable"
    if row.get("contended"):
        return "contended"
    if row.get("ci_rel") is None or row.get("time_us") is None:
        return "no confidence interval"
    return None


def ratio_text(ratio: Optional[float], reason: Optional[str]) -> str:
    """'1.20x' when significant, '~1.20x' when not (reason: why_not's answer); '-' without a ratio."""
    if ratio is None:
        return "-"
    return f"{MARK if reason else ''}{ratio:.2f}x"
