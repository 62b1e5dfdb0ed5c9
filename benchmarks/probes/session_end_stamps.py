"""Where a session's start and end go: a pytest plugin that stamps, from the process
start, the plugin's import, configure, the end of collection, the run loop's start and the first
case's start; and after the last case the start of sessionfinish and of the terminal summary,
the end of unconfigure and the last atexit handler. Printed on stderr at exit (seconds after the
process start, then seconds after the last case).

Under xdist the controller also stamps the workers' spawn, each worker's ready, collection and
end (and their first and last case, from the reports' own times), and each worker prints its own
stamps, from the controller's start, prefixed with its id ("gw0 START STAMPS ...").

    s=$(date +%s.%N); PYTHONPATH=benchmarks/probes python3 -m pytest benches/ -p session_end_stamps -k ...; date +%s.%N
"""

import atexit
import os
import sys
import time

import pytest

T = {}
S = {"plugin imported": time.time()}


WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in an xdist worker before its plugins load
PREFIX = f"{WORKER} " if WORKER else ""


def _process_start(pid: int) -> float:
    """A process's start in unix seconds (Linux: /proc, to the clock tick), else the plugin's import."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return S["plugin imported"]


def _dump():
    T["atexit (last handler)"] = time.time()
    base = _process_start(os.getppid() if WORKER else os.getpid())  # a worker's parent: the controller
    if WORKER:
        S["process start"] = _process_start(os.getpid())
        S["atexit (last handler)"] = T["atexit (last handler)"]
    print(PREFIX + "START STAMPS", {k: round(v - base, 3) for k, v in S.items()}, file=sys.stderr, flush=True)
    print(PREFIX + "SLOW HOOK IMPLEMENTATIONS", IMPLS, file=sys.stderr, flush=True)
    base = T.get("last case end")
    print(PREFIX + "END STAMPS", {k: round(v - base, 3) for k, v in T.items()} if base else T, file=sys.stderr, flush=True)
    if os.environ.get("STAMPS_FAST_EXIT"):
        os._exit(0)


atexit.register(_dump)  # registered first: runs last


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    S["configure"] = time.time()
    config.pluginmanager.register(_First(), "session-end-stamps-first")
    # cleanups run last first: this one, registered before the plugin's own, runs after them
    config.add_cleanup(lambda: T.setdefault("config cleanups done", time.time()))


IMPLS: dict = {}  # "hook: plugin" -> seconds, for the implementations that took over 5 ms


def pytest_sessionstart(session):
    """Time each plain implementation of the session-end hooks (wrappers excluded)."""
    manager = session.config.pluginmanager
    for hook in ("pytest_sessionfinish", "pytest_terminal_summary", "pytest_unconfigure"):
        for impl in getattr(session.config.hook, hook).get_hookimpls():
            if impl.hookwrapper or getattr(impl, "wrapper", False):
                continue
            label = f"{hook}: {manager.get_name(impl.plugin) or impl.plugin_name}"

            def timed(*args, _fn=impl.function, _label=label, **kwargs):
                start = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    spent = time.perf_counter() - start
                    if spent > 0.005:
                        IMPLS[_label] = round(spent, 3)

            impl.function = timed


def _stamp_node(event: str, node) -> None:
    S[f"{node.gateway.id} {event}"] = time.time()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    S["workers spawn"] = time.time()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node):
    _stamp_node("ready", node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _stamp_node("collected", node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    T[f"{node.gateway.id} down"] = time.time()


def pytest_runtest_logreport(report):
    """The controller under xdist: the first and last case from the workers' reports."""
    if WORKER or not hasattr(report, "node"):
        return
    if report.when == "setup":
        S["first case setup"] = min(S.get("first case setup", report.start), report.start)
    if report.when == "teardown":
        T["last case end"] = max(T.get("last case end", report.stop), report.stop)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    S["collection finished"] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    S["run loop"] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    S.setdefault("first case setup", time.time())


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    T["last case end"] = time.time()



@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    T["sessionfinish first"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary():
    T["terminal summary last"] = time.time()


class _First:
    """The tryfirst stamps of hooks the module also stamps trylast."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_terminal_summary(self):
        T["terminal summary first"] = time.time()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionfinish(self, session):
        yield
        T["sessionfinish done"] = time.time()

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        T["unconfigure first"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    T["unconfigure last"] = time.time()
