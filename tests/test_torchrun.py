"""One sweep over a torchrun world, on a CPU: two simulated nodes on this machine (two torchrun
launches, --nnodes=2, a c10d rendezvous on 127.0.0.1), each in its own copy of a project, as two
hosts would run it. Kernel cases are shared (each measured once), collectives run on the world,
rank 0 writes the one database; a rank killed mid-sweep and a world that never assembles end
with one line, not a hang."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT_S = 240  # each launch: two interpreters importing torch on a busy 2-core machine

GEMM = """backend: torch
dtypes: [fp32]
params:
  m: [16, 32, 48, 64, 80, 96]
  n: [32]
  k: [32]
"""
ALL_REDUCE = """backend: torch_dist
dtypes: [fp32]
params:
  num_devices: [all]
  message_bytes: [4096]
  reduce_op: [sum]
"""
BENCHES = """
def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)


def test_all_reduce(backend, collective):
    collective(backend)
"""
# Rank 1 dies in its second case, as a process killed by the OOM killer or a segfault would. It
# dies only once rank 0 has ended a case of its own (a file says so), so that rank 0 has a share to
# store however the two processes are scheduled on a busy machine (CI once ran rank 1's two cases
# before rank 0 had ended one).
DIES = """
import os
import time
from pathlib import Path

DONE = Path({done!r})
seen = []


def pytest_runtest_logfinish(nodeid, location):
    if os.environ.get("RANK") == "0":
        DONE.touch()


def pytest_runtest_call(item):
    if os.environ.get("RANK") == "1":
        seen.append(item.nodeid)
        if len(seen) == 2:
            deadline = time.monotonic() + 60
            while not DONE.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            os._exit(9)
"""
# Rank 1 differs from rank 0 in two ways a real world does:
# - it would loop a different number of calls per sample (its own clock's reading of a call's
#   time): a collective called a different number of times on two ranks waits forever, so the
#   ranks must take the leader's counts;
# - its kernel cases end 12 s after rank 0's, longer than the rank timeout (8 s): rank 0 must wait
#   for it before the collectives for as long as it is alive, not fail them at the timeout.
RANK1_DIFFERS = """
import os
import time

SLOW = []

if os.environ.get("RANK") == "1":
    from pytest_opperf.measure import collective

    _loop_calls = collective.loop_calls
    collective.loop_calls = lambda *args: _loop_calls(*args) + 3


def pytest_runtest_call(item):
    if os.environ.get("RANK") == "1" and "test_gemm" in item.nodeid and not SLOW:
        SLOW.append(item.nodeid)
        time.sleep(12)
"""
FAST = ["--opperf-budget=0.05", "--opperf-min-samples=3", "--opperf-warmup=0", "--opperf-clock-warmup=off",
        "--opperf-contention=off", "-p", "no:cacheprovider"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(root: Path, name: str, conftest: str = "", collectives: bool = True) -> Path:
    """One node's copy of the project."""
    node = root / name
    (node / "configs").mkdir(parents=True)
    (node / "benches").mkdir()
    (node / "configs" / "gemm.yaml").write_text(GEMM)
    if collectives:
        (node / "configs" / "all_reduce.yaml").write_text(ALL_REDUCE)
    tests = BENCHES if collectives else BENCHES.split("\n\ndef test_all_reduce")[0] + "\n"
    (node / "benches" / "test_ops.py").write_text(tests)
    (node / "pytest.ini").write_text("[pytest]\n")
    if conftest:
        (node / "conftest.py").write_text(conftest)
    return node


