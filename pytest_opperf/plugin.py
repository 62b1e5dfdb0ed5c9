"""pytest hooks and nothing else: each delegates to the module that owns the work."""

from __future__ import annotations

import time

import pytest

from pytest_opperf import hookspec
from pytest_opperf.fixtures import backend, bench, collective, device, inputs, opperf_case  # noqa: F401  (fixtures)
from pytest_opperf.fixtures import opperf_search_budget  # noqa: F401  (an autouse fixture)
from pytest_opperf.measure import contention
from pytest_opperf.measure.phases import Span
from pytest_opperf.record import Record
from pytest_opperf.run import benchmark_options, collect, durations, isolation, machine, options, ranks, schedule, shutdown
from pytest_opperf.run import xdist, xdist_schedule
from pytest_opperf.run.bench import CHECK_FAILED_KEY, RECORD_KEY, SETUP_KEY
from pytest_opperf.run.gateloop import REFERENCE_OUTPUT, GateLoop
from pytest_opperf.run.collective import collectives_last, group_size_of, release_after
from pytest_opperf.run.controller import Controller
from pytest_opperf.run.machine import backends_of
from pytest_opperf.run.session import BUSY_BEFORE_WORKERS_KEY, check_before_workers, is_open, open_now, opens_late
from pytest_opperf.run.session import session_of
from pytest_opperf.run.world import World
from pytest_opperf.view import progress, terminal

PINNING_KEY = pytest.StashKey[str]()
TUNED_KEY = pytest.StashKey[list]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config):
    # Outside pytest's capture, which starts in here: a torchrun rank > 0 prints to its log file.
    ranks.quiet_unless_writer()
    return (yield)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_cmdline_main(config: pytest.Config) -> None:
    # Registered before pytest's unraisable-exception check registers its garbage collection (in
    # pytest_configure), so the heap frozen at the run loop's start thaws after it, at the very end.
    config.add_cleanup(machine.thaw_heap)
    # After xdist's own (tryfirst) hook has turned -n into worker specs: pin them to devices.
    line = xdist.pin_workers(config)
    if line:
        config.stash[PINNING_KEY] = line


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config):
    return xdist.auto_workers(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "opperf(op=None, config=None): the op (and config file) a bench test runs")
    # An xdist controller opens its session (torch, the device, the database) once its workers
    # have started, beside their start-up; its options are checked now, before they start.
    late = opens_late(config)
    settings = check_before_workers(config) if late else open_now(config).settings
    if late and settings.contention:  # the machine before the workers start: theirs is not "other" load
        config.stash[BUSY_BEFORE_WORKERS_KEY] = contention.busy_cores()
    terminal.summary_columns(settings.columns, attained=False)  # an unknown column: a usage error now
    config.stash[TUNED_KEY] = options.use_tuned(settings)
    writes = late or session_of(config).controller is not None
    if writes:
        config.pluginmanager.register(_Controller(config), "opperf-controller")
    opened_controller = (lambda: session_of(config).controller if is_open(config) else None)
    config.pluginmanager.register(shutdown.Shutdown(config, opened_controller, writes, settings.flush_interval_s),
                                  "opperf-shutdown")
    config.pluginmanager.register(schedule.Schedule(config, lambda: session_of(config).env.db_path,
                                                    settings.durations_file, settings.shard), "opperf-schedule")
    config.pluginmanager.register(benchmark_options.HeaderTrim(), "opperf-benchmark-header")
    # Before pytest-benchmark's own pytest_configure (trylast) makes its storage folder.
    config.pluginmanager.register(benchmark_options.EmptyStorage(config), "opperf-benchmark-storage")
    if not late and session_of(config).env.world is not None:
        session = session_of(config)
        config.pluginmanager.register(World(config, session.env.world, session.controller,
                                            durations.recorded(session.env.db_path, time.time())),
                                      "opperf-world")
    if xdist.is_distributed(config):
        config.pluginmanager.register(xdist.CrashReports(config), "opperf-crash-reports")
        # each case on the devices it needs: collective groups on leased devices, kernel cases on the rest
        config.pluginmanager.register(xdist_schedule.LeasedDevices(config.stash.get(xdist.HOST_DEVICES, None),
                                                                   xdist.workers_dir(config)),
                                      "opperf-leased-devices")
    else:
        session = session_of(config)
        flush = session.controller.flush if session.controller is not None else (lambda: None)
        config.pluginmanager.register(isolation.CaseGuard(config, session.env.torch, settings.timeout_s, flush),
                                      "opperf-case-guard")
        if session.gate.active:
            config.pluginmanager.register(GateLoop(config, session.env, session.gate), "opperf-gate-loop")


def pytest_report_header(config: pytest.Config) -> list[str]:
    # pytest writes the header before xdist starts the workers: a session that opens late writes
    # these lines once it has opened, after the workers started (_Controller.pytest_sessionstart).
    return header_lines(config) if is_open(config) else []


