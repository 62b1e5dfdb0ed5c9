"""The plugin's own hooks: implement them in a conftest.py (or a plugin) to add to what a run stores.

They run in the process that writes (the controller under xdist), so an implementation sees every
record of the run, whichever worker measured it.

    # conftest.py
    def pytest_opperf_update_record(config, record):
        record["extra_info"] = {**(record.get("extra_info") or {}), "branch": "fast-path"}

    def pytest_opperf_machine_info(config, info):
        info["rack"] = "b12"

docs/hooks.md has the whole story and a worked example.
"""

from __future__ import annotations

import pluggy
import pytest

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_opperf_update_record(config: pytest.Config, record: dict) -> None:
    """Change a measured case's record before it is stored, in place.

    Called once per record, after its metrics (gflops, mfu, ...) are derived and before it is
    written to the database, the reports and the baseline. Values must stay plain data (str,
    int, float, None; a dict or list lands in a JSON column). A key that is not one of the
    table's columns (columns.py) is not stored: put your own data in `extra_info`.
    """


@hookspec
def pytest_opperf_machine_info(config: pytest.Config, info: dict) -> None:
    """Add to (or change) the run's machine description, in place.

    `info` is the environment part of the run's row in the `runs` table (device, driver, torch
    and library versions, host, git commit, ...), read once per run. A new key becomes a new
    column of `runs` (its value: str, int, float or None).
    """
