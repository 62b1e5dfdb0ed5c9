"""Collective cases: the rank processes, and the `collective` fixture that checks, times and records.

    def test_all_reduce(backend, collective):
        collective(backend)

How cases meet the process group. The session starts `num_devices` rank processes (one per
device: NCCL on CUDA, gloo on a CPU, HCCL on an NPU) the first time a case needs that many, and
keeps them: later cases of that size are sent to the same ranks over pipes. Starting a group
costs seconds (a Python process importing torch per rank, a communicator's set-up), more than
most cases take, so one group per size, not per case. Isolation is kept where it matters: a
rank that dies, errs or does not answer within --opperf-rank-timeout fails its case, the
group's processes are ended (only the ones this session started) and the next case of that
size starts a fresh group. Nothing of the test process is shared with the ranks but plain
data and functions named by module.

This process never joins a group: it only coordinates, so a hung collective cannot hang it.
Under xdist every worker that runs collective cases starts its own groups, on the devices it
sees: run the collective bench file without -n (docs/collectives.md).
"""

from __future__ import annotations

import datetime as dt
import functools
import multiprocessing
import time
import uuid
from typing import Callable, Optional

import pytest

from pytest_opperf.catalog.ops.collective import COLLECTIVES, algbw_gbps, is_collective
from pytest_opperf.catalog.registry import OPS
from pytest_opperf.run.bench import RECORD_KEY, Bench, case_seed, pick
from pytest_opperf.measure import sampler
from pytest_opperf.measure.collective import rank_main
from pytest_opperf.measure.stats import Stats, StoppingRule

POOLS_KEY = pytest.StashKey[dict]()
TIMERS = ("cpu", "event")  # what a rank can time a collective with (measure/collective.py)
POLL_S = 0.05  # how often a wait looks at the ranks' processes
CLOSE_S = 5.0  # how long ranks get to leave their group before they are killed
# Starting a group (an interpreter and torch per rank, the communicator) gets at least this long.
START_S = 120.0
DEATH_GRACE_S = 0.5  # after a failure, how long the other ranks get to show whether they died
# Topology tiers (seed 001): 0 across nodes, 1 within a node, 2 within a die or package.
ACROSS_NODES, WITHIN_NODE, WITHIN_PACKAGE = 0, 1, 2


class RankFailure(Exception):
    """A rank died, raised, or did not answer in time: its group can no longer be trusted."""


def comm_backend(device_type: str) -> Optional[str]:
    """The torch.distributed backend of a device type: nccl on cuda, gloo on cpu, hccl on npu, ...

    >>> comm_backend("cuda"), comm_backend("cpu"), comm_backend("npu")
    ('nccl', 'gloo', 'hccl')
    """
    import torch.distributed as dist

    known = {**dist.Backend.default_device_backend_map, "npu": "hccl"}
    return known.get(device_type)


class RankGroup:
    """`size` rank processes in one process group, each driven over its own pipe.

    Every command goes to every rank and waits for every answer, each rank bounded by
    `timeout_s`: a rank that exits or does not answer in time raises RankFailure, as does an
    answer that is an error.
    """

    def __init__(self, size: int, device_type: str, timeout_s: float):
        import torch.distributed as dist

        self.size, self.device_type, self.timeout_s = size, device_type, timeout_s
        backend = comm_backend(device_type)
        # The store lives here, on a port the OS picks: no race for a fixed MASTER_PORT.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=dt.timedelta(seconds=timeout_s))
        setup = {"device_type": device_type, "comm_backend": backend, "host": "127.0.0.1", "port": self.store.port,
                 "prefix": uuid.uuid4().hex, "timeout_s": timeout_s,
                 "imports": ["torch_npu"] if device_type == "npu" else []}
        ctx = _context()
        self.procs, self.conns = [], []
        for rank in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=rank_main, args=(rank, size, setup, child), daemon=True,
                               name=f"opperf-rank{rank}of{size}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        ready = self._answers("start", expect="ready", timeout_s=max(timeout_s, START_S))
        self.hosts = ready[0]["hosts"]

    def ask(self, command: str, **args) -> list:
        """Send a command to every rank; their answers, in rank order."""
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((command, args))
            except (OSError, ValueError) as exc:
                raise RankFailure(f"rank {rank} of {self.size}: cannot send {command!r}: {exc}") from None
        return self._answers(command)

    def _answers(self, command: str, expect: str = "ok", timeout_s: Optional[float] = None) -> list:
        try:
            return self._collect(command, expect, timeout_s or self.timeout_s)
        except RankFailure as exc:
            # A rank that died makes its peers fail too (connection reset, a watchdog): name the dead one.
            time.sleep(DEATH_GRACE_S)
            dead = [f"rank {rank} of {self.size} exited with code {proc.exitcode}"
                    for rank, proc in enumerate(self.procs) if not proc.is_alive()]
            if dead and not str(exc).startswith(dead[0]):
                raise RankFailure(f"{'; '.join(dead)} during {command!r} (then: {exc})") from None
            raise

    def _collect(self, command: str, expect: str, timeout_s: float) -> list:
        answers = []
        deadline = time.monotonic() + timeout_s
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns)):
            while not conn.poll(POLL_S):
                if not proc.is_alive() and not conn.poll(0):
                    raise RankFailure(f"rank {rank} of {self.size} exited with code {proc.exitcode} during "
                                      f"{command!r}")
                if time.monotonic() > deadline:
                    raise RankFailure(f"rank {rank} of {self.size} did not answer {command!r} within "
                                      f"{timeout_s:g} s (--opperf-rank-timeout)")
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                proc.join(DEATH_GRACE_S)  # its pipe closed as it exited: the exit code follows
                raise RankFailure(f"rank {rank} of {self.size} exited with code {proc.exitcode} during "
                                  f"{command!r}") from None
            if kind != expect:
                raise RankFailure(f"rank {rank} of {self.size} failed in {command!r}:\n{value.rstrip()}")
            answers.append(value)
        return answers

    def close(self) -> None:
        """Ask the ranks to leave, then end those still running (only these processes)."""
        for conn in self.conns:
            try:
                conn.send(("close", {}))
            except (OSError, ValueError):
                pass
        self.kill(grace_s=CLOSE_S)

    def kill(self, grace_s: float = 0.0) -> None:
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(CLOSE_S)
        for conn in self.conns:
            conn.close()


