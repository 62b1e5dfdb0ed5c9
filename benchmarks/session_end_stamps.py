"""Where a session's end goes (issue 13): a pytest plugin that stamps the end of the last case, the
start of sessionfinish and of the terminal summary, the end of unconfigure and the last atexit
handler, and prints them (seconds after the last case) on stderr at exit.

    s=$(date +%s.%N); PYTHONPATH=benchmarks python3 -m pytest benches/ -p session_end_stamps -k ...; date +%s.%N
"""

import atexit
import sys
import time

import pytest

T = {}


def _dump():
    T["atexit (last handler)"] = time.time()
    base = T.get("last case end")
    print("END STAMPS", {k: round(v - base, 3) for k, v in T.items()} if base else T, file=sys.stderr, flush=True)


atexit.register(_dump)  # registered first: runs last


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    T["last case end"] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    T["sessionfinish first"] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary():
    T["terminal summary first"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    T["unconfigure last"] = time.time()
