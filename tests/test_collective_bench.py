"""Collectives: nccl-tests' bandwidth formulas by hand, each op's reference by hand, and real pytest
sessions whose ranks are gloo processes on this CPU (NCCL with two GPUs or more where present)."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from conftest import FAST, rows, write_config
from pytest_opperf import dtypes
from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.ops.collective import COLLECTIVES, algbw_gbps
from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes
from pytest_opperf.measure.collective import SendBuffers
from pytest_opperf.measure.stats import is_unstable
from pytest_opperf.run import options
from pytest_opperf.run.collective import bandwidth_columns, topology_tier
from pytest_opperf.view import timeline

load_builtin()
ROOT = Path(__file__).resolve().parent.parent
OPS_OF_FILE = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
multi_gpu = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs or more")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16 = DTypes(dtypes.lookup("bf16"), dtypes.lookup("bf16"))


# --- formulas ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75), ("all_reduce", 1, 0.0),
    ("all_gather", 2, 0.5), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 8, 0.875),
    ("broadcast", 8, 1.0), ("send_recv", 2, 1.0),
])
def test_bus_factor_is_nccl_tests(op, n, factor):
    # all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast and sendrecv 1
    assert COLLECTIVES[op].bus_factor(n) == pytest.approx(factor)


def test_algbw_and_busbw_of_a_hand_worked_all_reduce():
    # 1 GiB all-reduced over 8 ranks in 5000 us: algbw 1073741824 / 5e-3 s = 214.748 GB/s,
    # busbw = 214.748 x 2 x 7 / 8 = 375.809 GB/s, against a 450 GB/s link: 83.5%.
    cols = bandwidth_columns("all_reduce", 1073741824, 8, 5000.0, 450.0, 1, "nccl")
    assert cols["algbw_gbps"] == pytest.approx(214.7483648)
    assert cols["busbw_gbps"] == pytest.approx(375.8096384)
    assert cols["busbw_util"] == pytest.approx(0.835132530)
    assert (cols["topology_tier"], cols["comm_backend"], cols["link_gbps"]) == (1, "nccl", 450.0)


def test_algbw_of_all_gather_counts_the_gathered_buffer():
    # 64 MiB from each of 4 ranks: S = 256 MiB = 268435456 bytes; in 2000 us: 134.2 GB/s, busbw x 3/4.
    p = {"num_devices": 4, "message_bytes": 64 << 20}
    size = OPS["all_gather"].bytes(p, BF16)
    assert size == 268435456
    cols = bandwidth_columns("all_gather", size, 4, 2000.0, None, 1, "nccl")
    assert cols["algbw_gbps"] == pytest.approx(134.217728)
    assert cols["busbw_gbps"] == pytest.approx(100.663296)
    assert cols["busbw_util"] is None  # no link peak known (a CPU, a PCIe card)


def test_algbw_of_zero_time_is_unknown_not_infinite():
    assert algbw_gbps(1024, 0.0) is None
    assert algbw_gbps(2e9, 1e6) == pytest.approx(2.0)


def test_topology_tier_from_hosts_or_configured():
    assert topology_tier(["node1", "node2"], None) == 0
    assert topology_tier(["node1", "node1"], None) == 1
    assert topology_tier(["node1"], None) == 2
    assert topology_tier(["node1", "node1"], 0) == 0


# --- references by hand: what rank r must hold --------------------------------------------------


def _sent():
    return [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([10.0, 20.0, 30.0, 40.0])]


@pytest.mark.parametrize("op, params, rank, expected", [
    ("all_reduce", {"reduce_op": "sum"}, 1, [11.0, 22.0, 33.0, 44.0]),
    ("all_reduce", {"reduce_op": "max"}, 0, [10.0, 20.0, 30.0, 40.0]),
    ("all_reduce", {"reduce_op": "min"}, 0, [1.0, 2.0, 3.0, 4.0]),
    ("all_gather", {}, 1, [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]),
    ("reduce_scatter", {"reduce_op": "sum"}, 0, [11.0, 22.0]),
    ("reduce_scatter", {"reduce_op": "sum"}, 1, [33.0, 44.0]),
    ("all_to_all", {}, 0, [1.0, 2.0, 10.0, 20.0]),
    ("all_to_all", {}, 1, [3.0, 4.0, 30.0, 40.0]),
    ("broadcast", {}, 1, [1.0, 2.0, 3.0, 4.0]),
    ("send_recv", {}, 0, [10.0, 20.0, 30.0, 40.0]),
    ("send_recv", {}, 1, [1.0, 2.0, 3.0, 4.0]),
])
def test_reference_of_each_collective(op, params, rank, expected):
    got = OPS[op].reference(_sent(), rank, {"num_devices": 2, "message_bytes": 16, **params})
    # exact: a reduction of float32 buffers in float64; values only moved stay in their own dtype
    assert got.dtype == (torch.float64 if "reduce_op" in params else torch.float32)
    assert got.tolist() == expected


@pytest.mark.parametrize("op, params, dtype", [
    ("all_reduce", {"reduce_op": "sum"}, torch.float32), ("reduce_scatter", {"reduce_op": "max"}, torch.float32),
    ("all_gather", {}, torch.bfloat16), ("all_to_all", {}, torch.bfloat16), ("broadcast", {}, torch.bfloat16)])
def test_a_bf16_reference_is_exact_in_half_the_bytes_of_float64_and_made_one_buffer_at_a_time(op, params, dtype):
    made = []

    def make(rank):
        made.append(rank)
        return _sent()[rank].to(torch.bfloat16)

    sent = SendBuffers(make, 2)
    got = OPS[op].reference(sent, 1, {"num_devices": 2, "message_bytes": 8, **params})
    assert got.dtype == dtype
    whole = [x.double() for x in _sent()]
    if op == "all_reduce":
        assert got.double().equal(whole[0] + whole[1])
    if op == "all_gather":
        assert got.double().equal(torch.cat(whole))
    assert sorted(made) == ([0] if op == "broadcast" else [0, 1])  # each regenerated once, on demand


def test_message_sizes_a_dtype_or_the_ranks_cannot_split_are_skipped_with_the_reason():
    all_to_all = BACKENDS[("all_to_all", "torch_dist")]
    assert all_to_all.unsupported("cpu", BF16, (0, 0), {"num_devices": 2, "message_bytes": 1024}) is None
    assert "does not split into 3" in all_to_all.unsupported("cpu", BF16, (0, 0),
                                                             {"num_devices": 3, "message_bytes": 1024})
    assert "multiple of bf16's 2 bytes" in BACKENDS[("all_reduce", "torch_dist")].unsupported(
        "cpu", BF16, (0, 0), {"num_devices": 2, "message_bytes": 1023, "reduce_op": "sum"})
    assert "num_devices >= 2" in BACKENDS[("send_recv", "torch_dist")].unsupported(
        "cpu", BF16, (0, 0), {"num_devices": 1, "message_bytes": 1024})


# --- real sessions on gloo ------------------------------------------------------------------------

BENCH = """
def test_all_reduce(backend, collective):
    collective(backend)
