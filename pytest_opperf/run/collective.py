"""Collective cases: the rank processes, and the `collective` fixture that checks, times and records.

    def test_all_reduce(backend, collective):
        collective(backend)

How cases meet the process group. The session starts `num_devices` rank processes (one per
device: NCCL on CUDA, gloo on a CPU, HCCL on an NPU) the first time a case needs that many, and
keeps them until its last case: later cases of that size are sent to the same ranks over pipes.
A serial run (and a torchrun world) takes the collective cases after the kernel cases, one group
size after another (collectives_last), and ends a group after its last case (release_after): a
rank process holds a context on its GPU while it lives, and a kernel case measured beside it
would read `contended`. Starting a group costs seconds (a Python process importing torch per
rank, a communicator's set-up), more than most cases take, so one group per size, not per case.
Isolation is kept where it matters: a rank that dies, errs or does not answer within
--opperf-rank-timeout fails its case, the group's processes are ended (only the ones this session
started) and the next case of that size starts a fresh group. Nothing of the test process is
shared with the ranks but plain data and functions named by module.

This process never joins a group: it only coordinates, so a hung collective cannot hang it.
Under xdist the controller leases each case the devices its group needs (run/xdist_schedule.py):
the worker that runs it starts its ranks on those devices once the lease is ready, keeps them for
the next case on the same devices, and ends them when its next item runs elsewhere. Each row says
which devices its ranks ran on (`gpus`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import multiprocessing
import time
import traceback
import uuid
from typing import Callable, Optional

import pytest

from pytest_opperf.case import case_of
from pytest_opperf.catalog.ops.collective import ALL_SIZES, COLLECTIVES, algbw_gbps, is_collective
from pytest_opperf.catalog.registry import OPS
from pytest_opperf.gate.session import GateSession
from pytest_opperf.run.bench import RECORD_KEY, Bench, pick
from pytest_opperf.run import isolation, xdist, xdist_schedule
from pytest_opperf.run.env import CaseEnv
from pytest_opperf.measure import budget, sampler
from pytest_opperf.measure.collective import RankWork
from pytest_opperf.measure.rankserver import link_of, rank_main
from pytest_opperf.measure.stats import Stats, StoppingRule

POOLS_KEY = pytest.StashKey[dict]()
TIMERS = ("cpu", "event")  # what a rank can time a collective with (measure/collective.py)
POLL_S = 0.05  # how often a wait looks at the ranks' processes
CLOSE_S = 5.0  # how long ranks get to leave their group before they are killed
# Starting a group (an interpreter and torch per rank, the communicator) gets at least this long.
START_S = 120.0
DEATH_GRACE_S = 0.5  # after a failure, how long the other ranks get to show whether they died
COLLECTIVE_WARMUP_S = 0.01  # --opperf-warmup=auto for a collective: every rank must agree on the calls
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

    def __init__(self, size: int, device_type: str, timeout_s: float, environ: Optional[dict] = None):
        """environ: variables the ranks set before they touch a device (the host's device list, where
        this process was pinned to one device)."""
        import torch.distributed as dist

        self.size, self.device_type, self.timeout_s = size, device_type, timeout_s
        backend = comm_backend(device_type)
        # The store lives here, on a port the OS picks: no race for a fixed MASTER_PORT.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=dt.timedelta(seconds=timeout_s))
        setup = {"device_type": device_type, "comm_backend": backend, "host": "127.0.0.1", "port": self.store.port,
                 "prefix": uuid.uuid4().hex, "timeout_s": timeout_s, "environ": dict(environ or {}),
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
        self.link = ready[0]["link"]

    nodes = None  # rank processes of this session all run on this host
    leads = True  # this process coordinates the group: it records the row

    @staticmethod
    def agree(value):
        """This process alone decides for the group."""
        return value

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


def group_sizes(available: int) -> list[int]:
    """num_devices: all - every power of two from 2 up to the ranks available, and their total.

    >>> group_sizes(8), group_sizes(6), group_sizes(2), group_sizes(1)
    ([2, 4, 8], [2, 4, 6], [2], [])
    """
    sizes = [n for n in (2 ** k for k in range(1, max(available, 1).bit_length())) if n <= available]
    return sizes + ([available] if available >= 2 and available not in sizes else [])


def expand_sizes(cases: list, available: int) -> list:
    """Collective cases of `num_devices: all` become one case per group size (group_sizes)."""
    out = []
    for case in cases:
        if case.param_dict.get("num_devices") != ALL_SIZES:
            out.append(case)
            continue
        for n in group_sizes(available):
            params = tuple((k, n if k == "num_devices" else v) for k, v in case.params)
            out.append(dataclasses.replace(case, params=params))
    return list(dict.fromkeys(out))


class WorldGroup:
    """A group of the torchrun world's first `size` ranks, with this process as one of its members
    (or not: then `member` is False and the case is skipped here). The members run each command
    themselves (RankWork) and exchange their answers over a gloo group; the collective itself runs
    on a group of the device's backend (NCCL on CUDA). Every rank creates every group, in one
    order: torch.distributed requires it."""

    def __init__(self, size: int, rank, device_type: str, device, timeout_s: float):
        import torch.distributed as dist

        self.size, self.device_type = size, device_type
        members = list(range(size))
        timeout = dt.timedelta(seconds=timeout_s)
        backend = comm_backend(device_type)
        try:
            self.control = dist.new_group(members, backend="gloo", timeout=timeout)
            self.group = self.control if backend == "gloo" else dist.new_group(members, backend=backend,
                                                                               timeout=timeout)
        except Exception as exc:  # noqa: BLE001 (a rank that never came: one line, the case fails)
            said = str(exc).strip().splitlines()
            raise RankFailure(f"the world's ranks did not all make the group of {size} within {timeout_s:g} s "
                              f"(--opperf-rank-timeout): {said[0] if said else type(exc).__name__}") from None
        self.member = rank.rank < size
        self.leads = rank.rank == 0
        self.hosts = [rank.hosts[m] for m in members]
        self.nodes = [rank.nodes[m] for m in members]
        self.link = "network" if len(set(self.nodes)) > 1 else link_of(device_type, size)
        self.work = RankWork(rank.rank, size, device_type, device, self.group, self.control) if self.member else None

    def ask(self, command: str, **args) -> list:
        """Every member runs the command; their answers, in rank order, on every member."""
        import torch.distributed as dist

        try:
            answer = ("ok", getattr(self.work, "do_" + command)(**args))
        except Exception:  # noqa: BLE001 (told to every member: each fails the case the same way)
            answer = ("error", traceback.format_exc())
        answers: list = [None] * self.size
        try:
            dist.all_gather_object(answers, answer, group=self.control)
        except Exception as exc:  # noqa: BLE001 (a rank that died or hangs: the group is lost)
            raise RankFailure(f"the ranks of this group did not all answer {command!r}: {exc}") from None
        for rank, (kind, value) in enumerate(answers):
            if kind != "ok":
                raise RankFailure(f"rank {rank} of {self.size} failed in {command!r}:\n{value.rstrip()}")
        return [value for _, value in answers]

    def agree(self, value):
        """The leader's value (a decision, a count), on every member: whatever a member decides
        by its own clock differs from the others', and a collective called a different number of
        times on two ranks waits forever."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def kill(self, grace_s: float = 0.0) -> None:
        """A torchrun group is the world's: it is not ended case by case."""

    close = kill


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
    ctx.set_forkserver_preload(["torch", "torch.distributed", "pytest_opperf.measure.rankserver"])
    return ctx