def _environ() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "OPPERF_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch(node: Path, port: int, *args: str, nnodes: int = 2, rdzv_conf: str = "") -> subprocess.Popen:
    # A run id of its own (it names the rank logs): the suite's xdist workers run these side by side.
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=opperf-test-{port}",
               "--max-restarts=0"]
    if rdzv_conf:
        command.append(f"--rdzv-conf={rdzv_conf}")
    command += ["-m", "pytest", "benches/", "--device=cpu", *FAST, *args]
    return subprocess.Popen(command, cwd=node, env=_environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _finish(procs: list) -> list:
    out = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            pytest.fail(f"a torchrun launch did not end within {TIMEOUT_S} s:\n{text[-3000:]}")
        out.append((proc.returncode, text))
    return out


def _rows(db: Path, table: str) -> list:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"select * from {table}")]
    finally:
        con.close()


def test_two_nodes_are_one_sweep_with_one_database(tmp_path):
    port = _free_port()
    nodes = [_node(tmp_path, "node-a", conftest=RANK1_DIFFERS), _node(tmp_path, "node-b", conftest=RANK1_DIFFERS)]
    results = _finish([_launch(node, port, "--opperf-rank-timeout=8") for node in nodes])
    written = [node for node in nodes if (node / "results" / "cpu.db").exists()]
    assert len(written) == 1, "\n\n".join(text[-2000:] for _, text in results)
    writer = nodes.index(written[0])
    code, text = results[writer]
    assert code == 0, text[-4000:]
    assert "torchrun: 2 ranks on 2 nodes" in text, text[-3000:]
    db = written[0] / "results" / "cpu.db"
    gemm = _rows(db, "gemm")
    assert sorted(r["m"] for r in gemm) == [16, 32, 48, 64, 80, 96]  # each kernel case once
    assert {r["rank"] for r in gemm} == {0, 1}  # measured by both ranks
    assert {r["num_nodes"] for r in gemm} == {2}
    assert len({r["run_id"] for r in gemm}) == 1  # one sweep
    reduce = _rows(db, "all_reduce")
    assert [(r["num_devices"], r["num_nodes"], r["topology_tier"], r["topology_link"]) for r in reduce] == \
        [(2, 2, 0, "network")]
    assert reduce[0]["comm_convention"] == "loop" and reduce[0]["timer"] == "loop"
    other_code, other_text = results[1 - writer]
    assert other_code == 0, other_text[-3000:]
    assert "opperf" not in other_text.replace(f"opperf-test-{port}", "")  # rank 1 is quiet: its output goes to a log


# Rank 1 (node-b: the later launch, so the later agent's pid and the second place in the
# rendezvous) dies in its second case. "timeout": rank 0's node holds torchrun's rendezvous (is_host;
# left to itself, the agent that binds the port first holds it, which on a loaded host can be the
# later launch's), and rank 0 names the silent rank once its heartbeat is 8 s old. "sigterm":
# node-b holds it, so once its agent fails and exits, rank 0's agent loses the rendezvous and ends
# rank 0 (SIGTERM) long before the 60 s rank timeout; rank 0 names the rank it was still waiting for.
@pytest.mark.parametrize("rank_timeout, hosts", [("8", ("is_host=1", "is_host=0")), ("60", ("is_host=0", "is_host=1"))],
                         ids=["timeout", "sigterm"])
