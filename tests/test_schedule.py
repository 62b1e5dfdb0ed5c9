"""The sweep's schedule by recorded time: -n hands the longest cases out first, --opperf-shard balances
the shares' seconds (run/schedule.py, run/shard.py, run/durations.py). Real sessions on real results
databases; a backend that sleeps a known time per call stands in for kernels of known durations."""

import json
import shutil
import sqlite3

import pytest

from conftest import FAST, rows_at, write_config
from pytest_opperf.run import durations, schedule, shard

# `add` of n elements sleeps n ms per call: a case's wall time grows with n, whatever the machine.
# Under OPPERF_TEST_AWAKE it does not: for a run whose order (made from a history) is under test,
# not its times.
SLEEPY = """

import os
import time


@register_backend("add", "sleepy")
def add_sleepy(a, b):
    if not os.environ.get("OPPERF_TEST_AWAKE"):
        time.sleep(a.numel() / 1000)
    return torch.add(a, b)
"""

# Each process writes the order its cases run in (after every plugin's modifyitems) to order-<worker>.json.
ORDER = """

import json, os


def pytest_collection_finish(session):
    # Not PYTEST_XDIST_WORKER: a serial run inside an xdist worker of the suite inherits it.
    name = getattr(session.config, "workerinput", {}).get("workerid", "serial")
    with open(f"order-{name}.json", "w") as f:
        json.dump([item.nodeid for item in session.items], f)
"""

SIZES = [2, 3, 5, 8, 13, 21, 34, 55, 89, 144]


@pytest.fixture
def sleepy(project):
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + SLEEPY + ORDER)
    write_config(project, "add", f"backend: sleepy\ndtypes: fp32\nparams: {{N: {SIZES}}}\n")
    return project


_HISTORY: dict[str, bytes] = {}  # the database of the first serial run in this process


@pytest.fixture
def history(sleepy):
    """sleepy with results/cpu.db of a serial run of its 10 cases. One run per process, copied to the
    tests after it: the schedule reads a run's recorded times, however many tests read that run."""
    db = sleepy.path / "results" / "cpu.db"
    if not _HISTORY:
        sleepy.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=10)
        _HISTORY["cpu.db"] = db.read_bytes()
    else:
        db.parent.mkdir()
        db.write_bytes(_HISTORY["cpu.db"])
    return sleepy


def longest_recorded(project) -> list:
    """The test ids of the history, longest recorded first."""
    recorded = case_seconds(project.path / "results" / "cpu.db")
    return sorted(recorded, key=recorded.get, reverse=True)


def case_seconds(db, run_id=None) -> dict:
    """Seconds per test id of a database's add rows (of one run)."""
    return {r["test_id"]: r["ended_unix_s"] - r["started_unix_s"] for r in rows_at(db, "add")
            if run_id is None or r["run_id"] == run_id}


def order_of(project, name: str) -> list:
    return json.loads((project.path / f"order-{name}.json").read_text())


def test_lpt_balances_by_weight_and_counts_without_history():
    weights = {f"t{i}": float(i) for i in range(1, 11)}  # 55 s over 3 shares
    shares = [sum(weights[t] for t in b) for b in shard.lpt(weights, 3)]
    assert max(shares) - min(shares) <= 1.0
    assert shard.lpt(dict.fromkeys("edcba", 1.0), 2) == [["a", "c", "e"], ["b", "d"]]  # round-robin of sorted ids
    assert [len(b) for b in shard.lpt(weights, 2, [3, 7])] == [3, 7]  # sizes cap a bin


@pytest.mark.parametrize("dist", ["load", "worksteal", "loadscope", "loadfile", "loadgroup", "each"])
def test_every_dist_mode_gets_each_case_once(dist):
    ids = [f"f{i % 3}.py::t[{i}]" for i in range(40)]
    weights = {t: float(i % 7) for i, t in enumerate(ids)}
    ordered = schedule.order(weights, ids, dist, workers=4, maxschedchunk=None)
    assert sorted(ordered) == sorted(ids)
    if dist == "each":
        assert ordered == ids