def groups(config: pytest.Config) -> dict:
    """This session's rank groups by (size, devices); each closed after its last case, any left when the session ends."""
    if POOLS_KEY not in config.stash:
        config.stash[POOLS_KEY] = {}
        config.add_cleanup(functools.partial(close_all, config.stash[POOLS_KEY]))
    return config.stash[POOLS_KEY]


def close_all(pools: dict) -> None:
    while pools:
        pools.popitem()[1].close()


def group_size_of(item) -> Optional[int]:
    """The num_devices of the collective case an item runs; None for any other item."""
    case = case_of(item)
    if case is None or not is_collective(case.op):
        return None
    size = case.param_dict.get("num_devices")
    return size if isinstance(size, int) else None


def collectives_last(items: list) -> None:
    """Kernel cases first, in their order; then the collective cases, by group size (stable).

    A group's rank processes hold a context on each of its GPUs while they live: a kernel case
    measured beside them reads `contended` (NVML sees another process on the GPU). Run after the
    kernel cases, and one size after another, each group is started once and ended after its last
    case (release_after), before the next size's starts.
    """
    sizes = [group_size_of(item) for item in items]
    kernel = [item for item, n in zip(items, sizes) if n is None]
    grouped = sorted(((n, i) for i, n in enumerate(sizes) if n is not None))
    items[:] = kernel + [items[i] for _, i in grouped]