def test_a_rank_killed_mid_sweep_ends_the_sweep_with_one_line_naming_it(tmp_path, rank_timeout, hosts):
    port = _free_port()
    dies = DIES.format(done=str(tmp_path / "rank0-ended-a-case"))
    nodes = [_node(tmp_path, name, conftest=dies, collectives=False) for name in ("node-a", "node-b")]
    start = time.monotonic()
    procs = []
    for node, host in zip(nodes, hosts):
        procs.append(_launch(node, port, f"--opperf-rank-timeout={rank_timeout}", rdzv_conf=host))
        time.sleep(0.5)  # node-a's agent starts first: the lower pid, rank 0
    results = _finish(procs)
    assert time.monotonic() - start < TIMEOUT_S
    written = [node for node in nodes if (node / "results" / "cpu.db").exists()]
    assert len(written) == 1, "\n\n".join(text[-2000:] for _, text in results)
    code, text = results[nodes.index(written[0])]
    assert code != 0
    named = [line for line in text.splitlines() if "rank 1 (node 1" in line and "stopped answering" in line]
    assert len(named) == 1, text[-3000:]
    if rank_timeout == "8":
        assert "silent for" in named[0], named[0]
    else:
        assert "not finished when this rank was stopped" in named[0], named[0]
        assert time.monotonic() - start < 60  # before rank 0's own timeout could have fired
    assert "[rank0]:" not in text  # no traceback of rank 0 (torchrun's agent reports the exit code its own way)
    rows = _rows(written[0] / "results" / "cpu.db", "gemm")
    assert {r["rank"] for r in rows} >= {0}  # rank 0's share is stored
    assert 1 <= sum(1 for r in rows if r["rank"] == 1) <= 1  # rank 1's first case reached rank 0; its second did not


# Rank 0 fails its first case under -x: its session stops, and so does every other rank's after
# its current case (the sweep is one session). Before, rank 0 waited for rank 1 to finish its share
# while rank 1 waited for rank 0 at the collectives: both alive, neither ever done.
FAILS_ON_RANK_0 = """
import os
import time


def pytest_runtest_call(item):
    if "test_gemm" not in item.nodeid:
        return
    if os.environ.get("RANK") == "0":
        raise AssertionError("rank 0 fails here")
    time.sleep(1)  # rank 1 is mid-share when rank 0 stops
"""


def test_x_on_one_rank_stops_every_rank(tmp_path):
    port = _free_port()
    nodes = [_node(tmp_path, name, conftest=FAILS_ON_RANK_0) for name in ("node-a", "node-b")]
    start = time.monotonic()
    results = _finish([_launch(node, port, "-x", "--opperf-rank-timeout=60") for node in nodes])
    assert time.monotonic() - start < 60  # neither waited out the rank timeout
    written = [node for node in nodes if (node / "results" / "cpu.db").exists()]
    assert len(written) == 1, "\n\n".join(text[-2000:] for _, text in results)
    code, text = results[nodes.index(written[0])]
    assert code == 1, text[-3000:]
    assert "stopping after 1 failures" in text, text[-3000:]
    assert "stopped answering" not in text, text[-3000:]
    ranks_line = [line for line in text.splitlines() if line.startswith("opperf: rank 1: ")]
    assert ranks_line and "passed" in ranks_line[0], text[-3000:]  # rank 1 ended its session and said so
    rows = _rows(written[0] / "results" / "cpu.db", "gemm")
    assert len(rows) < 6 and {r["rank"] for r in rows} <= {1}  # rank 1 stopped before its share's end


def test_a_world_that_never_assembles_is_one_line_not_a_hang(tmp_path):
    node = _node(tmp_path, "alone", collectives=False)
    env = {**_environ(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "benches/", "--device=cpu", "--opperf-rank-timeout=2",
                           *FAST], cwd=node, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert time.monotonic() - start < 120
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "could not join" in line]
    assert len(errors) == 1 and "--opperf-rank-timeout" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (node / "results" / "cpu.db").exists()


def test_torchrun_with_one_node_missing_ends_at_its_join_timeout(tmp_path):
    # The rendezvous is torchrun's (before any process of ours starts): its join timeout ends it.
    node = _node(tmp_path, "alone", collectives=False)
    start = time.monotonic()
    (code, text), = _finish([_launch(node, _free_port(), rdzv_conf="join_timeout=2")])
    assert code != 0
    assert time.monotonic() - start < 120
    assert not (node / "results" / "cpu.db").exists()


