"""The plugin's own hooks (hookspec.py), implemented in a project's conftest.py as a user would,
under a real session: what they add reaches the database, with and without xdist."""

import json

import pytest

from conftest import FAST, rows

HOOKS = """

def pytest_opperf_update_record(config, record):
    record["extra_info"] = {**(record.get("extra_info") or {}), "branch": "fast-path", "n_twice": 2 * record["n"]}


def pytest_opperf_machine_info(config, info):
    info["rack"] = "b12"
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_conftest_adds_to_every_record_and_to_the_run(project, workers):
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + HOOKS)
    result = project.runpytest("benches", "-k", "add and torch", *FAST, *workers)
    assert result.ret == 0, result.stdout.str()
    stored = rows(project, "add")
    assert len(stored) == 4
    assert all(json.loads(r["extra_info"]) == {"branch": "fast-path", "n_twice": 2 * r["n"]} for r in stored)
    (run,) = rows(project, "runs")
    assert run["rack"] == "b12"


def test_a_hook_that_does_nothing_changes_nothing(project):
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + "\n\ndef pytest_opperf_update_record(config, record):\n    pass\n")
    result = project.runpytest("benches", "-k", "add and torch", *FAST)
    assert result.ret == 0, result.stdout.str()
    assert all(r["extra_info"] is None for r in rows(project, "add"))
    assert "rack" not in rows(project, "runs")[0]
