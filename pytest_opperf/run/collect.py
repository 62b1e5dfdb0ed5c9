"""Collection: which op a test benchmarks, its config, and the parametrization into cases.

A test takes part when it asks for one of the opperf fixtures (``bench``, ``inputs``,
``backend``, ``opperf_case``). Its op is the marker's ``@pytest.mark.opperf(op=...)`` or
its name: ``test_gemm`` benchmarks ``gemm`` with ``configs/gemm.yaml``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf.catalog.registry import BACKENDS, OPS, backends_of, library_version, version_matches
from pytest_opperf.measure import budget, inputs, timers
from pytest_opperf import config as config_mod
from pytest_opperf.config import ConfigError, OpConfig, knobs, yamlfile
from pytest_opperf.run import budgets, xdist
from pytest_opperf.case import CASE_FIXTURE, Case, case_of, shape_of
from pytest_opperf.catalog.ops.collective import is_collective
from pytest_opperf.gate.session import GateSession
from pytest_opperf.run.collective import expand_sizes
from pytest_opperf.run.env import RunEnv, dtypes_of
from pytest_opperf.files import short



class CollectError(pytest.Collector.CollectError):
    """Shown by pytest as its message alone: no traceback."""


def op_of(metafunc: pytest.Metafunc) -> tuple[str, Optional[str]]:
    marker = metafunc.definition.get_closest_marker("opperf")
    kwargs = dict(marker.kwargs) if marker else {}
    name = kwargs.get("op") or metafunc.function.__name__.removeprefix("test_")
    if name not in OPS:
        raise CollectError(
            f"{metafunc.definition.nodeid}: cannot tell which op this test benchmarks: {name!r} is not a "
            f"registered op (known: {sorted(OPS)}). Name the test test_<op> or mark it "
            f"@pytest.mark.opperf(op='<op>'); register your own ops in a module conftest.py imports.")
    return name, kwargs.get("config")


class Collection:
    """What collection learns, kept for the run: each config once, the config of each case, the
    marks made. One per process; the gate gets each case's threshold through `set_threshold`."""

    def __init__(self, config: pytest.Config, env: RunEnv):
        self.config = config  # for the marks it registers and the search budgets
        self.env = env
        self.configs: dict = {}  # (op, path) -> OpConfig
        self.config_of: dict = {}  # Case -> the OpConfig it came from
        self.marks: set = set()
        # Config files that could not be read or used -> the one line that says why: a --opperf-config
        # file is reported once, a config of the configs directory only if a selected test needs it.
        self.broken: dict = {}
        self.stand_ins: dict = {}  # a test's node id (no parameters) -> its unusable config

    @property
    def settings(self):
        return self.env.settings

    def find_config(self, op: str, explicit: Optional[str]) -> Path:
        if explicit:
            path = self.env.rootpath / explicit
            if not path.is_file():
                raise CollectError(f"@pytest.mark.opperf(config={explicit!r}): no such file {path}")
            return path
        for path in self.settings.config_files:
            if path in self.broken:
                continue  # said once, at the first test that looked (a collection error stops the run)
            try:
                names = _names_op(path)
            except CollectError as exc:
                self.broken[path] = str(exc)
                raise
            if names == op:
                return path
        folder = self.settings.configs_dir
        candidates = [folder / f"{op}.yaml", folder / f"{op}.yml", folder / op / "config.yaml"]
        for path in candidates:
            if path.is_file():
                return path
        raise CollectError(f"no config for op {op!r}: looked for {', '.join(str(c) for c in candidates)}")

    def check_config_files(self, items: list) -> None:
        """After deselection: each --opperf-config file of the command line is for the op of a
        selected test. One that is not would be ignored without a word: the op's test runs the
        directory's config, or no test runs it. (Files set in the ini file may cover more ops.)"""
        self._check_set_aside(items)
        if self.config.getoption("opperf_config") is None or hasattr(self.config, "workerinput"):
            return  # an xdist worker's usage error would be an internal error of the controller: not checked there
        ops = {case.op for item in items if (case := case_of(item)) is not None}
        if not ops:
            return  # no opperf test selected: nothing could use a config
        for path in self.settings.config_files:
            if path in self.broken:
                continue  # its collection error said so
            try:
                op = _names_op(path)
            except CollectError as exc:
                raise pytest.UsageError(f"--opperf-config={path}: {exc}") from None
            if op not in ops:
                raise pytest.UsageError(
                    f"--opperf-config={path}: this config is for op {short(op)}, but the selected tests benchmark "
                    f"{', '.join(sorted(ops))}: it would be ignored (its 'op:', else its file name, names the op it "
                    f"is for)")

    def _check_set_aside(self, items: list) -> None:
        """A config of the configs directory that could not be used is the collection error of
        the first selected test's file that needs it (one line; the run stops as for any
        collection error); one that no selected test needs is one warning (`-k softmax` runs
        while gelu.yaml is broken)."""
        needed: dict[Path, str] = {}  # config -> the file of the first selected test that needs it
        for item in list(items):
            path = self.stand_ins.get(item.nodeid.partition("[")[0])
            if path is not None:
                needed.setdefault(path, item.nodeid.partition("::")[0])
                items.remove(item)  # no case to run (--continue-on-collection-errors)
        for path, message in self.broken.items():
            if path in self.settings.config_files:
                continue  # a --opperf-config file: its collection error stopped the run already
            if path in needed:
                report = pytest.CollectReport(needed[path], "failed", message, [])
                self.config.hook.pytest_collectreport(report=report)
            else:
                warnings.warn_explicit(pytest.PytestWarning(f"{message} (no selected test uses this config: "
                                                            f"passed over)"), None, str(path), 0)  # named by the file

    def load_config(self, op: str, path: Path) -> OpConfig:
        """Read, validate and size-check a config (cached: several tests may share it)."""
        key = (op, path)
        if key not in self.configs:
            spec = OPS[op]
            try:
                cfg = config_mod.load(path, spec.params, spec.defaults, op_name=op, op_types=spec.types,
                                      max_cases=self.settings.max_cases, timers=timers.TIMERS, caches=inputs.CACHES)
            except ConfigError as exc:
                raise CollectError(str(exc)) from None
            self._check_timer(cfg)
            try:
                knobs.check(cfg, op, {name: b.fn for (o, name), b in BACKENDS.items() if o == op})
            except ConfigError as exc:
                raise CollectError(str(exc)) from None
            self.configs[key] = cfg
        return self.configs[key]

    def _check_timer(self, cfg: OpConfig) -> None:
        """A config's timer must run on this session's device, unless the command line overrides it."""
        if cfg.timer is None or self.settings.timer != "auto":
            return
        device_type = self.env.device.type
        reason = timers.unsupported(cfg.timer, device_type)
        if reason:
            raise CollectError(f"{cfg.path}: timer: {reason}, and this session runs on {device_type} "
                               f"(--opperf-timer=NAME overrides the config)")

    def parametrize(self, metafunc: pytest.Metafunc, gate: GateSession) -> None:
        op, explicit = op_of(metafunc)
        path = self.find_config(op, explicit)
        if explicit or path in self.settings.config_files:
            return self._parametrize(metafunc, gate, op, path)  # a config the user named: its error stops the run
        if path not in self.broken:
            try:
                return self._parametrize(metafunc, gate, op, path)
            except CollectError as exc:
                # Only the selected tests' configs matter: judged after -k/-m (check_config_files).
                self.broken[path] = str(exc)
        # One case stands for the config (an xdist worker that runs it fails it: no case to run).
        self.stand_ins[metafunc.definition.nodeid] = path
        metafunc.parametrize(CASE_FIXTURE, [pytest.param(None, id="config-error")])

    def _parametrize(self, metafunc: pytest.Metafunc, gate: GateSession, op: str, path: Path) -> None:
        cfg = self.load_config(op, path)
        backend_marks = {b.name: self._backend_marks(cfg, op, b) for b in cfg.backends}
        spec_name = self.env.device.spec.name
        try:
            cases = list(cfg.expand(OPS[op].params, device=spec_name))
            if is_collective(op):
                cases = expand_sizes(cases, self._ranks_available())
            # Thresholds now, so a broken max_regression expression is a collection error, not N failures.
            thresholds = {case: cfg.threshold_for(case, spec_name) for case in cases}
            violations = {case: cfg.violated(case, spec_name) for case in cases}
        except ConfigError as exc:
            raise CollectError(str(exc)) from None
        budgets.budgets(self.config).note(cfg, cases)
        params = []
        for case in cases:
            self.config_of[case] = cfg
            gate.set_threshold(case, thresholds[case])
            marks = [self._mark(op), self._mark(case.backend), *backend_marks[case.backend]]
            reason = violations[case] or self._unsupported(case)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param(case, id=case.id, marks=marks))
        if not params:
            params = [pytest.param(None, id="no-cases",
                                   marks=pytest.mark.skip(reason=f"{path}: every case is excluded"))]
        metafunc.parametrize(CASE_FIXTURE, params)

    def _ranks_available(self) -> int:
        """The ranks a collective group may take: the torchrun world, else the host's devices (a
        CPU: 2 processes of gloo), also in an xdist worker that sees only its own."""
        if self.env.world is not None:
            return self.env.world.world_size
        if self.env.device.type == "cpu":
            return 2
        host = xdist.host_devices(self.config)
        if host is not None:
            return len(host[1])
        import torch

        return torch.accelerator.device_count()

    def _backend_marks(self, cfg: OpConfig, op: str, backend) -> list:
        if (op, backend.name) not in BACKENDS:
            raise CollectError(
                f"{cfg.path}: backend {backend.name!r}: not registered for op {op!r} (registered: {backends_of(op)})")
        library = BACKENDS[(op, backend.name)].library
        installed = library_version(library)
        key = "backend_version" if len(cfg.backends) == 1 else f"backends.{backend.name}.version"
        if installed is None:
            return [pytest.mark.skip(reason=f"backend {backend.name}: library {library!r} is not installed")]
        if backend.version is not None and not version_matches(backend.version, installed):
            message = (f"{cfg.path}: {key}: pins {backend.version!r} but the installed {library} is {installed!r}")
            if self.settings.version_mismatch == "error":
                raise CollectError(message + " (--opperf-version-mismatch=skip turns this into skips)")
            return [pytest.mark.skip(reason=message)]
        return []

    def _unsupported(self, case: Case) -> Optional[str]:
        backend = BACKENDS[(case.op, case.backend)]
        device = self.env.device
        if backend.devices is not None and device.type not in backend.devices:
            return f"backend {case.backend} does not run on {device.type}"
        reason = backend.unsupported(device.type, dtypes_of(case), device.capability, case.param_dict)
        if reason:
            return reason
        return self._over_memory_budget(case)

    def _over_memory_budget(self, case: Case) -> Optional[str]:
        device = self.env.device
        limit, source = device.memory_budget(self.settings)
        if limit is None:
            return None
        need = budget.case_bytes(OPS[case.op], case.param_dict, dtypes_of(case))
        # A collective's buffers are its ranks' (each on its own device), reused hot: no flush buffer.
        extra = 0 if is_collective(case.op) else inputs.cold_extra_bytes(device.cache_bytes())
        return budget.over_budget(need + extra, need, limit, source)

    def _mark(self, name: str):
        """A mark per op and per backend, registered on first use so --strict-markers accepts it."""
        if name not in self.marks:
            self.config.addinivalue_line("markers", f"{name}: pytest-opperf cases of op or backend {name!r}")
            self.marks.add(name)
        if name not in _MARKS:  # one decorator per name, not a new one per case of a large grid
            _MARKS[name] = getattr(pytest.mark, name)
        return _MARKS[name]


def _names_op(path: Path) -> str:
    """The op a config file is for: its 'op:' key, else its file name (or folder for config.yaml)."""
    try:
        raw = yamlfile.read_yaml(path)
    except ConfigError as exc:
        raise CollectError(str(exc)) from None
    if isinstance(raw, dict) and isinstance(raw.get("op"), str):
        return raw["op"]
    return path.parent.name if path.stem == "config" else path.stem


_MARKS: dict = {}


def group_shapes(items: list) -> None:
    """Put the cases of one shape (op, dtypes, parameters: Case.inputs_key) side by side, in place,
    the shapes in the order of their first case; other items keep their places among them.

    A config's product lists one backend's cases before the next's. Side by side, the backends of
    a shape run one after another on the same inputs, and one reference output serves them all
    (check.LastReference).
    """
    first: dict = {}
    order = {}
    for i, item in enumerate(items):
        order[id(item)] = first.setdefault(shape_of(item) or i, i)
    items.sort(key=lambda item: order[id(item)])