def header_lines(config: pytest.Config) -> list[str]:
    pinning = [config.stash[PINNING_KEY]] if PINNING_KEY in config.stash else []
    session = session_of(config)
    width = terminal.Out.of(config, session.settings).width
    unused = [line for line in [benchmark_options.note(config)] if line]  # pytest-benchmark's options given
    ours = terminal.header(session.controller.header(), width) if session.controller is not None else []
    return ours + terminal.wrapped(pinning + config.stash.get(TUNED_KEY, []) + unused, width)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if collect.CASE_FIXTURE in metafunc.fixturenames:
        session = session_of(metafunc.config)
        session.collection.parametrize(metafunc, session.gate)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    # trylast: after -k/-m/--lf deselection, so N shards split what was selected.
    session = session_of(config)
    session.collection.check_config_files(items)
    collect.group_shapes(items)  # a shape's backends one after another: one reference serves them
    config.pluginmanager.get_plugin("opperf-schedule").arrange(items)  # the shard, and -n's order
    if not hasattr(config, "workerinput"):  # a serial run or a torchrun rank: groups never beside kernel cases
        collectives_last(items)
    if not config.option.collectonly and not xdist.is_distributed(config):  # this process runs the cases
        session.machine.warm_backends(backends_of(items))  # compilers' own start, beside the rest of start-up
        config.add_cleanup(session.machine.warmed)  # no kernel case ran: the process does not end mid-compile


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    # The process that runs the cases (not an xdist controller), before the first: one Triton cache
    # directory for the sweep, and the profiler's start. It and the xdist controller (which runs no
    # tests) then leave their start-up's objects out of the garbage collector's walks.
    if session.config.option.collectonly:
        return
    if xdist.is_distributed(session.config):
        machine.freeze_heap()
    elif any("bench" in getattr(item, "fixturenames", ()) for item in session.items):  # a sweep, not other tests
        session_of(session.config).machine.before_first_case()
        machine.freeze_heap()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # An xdist worker's session is over (its reports are with the controller): it exits without
    # the interpreter's finalization, which the controller would wait for.
    if hasattr(config, "workerinput"):
        xdist.exit_without_finalizing()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):
    # The case's set-up phase (its row's phase_setup_ms and started_unix_s): every fixture's set-up.
    if group_size_of(item) is None and "bench" in getattr(item, "fixturenames", ()):
        session_of(item.config).machine.warmed()  # a kernel case is timed here: the warm-ups are done first
    item.stash[SETUP_KEY] = span = Span()
    try:
        return (yield)
    finally:
        span.stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem) -> None:
    # A collective group whose last case this was ends now: its ranks hold contexts on the GPUs.
    release_after(item, nextitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    # The record rides on the report: plain data, so it crosses from xdist workers. A case the gate
    # failed carries it too: its measurement is valid, and the controller stores and reports it.
    record = item.stash.get(RECORD_KEY, None)
    if call.when == "call" and _keeps(report, record):
        report.opperf_record = dict(record)  # a plain dict: xdist's wire carries nothing else
    if call.when == "call" and report.failed and CHECK_FAILED_KEY in item.stash:
        report.opperf_check_failed = dict(item.stash[CHECK_FAILED_KEY])  # its stored rows stop being current
    if report.failed and collect.CASE_FIXTURE in getattr(item, "fixturenames", ()):
        report.opperf_case = True  # its message is ours: the controller fits it to the terminal
    return report


def _keeps(report: pytest.TestReport, record) -> bool:
    """A measured case's record is kept when its test passed, or failed on the gate alone."""
    return record is not None and (report.passed or Record(record).gate_fails)


class _Controller:
    """Hooks of the one process that writes: it receives every report, local or from workers."""

    def __init__(self, config: pytest.Config):
        self.config = config  # for the terminal's width

    @property
    def controller(self) -> Controller:
        return session_of(self.config).controller  # an xdist controller's session opens at its first use

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session: pytest.Session):
        # Before every implementation, so before xdist starts its workers: a calibration has the
        # device to itself, and the look at how busy the machine is sees other processes, not ours.
        # A session that opens late does both as it opens, after (run/session.py).
        late = not is_open(session.config)
        if not late and not session.config.option.collectonly:
            self.controller.start()
        result = yield
        controller = self.controller  # a late session opens here, once xdist has started the workers
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if late and reporter is not None and reporter.showheader and not reporter.no_header:
            for line in header_lines(session.config):
                reporter.write_line(line)
        if progress.wanted(session.config):  # the terminal reporter is there by now
            shown = progress.Progress(session.config, controller.env.activity, controller.env.db_path)
            session.config.pluginmanager.register(shown, "opperf-progress")
        return result

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "opperf_record", None)
        if report.when == "call" and _keeps(report, record):
            self.controller.add_record(record)
        if report.when == "call" and getattr(report, "opperf_check_failed", None):
            self.controller.mark_check_failed(report.opperf_check_failed)
        if getattr(report, "opperf_case", False):
            terminal.fit_failure(report, terminal.Out.of(self.config, self.controller.settings).width)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        # xdist: a worker's machine reference timings come with its output.
        self.controller.gate.add_reference(getattr(node, "workeroutput", {}).get(REFERENCE_OUTPUT))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        c = self.controller
        collectonly = session.config.option.collectonly
        c.finish(collectonly)
        if c.settings.html_file is not None and not collectonly:
            c.notes.append(terminal.html_report(c.settings.html_file, c.stored_db(), c.gate_report(),
                                                c.settings.hardware_file))
        session.exitstatus = c.exit_status(session.exitstatus)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    record = getattr(report, "opperf_record", None)
    if record is not None and report.when == "call" and report.passed:
        verdict = record.get("gate") or {}
        ratio = f" ({verdict['ratio']:.2f}x, {verdict['verdict']})" if verdict.get("ratio") is not None else ""
        return "passed", ".", (f"PASSED {record['time_us']:.2f} us{ratio}", {"green": True})
    return None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    session = session_of(config)
    if session.controller is None:
        return
    run = session.controller.summary()
    out = terminal.Out.of(config, session.settings)
    if run.records or run.failed_to_write or run.notes:
        terminalreporter.section("opperf")
        terminal.summary(run, out)
    if session.gate.comparison is not None:
        terminalreporter.section("opperf gate")
        terminal.gate_summary(session.gate.comparison, session.settings.summary_rows, out)

