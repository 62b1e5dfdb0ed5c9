"""The nccl backend's bound calls (catalog/backends/ncclcalls.py) without NCCL: C functions of NCCL's
signatures stand in for the library, so what the compiled loop passes on every call is checked
on any machine with a C compiler, and the Python loop it falls back to gives the same calls."""

from __future__ import annotations

import ctypes

import pytest

from pytest_opperf.catalog.backends import ncclcalls

VP, SZ, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
COLL_ARG = ctypes.CFUNCTYPE(I, VP, VP, SZ, I, I, VP, VP)
COLL = ctypes.CFUNCTYPE(I, VP, VP, SZ, I, VP, VP)
P2P = ctypes.CFUNCTYPE(I, VP, SZ, I, I, VP, VP)
GROUP = ctypes.CFUNCTYPE(I)


def errors():
    said = []

    def check(result, what):
        if result:
            said.append((result, what))
            raise RuntimeError(f"{what} returned {result}")

    return said, check


def recorder(proto, calls: list, fail_at=None):
    """A C-callable stand-in for an NCCL function: records its arguments, returns 0 (or an error)."""

    def fn(*args):
        calls.append(args)
        return 5 if fail_at is not None and len(calls) == fail_at else 0

    c = proto(fn)
    c.argtypes = list(proto._argtypes_)
    return c


@pytest.fixture(params=["c", "python"])
def helper(request, tmp_path, monkeypatch):
    if request.param == "python":
        return None
    monkeypatch.setenv(ncclcalls.CACHE_VARIABLE, str(tmp_path))
    ncclcalls.helper.cache_clear()
    built = ncclcalls.helper()
    ncclcalls.helper.cache_clear()
    if built is None:
        pytest.skip(f"the helper cannot be built here: {ncclcalls.UNAVAILABLE.get('reason')}")
    return built


def test_a_collective_is_called_n_times_with_its_arguments_and_rotates_its_buffers(helper):
    calls: list = []
    fn = recorder(COLL_ARG, calls)
    _, check = errors()
    bound = ncclcalls.BoundCall("ncclAllReduce", "coll_arg", fn, (4096, 8192, 512, 9, 0, 77, 99), check, helper)
    assert bound.driver == ("c" if helper else "python")
    bound.repeat(5)
    assert calls == [(4096, 8192, 512, 9, 0, 77, 99)] * 5
    calls.clear()
    bound.rotating(3, 1000, 2000).repeat(4)  # slots 0 1 2 0, then the next call goes on from slot 1
    bound()
    assert [(c[0], c[1]) for c in calls] == [(4096, 8192), (5096, 10192), (6096, 12192), (4096, 8192),
                                             (5096, 10192)]
    assert all(c[2:] == (512, 9, 0, 77, 99) for c in calls)


def test_a_collective_without_an_argument_passes_six(helper):
    calls: list = []
    bound = ncclcalls.BoundCall("ncclAllGather", "coll", recorder(COLL, calls), (16, 32, 8, 1, 5, 6),
                                errors()[1], helper)
    bound.repeat(3)
    assert calls == [(16, 32, 8, 1, 5, 6)] * 3


def test_the_first_nccl_error_stops_the_loop_and_raises_with_the_functions_name(helper):
    calls: list = []
    said, check = errors()
    bound = ncclcalls.BoundCall("ncclAllReduce", "coll_arg", recorder(COLL_ARG, calls, fail_at=3),
                                (1, 2, 3, 4, 5, 6, 7), check, helper)
    with pytest.raises(RuntimeError, match="ncclAllReduce returned 5"):
        bound.repeat(10)
    assert len(calls) == 3 and said == [(5, "ncclAllReduce")]


def test_a_group_of_sends_and_receives_per_call(helper):
    log: list = []
    start = GROUP(lambda: log.append("start") or 0)
    end = GROUP(lambda: log.append("end") or 0)
    send = P2P(lambda *a: log.append(("send", *a)) or 0)
    recv = P2P(lambda *a: log.append(("recv", *a)) or 0)
    bound = ncclcalls.BoundCall("ncclSend/ncclRecv", "p2p", None,
                                (start, end, send, recv, [1, 0], [1, 0], [100, 200], [300, 400], 8, 9, 42, 43),
                                errors()[1], helper)
    bound.rotating(2, 10, 20).repeat(2)
    assert log == ["start", ("send", 100, 8, 9, 1, 42, 43), ("recv", 300, 8, 9, 1, 42, 43),
                   ("send", 200, 8, 9, 0, 42, 43), ("recv", 400, 8, 9, 0, 42, 43), "end",
                   "start", ("send", 110, 8, 9, 1, 42, 43), ("recv", 320, 8, 9, 1, 42, 43),
                   ("send", 210, 8, 9, 0, 42, 43), ("recv", 420, 8, 9, 0, 42, 43), "end"]


def test_without_a_compiler_the_helper_is_none_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv(ncclcalls.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    ncclcalls.helper.cache_clear()
    try:
        assert ncclcalls.helper() is None
        assert "no C compiler" in ncclcalls.UNAVAILABLE["reason"]
    finally:
        ncclcalls.helper.cache_clear()
        ncclcalls.UNAVAILABLE.clear()


def test_the_session_summary_says_when_nccl_loop_rows_came_from_python():
    from pytest_opperf.view.terminal import counts

    base = {"unstable": 0, "target_met": 1}
    records = [{**base, "backend": "nccl", "extra_info": {"loop_driver": "python"}},
               {**base, "backend": "nccl", "extra_info": '{"loop_driver": "python"}'},  # as stored
               {**base, "backend": "nccl", "extra_info": {"loop_driver": "c"}},
               {**base, "backend": "torch_dist", "extra_info": {"loop_driver": "python"}},  # PyTorch's own cost
               {**base, "backend": "nccl", "extra_info": None}]
    line = counts(records, 0.01)
    assert line.startswith("5 cases measured, 2 nccl loop rows called NCCL from a Python loop")
    assert "set CC" in line
    assert "Python loop" not in counts(records[2:], 0.01)


def test_a_compiler_that_fails_leaves_no_helper_and_names_itself(tmp_path, monkeypatch):
    monkeypatch.setenv(ncclcalls.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setenv("CC", "false")  # found on the PATH, exits 1 without building anything
    ncclcalls.helper.cache_clear()
    try:
        assert ncclcalls.helper() is None
        assert ncclcalls.UNAVAILABLE["reason"] == "false failed: 1"
        assert not list(tmp_path.glob("*.so"))  # nothing half-built is left to be loaded later
    finally:
        ncclcalls.helper.cache_clear()
        ncclcalls.UNAVAILABLE.clear()
