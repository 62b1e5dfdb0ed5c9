"""The parts of a run, wired once per process in pytest_configure; each hook takes the part it needs.

    RunEnv        (run/env.py)         what every process that runs cases is given, frozen
    Collection    (run/collect.py)     what collection learnt: configs, the config of each case
    GateSession   (gate/session.py)    the baseline, verdicts, the machine's drift
    Machine       (run/machine.py)     busy cores, threads, the profiler's start
    Controller    (run/controller.py)  only in the process that writes: records, writer, notes

Nothing below the plugin and the fixtures takes the Session itself: each part is handed on alone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf.files import unwritable
from pytest_opperf.gate.baseline import BaselineError
from pytest_opperf.gate.session import GateSession, GateSettings
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure import timers
from pytest_opperf.run import device as device_context
from pytest_opperf.run import options, ranks, xdist
from pytest_opperf.run.activity import Activity
from pytest_opperf.run.calibration import SessionCalibration, read_mode
from pytest_opperf.run.collect import Collection
from pytest_opperf.run.controller import Controller, Hooks
from pytest_opperf.run.env import RunEnv
from pytest_opperf.run.machine import Machine
from pytest_opperf.run.options import Settings

SESSION_KEY = pytest.StashKey["Session"]()
# Where the session opens late: the cores other processes kept busy, read before the workers started.
BUSY_BEFORE_WORKERS_KEY = pytest.StashKey[Optional[float]]()


@dataclass
class Session:
    env: RunEnv
    collection: Collection
    gate: GateSession
    machine: Machine
    controller: Optional[Controller]  # None in a process that does not write (xdist worker, rank > 0)

    @property
    def settings(self) -> Settings:
        return self.env.settings


def opens_late(config: pytest.Config) -> bool:
    """This process is an xdist controller that starts its workers before it opens its session.

    Opening it imports torch and the catalog, initialises the device, reads the gate's baseline
    and the database: seconds, which the workers' own start-up (the same imports, their
    collection) would otherwise wait for. Not when a calibration is to be measured (it needs the
    device to itself, before any worker holds it), nor for --collect-only (no workers).
    """
    return (xdist.is_distributed(config) and not config.option.collectonly
            and read_mode(config) not in ("missing", "always"))


def session_of(config: pytest.Config) -> Session:
    """The session of a pytest run: made in pytest_configure, or, where it opens late (opens_late),
    at its first use once xdist has started the workers (the report header, else the end of
    pytest_sessionstart). A bad option found then is a UsageError too, and the workers are stopped."""
    if SESSION_KEY not in config.stash:
        try:
            session = open_session(config)
        except pytest.UsageError:
            xdist.stop_workers(config)
            raise
        config.stash[SESSION_KEY] = session
        if session.controller is not None:
            busy = config.stash.get(BUSY_BEFORE_WORKERS_KEY, None)
            session.controller.start(lambda: busy, workers_started=True)  # the machine as it was before the workers started
    return config.stash[SESSION_KEY]


def check_before_workers(config: pytest.Config) -> Settings:
    """Where the session opens late: the options, and what of the device can be checked without
    it (the specs file, a --device name), as UsageErrors before the workers start."""
    settings = options.read(config)
    try:
        device_context.check_name(settings.device, settings.hardware_file)
    except hardware.SpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    return settings


def open_now(config: pytest.Config) -> Session:
    """Open this process's session in pytest_configure (all but a controller that opens late)."""
    session = config.stash[SESSION_KEY] = open_session(config)
    return session


def is_open(config: pytest.Config) -> bool:
    return SESSION_KEY in config.stash