def group_key(item) -> Optional[tuple]:
    """The rank group a collective case runs on: (num_devices, the devices its lease named, or None
    where no lease names them: a serial run, a torchrun world, unpinned xdist workers); None for
    any other item."""
    n = group_size_of(item)
    if n is None:
        return None
    lease = xdist_schedule.lease_of(item.config, item.nodeid)
    return n, tuple(lease["devices"]) if lease and lease.get("devices") else None


def release_after(item, nextitem, pools: Optional[dict] = None) -> None:
    """After a collective case whose next item does not run on the same group (its size, its
    devices): end that group's rank processes now, not at the session's end (their contexts stay on
    the GPUs, and under xdist the devices go back to their workers). `pools`: the session's groups
    by key (groups(), group_key()), read from the item's config by default."""
    pools = item.config.stash.get(POOLS_KEY, {}) if pools is None else pools
    key = group_key(item)
    if key is None or key not in pools or (nextitem is not None and group_key(nextitem) == key):
        return
    pools.pop(key).close()


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

    def __init__(self, item: pytest.Item, env: CaseEnv, gate: GateSession, pools: dict):
        super().__init__(item, env, gate)
        self.pools = pools  # this session's rank groups by (size, devices) (groups(), group_key())
        self.gpus: Optional[tuple] = None  # the devices the case's ranks ran on

    def __call__(self, fn: Callable) -> None:
        case = self.case
        if not is_collective(case.op):
            pytest.fail(f"{case.op} is not a collective: use the `bench` fixture", pytrace=False)
        n = int(case.param_dict["num_devices"])
        device_type = self.env.device.type
        self._check_devices(n, device_type)
        self._timer()  # a timer collectives cannot use skips the case before any group starts
        pools = self.pools
        lease = xdist_schedule.lease_of(self.item.config, self.item.nodeid)
        devices = tuple(lease["devices"]) if lease and lease.get("devices") else None
        key = (n, devices)
        failure = None
        try:
            group = pools.get(key)
            if group is None:  # starting the ranks is this case's set-up (the later cases of this group share them)
                with self.phases("setup"):
                    if lease is not None:  # under xdist: until the lease's other workers are idle
                        self._wait_for(lease)
                    group = pools.setdefault(key, self._start_group(n, devices))
            if not getattr(group, "member", True):
                pytest.skip(f"rank {self.env.run.world.rank} is not among the {n} ranks of this group")
            self.gpus = devices if devices is not None else self._default_devices(n)
            self._measure(group, fn)
        except RankFailure as exc:
            self._drop(pools, key)
            failure = str(exc)
        except (pytest.fail.Exception, pytest.skip.Exception):
            raise  # the case's verdict (a wrong result, the gate): the group finished its commands
        except BaseException:
            self._drop(pools, key)  # a timeout or an interrupt mid-case leaves the ranks mid-command
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
        if n == 1 and not self.env.settings.one_rank:
            # A group of one moves no data: its time is a local copy's, not a collective's (busbw 0).
            pytest.skip("num_devices=1: a group of one rank moves no data; --opperf-one-rank times it")
        world = self.env.run.world
        if world is not None:
            if n > world.world_size:
                pytest.skip(f"num_devices={n} needs {n} ranks; this torchrun world has {world.world_size}")
        elif device_type != "cpu":
            host = xdist.host_devices(self.item.config)
            if host is not None:
                count, where = len(host[1]), f"this host has ({host[0]}={','.join(host[1])})"
            else:
                import torch

                count, where = torch.accelerator.device_count(), "this process sees"
            if n > count:
                pytest.skip(f"num_devices={n} needs {n} {device_type} devices; {where} {count}")

    def _start_group(self, n: int, devices: Optional[tuple] = None):
        """The ranks of a group of n: this torchrun world's first n, or n processes of our own, on
        `devices` (the entries of the visibility variable a lease named) or on the host's first n.
        This process gives back the device memory its allocator cached for the kernel cases first:
        the ranks need it (a sweep's process held 59 GiB of an H100 when its ranks started)."""
        env = self.env
        isolation.release_memory()
        if env.run.world is not None:
            return WorldGroup(n, env.run.world, env.device.type, env.device.torch, env.settings.rank_timeout_s)
        host = xdist.host_devices(self.item.config)
        environ = None
        if host is not None and host[0] != xdist.INDEX_VARIABLE:
            environ = {host[0]: ",".join(devices if devices is not None else host[1])}
        return RankGroup(n, env.device.type, env.settings.rank_timeout_s, environ)

    def _wait_for(self, lease: dict) -> None:
        """Wait until the controller says the lease's devices are free (run/xdist_schedule.py)."""
        try:
            waited = xdist_schedule.wait_ready(self.item.config, lease, self.env.settings.rank_timeout_s)
        except TimeoutError as exc:
            pytest.fail(f"collective {self.case.op}/{self.case.backend} [{self.case.id}]: {exc} "
                        f"(--opperf-rank-timeout)", pytrace=False)
        self.extra_info["lease_wait_s"] = round(waited, 4)

    def _default_devices(self, n: int) -> Optional[tuple]:
        """The devices a group of n takes without a lease: the first n the ranks see (None on a CPU,
        or in a torchrun world, where each rank's row is its own)."""
        if self.env.device.type == "cpu" or self.env.run.world is not None:
            return None
        host = xdist.host_devices(self.item.config)
        if host is not None:
            return tuple(host[1][:n])
        variable = xdist.visibility_variable(self.env.device.type)
        return tuple(xdist.visible_entries(variable, n)) if variable != xdist.INDEX_VARIABLE else None

    @staticmethod
    def _drop(pools: dict, key: tuple) -> None:
        group = pools.pop(key, None)
        if group is not None:
            group.kill()

    def _measure(self, group: RankGroup, fn: Callable) -> None:
        case, settings = self.case, self.env.settings
        n = group.size
        op = OPS[case.op]
        timer_name = self._timer()
        seed = self.env.seed
        parts = {"fn": fn, "inputs": op.inputs, "reference": op.reference,
                 "output": COLLECTIVES[case.op].output, "prepare": COLLECTIVES[case.op].prepare}
        started = time.perf_counter()
        with self.phases("check"):
            checked = group.ask("case", parts=parts, params=case.param_dict, dtypes=self.dtypes,
                                seeds=[seed + rank for rank in range(n)], tolerance=self._tolerance(),
                                need_bytes=budget.case_bytes(op, case.param_dict, self.dtypes))
        short = [c["skip"] for c in checked if "skip" in c]
        if short:  # nothing was made on any rank
            pytest.skip(f"{case.op} [{case.id}] does not fit: {short[0]}")
        problems = [c["problem"] for c in checked if c["problem"]]
        if problems:
            group.ask("end_case")
            pytest.fail(f"functional check failed: {case.op}/{case.backend} [{case.id}]: " + "; ".join(problems),
                        pytrace=False)
        self.first_call_ms = max(c["first_call_ms"] for c in checked)
        convention = self._convention()
        if convention == "loop":
            drivers = {c.get("loop_driver", "python") for c in checked}
            self.extra_info["loop_driver"] = "c" if drivers == {"c"} else "python"
        floors = [c.get("floor") for c in checked]
        self.check_floor = None if None in floors else max(floors)  # the case's: its least sensitive rank's
        # A collective case's own budget (--opperf-collective-budget): it stops at the target or there.
        rule = StoppingRule(settings.target_rel, settings.min_samples, settings.max_samples,
                            settings.collective_budget_s)
        warmup_s = COLLECTIVE_WARMUP_S if settings.warmup_s is None else settings.warmup_s
        # The ranks warm up, sample until the rule stops them and check a timed call among
        # themselves (measure/collective.py): one command, however many samples.
        with self.phases.told("sampling"):
            measured = group.ask("measure", timer=timer_name, convention=convention, warmup_s=warmup_s,
                                 rule=(rule.target_rel, rule.min_samples, rule.max_samples, rule.budget_s))
        lead = measured[0]  # the samples and counts are the same on every rank
        for phase in ("warmup", "sampling", "verify"):
            self.phases.add(phase, lead["phase_s"][phase])
        samples, iters, replays = lead["samples"], lead["iters"], lead["replays"]
        stats = Stats(samples)
        problems = [a["problem"] for a in measured if a["problem"]]
        if problems:
            pytest.fail(f"timer {timer_name}: the timed call's output differs from the reference: "
                        + "; ".join(problems), pytrace=False)
        m = sampler.Measurement(timer_name if convention == "single" else convention, "hot", stats, rule.met(stats),
                               lead["warmup_calls"], None, samples, time.perf_counter() - started, iters * replays)
        self.measurement = m
        with self.phases("record"):
            record = self._record(m, {})
            record.update(bandwidth_columns(case.op, record["bytes"], n, record["time_us"],
                                            self.env.device.spec.link_gbytes_per_s,
                                            topology_tier(group.hosts if group.nodes is None else
                                                          [f"node {k}" for k in group.nodes], settings.topology_tier),
                                            str(comm_backend(group.device_type))))
            record.update({"comm_convention": convention, "topology_link": group.link,
                           "gpus": ",".join(self.gpus) if self.gpus else None,
                           "num_nodes": len(set(group.hosts)) if group.nodes is None else len(set(group.nodes))})
            verdict = self.gate.judge(case, record)
            if verdict is not None:
                record["gate"] = verdict
        record.update(self._phase_columns())  # where the case's time went, and when: as a kernel case's row
        if group.leads:
            self.item.stash[RECORD_KEY] = record  # a regressed measurement is still a valid row
        if record.gate_fails:
            pytest.fail(self.gate.failure_message(verdict), pytrace=False)

    def _convention(self) -> str:
        """--opperf-comm-convention (auto: nccl-tests' loop); `graph` needs CUDA graphs."""
        chosen = self.env.settings.comm_convention
        cfg = self.env.config
        named = self.env.settings.timer != "auto" or (cfg is not None and cfg.timer is not None)
        # auto: nccl-tests' loop; a timer named on the command line or in the config times single calls
        convention = ("single" if named else "loop") if chosen == "auto" else chosen
        if convention == "graph" and self.env.device.type != "cuda":
            pytest.skip(f"--opperf-comm-convention=graph captures CUDA graphs; this run is on {self.env.device.type}")
        return convention

    def _timer(self) -> str:
        """The command line's timer, else the config's, else cpu on a CPU and event on an accelerator;
        a timer of single-device kernels (cuda_graph, profiler) skips the case."""
        cfg = self.env.config
        name = pick(self.env.settings.timer, cfg.timer if cfg else None,
                    "cpu" if self.env.device.type == "cpu" else "event")
        if name not in TIMERS:
            pytest.skip(f"timer {name}: a collective is timed with {' or '.join(TIMERS)}")
        return name