def test_a_check_that_failed_on_another_rank_marks_rank_0s_stored_rows():
    # A rank > 0 mails its failed case with what the check found; rank 0, the writer, marks the
    # stored rows of that case as it does for its own failures (they stop being current).
    from pytest_opperf.run.world import World

    marked = []
    world = World.__new__(World)  # its hooks' state alone: no store, no process group
    world.controller = type("Controller", (), {"mark_check_failed": lambda self, failure: marked.append(failure)})()
    world.failures = []
    failure = {"op": "gemm", "m": 16, "n": 32, "k": 32, "dtype_in": "fp32", "dtype_out": "fp32",
               "backend": "torch", "knobs": "", "check_failed": "normwise relative error 0.01 exceeds 0.0001"}
    world._take(1, {"kind": "failed", "nodeid": "benches/test_ops.py::test_gemm[x]", "when": "call",
                    "line": "functional check failed", "check_failed": failure})
    world._take(1, {"kind": "failed", "nodeid": "benches/test_ops.py::test_gemm[y]", "when": "call",
                    "line": "AssertionError", "check_failed": None})
    assert marked == [failure]
    assert world.failures == ["rank 1: FAILED benches/test_ops.py::test_gemm[x]: functional check failed",
                              "rank 1: FAILED benches/test_ops.py::test_gemm[y]: AssertionError"]


class _Store:
    """torchrun's key-value store as the mailbox uses it, in a dict."""

    def __init__(self):
        self.data = {}

    def add(self, key, n):
        self.data[key] = int(self.data.get(key, 0)) + n
        return self.data[key]

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)


def _world_of(rank: int, store: _Store, timeout_s: float = 0.3):
    from pytest_opperf.run.ranks import Mailbox, Rank
    from pytest_opperf.run.world import World

    me = Rank(rank, 2, 0, 1, rank, 2, (0, 1), ("a", "b"), "run", timeout_s)
    world = World.__new__(World)  # its hooks' state alone: no process group
    world.rank, world.mailbox, world.controller = me, Mailbox(store, "opperf/run", me), None
    world.failures, world.counts, world.logs, world.received = [], {}, {}, {}
    world.meeting = None
    return world


def test_before_the_collectives_rank_0_waits_for_the_others_or_calls_it_off_for_a_silent_one():
    from pytest_opperf.run.world import COLLECTIVES

    store = _Store()
    rank1 = _world_of(1, store)
    rank1.mailbox.arrive(COLLECTIVES)
    assert _world_of(0, store)._meet(COLLECTIVES) is None  # both there: no wait

    store = _Store()  # rank 1 never arrives and its heartbeat stops: rank 0 says so, and tells rank 1
    why = _world_of(0, store)._meet(COLLECTIVES)
    assert why.startswith("rank 1 stopped answering before them (silent for") and "--opperf-rank-timeout=0.3" in why
    assert _world_of(1, store)._meet(COLLECTIVES) == why


def test_ranks_that_share_a_host_share_its_cores():
    # Two torchrun "nodes" on one host (each LOCAL_WORLD_SIZE 1) still share its CPUs: a CPU sweep's
    # intra-op threads are divided among the ranks on the host, not given whole to each.
    from pytest_opperf.run.ranks import Rank
    from pytest_opperf.run.session import _processes

    def rank(r, hosts, local_world_size):
        return Rank(r, len(hosts), 0, local_world_size, r, len(set(hosts)), tuple(range(len(hosts))), hosts, "run", 5)

    assert _processes(None, rank(0, ("vm", "vm"), 1)) == 2
    assert _processes(None, rank(1, ("a", "b"), 1)) == 1  # two hosts of one rank each
    assert _processes(None, rank(2, ("a", "a", "b", "b"), 2)) == 2


def _baseline(path: Path, time_us: float) -> None:
    """A baseline of the gemm cases of GEMM (as saved on this machine), each at time_us."""
    import json

    import torch

    cases = [{"op": "gemm", "backend": "torch", "dtype_in": "fp32", "dtype_out": "fp32",
              "params": {"m": m, "n": 32, "k": 32}, "time_us": time_us, "time_us_p95": time_us, "ci_rel": 0.001,
              "cv": 0.01, "samples": 100, "backend_version": torch.__version__, "timer": "cpu", "cache": "hot",
              "runs": [time_us] * 3} for m in (16, 32, 48, 64, 80, 96)]
    path.write_text(json.dumps({"format": "pytest-opperf-baseline/1", "device": "cpu", "cases": cases}))