def test_load_first_blocks_are_balanced_and_scoped_modes_keep_scopes_whole():
    ids = [f"t{i}" for i in range(40)]
    weights = {t: float(i) for i, t in enumerate(ids)}
    ordered = schedule.order(weights, ids, "load", workers=2)
    chunk = 40 // 2 // 4  # xdist's first hand-out: a block of 5 per worker
    first, second = ordered[:chunk], ordered[chunk:2 * chunk]
    assert set(first + second) == {f"t{i}" for i in range(30, 40)}  # the 10 longest go out first
    assert abs(sum(map(weights.get, first)) - sum(map(weights.get, second))) <= 5
    assert ordered[2 * chunk:] == [f"t{i}" for i in range(29, -1, -1)]  # then longest first
    files = [f"f{i % 4}.py::t{i}" for i in range(12)]
    scoped = schedule.order({t: float(i) for i, t in enumerate(files)}, files, "loadfile", workers=2)
    assert [t.split("::")[0] for t in scoped][:3] == ["f3.py"] * 3  # f3 holds the most time (3+7+11)


def test_durations_file_is_checked(tmp_path):
    path = tmp_path / ".test_durations"
    path.write_text(json.dumps({"a.py::t": 1.5, "a.py::u": 0}))
    assert durations.from_file(path) == {"a.py::t": 1.5, "a.py::u": 0.0}
    for bad, why in (([1, 2], "expected a JSON object"), ({"a.py::t": "slow"}, "'a.py::t': expected seconds >= 0"),
                     ({"a.py::t": -1}, "expected seconds >= 0")):
        path.write_text(json.dumps(bad))
        with pytest.raises(durations.DurationsError, match=why):
            durations.from_file(path)
    path.write_text("{")
    with pytest.raises(durations.DurationsError, match="invalid JSON"):
        durations.from_file(path)


def test_n2_hands_out_the_longest_recorded_cases_first_and_serial_keeps_its_order(history, monkeypatch):
    history.runpytest("benches", "-k", "add", "--collect-only", *FAST)
    collected = order_of(history, "serial")
    assert len(collected) == 10
    db = history.path / "results" / "cpu.db"
    recorded = case_seconds(db)
    # The history as recorded: each case's set-up to record, longer for the longer sleep.
    assert durations.recorded(db, float("inf")) == pytest.approx(recorded)
    longest = longest_recorded(history)
    assert longest[0].endswith("[sleepy-fp32-n=144]") and longest[1].endswith("[sleepy-fp32-n=89]")

    monkeypatch.setenv("OPPERF_TEST_AWAKE", "1")
    result = history.runpytest("benches", "-k", "add", "-n", "2", *FAST)
    result.assert_outcomes(passed=10)
    for worker in ("gw0", "gw1"):
        ordered = order_of(history, worker)
        assert sorted(ordered) == sorted(collected) and ordered != collected
    # xdist's load mode hands each worker its first block of 2: the 4 longest, balanced.
    assert order_of(history, "gw0")[:4] == [longest[0], longest[3], longest[1], longest[2]]
    con = sqlite3.connect(db)
    run_id = con.execute("select run_id from runs order by started_at desc, rowid desc").fetchone()[0]
    firsts = con.execute("select worker, test_id from [add] where run_id = ? order by started_unix_s",
                         [run_id]).fetchall()
    first_of = {}
    for worker, test_id in firsts:
        first_of.setdefault(worker, test_id)
    assert set(first_of.values()) == {longest[0], longest[1]}  # each worker began with one of the two longest

    # Serial runs keep the collection order, history or not (the order is made at collection).
    history.runpytest("benches", "-k", "add", "--collect-only", *FAST)
    assert order_of(history, "serial") == collected


# worksteal: the longest goes out first; loadgroup: whole groups (here the module) go out, its
# cases longest first.
@pytest.mark.parametrize("dist, worker, first", [("worksteal", "gw0", 1), ("loadgroup", "gw1", 2)])
def test_other_dist_modes_hand_out_the_longest_recorded_cases_first(history, dist, worker, first, monkeypatch):
    longest = longest_recorded(history)
    monkeypatch.setenv("OPPERF_TEST_AWAKE", "1")
    result = history.runpytest("benches", "-k", "add", "-n", "2", "--dist", dist, *FAST)
    result.assert_outcomes(passed=10)
    assert order_of(history, worker)[:first] == longest[:first]


def test_n2_without_history_keeps_the_collection_order(sleepy, monkeypatch):
    monkeypatch.setenv("OPPERF_TEST_AWAKE", "1")
    sleepy.runpytest("benches", "-k", "add", "-n", "2", *FAST).assert_outcomes(passed=10)
    sleepy.runpytest("benches", "-k", "add", "--collect-only", *FAST)
    assert order_of(sleepy, "gw0") == order_of(sleepy, "gw1") == order_of(sleepy, "serial")