def open_session(config: pytest.Config) -> Session:
    """Every part of this process's run, from the options; a bad option is a UsageError."""
    from pytest_opperf.catalog import load_builtin

    load_builtin()  # registers the built-in ops and backends
    settings = options.read(config)
    xdist.pin_this_worker(config)
    rank = _join_world(config, settings)
    try:
        device = device_context.resolve(settings.device, settings.hardware_file)
        gate = GateSession(GateSettings.of(settings), device.spec.name)
    except (hardware.SpecError, BaselineError) as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_timer(settings, device.type)
    placement = {**xdist.placement(config, device.torch),
                 **(rank.placement() if rank is not None else {"rank": None, "num_nodes": 1})}
    env = RunEnv(settings, device, _run_id(rank), placement, config.rootpath, Activity(xdist.status_file(config)),
                 _db_path(settings, device.spec.name), rank)
    machine = Machine(settings, device, _processes(config, rank))
    writes = not hasattr(config, "workerinput") and (rank is None or rank.is_writer)
    controller = None
    if writes:
        hooks = Hooks(lambda record: config.hook.pytest_opperf_update_record(config=config, record=record),
                      lambda info: config.hook.pytest_opperf_machine_info(config=config, info=info))
        controller = Controller(env, gate, machine, SessionCalibration(read_mode(config), env), hooks,
                                list(config.invocation_params.args), _workers(config, rank))
        if not config.option.collectonly:
            check_outputs(settings, env.db_path)
    return Session(env, Collection(config, env), gate, machine, controller)


def _join_world(config: pytest.Config, settings: Settings) -> Optional[ranks.Rank]:
    """Under torchrun: this rank in the world, on its LOCAL_RANK's device; else None."""
    if not ranks.launched():
        return None
    if getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        raise pytest.UsageError("-n under torchrun: torchrun already starts one process per GPU "
                                "(--nproc-per-node); leave -n out")
    try:
        rank = ranks.join(settings.rank_timeout_s)
        ranks.pin_device(rank)
    except ranks.RankError as exc:
        raise pytest.UsageError(str(exc)) from None
    return rank


def _run_id(rank) -> str:
    # Every rank of a torchrun sweep writes under one run id: rank 0's, agreed at the rendezvous.
    return rank.run_id if rank is not None else uuid.uuid4().hex[:16]


def _workers(config: pytest.Config, rank) -> int:
    """The runs row's `workers`: xdist's -n, or the torchrun world's size."""
    if rank is not None:
        return rank.world_size
    n = getattr(config.option, "numprocesses", None)
    return int(n) if isinstance(n, int) else 0


def _processes(config: pytest.Config, rank) -> int:
    """The processes of this run that share this machine's CPUs (for the intra-op threads): under
    torchrun the ranks on this host (more than torchrun's LOCAL_WORLD_SIZE where two of its
    "nodes" share a host, as simulated nodes do)."""
    if rank is not None:
        return max(rank.local_world_size, rank.hosts.count(rank.hosts[rank.rank]))
    count = getattr(config, "workerinput", {}).get("workercount")
    if count is None:
        n = getattr(config.option, "numprocesses", None)
        count = n if isinstance(n, int) and n > 0 else 1
    return count


def _check_timer(settings: Settings, device_type: str) -> None:
    if settings.timer == "auto":
        return
    reason = timers.unsupported(settings.timer, device_type)
    if reason:
        raise pytest.UsageError(f"--opperf-timer={settings.timer}: {reason}, and this session runs on {device_type}")


def _db_path(settings: Settings, name: str) -> Path:
    path = (settings.results_dir / f"{name}.db").resolve()
    if path.parent != settings.results_dir.resolve():
        raise pytest.UsageError(f"device name {name!r} would leave the results directory")
    return path


def check_outputs(settings: Settings, db_path: Path) -> None:
    """Before the first case: every file the run will write can be written (a usage error naming
    the path, not rows or a report lost at the end of a long sweep)."""
    s = settings
    if not s.sample_only:
        problem = unwritable(db_path)
        if problem:
            raise pytest.UsageError(f"{db_path}: cannot write the results database: {problem} "
                                    f"(choose another directory with --opperf-results=DIR)")
    for flag, path in (("--opperf-benchmark-json", s.benchmark_json), ("--opperf-save-baseline",
                       s.save_baseline_file), ("--opperf-report-json", s.report_json_file),
                       ("--opperf-report-md", s.report_md_file), ("--opperf-html", s.html_file)):
        problem = unwritable(path) if path is not None else None
        if problem:
            raise pytest.UsageError(f"{flag}={path}: cannot write it: {problem}")