"""

# A sum that drops the last rank's buffer; a rank killed (SIGKILL) or hung on its 5th call (after the
# check and the warm-up's first calls); each rank process imports this conftest to unpickle the backend.
CONFTEST = """
import os
import signal
import time

import torch.distributed as dist
from pytest_opperf import register_backend

CALLS = []


@register_backend("all_reduce", "drops_last")
def all_reduce_drops_last(x, out, comm):
    if comm.rank == comm.size - 1:
        out.zero_()
    dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
    return out


@register_backend("all_reduce", "dies")
def all_reduce_dies(x, out, comm):
    CALLS.append(1)
    if comm.rank == 1 and len(CALLS) == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
    return out


@register_backend("all_reduce", "hangs")
def all_reduce_hangs(x, out, comm):
    CALLS.append(1)
    if comm.rank == 1 and len(CALLS) == 5:
        time.sleep(3600)
    dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
    return out
"""


def _project(pytester, bench: str, conftest: str = ""):
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_collectives.py").write_text(bench)
    (pytester.path / "configs").mkdir()
    if conftest:
        pytester.makepyfile(conftest=conftest)
    return pytester


def test_every_shipped_collective_writes_rows_on_two_gloo_ranks(pytester):
    _project(pytester, (ROOT / "benches" / "test_collectives.py").read_text())
    for op in OPS_OF_FILE:
        shutil.copy(ROOT / "configs" / f"{op}.yaml", pytester.path / "configs")
    result = pytester.runpytest("benches", *FAST, "-rs")
    result.assert_outcomes(passed=len(OPS_OF_FILE), skipped=len(OPS_OF_FILE))  # nccl: GPU only
    result.stdout.fnmatch_lines([f"SKIPPED [[]{len(OPS_OF_FILE)}[]] *backend nccl does not run on cpu"])
    for op in OPS_OF_FILE:
        (row,) = rows(pytester, op)
        n, size = row["num_devices"], row["message_bytes"]
        assert (n, size, row["dtype_in"]) == (2, 65536, "bf16")
        assert (row["timer"], row["cache"], row["comm_backend"], row["topology_tier"]) == ("loop", "hot", "gloo", 1)
        assert (row["comm_convention"], row["topology_link"], row["num_nodes"]) == ("loop", "loopback", 1)
        assert row["backend"] == "torch_dist" and row["samples"] >= 3 and row["time_us"] > 0
        # the row's own numbers obey nccl-tests' formulas
        s = 2 * size if op == "all_gather" else size
        assert row["bytes"] == s
        assert row["algbw_gbps"] == pytest.approx(s / (row["time_us"] * 1e-6) / 1e9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0, "send_recv": 1.0}.get(op, 0.5)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert row["gbytes_per_s"] == pytest.approx(row["algbw_gbps"])
        assert row["mfu"] is None and row["mbu"] is None and row["link_gbps"] is None and row["busbw_util"] is None
        assert row["flops"] == 0
        # one definition with a kernel row's: the flag is the drift's; the stalls are counted, not in cv
        assert row["unstable"] == int(is_unstable(row["median_drift"]))
        assert row["outlier_share"] == row["outliers"] / row["samples"]
    # Where each case's time went, as in a kernel case's row: the timeline and the harness's
    # account read these. The first case starts the group of two ranks: its set-up holds that.
    stamped = sorted((rows(pytester, op)[0] for op in OPS_OF_FILE), key=lambda r: r["started_unix_s"])
    for row in stamped:
        phases = [row[f"phase_{p}_ms"] for p in ("setup", "check", "warmup", "sampling", "verify", "record")]
        assert all(ms is not None and ms >= 0 for ms in phases), row
        assert row["phase_sampling_ms"] > 0
        assert sum(phases) <= (row["ended_unix_s"] - row["started_unix_s"]) * 1e3 + 1e-6
    assert stamped[0]["phase_setup_ms"] > max(row["phase_setup_ms"] for row in stamped[1:])
    assert all(a["ended_unix_s"] <= b["started_unix_s"] for a, b in zip(stamped, stamped[1:]))
    # so `opperf timeline` draws them: one bar per collective case, on the session's lane
    sweep = timeline.load(pytester.path / "results" / "cpu.db")
    assert sorted(bar.label.split(":")[0] for bar in sweep.bars) == sorted(OPS_OF_FILE)
    assert all(bar.end_s > bar.start_s >= 0 for bar in sweep.bars)


def test_a_sum_that_drops_a_rank_fails_its_check_and_writes_no_row(pytester):
    _project(pytester, BENCH, CONFTEST)
    write_config(pytester, "all_reduce", """
        backends: [drops_last, torch_dist]
        dtypes: [fp32]
        params: {num_devices: [2], message_bytes: [4096]}
    """)
    result = pytester.runpytest("benches", *FAST)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*functional check failed: all_reduce/drops_last*rank 0: normwise relative error*"])
    assert [r["backend"] for r in rows(pytester, "all_reduce")] == ["torch_dist"]


@pytest.mark.parametrize("backend, messages", [
    ("dies", ["rank 1 of 2 exited with code -9 during"]),
    # rank 0 waits in gloo, whose timeout is the same 5 s; whichever notices first names the failure
    ("hangs", ["did not answer", "Timed out waiting 5000ms"]),
])
def test_a_rank_that_dies_or_hangs_fails_its_case_and_the_session_goes_on(pytester, backend, messages):
    _project(pytester, BENCH, CONFTEST)
    write_config(pytester, "all_reduce", f"""
        backends: [{backend}, torch_dist]
        dtypes: [fp32]
        params: {{num_devices: [2], message_bytes: [4096]}}
    """)
    result = pytester.runpytest("benches", "--opperf-rank-timeout=5", *FAST)
    result.assert_outcomes(passed=1, failed=1)
    failure = result.stdout.str().split("= FAILURES =", 1)[1].split("= opperf =", 1)[0]
    assert f"collective all_reduce/{backend}" in failure
    assert any(m in failure for m in messages), failure
    # the next case started a fresh group and wrote its row
    assert [r["backend"] for r in rows(pytester, "all_reduce")] == ["torch_dist"]


def _all_reduce_project(pytester, ranks: int):
    """One case: torch_dist's all_reduce of 4 KiB on `ranks` ranks."""
    _project(pytester, BENCH)
    write_config(pytester, "all_reduce", f"""
        backend: torch_dist
        dtypes: [fp32]
        params: {{num_devices: [{ranks}], message_bytes: [4096]}}
    """)


