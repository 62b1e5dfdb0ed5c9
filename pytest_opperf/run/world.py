"""The pytest side of a torchrun sweep (run/ranks.py): every rank's hooks.

    collection   rank 0 deals the kernel cases, every rank keeps its share and every collective
                 case (after the kernel cases, in one order); the others are deselected
    each case    a rank > 0 mails its row (or its failure) to rank 0; rank 0 reads its mail
    collectives  every rank waits for the others before the first collective case, for as long
                 as their heartbeats say they are alive, then the groups are made
    the end      a rank > 0 mails that it is done; rank 0 waits for every rank (or names the one
                 that stopped answering), then writes, as the one writer
    the terminal rank 0 shows the session; a rank > 0 writes its output to a log file
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf.catalog.ops.collective import is_collective
from pytest_opperf.case import case_of
from pytest_opperf.record import Record
from pytest_opperf.run import durations, ranks, shard
from pytest_opperf.run.controller import Controller
from pytest_opperf.run.ranks import Mailbox, Rank

EXIT_RANK_LOST = 3  # pytest's INTERNAL_ERROR: rows of the sweep are missing
COLLECTIVES = "collectives"  # the meeting point before the first collective case
STOP = "stop"  # a rank's session stopped at a failure (-x, --maxfail): every rank stops


class World:
    """Hooks of every rank of a torchrun sweep."""

    def __init__(self, config: pytest.Config, rank: Rank, controller: Optional[Controller],
                 durations: dict):
        self.config = config
        self.rank = rank
        self.controller = controller  # rank 0 only
        self.durations = durations  # test id -> recorded seconds (rank 0: from its database), for dealing
        self.mailbox = Mailbox.open(rank, rank.timeout_s)
        self.heartbeat: Optional[ranks.Heartbeat] = None
        self.failures: list[str] = []  # rank 0: the other ranks' failed cases, one line each
        self.shares: dict[int, int] = {}  # rank -> kernel cases dealt to it
        self.counts: dict[int, dict] = {}  # rank -> its outcome counts, from its `done`
        self.logs: dict[int, str] = {}  # rank -> where its output went (host:path), from its `done`
        self.lost: list[str] = []  # rank 0: ranks that stopped answering, one line each
        self.received: dict[int, int] = {}  # rank -> rows received from it
        self.log_path: Optional[Path] = None
        self.session: Optional[pytest.Session] = None
        self.stopped = False  # this rank told the others to stop
        # Before the collective cases: None until this rank asked; then "" (every rank came), or why
        # the meeting was called off and the collective cases cannot run.
        self.meeting: Optional[str] = None
        if rank.rank > 0:
            self.log_path = ranks.QUIET.get("log")
            self.heartbeat = ranks.Heartbeat(self.mailbox, self._rank0_lost)
            self.heartbeat.start()

    # --- collection ---------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list) -> None:
        # trylast: after -k/-m/--lf and the shard: the ranks share what was selected.
        ids = [item.nodeid for item in items]
        try:
            everyone = ranks.gather_ids(ids, self.rank)
        except Exception as exc:  # noqa: BLE001 (a rank that failed its collection never arrives)
            raise pytest.UsageError(f"rank {self.rank.rank}: the other ranks did not all finish collecting within "
                                    f"{self.rank.timeout_s:g} s (--opperf-rank-timeout); one stopped before its "
                                    f"cases (rank 0's terminal or the rank's log says why): {type(exc).__name__}"
                                    ) from None
        for r, theirs in enumerate(everyone):
            if theirs != ids:
                raise pytest.UsageError(
                    f"rank {r} (host {self.rank.hosts[r]}) collected {len(theirs)} cases and rank {self.rank.rank} "
                    f"{len(ids)}, or in another order: run the same checkout, configs and arguments on every node")
        kernel = [item.nodeid for item in items if not _collective(item)]
        dealt = ranks.broadcast(deal(kernel, self.durations, self.rank.world_size) if self.rank.rank == 0 else None,
                                self.rank)
        self.shares = {r: sum(1 for v in dealt.values() if v == r) for r in range(self.rank.world_size)}
        mine = [item for item in items if not _collective(item) and dealt[item.nodeid] == self.rank.rank]
        others = [item for item in items if not _collective(item) and dealt[item.nodeid] != self.rank.rank]
        collective = [item for item in items if _collective(item)]
        if others:
            config.hook.pytest_deselected(items=others)
        items[:] = mine + collective

    # --- each case ----------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.rank.rank == 0:
            return
        record = getattr(report, "opperf_record", None)
        if report.when == "call" and record is not None and (report.passed or Record(record).gate_fails):
            self.mailbox.send("row", {"record": dict(record)})
        if report.failed:
            text = report.longreprtext.strip().splitlines()
            self.mailbox.send("failed", {"nodeid": report.nodeid, "when": report.when,
                                         "line": text[-1] if text else "",
                                         "check_failed": getattr(report, "opperf_check_failed", None)})

    # --- the collectives: every rank there before the first -----------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # A rank whose kernel cases end early would otherwise wait for the others inside the first
        # group's creation, bounded by --opperf-rank-timeout: a share that runs minutes longer than
        # another (no recorded times to deal by) would fail every collective case. Here a rank
        # waits as long as the others are alive (their heartbeats), however long their cases take.
        if not _collective(item):
            return
        if self.meeting is None:
            self.meeting = self._meet(COLLECTIVES) or ""
        if self.meeting:
            pytest.fail(f"collective cases not run: {self.meeting}", pytrace=False)

    def _meet(self, name: str) -> Optional[str]:
        """Wait until every rank reached `name`; None, or why the meeting was called off (rank 0
        calls it off when a rank that has not arrived stops answering)."""
        self.mailbox.arrive(name)
        while True:
            why = self.mailbox.called_off(name)  # checked first: a late rank completes a count rank 0 gave up on
            if why or self.mailbox.arrived(name) >= self.rank.world_size:
                return why
            if self.rank.rank == 0:
                self._read_mail()  # the others' rows keep arriving meanwhile
                silent = self.mailbox.silent()
                if silent:
                    why = "; ".join(f"rank {r} stopped answering before them (silent for {s:.0f} s, "
                                    f"--opperf-rank-timeout={self.rank.timeout_s:g})" for r, s in silent)
                    self.mailbox.call_off(name, why)
                    return why
            time.sleep(ranks.POLL_S)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.rank.rank == 0:
            self._read_mail()
        self._spread_stop()

    def _spread_stop(self) -> None:
        """A rank whose session stops at a failure (-x or --maxfail: pytest's shouldfail) stops
        every rank's after its current case: the sweep is one session, and rank 0 must not wait for
        the rest of the others' shares (nor they for rank 0 at the collectives). A rank that stops
        for its own device (shouldstop: it no longer works) stops alone: the others' GPUs measure
        on, and it calls the collectives' meeting off as it ends."""
        session = self.session
        if session is None:
            return
        mine = session.shouldfail
        if mine and not self.stopped:
            self.stopped = True
            self.mailbox.call_off(STOP, f"rank {self.rank.rank} stopped: {mine}")
        elif not mine:
            why = self.mailbox.called_off(STOP)
            if why:
                session.shouldfail, self.stopped = why, True

    def _read_mail(self) -> None:
        for r, message in self.mailbox.receive():
            self._take(r, message)

    def _take(self, r: int, message: dict) -> None:
        kind = message["kind"]
        if kind == "row" and self.controller is not None:
            self.controller.add_record(message["record"])
            self.received[r] = self.received.get(r, 0) + 1
        elif kind == "failed":
            if message.get("check_failed") and self.controller is not None:
                self.controller.mark_check_failed(dict(message["check_failed"]))  # its stored rows stop being current
            self.failures.append(f"rank {r}: FAILED {message['nodeid']}"
                                 + (f" ({message['when']})" if message["when"] != "call" else "")
                                 + (f": {message['line']}" if message["line"] else ""))
        elif kind == "done":
            self.counts[r] = message["counts"]
            if message.get("log"):
                self.logs[r] = message["log"]

    # --- the end ------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # tryfirst: before the controller writes, so rank 0 holds every rank's rows by then.
        if self.meeting is None:  # no rank waits at the collectives for one that will not come
            self.mailbox.call_off(COLLECTIVES, f"rank {self.rank.rank} ended its session before the collective cases")
        if self.rank.rank > 0:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            stats = getattr(reporter, "stats", {}) if reporter is not None else {}
            counts = {k: len(v) for k, v in stats.items() if k in ("passed", "failed", "skipped", "error")}
            self.mailbox.send("done", {"counts": counts, "log": f"{self.rank.hosts[self.rank.rank]}:{self.log_path}",
                                       "status": int(exitstatus)})
            if self.heartbeat is not None:
                self.heartbeat.stopped.set()
            return
        ended = None  # why rank 0 stopped waiting for the others, when it did not see them all finish
        try:
            if exitstatus == pytest.ExitCode.INTERRUPTED:
                raise KeyboardInterrupt("the session was interrupted")
            self._spread_stop()  # a rank 0 that stopped early (-x) has the others stop after their current case
            silent = self.mailbox.wait_for_all(self._take)
        except KeyboardInterrupt as exc:
            # SIGTERM/SIGINT (torchrun's agents end every rank once one has failed): keep what arrived.
            for r, message in self.mailbox.receive():
                self._take(r, message)
            ended = str(exc) or "interrupted"
            silent = [(r, None) for r in range(1, self.rank.world_size) if not self.mailbox.done[r]]
        for r, seconds in silent:
            why = (f"silent for {seconds:.0f} s (--opperf-rank-timeout={self.rank.timeout_s:g})" if seconds is not None
                   else f"not finished when this rank was stopped ({ended})")
            self.lost.append(f"rank {r} (node {self.rank.nodes[r]}, host {self.rank.hosts[r]}) stopped answering: "
                             f"{why}; {self.received.get(r, 0)} of its {self.shares.get(r, 0)} kernel cases reached "
                             f"rank 0, the rest are not stored")
        if self.controller is not None:
            self.controller.notes.extend(self.summary_lines())
        if self.failures and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.lost and session.exitstatus in (0, 1):
            session.exitstatus = EXIT_RANK_LOST

    def summary_lines(self) -> list[str]:
        r = self.rank
        shares = ", ".join(f"rank {k} {v}" for k, v in sorted(self.shares.items()))
        lines = [f"torchrun: {r.world_size} ranks on {r.num_nodes} node{'s' if r.num_nodes > 1 else ''}; kernel "
                 f"cases dealt: {shares}; collective cases on every rank"]
        for k, counts in sorted(self.counts.items()):
            told = ", ".join(f"{v} {name}" for name, v in counts.items() if v)
            where = f" (its output: {self.logs[k]})" if k in self.logs else ""
            lines.append(f"rank {k}: {told or 'nothing run'}{where}")
        return lines + self.failures + [f"ERROR: {line}" for line in self.lost]

    def _rank0_lost(self, why: str) -> None:
        # Rank 0 (and the store it held) is gone: this rank's rows have nowhere to go.
        sys.__stderr__.write(f"opperf: rank {self.rank.rank}: rank 0 is gone ({why}); ending this rank\n")
        os._exit(EXIT_RANK_LOST)


def deal(ids: list, recorded: dict, world: int) -> dict:
    """Kernel cases to ranks: longest recorded first to the least loaded rank (shard.lpt; cases
    without history weigh the median of those with), round-robin without any history.

    >>> deal(["a", "b", "c", "d"], {}, 2)
    {'a': 0, 'c': 0, 'b': 1, 'd': 1}
    >>> deal(["a", "b", "c"], {"a": 1.0, "b": 5.0, "c": 3.0}, 2)
    {'b': 0, 'c': 1, 'a': 1}
    """
    weights, _ = durations.estimate(ids, recorded)
    return {case: r for r, share in enumerate(shard.lpt(weights, world)) for case in share}


def _collective(item) -> bool:
    case = case_of(item)
    return case is not None and is_collective(case.op)