def _context():
    """Ranks fork from a server process that imported torch once, and never touched a device.

    Not plain fork: this process may hold a CUDA context, which a forked child cannot use. Not
    spawn: each rank would import torch again (seconds each; 18 s for two ranks on a two-core
    machine, against under one once the server runs). Where there is no forkserver: spawn.
    """
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "pytest_opperf.measure.collective"])
    return ctx


def groups(config: pytest.Config) -> dict:
    """This session's rank groups by size; closed when the session ends."""
    if POOLS_KEY not in config.stash:
        config.stash[POOLS_KEY] = {}
        config.add_cleanup(functools.partial(close_all, config.stash[POOLS_KEY]))
    return config.stash[POOLS_KEY]


def close_all(pools: dict) -> None:
    while pools:
        pools.popitem()[1].close()


def topology_tier(hosts: list, configured: Optional[int]) -> int:
    """The tier of the links a group's traffic crosses: configured, else from the ranks' hosts.

    >>> topology_tier(["a", "b"], None), topology_tier(["a", "a"], None), topology_tier(["a"], None)
    (0, 1, 2)
    """
    if configured is not None:
        return configured
    if len(set(hosts)) > 1:
        return ACROSS_NODES
    # One rank moves nothing off its device; several ranks on one host cross that host's links
    # (NVLink, PCIe, or the loopback of gloo): the tiers below a node need the device's topology.
    return WITHIN_PACKAGE if len(hosts) == 1 else WITHIN_NODE


def bandwidth_columns(op: str, size_bytes: float, n: int, time_us: float, link_gbps: Optional[float],
                      tier: int, backend: str) -> dict:
    """The row's collective columns: nccl-tests' algbw and busbw, and busbw over the link's peak.

    >>> bandwidth_columns("all_reduce", 1e9, 4, 10_000.0, 450.0, 1, "nccl")["busbw_gbps"]   # 100 x 2*3/4
    150.0
    """
    algbw = algbw_gbps(size_bytes, time_us)
    busbw = None if algbw is None else algbw * COLLECTIVES[op].bus_factor(n)
    return {"topology_tier": tier, "comm_backend": backend, "algbw_gbps": algbw, "busbw_gbps": busbw,
            "link_gbps": link_gbps,
            "busbw_util": busbw / link_gbps if busbw is not None and link_gbps else None}


