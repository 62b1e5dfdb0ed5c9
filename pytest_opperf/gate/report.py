"""What a comparison against a baseline says: a terminal table, a markdown report, a JSON report.

The same Comparison serves the gate at the end of a session and `opperf compare A B`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from pytest_opperf.gate import drift
from pytest_opperf.gate.baseline import ENV_FIELDS, Baseline, case_name
from pytest_opperf.gate.rules import VERDICTS, pct
from pytest_opperf.record import Record

REPORT_FORMAT = "pytest-opperf-report/1"
LISTED = 10  # names listed per group of new / not-run cases before "... and N more"


@dataclass
class Comparison:
    verdicts: list[dict]  # one per measured case (rules.judge's dicts)
    baseline: Baseline
    rule: str
    threshold: float  # the default; a case's own is in its verdict
    not_run: list[str] = field(default_factory=list)  # baseline cases this run did not measure
    environment: list[str] = field(default_factory=list)  # environment differences, one line each
    machine: Optional[dict] = None  # gate.drift.summary: the machine's drift, when the run measured it

    @classmethod
    def build(cls, baseline: Baseline, verdicts: list[dict], rule: str, threshold: float,
              device: str, environment: dict, machine: Optional[dict] = None) -> "Comparison":
        measured = {v["key"] for v in verdicts}
        not_run = [case_name(e) for k, e in sorted(baseline.entries.items(), key=lambda kv: case_name(kv[1]))
                   if k not in measured]
        return cls(verdicts, baseline, rule, threshold, not_run, environment_differences(baseline, device, environment),
                   machine)

    def cleared(self) -> int:
        """Cases that looked regressed and that their re-measurement did not confirm."""
        return sum(1 for v in self.verdicts if v.get("confirm") == "cleared")

    def machine_lines(self) -> list[str]:
        return drift.lines(self.machine) if self.machine else []

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v["verdict"] == verdict)

    def failures(self) -> int:
        """Cases the gate failed: regressed, and inconclusive ones under --opperf-inconclusive=fail."""
        return sum(1 for v in self.verdicts if v.get("fails", v["verdict"] == "regressed"))

    @property
    def failed(self) -> bool:
        return self.failures() > 0

    def ordered(self, show_same: bool = False) -> list[dict]:
        """Regressions (worst first), improvements (best first), then the rest by verdict."""
        rank = {v: i for i, v in enumerate(VERDICTS)}
        rows = [v for v in self.verdicts if show_same or v["verdict"] not in ("same", "new") or v.get("confirm")]

        def order(v):
            ratio = v["ratio"] or 1.0
            return rank[v["verdict"]], -ratio if v["verdict"] == "regressed" else ratio, v["case"]

        return sorted(rows, key=order)

    def headline(self) -> str:
        counts = ", ".join(f"{self.count(v)} {v}" for v in VERDICTS[:-1] if self.count(v) or v == "regressed")
        tail = []
        if self.count("new"):
            tail.append(f"{self.count('new')} not in the baseline")
        if self.not_run:
            tail.append(f"{len(self.not_run)} baseline cases not run")
        if self.cleared():
            tail.append(f"{self.cleared()} cleared by re-measurement")
        failed_inconclusive = self.failures() - self.count("regressed")
        if failed_inconclusive > 0:
            tail.append(f"{failed_inconclusive} inconclusive failed (--opperf-inconclusive=fail)")
        return counts + ("; " + ", ".join(tail) if tail else "")

    def preamble(self) -> str:
        return (f"baseline {self.baseline.source} (device {self.baseline.device}), rule {self.rule}, "
                f"max regression {pct(self.threshold)} by default")

    # --- terminal ---------------------------------------------------------------------------

    def lines(self, limit: int = 100, show_same: bool = False,
              table: Optional[Callable[[list[dict]], list[str]]] = None) -> list[str]:
        """The terminal report; `table` renders the verdicts' table (a view that fits a terminal)."""
        out = [self.preamble()]
        rows = self.ordered(show_same)
        if rows and limit:
            out += (table or _table)(rows[:limit])
            if len(rows) > limit:
                out.append(f"... {len(rows) - limit} more")
        new = [v["case"] for v in self.verdicts if v["verdict"] == "new"]
        if new:
            out.append(f"not in the baseline ({len(new)}): {_names(new)}")
        if self.not_run:
            out.append(f"in the baseline, not run ({len(self.not_run)}): {_names(self.not_run)}")
        out += [f"environment: {line}" for line in self.environment]
        out += [f"machine: {line}" for line in self.machine_lines()]
        advice = self.advice()
        if advice:
            out.append(f"gate: {advice}")
        out.append(("gate: FAILED: " if self.failed else "gate: passed: ") + self.headline())
        return out

    def advice(self) -> Optional[str]:
        """What to do about the inconclusive cases (None without any): why they could not be judged,
        counted, and the step that would let the next run judge them."""
        reasons = [v.get("reason") or "" for v in self.verdicts if v["verdict"] == "inconclusive"]
        if not reasons:
            return None
        kinds = [("contended while measured", "contended", "run the gate where nothing else competes for the machine"),
                 ("unsteady machine", "against a baseline timed on an unsteady machine",
                  "save the baseline again on a quiet machine"),
                 ("the machine drifted", "on a machine that drifted",
                  "rerun on a quiet machine, or with --opperf-normalize=reference")]
        said, steps = [], []
        for needle, what, step in kinds:
            n = sum(1 for r in reasons if needle in r)
            if n:
                said.append(f"{n} {what}")
                steps.append(step)
        strict = "they fail (--opperf-inconclusive=fail)" if self.failures() > self.count("regressed") else "they pass"
        return (f"{len(reasons)} inconclusive ({', '.join(said) or 'see their notes'}): {strict}; to judge them, "
                + ("; ".join(steps) or "rerun on a quiet machine"))

    # --- markdown ---------------------------------------------------------------------------

    def markdown(self, title: str = "opperf gate") -> str:
        strict = self.failures() - self.count("regressed")
        status = (", ".join([f"{self.count('regressed')} regressed"] + ([f"{strict} inconclusive"] if strict else []))
                  if self.failed else "passed")
        out = [f"### {title}: {status}", "", self.preamble().capitalize() + ".", "", f"**{self.headline()}**", ""]
        rows = self.ordered()
        if rows:
            out += ["| case | baseline (us) | time (us) | ratio | max | noise | verdict | notes |",
                    "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
            for v in rows:
                out.append(f"| `{v['case']}` | {_num(v['base_time_us']).strip()} | {_num(v['time_us']).strip()} | "
                           f"{_ratio(v['ratio']).strip()} | {pct(v['threshold'])} | {_noise(v['noise_rel']).strip()} | "
                           f"{v['verdict']} | {v['notes']} |")
            out.append("")
        new = [v["case"] for v in self.verdicts if v["verdict"] == "new"]
        for label, names in (("Not in the baseline", new), ("In the baseline, not run", self.not_run)):
            if names:
                out += [f"<details><summary>{label}: {len(names)}</summary>", "",
                        *[f"- `{n}`" for n in names], "", "</details>", ""]
        if self.advice():
            out += [f"Inconclusive: {self.advice()}.", ""]
        if self.environment:
            out += ["Environment differences:", "", *[f"- {line}" for line in self.environment], ""]
        if self.machine_lines():
            out += ["Machine:", "", *[f"- {line}" for line in self.machine_lines()], ""]
        return "\n".join(out)

    def as_dict(self) -> dict:
        return {"baseline": self.baseline.source, "baseline_device": self.baseline.device, "rule": self.rule,
                "max_regression": self.threshold, "failed": self.failed,
                "counts": {v: self.count(v) for v in VERDICTS}, "not_run": list(self.not_run),
                "environment_differences": list(self.environment), "cleared": self.cleared(),
                "machine": self.machine}


def environment_differences(baseline: Baseline, device: str, environment: dict) -> list[str]:
    """One line per fact that differs between the baseline's environment and this one."""
    out = []
    if baseline.device != device:
        out.append(f"device: {baseline.device} in the baseline, {device} here")
    for name in ENV_FIELDS:
        old, new = baseline.environment.get(name), environment.get(name)
        if old != new and (old is not None or new is not None):
            out.append(f"{name}: {old} in the baseline, {new} here")
    return out


def run_report(records: list[dict], run: dict, comparison: Optional[Comparison]) -> dict:
    """The JSON report of a run (seed 002's template per case): commit, device, p50/p95, ratio, verdict."""
    cases = []
    for r in records:
        gate = r.get("gate") or {}
        entry = Record(r).to_baseline_entry()
        cases.append({
            "case": case_name(entry), "test_id": r["test_id"], "op": r["op"], "params": entry["params"],
            "dtype_in": r["dtype_in"], "dtype_out": r["dtype_out"], "backend": r["backend"],
            "backend_version": r["backend_version"], "knobs": r["knobs"], "timer": r["timer"], "cache": r["cache"],
            "p50_us": r["time_us"], "p95_us": r["time_us_p95"], "mean_us": r["time_us_mean"], "cv": r["cv"],
            "ci_rel": r["ci_rel"], "samples": r["samples"], "gflops": r.get("gflops"),
            "gbytes_per_s": r.get("gbytes_per_s"), "mfu": r.get("mfu"), "mbu": r.get("mbu"),
            "baseline_p50_us": gate.get("base_time_us"), "ratio": gate.get("ratio"),
            "max_regression": gate.get("threshold"), "noise_rel": gate.get("noise_rel"),
            "verdict": gate.get("verdict"), "notes": gate.get("notes"), "reason": gate.get("reason"),
            "contended": r.get("contended"), "contention": r.get("contention"),
            "baseline_runs": gate.get("runs"), "run_noise_rel": gate.get("run_noise_rel"), "scale": gate.get("scale"),
            "confirm": gate.get("confirm"), "measurements": gate.get("measurements"),
        })
    return {
        "format": REPORT_FORMAT, "commit": run.get("git_commit"), "git_dirty": run.get("git_dirty"),
        "device": run.get("device"), "run_id": run.get("run_id"), "started_at": run.get("started_at"),
        "ended_at": run.get("ended_at"), "environment": {k: run.get(k) for k in ENV_FIELDS},
        "gate": comparison.as_dict() if comparison else None, "cases": cases,
    }


def _table(rows: list[dict]) -> list[str]:
    out = [f"{'case':<56} {'base_us':>10} {'time_us':>10} {'ratio':>7} {'max':>5} {'noise':>6}  verdict"]
    for v in rows:
        out.append(f"{v['case'][:56]:<56} {_num(v['base_time_us'])} {_num(v['time_us'])} "
                   f"{_ratio(v['ratio'])} {pct(v['threshold']):>5} {_noise(v['noise_rel'])}  "
                   f"{v['verdict'].upper()}{'  (' + v['notes'] + ')' if v['notes'] else ''}")
    return out


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" ... and {len(names) - LISTED} more" if len(names) > LISTED else "")


def _num(value) -> str:
    return f"{'-':>10}" if value is None else f"{value:>10.2f}"


def _ratio(value) -> str:
    return f"{'-':>7}" if value is None else f"{value:>6.3f}x"


def _noise(value) -> str:
    return f"{'-':>6}" if value is None else f"{value:>6.1%}"