def test_the_gate_judges_every_rank_s_cases_and_rank_0_fails_the_sweep(tmp_path):
    # A baseline a thousand times faster than any CPU: every case regresses, on whichever rank ran it.
    # Judged on the threshold alone: under the ci rule a case whose median's interval is wider than
    # itself is noisy at any ratio (on a loaded host a 35000x case with 3 samples read CV 2.1, NOISY).
    port = _free_port()
    nodes = [_node(tmp_path, name, collectives=False) for name in ("node-a", "node-b")]
    for node in nodes:
        _baseline(node / "base.json", 0.001)
    gate = ("--opperf-baseline=base.json", "--opperf-gate-rule=threshold", "--opperf-confirm=0")
    results = _finish([_launch(node, port, *gate) for node in nodes])
    written = [node for node in nodes if (node / "results" / "cpu.db").exists()]
    assert len(written) == 1, "\n\n".join(text[-2000:] for _, text in results)
    code, text = results[nodes.index(written[0])]
    assert code == 1, text[-3000:]
    assert "gate: FAILED: 6 regressed" in text, text[-3000:]
    rank1 = [line for line in text.splitlines() if line.startswith("opperf: rank 1: FAILED") and "regression" in line]
    assert len(rank1) >= 1, text[-3000:]  # rank 1's regressions reach rank 0's terminal
    rows = _rows(written[0] / "results" / "cpu.db", "gemm")
    assert sorted(r["m"] for r in rows) == [16, 32, 48, 64, 80, 96]  # a regressed measurement is still a row
    assert {r["rank"] for r in rows} == {0, 1}


def test_a_group_the_world_cannot_make_is_one_line():
    # torch.distributed refuses to make the group (here: no world was ever joined): the case gets
    # one line naming the group and the option, not c10d's traceback.
    import torch

    from pytest_opperf.run.collective import RankFailure, WorldGroup
    from pytest_opperf.run.ranks import Rank

    rank = Rank(0, 2, 0, 1, 0, 2, (0, 1), ("a", "b"), "run", 5)
    with pytest.raises(RankFailure) as failed:
        WorldGroup(2, rank, "cpu", torch.device("cpu"), 5.0)
    said = str(failed.value)
    assert said.startswith("the world's ranks did not all make the group of 2 within 5 s (--opperf-rank-timeout): ")
    assert "\n" not in said and "Traceback" not in said


def test_collective_cases_fail_with_the_reason_the_meeting_was_called_off():
    from pytest_opperf.case import CASE_FIXTURE, Case
    from pytest_opperf.run.world import COLLECTIVES

    store = _Store()
    world = _world_of(1, store)
    world.mailbox.call_off(COLLECTIVES, "rank 0 ended its session before the collective cases")
    case = Case("all_reduce", "torch_dist", None, "fp32", "fp32", (("num_devices", 2), ("message_bytes", 4096)))
    item = type("Item", (), {"callspec": type("Spec", (), {"params": {CASE_FIXTURE: case}})()})()
    for _ in range(2):  # the first collective case asks; the later ones fail with the same line
        with pytest.raises(pytest.fail.Exception, match="^collective cases not run: rank 0 ended its session before"):
            world.pytest_runtest_setup(item)
    kernel = type("Item", (), {"callspec": type("Spec", (), {"params": {CASE_FIXTURE: Case(
        "gemm", "torch", None, "fp32", "fp32", (("m", 16),))}})()})()
    world.pytest_runtest_setup(kernel)  # a kernel case is not held at the meeting