class CollectiveBench(Bench):
    """The `collective` fixture: collective(fn) checks fn on every rank against the op's reference,
    then times it until the stopping rule is met (a sample: the slowest rank's time of one call),
    checks one more timed call, and records the row."""

    def __call__(self, fn: Callable) -> None:
        case, state = self.case, self.state
        if not is_collective(case.op):
            pytest.fail(f"{case.op} is not a collective: use the `bench` fixture", pytrace=False)
        n = int(case.param_dict["num_devices"])
        device_type = state.device.type
        self._check_devices(n, device_type)
        self._timer()  # a timer collectives cannot use skips the case before any group starts
        pools = groups(state.config)
        failure = None
        try:
            group = pools.get(n)
            if group is None:  # starting the ranks is this case's set-up (the later cases of this size share them)
                with self.phases("setup"):
                    group = pools.setdefault(n, RankGroup(n, device_type, state.settings.rank_timeout_s))
            self._measure(group, fn)
        except RankFailure as exc:
            self._drop(pools, n)
            failure = str(exc)
        except (pytest.fail.Exception, pytest.skip.Exception):
            raise  # the case's verdict (a wrong result, the gate): the group finished its commands
        except BaseException:
            self._drop(pools, n)  # a timeout or an interrupt mid-case leaves the ranks mid-command
            raise
        if failure is not None:  # failed outside the except block: the report shows this message alone
            pytest.fail(f"collective {case.op}/{case.backend} [{case.id}]: {failure}", pytrace=False)

    def pedantic(self, *args, **kwargs):
        pytest.fail("a collective case has no pedantic mode: call collective(fn)", pytrace=False)

    def _check_devices(self, n: int, device_type: str) -> None:
        if n < 1:
            pytest.fail(f"{self.case.op} [{self.case.id}]: num_devices must be >= 1, got {n}", pytrace=False)
        if comm_backend(device_type) is None:
            pytest.skip(f"torch.distributed has no backend for {device_type}")
        if n == 1 and not self.state.settings.one_rank:
            # A group of one moves no data: its time is a local copy's, not a collective's (busbw 0).
            pytest.skip("num_devices=1: a group of one rank moves no data; --opperf-one-rank times it")
        if device_type != "cpu":
            import torch

            count = torch.accelerator.device_count()
            if n > count:
                pytest.skip(f"num_devices={n} needs {n} {device_type} devices; this process sees {count}")

    @staticmethod
    def _drop(pools: dict, n: int) -> None:
        group = pools.pop(n, None)
        if group is not None:
            group.kill()

    def _measure(self, group: RankGroup, fn: Callable) -> None:
        case, state, settings = self.case, self.state, self.state.settings
        n = group.size
        op = OPS[case.op]
        timer_name = self._timer()
        seed = case_seed(settings.seed, case)
        parts = {"fn": fn, "inputs": op.inputs, "reference": op.reference,
                 "output": COLLECTIVES[case.op].output, "prepare": COLLECTIVES[case.op].prepare}
        started = time.perf_counter()
        with self.phases("check"):
            checked = group.ask("case", parts=parts, params=case.param_dict, dtypes=self.dtypes,
                                seeds=[seed + rank for rank in range(n)], tolerance=self._tolerance())
        problems = [c["problem"] for c in checked if c["problem"]]
        if problems:
            group.ask("end_case")
            pytest.fail(f"functional check failed: {case.op}/{case.backend} [{case.id}]: " + "; ".join(problems),
                        pytrace=False)
        self.first_call_ms = max(c["first_call_ms"] for c in checked)
        with self.phases("warmup"):
            warmup_calls, per_call = self._warm_up(group)
        rule = StoppingRule(settings.target_rel, settings.min_samples, settings.max_samples, settings.budget_s)
        batch = max(1, min(200, int(0.01 / max(per_call, 1e-7))))
        samples: list[float] = []
        stats = None
        start = time.perf_counter()
        with self.phases("sampling"):
            while not rule.done(stats, time.perf_counter() - start):
                per_rank = group.ask("sample", count=min(batch, rule.max_samples - len(samples)), timer=timer_name)
                samples.extend(max(times) for times in zip(*per_rank))
                stats = Stats(samples)
        with self.phases("verify"):
            problems = [p for p in group.ask("verify") if p]
            group.ask("end_case")
        if problems:
            pytest.fail(f"timer {timer_name}: the timed call's output differs from the reference: "
                        + "; ".join(problems), pytrace=False)
        m = sampler.Measurement(timer_name, "hot", stats, rule.met(stats), warmup_calls, None, samples,
                               time.perf_counter() - started, 1)
        self.measurement = m
        with self.phases("record"):
            record = self._record(m, {})
            record.update(bandwidth_columns(case.op, record["bytes"], n, record["time_us"],
                                            state.spec.link_gbytes_per_s, topology_tier(group.hosts, settings.topology_tier),
                                            str(comm_backend(group.device_type))))
            verdict = state.gate.judge(case, record)
            if verdict is not None:
                record["gate"] = verdict
        record.update(self._phase_columns())  # where the case's time went, and when: as a kernel case's row
        self.item.stash[RECORD_KEY] = record  # a regressed measurement is still a valid row
        if record.gate_fails:
            pytest.fail(state.gate.failure_message(verdict), pytrace=False)

    def _warm_up(self, group: RankGroup) -> tuple[int, float]:
        """At least 3 calls and --opperf-warmup seconds, every rank making the same number of calls;
        returns (calls, seconds a call took)."""
        calls, chunk = 0, 1
        start = time.perf_counter()
        while calls < 3 or time.perf_counter() - start < self.state.settings.warmup_s:
            group.ask("warmup", calls=chunk)
            calls += chunk
            chunk = min(2 * chunk, 1000)
        return calls, (time.perf_counter() - start) / calls

    def _timer(self) -> str:
        """The command line's timer, else the config's, else cpu on a CPU and event on an accelerator;
        a timer of single-device kernels (cuda_graph, profiler) skips the case."""
        cfg = self._config()
        name = pick(self.state.settings.timer, cfg.timer if cfg else None,
                     "cpu" if self.state.device.type == "cpu" else "event")
        if name not in TIMERS:
            pytest.skip(f"timer {name}: a collective is timed with {' or '.join(TIMERS)}")
        return name