def test_one_rank_is_a_valid_group_with_zero_bus_bandwidth(pytester):
    _all_reduce_project(pytester, 1)
    pytester.runpytest("benches", "--opperf-topology-tier=0", "--opperf-one-rank", *FAST).assert_outcomes(passed=1)
    (row,) = rows(pytester, "all_reduce")
    assert row["busbw_gbps"] == 0.0 and row["algbw_gbps"] > 0
    assert row["topology_tier"] == 0  # configured wins over the detected 2


def test_one_rank_is_skipped_with_the_reason_unless_asked_for(pytester):
    # The default sweep on one GPU: no collective rows of a group that moves nothing.
    _all_reduce_project(pytester, 1)
    result = pytester.runpytest("benches", "-rs", *FAST)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*num_devices=1: a group of one rank moves no data; --opperf-one-rank times it*"])
    assert rows(pytester, "all_reduce") == []
    pytester.makeini("[pytest]\nopperf_one_rank = true\n")  # the ini key asks for it too
    pytester.runpytest("benches", *FAST).assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nopperf_one_rank = maybe\n")
    result = pytester.runpytest("benches", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--opperf-one-rank (ini opperf_one_rank): expected true or false, got 'maybe'*"])


def test_the_command_line_timer_wins_over_the_configs(pytester):
    _project(pytester, BENCH)
    write_config(pytester, "all_reduce", """
        backend: torch_dist
        dtypes: [fp32]
        timer: profiler
        params: {num_devices: [2], message_bytes: [4096]}
    """)
    # without --opperf-timer the config's profiler timer is a collection error on a CPU
    pytester.runpytest("benches", "--opperf-timer=cpu", *FAST).assert_outcomes(passed=1)
    assert [r["timer"] for r in rows(pytester, "all_reduce")] == ["cpu"]


def test_each_convention_is_recorded_and_keyed_apart(pytester):
    _project(pytester, BENCH)
    write_config(pytester, "all_reduce", """
        backend: torch_dist
        dtypes: [fp32]
        params: {num_devices: [2], message_bytes: [4096]}
    """)
    for convention in ("auto", "single", "loop"):
        pytester.runpytest("benches", f"--opperf-comm-convention={convention}", *FAST).assert_outcomes(passed=1)
    got = sorted((r["timer"], r["comm_convention"], r["calls_per_sample"]) for r in rows(pytester, "all_reduce"))
    # auto and loop are one fact (the second replaced the first); single is another row, of one
    # call a sample (a loop's calls: enough for 2 ms on this machine, tested with loop_calls)
    assert [g[:2] for g in got] == [("cpu", "single"), ("loop", "loop")] and got[0][2] == 1
    graph = pytester.runpytest("benches", "--opperf-comm-convention=graph", "-rs", *FAST)
    graph.assert_outcomes(skipped=1)
    graph.stdout.fnmatch_lines(["*captures CUDA graphs; this run is on cpu*"])
    bad = pytester.runpytest("benches", "--opperf-comm-convention=nccl", *FAST)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--opperf-comm-convention=nccl: expected auto, loop, graph or single*"])


def test_all_sizes_are_every_power_of_two_and_the_total():
    from pytest_opperf.case import Case
    from pytest_opperf.measure.collective import loop_calls, sample_shape
    from pytest_opperf.run.collective import expand_sizes, group_sizes

    assert group_sizes(8) == [2, 4, 8] and group_sizes(6) == [2, 4, 6] and group_sizes(12) == [2, 4, 8, 12]
    assert group_sizes(1) == [] and group_sizes(2) == [2]
    case = Case("all_reduce", "torch_dist", None, "bf16", "bf16", (("num_devices", "all"), ("message_bytes", 1024)))
    listed = Case("all_reduce", "torch_dist", None, "bf16", "bf16", (("num_devices", 4), ("message_bytes", 1024)))
    assert [c.param_dict["num_devices"] for c in expand_sizes([case, listed], 4)] == [2, 4]  # 4 once
    assert [c.param_dict["num_devices"] for c in expand_sizes([listed], 2)] == [4]  # listed: kept, skipped later
    # MIN_SAMPLE_S (2 ms) a sample, at most LOOP_SAMPLE_S (50 ms); a call of 3.2 ms alone, not 20
    assert loop_calls(13e-6) == 154 and loop_calls(200e-6) == 10 and loop_calls(3.2e-3) == 1
    assert loop_calls(2.0) == 1 and loop_calls(10e-6, min_sample_s=0.005) == 500
    # a graph holds nccl-tests' 20 calls (fewer where 20 exceed 50 ms), replayed for 2 ms a sample
    assert sample_shape("graph", 10e-6) == (20, 10) and sample_shape("graph", 3.2e-3) == (15, 1)


def test_all_sizes_on_a_cpu_are_one_group_of_two(pytester):
    _project(pytester, BENCH)
    write_config(pytester, "all_reduce", """
        backend: torch_dist
        dtypes: [fp32]
        params: {num_devices: [all], message_bytes: [4096]}
    """)
    result = pytester.runpytest("benches", "--collect-only", "-q", *FAST)
    result.stdout.fnmatch_lines(["*num_devices=2-message_bytes=4096*", "*1 test collected*"])


@pytest.mark.parametrize("option, value, expected", [
    ("--opperf-rank-timeout", "0", "expected a number of seconds > 0"),
    ("--opperf-collective-budget", "soon", "expected auto or seconds >= 0"),
    ("--opperf-collective-budget", "-1", "expected auto or seconds >= 0"),
    ("--opperf-topology-tier", "3", "expected auto, 0 (across nodes), 1 (within a node) or 2"),
])
def test_bad_collective_options_are_usage_errors(pytester, option, value, expected):
    _project(pytester, BENCH)
    result = pytester.runpytest("benches", f"{option}={value}", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}={value}: {expected}*"])


def test_the_collective_budget_is_its_own_else_the_default_or_a_smaller_kernel_budget():
    def budget(kernel: str, collective: str) -> float:
        return options._collective_budget({"opperf_budget": kernel, "opperf_collective_budget": collective})

    assert budget("1.0", "auto") == options.COLLECTIVE_BUDGET_S == 0.25
    assert budget("0.02", "auto") == 0.02  # a budget lowered for a quick run lowers the collectives' too
    assert budget("5", " Auto ") == 0.25  # a raised one does not: --opperf-collective-budget does that
    assert budget("0.02", "3") == 3.0 and budget("1.0", "0") == 0.0
    with pytest.raises(pytest.UsageError, match=r"^--opperf-collective-budget=nan: expected auto or seconds >= 0$"):
        budget("1.0", "nan")


def test_a_collective_case_stops_on_its_own_budget_and_its_row_says_the_target_was_missed(pytester):
    _all_reduce_project(pytester, 2)
    # A target no gloo loop reaches; a kernel case's budget of 60 s, the collective's 0.05 s.
    fast = [a for a in FAST if not a.startswith("--opperf-budget")]
    result = pytester.runpytest("benches", *fast, "--opperf-budget=60", "--opperf-collective-budget=0.05",
                                "--opperf-target=0.001%")
    result.assert_outcomes(passed=1)
    (row,) = rows(pytester, "all_reduce")
    assert row["target_met"] == 0
    assert row["phase_sampling_ms"] < 10_000  # stopped on its 0.05 s, not the kernel cases' 60 s
    result.stdout.fnmatch_lines(["*target 0.00% within 60s/case (0.05s/collective case)*",
                                 "*all_reduce*target-missed*",
                                 "opperf: 1 cases measured*1 missed the 0.0% target within the budget*"])
    settings = sqlite3.connect(pytester.path / "results" / "cpu.db").execute("select settings from runs").fetchone()[0]
    assert "budget_s=60.0 collective_budget_s=0.05" in settings


# --- GPUs ---------------------------------------------------------------------------------------


@cuda
def test_one_gpu_nccl_group_of_one(pytester):
    _project(pytester, BENCH)
    write_config(pytester, "all_reduce", """
        backend: torch_dist
        dtypes: [bf16]
        params: {num_devices: [1], message_bytes: [1048576]}
    """)
    pytester.runpytest("benches", "--opperf-budget=0.2", "--opperf-one-rank", "-p", "no:cacheprovider"
                       ).assert_outcomes(passed=1)
    (row,) = rows(pytester, "all_reduce", _device(pytester))
    assert row["comm_backend"] == "nccl" and row["timer"] == "loop" and row["busbw_gbps"] == 0.0


@multi_gpu
def test_nccl_all_reduce_and_all_gather_on_two_gpus(pytester):
    _project(pytester, BENCH + """

def test_all_gather(backend, collective):
    collective(backend)
""", CONFTEST)
    for op in ("all_reduce", "all_gather"):
        write_config(pytester, op, f"""
            backends: [torch_dist{', drops_last' if op == 'all_reduce' else ''}]
            dtypes: [bf16]
            params: {{num_devices: [2], message_bytes: [1024, 67108864]}}
        """)
    result = pytester.runpytest("benches", "--opperf-budget=0.2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)  # drops_last fails its check on NCCL too
    for op in ("all_reduce", "all_gather"):
        found = rows(pytester, op, _device(pytester))
        assert [r["message_bytes"] for r in found] == [1024, 67108864]
        for row in found:
            assert row["comm_backend"] == "nccl" and row["topology_tier"] == 1 and row["backend"] == "torch_dist"
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * (1.0 if op == "all_reduce" else 0.5))
            if row["link_gbps"]:
                assert 0 < row["busbw_util"] < 1.2, row


def _device(pytester) -> str:
    (db,) = (pytester.path / "results").glob("*.db")
    return db.stem


# --- the seed's export ----------------------------------------------------------------------------


def _table(rows_, op="all_reduce"):
    from pytest_opperf.view.source import OpTable

    columns = ["num_devices", "message_bytes", "reduce_op", *rows_[0]]
    return OpTable(op, ["num_devices", "message_bytes", "reduce_op"], columns, rows_, Path("x.db"))


def _row(**kw):
    row = {"num_devices": 2, "message_bytes": 1 << 20, "reduce_op": "sum", "dtype_in": "bf16", "backend": "torch_dist",
           "knobs": "", "timer": "event", "time_us_mean": 50.0, "topology_tier": 1, "bytes": float(1 << 20)}
    return {**row, **kw}


def test_hcom_export_has_the_seeds_columns_and_names():
    from pytest_opperf.view.hcom import hcom_csv, hcom_file

    text = hcom_csv(_table([_row(message_bytes=1 << 21, bytes=float(1 << 21), dtype_in="fp32", num_nodes=2,
                                 topology_tier=0), _row()]))
    # 1 MiB in 50 us: 1048576 / 50e-6 / 1e9 = 20.97152 GB/s; sorted by message_bytes; a row without
    # num_nodes (written before the column) spanned one node
    assert text.splitlines() == [
        "message_bytes,num_devices,num_nodes,Average Duration(us),topology_tier,dtype,bandwidth_gbps",
        "1048576,2,1,50.0,1,DT_BF16,20.97152",
        "2097152,2,2,50.0,0,DT_FLOAT,41.94304",
    ]
    assert [hcom_file(op) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")] == [
        "hcom_allReduce_.csv", "hcom_allGather_.csv", "hcom_reduceScatter_.csv", "hcom_alltoallv_.csv"]


def test_hcom_export_refuses_mixed_backends_and_non_collectives():
    from pytest_opperf.view.hcom import hcom_csv
    from pytest_opperf.view.source import OpTable, ViewError

    with pytest.raises(ViewError, match="2 backends or timers .*drops_last .*torch_dist"):
        hcom_csv(_table([_row(), _row(backend="drops_last")]))
    with pytest.raises(ViewError, match="'gemm' is not a collective"):
        hcom_csv(OpTable("gemm", ["m"], ["m", "time_us"], [{"m": 1, "time_us": 1.0}], Path("x.db")))


# Records, after each case (set-up, call and teardown done), the group sizes whose ranks still live.
LIVE_GROUPS = """
import json

from pytest_opperf.run.collective import POOLS_KEY

SEEN = []


def pytest_configure(config):
    SEEN.append(config)


def pytest_runtest_logfinish(nodeid, location):
    config = SEEN[0]
    pools = config.stash.get(POOLS_KEY, {})
    alive = sorted(n for (n, _devices), group in pools.items() if any(p.is_alive() for p in group.procs))
    with open(config.rootpath / "order.jsonl", "a") as f:
        f.write(json.dumps([nodeid, alive]) + "\\n")
"""


def test_collectives_run_after_the_kernel_cases_and_each_group_ends_with_its_last_case(pytester):
    # Collected first (test_collectives.py sorts before test_ops.py), sizes in the order 1, 1, 2, 2
    # (all_reduce) then 1 (broadcast): the kernel cases still run first (no rank process beside
    # them), then each size's cases together, its ranks ended after the last of them (their
    # contexts would otherwise stay on the GPUs for the rest of the session).
    _project(pytester, BENCH + """

def test_broadcast(backend, collective):
    collective(backend)
""", LIVE_GROUPS)
    (pytester.path / "benches" / "test_ops.py").write_text("""
def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)
""")
    write_config(pytester, "all_reduce", """
        backend: torch_dist
        dtypes: [fp32]
        params: {num_devices: [1, 2], message_bytes: [4096, 8192]}
    """)
    write_config(pytester, "broadcast", """
        backend: torch_dist
        dtypes: [fp32]
        params: {num_devices: [1], message_bytes: [4096]}
    """)
    write_config(pytester, "gemm", """
        backend: torch
        dtypes: [fp32]
        params: {m: [16, 32], n: [16], k: [16]}
    """)
    pytester.runpytest("benches", "--opperf-one-rank", *FAST).assert_outcomes(passed=7)
    seen = [json.loads(line) for line in (pytester.path / "order.jsonl").read_text().splitlines()]
    names = [nodeid.split("::")[1].split("[")[0] for nodeid, _ in seen]
    assert names == ["test_gemm"] * 2 + ["test_all_reduce"] * 2 + ["test_broadcast"] + ["test_all_reduce"] * 2, seen
    sizes = [int(nodeid.split("num_devices=")[1].split("-")[0].rstrip("]")) for nodeid, _ in seen[2:]]
    assert sizes == [1, 1, 1, 2, 2], seen
    assert [alive for _, alive in seen] == [[], [], [1], [1], [], [2], []], seen


# --- memory: the check's own is bounded, a case that cannot fit is skipped with its figure ---------

MEMORY_CONFTEST = """
import torch.distributed as dist
from pytest_opperf import register_backend


@register_backend("all_reduce", "one_percent_off")
def all_reduce_one_percent_off(x, out, comm):
    dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
    return out.mul_(1.01)
"""


def test_a_collective_whose_whole_float64_check_exceeds_the_budget_runs_chunked(pytester, monkeypatch):
    # 1 MiB of bf16 a rank, the check 4096 elements at a time: the estimate is the buffers (1 + 1 MiB),
    # the float32 reference (2), one regenerated buffer and its float32 draw (3) and two float64 chunks
    # (64 KiB): 7.06 MiB = 7.41 MB. A float64 copy of the output and a float64 reference (4 + 4 MiB) beside
    # the buffers and the regenerated ones (12 MiB) would not fit in the 10 MB budget; chunked, it runs,
    # and the check still fails a backend 1% off.
    _project(pytester, BENCH, MEMORY_CONFTEST)
    write_config(pytester, "all_reduce", """
        backends: [torch_dist, one_percent_off]
        dtypes: [bf16]
        params: {num_devices: [2], message_bytes: [1048576], reduce_op: [sum]}
    """)
    need = OPS["all_reduce"].memory({"num_devices": 2, "message_bytes": 1 << 20, "reduce_op": "sum"},
                                    DTypes(dtypes.lookup("bf16"), dtypes.lookup("bf16")))
    assert need > 12 << 20  # at the default chunk (2^24 elements: the whole 2^19-element output at once)
    monkeypatch.setenv("OPPERF_CHECK_CHUNK", "4096")
    chunked = OPS["all_reduce"].memory({"num_devices": 2, "message_bytes": 1 << 20, "reduce_op": "sum"},
                                       DTypes(dtypes.lookup("bf16"), dtypes.lookup("bf16")))
    assert chunked == 7 * (1 << 20) + 2 * 8 * 4096
    result = pytester.runpytest("benches", *FAST, "--opperf-max-mem-gb=0.01", "-rfs")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*one_percent_off*normwise relative error 0.0101 exceeds 0.0078125*"])
    (row,) = rows(pytester, "all_reduce")
    assert row["backend"] == "torch_dist" and row["outliers"] is not None

    result = pytester.runpytest("benches", *FAST, "--opperf-max-mem-gb=0.007", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*estimated device memory 0.01 GB (case 0.01 GB *exceeds the budget of 0.01 GB "
                                 "(--opperf-max-mem-gb=0.007)*"])


def test_a_rank_whose_device_lacks_the_memory_skips_before_making_anything(monkeypatch):
    from pytest_opperf.measure.collective import RankWork

    torch_cuda = pytest.importorskip("torch.cuda")
    monkeypatch.setattr(torch_cuda, "mem_get_info", lambda device=None: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch_cuda, "empty_cache", lambda: None)
    work = RankWork(1, 8, "cuda", "cuda:1")
    answer = work.do_case({}, {}, None, [0] * 8, 0.01, need_bytes=20.25 * 2**30)
    assert answer == {"skip": "needs 20.25 GiB on each rank's device; rank 1's cuda:1 has 3.00 GiB free of "
                              "80.00 GiB"}
    assert work.case is None


# --- the nccl backend on two GPUs -------------------------------------------------------------------

TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA GPUs (NCCL)")

NCCL_CONFTEST = """
from pytest_opperf import register_backend
from pytest_opperf.catalog.backends.nccl import all_reduce_nccl, all_to_all_nccl


@register_backend("all_reduce", "nccl_one_percent_off", devices={"cuda"})
def all_reduce_off(x, out, comm):
    return all_reduce_nccl(x, out, comm).mul_(1.01)


@register_backend("all_to_all", "nccl_one_percent_off", devices={"cuda"})
def all_to_all_off(x, out, comm):
    return all_to_all_nccl(x, out, comm).mul_(1.01)
"""


@TWO_GPUS
@pytest.mark.parametrize("convention", ["loop", "graph"])
def test_the_nccl_backend_passes_and_one_percent_off_fails_at_every_dtype_on_two_gpus(pytester, convention):
    _project(pytester, BENCH + "\n\ndef test_all_to_all(backend, collective):\n    collective(backend)\n",
             NCCL_CONFTEST)
    for op, extra in (("all_reduce", ", reduce_op: [sum]"), ("all_to_all", "")):
        write_config(pytester, op, f"""
            backends: [nccl, nccl_one_percent_off]
            dtypes: [bf16, fp16, fp32]
            params: {{num_devices: [2], message_bytes: [1048576]{extra}}}
        """)
    result = pytester.runpytest_subprocess("benches", "--opperf-budget=0.05", "--opperf-min-samples=3", "-p",
                                           "no:cacheprovider", f"--opperf-comm-convention={convention}", "-rfs")
    result.assert_outcomes(passed=6, failed=6)
    assert result.stdout.str().count("nccl_one_percent_off") >= 6
    for op in ("all_reduce", "all_to_all"):
        got = rows(pytester, op, device=rows_device(pytester))
        assert {(r["backend"], r["dtype_in"], r["comm_convention"]) for r in got} == \
            {("nccl", d, convention) for d in ("bf16", "fp16", "fp32")}


def rows_device(pytester) -> str:
    (db,) = (pytester.path / "results").glob("*.db")
    return db.stem


def test_an_nccl_library_that_cannot_load_is_one_error_naming_it_and_the_variable(monkeypatch, tmp_path):
    from pytest_opperf.catalog.backends import nccl

    missing = tmp_path / "libnccl.so.2"
    monkeypatch.setenv(nccl.LIBRARY_VARIABLE, str(missing))
    nccl.nccl.cache_clear()
    try:
        with pytest.raises(nccl.NcclError, match=f"cannot load NCCL from {missing} .*OPPERF_NCCL_LIBRARY=PATH"):
            nccl.nccl()
    finally:
        nccl.nccl.cache_clear()


# --- a backend that binds its call: the loop and graph conventions over nccl-tests' moving buffers --


class _Bound:
    """A BoundCall's protocol, recording what the rank asks of it."""

    def __init__(self, x, out, log):
        self.x, self.out, self.log, self.slots = x, out, log, 1
        self.driver = "c"

    def rotating(self, slots, send_step, recv_step):
        self.log.append(("rotating", slots, send_step, recv_step))
        self.slots = slots
        return self

    def __call__(self):
        self.log.append(("call",))

    def repeat(self, n):
        self.log.append(("repeat", n, self.slots))


def _bound_work(message_bytes: int):
    from pytest_opperf.measure.collective import Comm, RankWork

    log: list = []

    def fn(x, out, comm):
        out.copy_(x)
        return out

    fn.bind = lambda x, out, comm: log.append(("bind", x.data_ptr(), out.data_ptr())) or _Bound(x, out, log)
    work = RankWork(0, 1, "cpu", torch.device("cpu"))
    x = torch.randn(message_bytes // 4)
    out = torch.empty_like(x)
    work.case = {"fn": fn, "x": x, "out": out, "comm": Comm(None, 0, 1, {}), "prepare": None}
    return work, log


def test_a_bound_backends_loop_repeats_its_call_over_slots_that_hold_the_send_buffers_values(monkeypatch):
    from pytest_opperf.measure import collective

    work, log = _bound_work(4096)
    monkeypatch.setattr(work, "_align", lambda: None)
    times = work._loop_samples(3, iters=25)
    assert len(times) == 3 and all(t > 0 for t in times)
    slots = collective.rotation_slots(4096, 4096)
    assert slots == 20
    assert ("rotating", 20, 4096, 4096) in log and log.count(("repeat", 25, 20)) == 3
    # the slots are copies of the checked send buffer (random values, never an empty region's), made once
    count, xs, outs = work.case["rotation"]
    assert count == 20 and torch.equal(xs.view(20, -1), work.case["x"].expand(20, -1))
    assert outs.numel() == 20 * work.case["out"].numel()
    bind = [entry for entry in log if entry[0] == "bind"]
    assert bind == [("bind", xs.data_ptr(), outs.data_ptr())]
    assert work.loop_driver() == "c"


def test_a_message_of_the_whole_span_uses_one_slot_and_the_checked_buffers(monkeypatch):
    from pytest_opperf.measure import collective

    monkeypatch.setattr(collective, "ROTATION_SPAN", 4096)  # the span nccl-tests moves in, made small
    work, log = _bound_work(4096)
    monkeypatch.setattr(work, "_align", lambda: None)
    work._loop_samples(1, iters=5)
    assert log[0] == ("bind", work.case["x"].data_ptr(), work.case["out"].data_ptr())
    assert not any(entry[0] == "rotating" for entry in log) and ("repeat", 5, 1) in log


def test_a_backend_without_bind_is_called_from_python_and_says_so():
    from pytest_opperf.measure.collective import Comm, RankWork

    calls = []

    def fn(x, out, comm):
        calls.append(1)
        return out

    work = RankWork(0, 1, "cpu", torch.device("cpu"))
    work.case = {"fn": fn, "x": torch.randn(8), "out": torch.empty(8), "comm": Comm(None, 0, 1, {}), "prepare": None}
    work._align = lambda: None
    work._loop_samples(2, iters=7)
    assert len(calls) == 14 and work.loop_driver() == "python"


def test_a_captured_graph_ends_its_capture_and_frees_what_it_captured_once_when_the_work_fails():
    from pytest_opperf.measure import cudart

    class FakeRuntime:
        def __init__(self):
            self.log = []

        def check(self, result, what):
            if result:
                raise cudart.CudaError(f"{what} returned {result}")

        def cudaStreamBeginCapture(self, stream, mode):
            self.log.append(("begin", stream, mode))
            return 0

        def cudaStreamEndCapture(self, stream, graph):
            self.log.append(("end", stream))
            graph._obj.value = 4096  # the captured graph's handle
            return 0

        def cudaGraphInstantiateWithFlags(self, exe, graph, flags):
            self.log.append(("instantiate", flags))
            return 0

        def cudaGraphLaunch(self, exe, stream):
            self.log.append(("launch", stream))
            return 0

        def cudaGraphExecDestroy(self, exe):
            self.log.append("destroy exec")

        def cudaGraphDestroy(self, graph):
            self.log.append("destroy graph")

    rt = FakeRuntime()
    graph = cudart.Graph(rt, 77, lambda: rt.log.append("work"))
    graph.launch(2)
    graph.close()
    graph.close()
    assert rt.log == [("begin", 77, cudart.CAPTURE_THREAD_LOCAL), "work", ("end", 77), ("instantiate", 0),
                      ("launch", 77), ("launch", 77), "destroy exec", "destroy graph"]
    rt.log.clear()

    def boom():
        raise RuntimeError("ncclAllReduce returned 5")

    with pytest.raises(RuntimeError, match="returned 5"):
        cudart.Graph(rt, 78, boom)
    assert rt.log == [("begin", 78, cudart.CAPTURE_THREAD_LOCAL), ("end", 78), "destroy graph"]


def _two_rank_work(other_times_us: float, other_clock_s: float):
    """A rank 0 of two whose peer's times (and clock) the exchange makes up: the peer's samples
    read other_times_us, and the peer's clock reads other_clock_s after each of its batches."""
    from pytest_opperf.measure.collective import RankWork

    work = RankWork(0, 2, "cpu", torch.device("cpu"))
    exchanged = []

    def gathered(values):
        exchanged.append(len(values))
        count = len(values) - 2
        return [list(values), [other_times_us] * count + [other_clock_s, other_clock_s]]

    work._gathered = gathered
    return work, exchanged


def test_the_ranks_samples_are_their_mean_in_a_loop_and_the_slowest_for_single_calls_every_second_sample():
    from pytest_opperf.measure.collective import SAMPLE_BATCH
    from pytest_opperf.measure.stats import StoppingRule

    work, exchanged = _two_rank_work(30.0, 0.0)
    work._timed = lambda count, *args: [10.0] * count
    rule = StoppingRule(0.01, 10, 100, 10.0)
    samples = work._sampled(rule, "cpu", "loop", 100, 1)
    assert samples == [20.0] * 10  # the mean of 10 and 30; the target met at the rule's minimum
    assert exchanged == [SAMPLE_BATCH + 2] * (10 // SAMPLE_BATCH)  # an exchange after every second sample
    work, exchanged = _two_rank_work(30.0, 0.0)
    work._timed = lambda count, *args: [10.0] * count
    assert work._sampled(rule, "cpu", "single", 1, 1) == [30.0] * 10  # a call is done when every rank's is
    assert exchanged == [10 + 2]  # single calls: the rule's minimum in one batch


def test_the_leaders_clock_ends_the_sampling_whatever_this_ranks_clock_says():
    from pytest_opperf.measure.stats import StoppingRule

    # Rank 1's samples spread too widely for the target; its own clock is young, the leader's
    # (row 0, made up here as 5 s after every batch) is past the 1 s budget: it stops at the minimum.
    from pytest_opperf.measure.collective import RankWork

    work = RankWork(1, 2, "cpu", torch.device("cpu"))
    spread = iter([5.0, 50.0] * 100)
    work._timed = lambda count, *args: [next(spread) for _ in range(count)]
    work._gathered = lambda values: [[*values[:-2], 5.0, 5.0], list(values)]
    samples = work._sampled(StoppingRule(0.01, 4, 100, 1.0), "cpu", "loop", 10, 1)
    assert len(samples) == 4
