"""Where a session's start and end go: a pytest plugin that stamps, from the process
start, the plugin's import, configure, the end of collection, the run loop's start and the first
case's start; and after the last case the start of sessionfinish and of the terminal summary,
the end of unconfigure and the last atexit handler. Printed on stderr at exit (seconds after the
process start, then seconds after the last case).

    s=$(date +%s.%N); PYTHONPATH=benchmarks python3 -m pytest benches/ -p session_end_stamps -k ...; date +%s.%N
"""

import atexit
import os
import sys
import time

import pytest

T = {}
S = {"plugin imported": time.time()}


def _process_start() -> float:
    """The process's start in unix seconds (Linux: /proc), else the plugin's import."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return S["plugin imported"]


def _dump():
    T["atexit (last handler)"] = time.time()
    base = _process_start()
    print("START STAMPS", {k: round(v - base, 3) for k, v in S.items()}, file=sys.stderr, flush=True)
    print("SLOW HOOK IMPLEMENTATIONS", IMPLS, file=sys.stderr, flush=True)
    base = T.get("last case end")
    print("END STAMPS", {k: round(v - base, 3) for k, v in T.items()} if base else T, file=sys.stderr, flush=True)


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

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        T["unconfigure first"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    T["unconfigure last"] = time.time()
