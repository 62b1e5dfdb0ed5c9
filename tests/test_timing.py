"""Timers: the CPU parts everywhere; the CUDA timers on a GPU (skipped cleanly without one)."""

import random

import pytest
import torch

from pytest_opperf import timing
from pytest_opperf.stats import StoppingRule

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CPU = torch.device("cpu")


def test_cpu_timer_measures_a_known_sleep():
    import time

    rule = StoppingRule(target_rel=0.05, min_samples=5, max_samples=20, budget_s=0.5)
    m = timing.measure(timing.Workload(time.sleep, (0.002,)), CPU, "cpu", "hot", rule, warmup_s=0)
    assert 2000 <= m.stats.median < 4000  # a 2 ms sleep, give or take the scheduler
    assert m.timer == "cpu" and m.cache == "hot" and m.warmup_calls >= 3
    assert 5 <= m.stats.n <= 20 and len(m.samples) == m.stats.n


def _jittery():
    # Durations spread over 1..100x: the median's CI can never shrink to the 1e-9 target
    # (a fixed-length call can: quantised timer readings tie and the CI collapses to zero).
    sum(range(random.randint(100, 10_000)))


def test_sampling_stops_at_max_samples_and_budget():
    rule = StoppingRule(target_rel=1e-9, min_samples=3, max_samples=7, budget_s=100)
    m = timing.measure(timing.Workload(_jittery), CPU, "cpu", "hot", rule, warmup_s=0)
    assert m.stats.n == 7 and not m.met
    rule = StoppingRule(target_rel=1e-9, min_samples=3, max_samples=10**9, budget_s=0.05)
    m = timing.measure(timing.Workload(_jittery), CPU, "cpu", "hot", rule, warmup_s=0)
    assert not m.met and m.wall_s < 2.0


def test_workload_copies_clone_tensors_only():
    a = torch.randn(4)
    work = timing.Workload(torch.add, (a, 3))
    sets = work.copies(3)
    assert sets[0][0] is a and sets[1][0] is not a and torch.equal(sets[2][0], a)
    assert sets[1][1] == 3 and work.input_bytes == 16


def test_default_timer_and_cache_by_device():
    assert (timing.default_timer("cpu"), timing.default_cache("cpu")) == ("cpu", "hot")
    assert (timing.default_timer("cuda"), timing.default_cache("cuda")) == ("profiler", "cold")
    assert timing.default_timer("npu") == "event"  # torch's device-generic events


def test_accelerator_timers_refuse_the_cpu_with_a_reason():
    rule = StoppingRule(min_samples=3, max_samples=3)
    for name in ("event", "profiler", "cuda_graph"):
        with pytest.raises(timing.TimerError, match="needs a"):
            timing.measure(timing.Workload(torch.add, (torch.ones(2), 1)), CPU, name, "hot", rule, warmup_s=0)


# --- on a GPU ---------------------------------------------------------------------------------


def _gemm(n=4096, dtype=torch.bfloat16):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return timing.Workload(torch.matmul, (a, b))


@cuda
@pytest.mark.parametrize("cache", ["cold", "hot"])
def test_graph_and_event_timers_agree_with_profiler_on_a_large_gemm(cache):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rule = StoppingRule(target_rel=0.005, min_samples=20, budget_s=2)
    work = _gemm()
    ref = timing.measure(work, torch.device("cuda"), "profiler", cache, rule, cache_bytes=l2)
    assert any("gemm" in k.lower() or "sm90" in k.lower() or "cutlass" in k.lower() for k in ref.kernels), ref.kernels
    # Per-call events carry a few microseconds of launch overhead; the graph timer does not.
    for name, rel in (("cuda_graph", 0.03), ("event", 0.10)):
        m = timing.measure(work, torch.device("cuda"), name, cache, rule, cache_bytes=l2)
        assert m.stats.median == pytest.approx(ref.stats.median, rel=rel), name


@cuda
def test_graph_timer_explains_an_uncapturable_call():
    x = torch.randn(16, device="cuda")
    work = timing.Workload(lambda t: t.sum().item(), (x,))  # a host sync cannot be captured
    with pytest.raises(timing.TimerError, match="cannot capture the call in a CUDA graph.*--opperf-timer=event"):
        timing.measure(work, torch.device("cuda"), "cuda_graph", "hot", StoppingRule(min_samples=3), warmup_s=0)
    # The process is sound afterwards: random inputs and a new capture work.
    y = torch.randn(1024, device="cuda")
    m = timing.measure(timing.Workload(torch.neg, (y,)), torch.device("cuda"), "cuda_graph", "hot",
                       StoppingRule(min_samples=3), warmup_s=0)
    assert m.stats.median > 0


@cuda
def test_cold_graph_timing_needs_the_inputs_as_arguments():
    x = torch.randn(1024, device="cuda")
    with pytest.raises(timing.TimerError, match="pass them as arguments"):
        timing.measure(timing.Workload(lambda: x + 1), torch.device("cuda"), "cuda_graph", "cold",
                       StoppingRule(min_samples=3), warmup_s=0, cache_bytes=50 << 20)



def test_cold_rotation_spans_twice_the_cache():
    assert timing.rotation_copies(8 << 20, 50 << 20) == 14  # 13 others move 104 MB >= 100 MB
    assert timing.rotation_copies(100 << 20, 50 << 20) == 1  # one set evicts itself
    assert timing.rotation_copies(16, 50 << 20) == timing.MAX_INPUT_COPIES
    a = torch.randn(1024)
    tmr = timing.TIMERS["cpu"](timing.Workload(torch.neg, (a,)), CPU, "cold", 64 << 10)
    assert len(tmr.arg_sets) == 33 and tmr.flush is None  # 2 * 64 KiB over 4 KiB inputs, + 1
    seen = [tmr.arg_sets[i % 33][0].data_ptr() for i in range(66)]
    outs = [tmr.call() for _ in range(66)]
    assert len(set(seen)) == 33 and all(torch.equal(o, -a) for o in outs)
    closure = timing.TIMERS["cpu"](timing.Workload(lambda: a + 1), CPU, "cold", 64 << 10)
    assert closure.flush is not None and len(closure.arg_sets) == 1
