"""The gate's part of the run loop (pytest hooks; the gate's logic is gate/session.py), in each process that runs cases (an xdist worker, or the one
process without xdist).

Machine reference: the reference kernels (gate.drift) are timed before the first case and
after the last; the timings reach the controller (xdist: in the worker's output).

Confirm before failing (--opperf-confirm=N): a case whose measurement the gate failed
(regressed; or inconclusive under --opperf-inconclusive=fail) is not reported yet. Its reports are held back, and after the last case of the
process it is measured again, up to N times, through the same test function, `bench`
fixture, timer and settings, with fresh inputs (the `inputs` fixture seeds them anew in each
round). It fails only if the gate fails every re-measurement too; one that it does not clears
it, and the case passes with the verdict of that re-measurement. Its reports then go out as
they would have, with the measurement the gate judged last as the case's row: its time is the
one every view shows (summary, gate table, database, report, HTML, compare), the first
measurement is kept in `time_us_first`, and the verdict lists every measurement. A
re-measurement that fails for another reason (an error, a failed check) leaves the first
failure standing, and the row the first measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest
from _pytest.runner import runtestprotocol

from pytest_opperf.gate import drift
from pytest_opperf.measure import contention
from pytest_opperf.gate.session import GateSession, summary_of
from pytest_opperf.record import Record
from pytest_opperf.run.env import RunEnv

REFERENCE_OUTPUT = "opperf_reference"  # key of the worker's output (xdist workeroutput)


@dataclass
class Held:
    """A case that looked regressed: its first reports, and every measurement's summary so far."""

    item: pytest.Item
    reports: list
    measurements: list = field(default_factory=list)
    last_call: Optional[pytest.TestReport] = None  # the latest re-measurement's call report
    problem: Optional[str] = None  # why a re-measurement gave no verdict

    @property
    def call(self) -> pytest.TestReport:
        return next(r for r in self.reports if r.when == "call")

    @property
    def open(self) -> bool:
        """Failed by the gate in every measurement so far, and each gave a verdict."""
        return self.problem is None and all(m.get("fails", m["verdict"] == "regressed") for m in self.measurements)


class GateLoop:
    """Hooks of a process that runs cases: the machine reference and confirmation rounds."""

    def __init__(self, config: pytest.Config, env: RunEnv, gate: GateSession):
        self.config = config
        self.env = env
        self.gate = gate
        self.rounds = env.settings.confirm if gate.gate is not None else 0
        self.held: list[Held] = []
        self.rerun: Optional[list] = None  # during a confirmation round: the reports of its protocol
        self.reference: dict = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        if session.config.option.collectonly or not session.items:
            return (yield)
        self._time_reference("start")
        try:
            result = yield
        except BaseException:
            self._release()  # interrupted (-x, Ctrl-C): what was held is reported as first measured
            raise
        self._time_reference("end")
        self._confirm(session)
        self._release()
        self._publish()
        return result

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]):
        if not self.rounds:
            return None
        if self.rerun is not None:
            self.rerun = runtestprotocol(item, nextitem=nextitem, log=False)
            return True
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        call = next((r for r in reports if r.when == "call"), None)
        if call is not None and call.failed and Record(getattr(call, "opperf_record", None) or {}).gate_fails:
            first = call.opperf_record["gate"]
            self.held.append(Held(item, reports, [summary_of(first, "in its turn")]))
            return True
        _log(item, reports)
        return True

    # --- the machine reference -------------------------------------------------------------

    def _time_reference(self, when: str) -> None:
        env = self.env
        probe = env.device.contention_probe() if env.settings.contention else None
        try:
            env.device.clock_warmer(env.settings).before_case()
            if probe is not None:
                probe.start(contention.own_threads(env.torch.type))
            timings = drift.time_reference(env.torch, env.reference_timer(), env.settings.warmup_s)
        except Exception as exc:  # noqa: BLE001 (the run goes on without a machine reference)
            self.reference.setdefault("errors", []).append(f"{when}: {type(exc).__name__}: {exc}")
            return
        seen = probe.stop() if probe is not None else {}
        if seen.get("contended"):
            timings["contended"] = seen["contention"]  # a baseline saved from it is marked (drift.unsteady)
        self.reference[when] = timings
        self.gate.set_reference(timings)

    def _publish(self) -> None:
        if hasattr(self.config, "workeroutput"):
            self.config.workeroutput[REFERENCE_OUTPUT] = self.reference
        else:
            self.gate.add_reference(self.reference)

    # --- confirmation ----------------------------------------------------------------------

    def _confirm(self, session: pytest.Session) -> None:
        for _ in range(self.rounds):
            batch = [h for h in self.held if h.open]
            for i, held in enumerate(batch):
                nextitem = batch[i + 1].item if i + 1 < len(batch) else None
                self._remeasure(held, nextitem)
                if session.shouldstop:
                    return

    def _remeasure(self, held: Held, nextitem: Optional[pytest.Item]) -> None:
        self.gate.confirming = held.measurements
        self.rerun = []
        try:
            held.item.config.hook.pytest_runtest_protocol(item=held.item, nextitem=nextitem)
        finally:
            reports, self.rerun = self.rerun or [], None
            self.gate.confirming = None
        call = next((r for r in reports if r.when == "call"), None)
        verdict = ((getattr(call, "opperf_record", None) or {}).get("gate")) if call is not None else None
        if verdict is None or "measurements" not in verdict:
            failed = next((r for r in reports if r.failed), None)
            why = "skipped" if call is None or call.skipped else "failed"
            if failed is not None and failed.longreprtext:
                why += ": " + failed.longreprtext.strip().splitlines()[-1][:300]
            held.problem = f"the re-measurement {why}"
            return
        held.measurements = verdict["measurements"]
        held.last_call = call

    def _release(self) -> None:
        """Report what was held: confirmed, cleared, or (no re-measurement) as first measured."""
        held, self.held = self.held, []
        for h in held:
            call = h.call
            record = dict(call.opperf_record)
            if h.last_call is not None:
                # One number per case: the row is what the gate judged, the sweep's own time kept beside it.
                record = {**h.last_call.opperf_record, "time_us_first": record["time_us"]}
                verdict = record["gate"]
                if verdict.get("fails"):
                    call.longrepr = h.last_call.longrepr
                else:
                    call.outcome, call.longrepr = "passed", None
            elif h.problem is not None:
                record["gate"] = {**record["gate"], "notes": "; ".join(
                    n for n in (record["gate"]["notes"], f"not confirmed: {h.problem}") if n)}
            call.opperf_record = record
            _xdist_at(h.item)
            h.item.ihook.pytest_runtest_logstart(nodeid=h.item.nodeid, location=h.item.location)
            _log(h.item, h.reports)


def _log(item: pytest.Item, reports: list) -> None:
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _xdist_at(item: pytest.Item) -> None:
    """Point an xdist worker's report channel at item: it tags each report with the index of the
    item it runs now, and a held report goes out after later items ran."""
    for plugin in item.config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "item_index"):
            plugin.item_index = item.session.items.index(item)