def test_shards_of_recorded_times_each_within_a_quarter_of_the_mean(history):
    """Issue 36's acceptance on a CPU: cases of known, very different durations (2 to 144 ms a call)."""
    db_of_history = history.path / "results" / "cpu.db"
    recorded = case_seconds(db_of_history)
    spent = []
    for i in range(3):
        # Each shard starts from the same history (as CI jobs from one artifact), into its own directory.
        (history.path / f"shard{i}").mkdir()
        shutil.copy(db_of_history, history.path / f"shard{i}" / "cpu.db")
        result = history.runpytest("benches", "-k", "add", f"--opperf-shard={i}/3", f"--opperf-results=shard{i}", *FAST)
        result.stdout.fnmatch_lines([f"opperf: shard {i}/3: * of 10 cases, expected * s of * s "
                                     f"(10 of 10 timed by *cpu.db)"])
        db = history.path / f"shard{i}" / "cpu.db"
        run_id = sqlite3.connect(db).execute("select run_id from runs order by started_at desc, rowid desc").fetchone()[0]
        spent.append(sum(case_seconds(db, run_id).values()))
    mean = sum(spent) / 3
    assert all(abs(s - mean) <= 0.25 * mean for s in spent), spent
    # The count's deal of sorted ids (without history) misses it on the same cases: the test can fail.
    by_count = [sum(recorded[t] for t in b) for b in shard.lpt(dict.fromkeys(recorded, 1.0), 3)]
    assert any(abs(s - sum(by_count) / 3) > 0.25 * sum(by_count) / 3 for s in by_count), by_count


def test_shards_read_a_durations_file(sleepy):
    result = sleepy.runpytest("benches", "-k", "add", "--opperf-shard=0/2", "--collect-only", *FAST)
    result.stdout.fnmatch_lines(["opperf: shard 0/2: 5 of 10 cases (no recorded times: balanced by count)"])
    sleepy.runpytest("benches", "-k", "add", "--collect-only", *FAST)
    ids = order_of(sleepy, "serial")
    (sleepy.path / ".test_durations").write_text(json.dumps({ids[0]: 100.0}))  # one case of 100 s, the rest unknown
    result = sleepy.runpytest("benches", "-k", "add", "--opperf-shard=0/2", "--opperf-durations=.test_durations",
                              "--collect-only", *FAST)
    result.stdout.fnmatch_lines(["opperf: shard 0/2: 5 of 10 cases, expected 500.0 s of 1000.0 s "
                                 "(1 of 10 timed by *.test_durations, the others at the median)"])
    result = sleepy.runpytest("benches", "--opperf-durations=missing.json", *FAST)
    result.stderr.fnmatch_lines(["*--opperf-durations=*missing.json: no such file*"])
    (sleepy.path / "bad.json").write_text("[1]")
    result = sleepy.runpytest("benches", "--opperf-shard=0/2", "--opperf-durations=bad.json", *FAST)
    result.stderr.fnmatch_lines(["*--opperf-durations: *bad.json: expected a JSON object*"])


def test_n2_keeps_a_shapes_backends_together_longest_shape_first(sleepy, monkeypatch):
    # Two backends a shape: -n hands out shapes, their summed times longest first, each shape's
    # cases side by side in collection order, so one worker runs them on one reference output.
    write_config(sleepy, "add", "backends: [sleepy, torch]\ndtypes: fp32\nparams: {N: [2, 34, 89, 144]}\n")
    sleepy.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=8)
    serial = order_of(sleepy, "serial")
    assert [t.split("[")[1].split("-")[0] for t in serial[:2]] == ["sleepy", "torch"]  # grouped serially too
    monkeypatch.setenv("OPPERF_TEST_AWAKE", "1")
    sleepy.runpytest("benches", "-k", "add", "-n", "2", "--dist", "worksteal", *FAST).assert_outcomes(passed=8)
    for worker in ("gw0", "gw1"):
        ordered = order_of(sleepy, worker)
        shapes = [t.split("-n=")[1] for t in ordered]
        assert shapes[0::2] == shapes[1::2]  # each shape's two cases one after the other
        assert [t.split("[")[1].split("-")[0] for t in ordered[:2]] == ["sleepy", "torch"]
    # worksteal splits them into one block a worker, balanced: the 144 and 89 shapes apart.
    first = {order_of(sleepy, w)[0].split("-n=")[1] for w in ("gw0",)}
    assert first <= {"144]", "89]"}
