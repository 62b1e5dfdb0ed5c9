"""Timers: the CPU parts everywhere; the CUDA timers on a GPU (skipped cleanly without one)."""

import contextlib
import math
import random
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import FAST, db_bytes, rows, write_config
from pytest_opperf.measure import devstate, inputs, profiler_records, sampler, timers
from pytest_opperf.measure.profiler_records import CALL_RANGE, CHECKED_RANGE, TIMED_RANGE
from pytest_opperf.measure.stats import Stats, StoppingRule, median_ci, percentile

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CPU = torch.device("cpu")


def test_cpu_timer_measures_a_known_sleep():
    import time

    rule = StoppingRule(target_rel=0.05, min_samples=5, max_samples=20, budget_s=0.5)
    m = sampler.measure(inputs.Workload(time.sleep, (0.002,)), CPU, "cpu", "hot", rule, warmup_s=0)
    assert 2000 <= m.stats.median < 4000  # a 2 ms sleep, give or take the scheduler
    assert m.timer == "cpu" and m.cache == "hot" and m.warmup_calls >= sampler.WARMUP_CALLS
    assert 5 <= m.stats.n <= 20 and len(m.samples) == m.stats.n


def _jittery():
    # Durations spread over 1..100x: the median's CI can never shrink to the 1e-9 target
    # (a fixed-length call can: quantised timer readings tie and the CI collapses to zero).
    sum(range(random.randint(100, 10_000)))


def test_sampling_stops_at_max_samples_and_budget():
    rule = StoppingRule(target_rel=1e-9, min_samples=3, max_samples=7, budget_s=100)
    m = sampler.measure(inputs.Workload(_jittery), CPU, "cpu", "hot", rule, warmup_s=0)
    assert m.stats.n == 7 and not m.met
    rule = StoppingRule(target_rel=1e-9, min_samples=3, max_samples=10**9, budget_s=0.05)
    m = sampler.measure(inputs.Workload(_jittery), CPU, "cpu", "hot", rule, warmup_s=0)
    assert not m.met and m.wall_s < 2.0


def test_default_timer_and_cache_by_device():
    assert (timers.default_timer("cpu"), inputs.default_cache("cpu")) == ("cpu", "hot")
    assert (timers.default_timer("cuda"), inputs.default_cache("cuda")) == ("profiler", "cold")
    assert timers.default_timer("npu") == "event"  # torch's device-generic events


def test_accelerator_timers_refuse_the_cpu_with_a_reason():
    rule = StoppingRule(min_samples=3, max_samples=3)
    for name in ("event", "profiler", "cuda_graph"):
        with pytest.raises(timers.TimerError, match="needs a"):
            sampler.measure(inputs.Workload(torch.add, (torch.ones(2), 1)), CPU, name, "hot", rule, warmup_s=0)


# --- the sampling loop, driven by a timer whose samples are set by the test -----------------


class Scripted(timers.Timer):
    """Returns the next samples of a fixed script, and notes each batch it was asked for."""

    name = "scripted"
    min_batch = 200  # with at most 200 a batch in measure(), every batch is exactly 200: deterministic
    script: list = []
    batches: list = []

    def sample(self, n):
        type(self).batches.append(n)
        taken = sum(type(self).batches[:-1])
        return type(self).script[taken:taken + n]


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(Scripted, "batches", [])

    def run(script, **rule):
        Scripted.script = script
        return sampler.measure(inputs.Workload(lambda: None), CPU, "scripted", "hot", StoppingRule(**rule),
                               warmup_s=0)
    with timers.registered(Scripted):
        yield run


def test_sampling_stops_at_the_first_batch_that_meets_the_target(scripted):
    m = scripted([100.0] * 1000, target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=1e9)
    assert Scripted.batches == [200] and m.met and m.stats.n == 200


def test_a_later_batch_takes_what_the_interval_says_the_target_needs(scripted):
    # 200 samples alternating 100/200: the median's interval spans 100..200, 33% each side of 150,
    # so the target (1%) needs thousands more: the batch is MAX_BATCH; then it is met exactly.
    script = [100.0, 200.0] * 100 + [100.0] * 3000
    m = scripted(script, target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=1e9)
    assert Scripted.batches == [200, sampler.MAX_BATCH]
    assert m.met and m.stats.n == 200 + sampler.MAX_BATCH and m.stats.median == 100.0 and m.stats.median_ci_rel == 0.0


def test_sampling_stops_on_the_budget_once_min_samples_are_in(scripted):
    m = scripted([100.0, 200.0] * 1000, target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=0)
    assert Scripted.batches == [200] and not m.met and m.stats.n == 200


def test_large_batches_never_overshoot_max_samples(scripted):
    m = scripted([100.0, 200.0] * 1000, target_rel=1e-9, min_samples=10, max_samples=250, budget_s=1e9)
    assert Scripted.batches == [200, 50] and m.stats.n == 250 and not m.met


class SlowScripted(Scripted):
    min_batch = 20  # as the profiler timer


def test_long_calls_take_a_first_batch_of_min_samples_then_what_the_target_needs(monkeypatch):
    # 20 ms a call: a 10 ms batch holds none, so the first batch stops at min_samples (10): that is
    # where a long kernel usually meets the target.
    monkeypatch.setattr(SlowScripted, "batches", [])
    SlowScripted.script = [100.0] * 10 + [100.0, 300.0] * 50
    rule = StoppingRule(target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=1e9)
    work = inputs.Workload(time.sleep, (0.02,))
    with timers.registered(SlowScripted):
        m = sampler.measure(work, CPU, "scripted", "hot", rule, warmup_s=0, warmup_calls=1)
        assert SlowScripted.batches == [10] and m.met and m.stats.n == 10
        # 10 samples over 100..104: the interval is [100, 104], 1.96% of the median 102, so the
        # target needs (1.96 / 1)^2 = 3.84 times the samples, 15% over: 45, 35 more. They meet it.
        monkeypatch.setattr(SlowScripted, "batches", [])
        SlowScripted.script = [100.0, 101.0, 102.0, 103.0, 104.0] * 2 + [100.0] * 100
        m = sampler.measure(work, CPU, "scripted", "hot", rule, warmup_s=0, warmup_calls=1)
    assert SlowScripted.batches == [10, 35] and m.met and m.stats.n == 45


def test_the_next_batch_is_at_least_the_timers_minimum_and_fits_the_budget_left():
    rule = StoppingRule(target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=1.0)
    close = Stats([100.0] * 9 + [100.5] * 11)  # met already: the timer's minimum all the same
    assert sampler.next_batch(close, rule, 20, 1e-4, 0.9) == 20
    wide = Stats([100.0, 200.0] * 10)
    assert sampler.next_batch(wide, rule, 20, 1e-3, 0.5) == 500  # 0.5 s left at 1 ms a sample
    assert sampler.next_batch(wide, rule, 20, 1e-6, 10.0) == sampler.MAX_BATCH
    assert sampler.next_batch(Stats([100.0] * 4), rule, 1, 1e-3, 1.0) == 6  # up to min_samples first


class FakeClock:
    """perf_counter for the sampler, advanced by the workload: call i takes durations[i] seconds
    (the last one from then on)."""

    def __init__(self, durations):
        self.now, self.calls, self.durations = 0.0, 0, durations

    def perf_counter(self):
        return self.now

    def call(self):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1


def test_warm_up_goes_on_until_two_rounds_of_calls_agree(monkeypatch):
    # Slow first calls (5 ms, 2 ms), then 0.1 ms a call: single calls while they last 0.5 ms or
    # more, then rounds of 1 ms (10 calls); the second such round agrees with the first.
    clock = FakeClock([5e-3, 2e-3, 1e-4])
    monkeypatch.setattr(sampler, "time", clock)
    calls, per_call = sampler._warm_up(inputs.Workload(clock.call), "cpu", sampler.WARMUP_CALLS, None, 0.0)
    assert calls == 1 + 1 + 1 + 10 + 10 and per_call == pytest.approx(1e-4)


def test_warm_up_of_a_long_call_is_its_minimum_once_steady(monkeypatch):
    clock = FakeClock([0.03])
    monkeypatch.setattr(sampler, "time", clock)
    calls, _ = sampler._warm_up(inputs.Workload(clock.call), "cpu", sampler.WARMUP_CALLS, None, 0.0)
    assert calls == sampler.WARMUP_CALLS == 2  # two 30 ms calls agree: 60 ms, where 3 calls took 90


def test_warm_up_that_never_steadies_stops_at_its_bound_and_an_explicit_time_is_kept(monkeypatch):
    clock = FakeClock([1e-4 * 1.06 ** i for i in range(1000)])  # each call 6% slower than the one before
    monkeypatch.setattr(sampler, "time", clock)
    sampler._warm_up(inputs.Workload(clock.call), "cpu", sampler.WARMUP_CALLS, None, 0.0)
    assert sampler.AUTO_WARMUP_S <= clock.now <= sampler.AUTO_WARMUP_S + 2e-3
    clock = FakeClock([1e-4])
    monkeypatch.setattr(sampler, "time", clock)
    sampler._warm_up(inputs.Workload(clock.call), "cpu", 3, 0.2, 0.0)  # steady at once, but 0.2 s asked
    assert 0.2 <= clock.now <= 0.2 + 2e-3


def test_stopping_rule_refuses_min_above_max():
    with pytest.raises(ValueError, match="min_samples <= max_samples"):
        StoppingRule(min_samples=10, max_samples=5)


def test_calls_per_sample_and_setup_run_as_asked():
    calls, prepared = [], []

    def setup():
        prepared.append(len(calls))
        return (len(prepared),), {}

    rule = StoppingRule(min_samples=5, max_samples=5)
    m = sampler.measure(inputs.Workload(calls.append, (0,)), CPU, "cpu", "hot", rule, warmup_s=0, warmup_calls=4,
                        calls_per_sample=3)
    assert m.calls_per_sample == 3 and m.warmup_calls == 4 and m.stats.n == 5
    assert len(calls) == 4 + 5 * 3
    calls.clear()
    m = sampler.measure(inputs.Workload(calls.append, setup=setup), CPU, "cpu", "hot", rule, warmup_s=0)
    # One setup before the warm-up, then one before each sample; each call sees the newest arguments.
    assert len(prepared) == 1 + 5 and calls == [1] * m.warmup_calls + [2, 3, 4, 5, 6]


def test_cpu_session_records_no_kernel_names():
    m = sampler.measure(inputs.Workload(torch.add, (torch.ones(4), 1)), CPU, "cpu", "hot",
                        StoppingRule(min_samples=3, max_samples=3), warmup_s=0, kernel_names=True)
    assert m.kernels is None


# --- timer choice per device ------------------------------------------------------------------


def test_timers_say_which_devices_they_need():
    assert timers.unsupported("cpu", "cpu") is None and timers.unsupported("cpu", "cuda") is None
    assert timers.unsupported("cuda_graph", "xpu") == "the cuda_graph timer needs a CUDA device"
    assert "needs an accelerator" in timers.unsupported("event", "cpu")
    assert timers.unsupported("event", "npu") is None  # torch.Event: any accelerator
    assert "needs an accelerator" in timers.unsupported("profiler", "cpu")


def test_profiler_activity_follows_the_device_type(monkeypatch):
    from torch.profiler import ProfilerActivity

    monkeypatch.setattr(torch.profiler, "supported_activities", lambda: set(ProfilerActivity.__members__.values()))
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    assert profiler_records.profiler_activity("cuda") == ProfilerActivity.CUDA  # ROCm too: its device type is cuda
    assert profiler_records.profiler_activity("xpu") == ProfilerActivity.XPU
    assert profiler_records.profiler_activity("npu") == ProfilerActivity.PrivateUse1  # torch_npu's registered name
    assert profiler_records.profiler_activity("mps") is None and profiler_records.profiler_activity("cpu") is None
    monkeypatch.setattr(torch.profiler, "supported_activities", lambda: {ProfilerActivity.CPU})
    assert profiler_records.profiler_activity("cuda") is None
    assert timers.unsupported("profiler", "xpu") == "the profiler of this torch build cannot trace xpu kernels"


# --- kernel names and times from profiler events ---------------------------------------------


def _event(name, device="DeviceType.CPU", start=0, end=0, kernels=(), children=(), device_time=0.0):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           kernels=[SimpleNamespace(name=k) for k in kernels], cpu_children=list(children),
                           device_time_total=device_time)


def test_kernel_times_from_the_cpu_side_call_ranges():
    call = CALL_RANGE
    events = [
        _event(call, device_time=3.5, children=[
            _event("aten::mm", kernels=["sm90_gemm_bf16"], children=[_event("aten::fill_", kernels=["fill"])]),
            _event("aten::add", kernels=["add_kernel"])]),
        _event(call, device_time=2.5, children=[_event("aten::mm", kernels=["sm90_gemm_bf16"])]),
    ]
    totals, names = profiler_records.kernel_times(events, 2)
    assert totals == [3.5, 2.5]
    assert names == ["sm90_gemm_bf16", "fill", "add_kernel", "sm90_gemm_bf16"]  # launch order, per call


def test_kernel_times_fall_back_to_device_side_ranges():
    call, dev = CALL_RANGE, "DeviceType.CUDA"
    events = [
        _event(call), _event(call),  # CPU-side ranges that got no kernels attributed
        _event(call, dev, 100, 110), _event(call, dev, 200, 230),
        _event("kernel_b", dev, 104, 109), _event("kernel_a", dev, 100, 103),  # out of order on purpose
        _event("kernel_c", dev, 200, 230),
        _event("flush", dev, 50, 90),  # before both ranges: not counted
    ]
    totals, names = profiler_records.kernel_times(events, 2)
    assert totals == [3.0 + 5.0, 30.0]
    assert names == ["kernel_a", "kernel_b", "kernel_c"]


def test_kernel_times_count_kernels_the_host_side_range_was_not_attributed():
    # Seen on an H100 (torch 2.11): a per-tensor fp8 quantizer ran a torch fill and two Triton
    # kernels; only the fill was attributed to the host-side range, so every size read ~1 us.
    call, dev = CALL_RANGE, "DeviceType.CUDA"
    events = [
        _event(call, device_time=1.0, children=[_event("aten::zero_", kernels=["fill"])]),
        _event(call, device_time=1.0, children=[_event("aten::zero_", kernels=["fill"])]),
        _event(call, dev, 100, 140), _event(call, dev, 200, 240),
        _event("fill", dev, 100, 101), _event("_row_amax", dev, 102, 120), _event("_quant_fp8", dev, 121, 140),
        _event("fill", dev, 200, 201), _event("_row_amax", dev, 202, 220), _event("_quant_fp8", dev, 221, 240),
    ]
    totals, names = profiler_records.kernel_times(events, 2)
    assert totals == [1.0 + 18.0 + 19.0] * 2
    assert names == ["fill", "_row_amax", "_quant_fp8"] * 2


def test_kernel_times_refuse_calls_without_kernels():
    call = CALL_RANGE
    with pytest.raises(timers.TimerError, match="recorded 1 calls of 2"):
        profiler_records.kernel_times([_event(call, device_time=1.0)], 2)
    with pytest.raises(timers.TimerError, match="no kernels for the calls"):
        profiler_records.kernel_times([_event(call)], 1)


class _Raw:
    """A raw profiler record (torch's _KinetoEvent) by hand."""

    def __init__(self, name, device, start, end, corr=0, linked=0, thread=1, end_thread=None, is_async=False,
                 hidden=False):
        from torch.autograd import DeviceType

        self._v = dict(name=name, device_type=getattr(DeviceType, device), start_ns=start, end_ns=end,
                       correlation_id=corr, linked_correlation_id=linked, start_thread_id=thread,
                       end_thread_id=thread if end_thread is None else end_thread, is_async=is_async,
                       is_hidden_event=hidden)

    def __getattr__(self, key):
        return lambda: self._v[key]


def _raw_session(records, start=0):
    results = SimpleNamespace(trace_start_ns=lambda: start, events=lambda: records)
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=results),
                           events=lambda: pytest.fail("the raw records were there: torch's parser is not needed"))


def test_recorded_events_attribute_device_work_to_the_range_that_launched_it():
    call = CALL_RANGE
    records = [
        # Two calls on thread 1 (ns); an aten op inside each, a Triton launch straight under the
        # second range (linked to the range itself); a fill before them; work of another thread.
        _Raw(call, "CPU", 1_000, 2_000, corr=10), _Raw("aten::mm", "CPU", 1_100, 1_900, corr=11),
        _Raw("cudaLaunchKernel", "CPU", 1_200, 1_300, corr=99, linked=11),  # runtime call: not a launcher
        _Raw(call, "CPU", 3_000, 4_000, corr=20), _Raw("aten::mm", "CPU", 3_100, 3_500, corr=21),
        _Raw("aten::fill_", "CPU", 500, 600, corr=5), _Raw("aten::add", "CPU", 1_500, 1_600, corr=30, thread=2),
        _Raw("sm90_gemm", "CUDA", 10_000, 14_000, linked=11), _Raw("sm90_gemm", "CUDA", 20_000, 24_500, linked=21),
        _Raw("_ZN6triton4quantEv", "CUDA", 25_000, 26_000, linked=20),  # mangled: demangled as torch does
        _Raw("fill", "CUDA", 9_000, 9_500, linked=5), _Raw("add_kernel", "CUDA", 15_000, 15_100, linked=30),
        _Raw("hidden", "CUDA", 10_000, 90_000, linked=11, hidden=True),
        _Raw(call, "CPU", 5_000, 6_000, corr=40, thread=1, end_thread=3),  # async: not a range
        _Raw(call, "CUDA", 10_000, 14_000), _Raw(call, "CUDA", 20_000, 26_000),  # device-side copies
    ]
    events = profiler_records.recorded_events(_raw_session(records, start=1_000), "cuda")
    totals, names = profiler_records.kernel_times(events, 2)
    assert totals == [4.0, 4.5 + 1.0]  # us: the fill before and the other thread's add are not counted
    quant = torch._C._demangle("_ZN6triton4quantEv")  # "triton::quant()" where torch was built to demangle
    assert names == ["sm90_gemm", "sm90_gemm", quant]
    ranges = [e for e in events if e.name == call and profiler_records._on_cpu(e)]
    assert [(r.time_range.start, r.time_range.end) for r in ranges] == [(0.0, 1.0), (2.0, 3.0)]
    assert profiler_records.range_kernels(events, call) == ["sm90_gemm", quant]


def test_recorded_events_read_torchs_raw_records():
    # A real session (host activity only, so no device events): the raw reader's calls exist in
    # this torch, and it finds the ranges torch's parser finds, at the same times.
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            with record_function(CALL_RANGE):
                torch.neg(x)
    ours = [e for e in profiler_records.recorded_events(prof, "cuda") if e.name == CALL_RANGE]
    theirs = [e for e in prof.events() if e.name == CALL_RANGE]
    assert len(ours) == 5 and all(profiler_records._on_cpu(e) for e in ours)
    spans = sorted((e.time_range.start, e.time_range.end) for e in theirs)
    assert [t for e in ours for t in (e.time_range.start, e.time_range.end)] == pytest.approx(
        [t for span in spans for t in span])


def test_recorded_events_leave_other_devices_to_torchs_parser():
    parsed = [object()]
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=None), events=lambda: parsed)
    assert profiler_records.recorded_events(prof, "cuda") is parsed  # no raw records kept
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(trace_start_ns=lambda: 0)),
                           events=lambda: parsed)
    assert profiler_records.recorded_events(prof, "npu") is parsed  # legacy device times come from the parser


def test_a_cold_graph_call_runs_from_the_end_of_its_flush_and_a_count_that_differs_is_named():
    def ev(start, end):
        return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end))

    # two replays of 2 calls; a flush runs one kernel, a call two (a gap of 1 us between them counts)
    replay = [ev(0, 20), ev(22, 30), ev(31, 40), ev(40, 60), ev(63, 70), ev(70, 75)]
    later = [ev(t.time_range.start + 100, t.time_range.end + 100) for t in replay]
    from pytest_opperf.measure.timers.cuda_graph import cold_call_times

    assert cold_call_times(replay + later, 2, 2, 1, 2) == [(40 - 20 + 75 - 60) / 2] * 2
    with pytest.raises(timers.TimerError, match="recorded 5 device events in 1 graph replays of 2 calls, where a "
                                                "flush runs 1 and a call 2: use --opperf-timer=profiler"):
        cold_call_times(replay[:5], 1, 2, 1, 2)


# --- on a GPU ---------------------------------------------------------------------------------


def _gemm(n=4096, dtype=torch.bfloat16):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return inputs.Workload(torch.matmul, (a, b))


@cuda
@pytest.mark.exclusive_gpu  # beside other GPU tests (-n 8 on one H100) the event timer read 10.4% high
@pytest.mark.parametrize("cache", ["cold", "hot"])
def test_graph_and_event_timers_agree_with_profiler_on_a_large_gemm(cache):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rule = StoppingRule(target_rel=0.005, min_samples=20, budget_s=2)
    work = _gemm()
    ref = sampler.measure(work, torch.device("cuda"), "profiler", cache, rule, cache_bytes=l2)
    assert any("gemm" in k.lower() or "sm90" in k.lower() or "cutlass" in k.lower() for k in ref.kernels), ref.kernels
    # Per-call events carry a few microseconds of launch overhead; the graph timer does not.
    # Each timer is held against the profiler read just before and just after it: under this
    # GEMM's sustained full load the card's clocks drift (an H100, hot: the profiler 173.5 us,
    # then the graph timer 180.4 us), and that drift is the card's, not the timer's.
    for name, rel in (("cuda_graph", 0.03), ("event", 0.10)):
        m = sampler.measure(work, torch.device("cuda"), name, cache, rule, cache_bytes=l2)
        after = sampler.measure(work, torch.device("cuda"), "profiler", cache, rule, cache_bytes=l2)
        low, high = sorted((ref.stats.median, after.stats.median))
        assert low * (1 - rel) <= m.stats.median <= high * (1 + rel), (name, ref.stats.median, m.stats.median,
                                                                       after.stats.median)
        ref = after


def _fp8_quant():
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS

    load_builtin()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return inputs.Workload(BACKENDS[("quant_fp8", "triton")].fn, (x, "tensor"))


@cuda
@pytest.mark.parametrize("make", [
    lambda: inputs.Workload(torch.add, (torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda"))),
    lambda: _gemm(1024),
    lambda: inputs.Workload(lambda x: torch.softmax(x, -1).sum(0), (torch.randn(512, 4096, device="cuda"),)),
    _fp8_quant,  # Triton kernels torch does not attribute to the host-side range
], ids=["add", "gemm", "two_kernels", "triton_fp8"])
def test_recorded_events_give_torchs_totals_and_names(make):
    from torch.profiler import record_function

    work = make()
    work()
    torch.cuda.synchronize()
    with profiler_records.profiling("cuda") as prof:
        with record_function(CHECKED_RANGE):
            work()
        torch.cuda.synchronize()
        for _ in range(50):
            with record_function(CALL_RANGE):
                work()
        torch.cuda.synchronize()
    ours = profiler_records.recorded_events(prof, "cuda")
    assert all(isinstance(e, profiler_records._Record) for e in ours)
    totals, names = profiler_records.kernel_times(ours, 50)
    torch_totals, torch_names = profiler_records.kernel_times(prof.events(), 50)
    assert totals == pytest.approx(torch_totals, rel=1e-9, abs=1e-6)
    assert sorted(names) == sorted(torch_names)
    assert (set(profiler_records.range_kernels(ours, CHECKED_RANGE))
            == set(profiler_records.range_kernels(prof.events(), CHECKED_RANGE)))


@cuda
def test_graph_timer_explains_an_uncapturable_call():
    x = torch.randn(16, device="cuda")
    work = inputs.Workload(lambda t: t.sum().item(), (x,))  # a host sync cannot be captured
    with pytest.raises(timers.TimerError, match="cannot capture the call in a CUDA graph.*--opperf-timer=event"):
        sampler.measure(work, torch.device("cuda"), "cuda_graph", "hot", StoppingRule(min_samples=3), warmup_s=0)
    # The process is sound afterwards: random inputs and a new capture work.
    y = torch.randn(1024, device="cuda")
    m = sampler.measure(inputs.Workload(torch.neg, (y,)), torch.device("cuda"), "cuda_graph", "hot",
                        StoppingRule(min_samples=3), warmup_s=0)
    assert m.stats.median > 0


@cuda
@pytest.mark.parametrize("timer_name", ["event", "cuda_graph", "profiler"])
def test_cold_samples_leave_the_flush_out(timer_name):
    # A closure too: the flush is inside the graph, between its calls, outside the events around them.
    x = torch.randn(1024, device="cuda")
    dev, l2 = torch.device("cuda"), torch.cuda.get_device_properties(0).L2_cache_size
    flush = inputs.Flusher(dev, l2)
    flush_us = sampler.measure(inputs.Workload(flush), dev, "profiler", "hot", StoppingRule(min_samples=10),
                               warmup_s=0).stats.median
    m = sampler.measure(inputs.Workload(lambda: x + 1), dev, timer_name, "cold", StoppingRule(min_samples=10),
                        warmup_s=0, cache_bytes=l2)
    assert m.cache_flush == "read" and m.stats.median < flush_us / 4, (m.stats.median, flush_us)


def test_cold_flushes_by_a_read_of_twice_the_cache_before_every_sample():
    a = torch.randn(1024)
    tmr = timers.TIMERS["cpu"](inputs.Workload(torch.neg, (a,)), CPU, "cold", 64 << 20)
    assert tmr.flush.nbytes >= 128 << 20 and tmr.cache_flush == "read"
    assert timers.TIMERS["cpu"](inputs.Workload(torch.neg, (a,)), CPU, "hot", 64 << 20).flush is None
    flushes = []
    tmr.flush = lambda: flushes.append(1)
    assert len(tmr.sample(5)) == 5 and len(flushes) == 5
    # Several calls a sample (pedantic's iterations): only its first call finds the cache flushed.
    tmr = timers.TIMERS["cpu"](inputs.Workload(torch.neg, (a,)), CPU, "cold", 64 << 20, 4)
    assert tmr.cache_flush == "read-per-sample"


def test_the_flush_reads_a_buffer_and_writes_one_number():
    flush = inputs.Flusher(CPU, 1 << 20)  # twice the host's LLC when that is larger (sysfs)
    assert flush.nbytes == inputs.flush_bytes("cpu", 1 << 20) >= inputs.FLUSH_MIN_BYTES
    assert flush.buffer.numel() * 8 == flush.nbytes
    flush()
    assert flush.total.numel() == 1 and int(flush.total) == flush.buffer.numel()  # it read every element


def test_the_host_cache_is_read_from_sysfs(tmp_path):
    for name, level, kind, size in [("index0", 1, "Data", "32K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "1M"), ("index3", 3, "Unified", "32768K")]:
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / field).write_text(f"{value}\n")
    assert inputs.host_llc_bytes(tmp_path) == 32 << 20
    assert inputs.host_llc_bytes(tmp_path / "absent") is None
    (tmp_path / "index3" / "size").write_text("garbled\n")
    assert inputs.host_llc_bytes(tmp_path) == 1 << 20  # an unreadable level is passed over


# --- statistics by hand -----------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks():
    data = [10.0, 20.0, 30.0, 40.0]
    # position (n - 1) * q: 0.75 -> 10 + 0.75 * 10; 1.5 -> between 20 and 30; 2.25 -> 30 + 0.25 * 10
    assert [percentile(data, q) for q in (0, 25, 50, 75, 100)] == [10.0, 17.5, 25.0, 32.5, 40.0]
    assert percentile([7.0], 95) == 7.0


def test_median_ci_ranks_by_hand():
    # n = 20: 1.96 * sqrt(20) / 2 = 4.38; ranks floor(10 - 4.38) = 5 and ceil(10 + 4.38) + 1 = 16
    data = [float(i) for i in range(1, 21)]
    assert median_ci(data) == (5.0, 16.0)
    assert Stats(data).median_ci_rel == pytest.approx((16 - 5) / 2 / 10.5)
    assert median_ci([1.0] * 8) == (1.0, 1.0)  # n = 8: the first n with an interval (ranks 1 and 8)
    assert Stats([1.0] * 7).median_ci_rel == math.inf  # n = 7: none yet, so never "met"


def test_cv_is_the_spread_and_unstable_a_median_that_moves():
    assert Stats([9.0, 10.0, 11.0]).cv == pytest.approx(0.1)  # std 1 over mean 10
    wide = Stats([8.0, 12.0] * 10)  # cv 0.21, seed 002's "unstable": yet its halves' medians agree
    assert wide.steady.cv > 0.15 and wide.drift == 0.0 and not wide.unstable
    narrow = Stats([10.0] * 10 + [10.5] * 10)  # cv 0.025: its median moved 5% from the first half to the second
    assert narrow.steady.cv < 0.03 and narrow.drift == pytest.approx(0.05) and narrow.unstable


# --- timer and cache selection in real sessions -------------------------------------------------

# A timer any device can run, whose samples are known: rows show which timer produced them.
FIXED_TIMER = """

from pytest_opperf.measure import timers


@timers.timer
class FixedTimer(timers.Timer):
    name = "fixed"

    def sample(self, n):
        return [5.0] * n


class ScriptedTimer(timers.Timer):
    # the i-th sample of the case (in the order taken, across batches) is level(i)

    def sample(self, n):
        start = getattr(self, "taken", 0)
        self.taken = start + n
        return [self.level(i) for i in range(start, start + n)]


@timers.timer
class NoisyTimer(ScriptedTimer):
    name = "noisy"

    def level(self, i):
        return 1.0 if i % 2 == 0 else 3.0


@timers.timer
class StallingTimer(ScriptedTimer):
    name = "stalling"  # 10 us +- 0.1, every 10th sample a stall of 23 us (a watchdog's)

    def level(self, i):
        return 23.0 if i % 10 == 9 else 10.0 + 0.1 * (i % 3 - 1)


@timers.timer
class SteppingTimer(ScriptedTimer):
    name = "stepping"  # 10 us for the first 50 samples, 11 us after

    def level(self, i):
        return 10.0 if i < 50 else 11.0
"""
HUNDRED = ("--opperf-min-samples=100", "--opperf-max-samples=100")  # exactly 100 samples, whatever the budget

ADD_FP32 = "backend: torch\ndtypes: fp32\nparams: {N: 64}\n"


@pytest.fixture
def timed_project(project):
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + FIXED_TIMER)
    with timers.registered():  # in-process sessions register the conftest's timers here too
        yield project


def _timer_cache(pytester):
    return [(r["timer"], r["cache"], r["time_us"]) for r in rows(pytester, "add")]


def test_timer_and_cache_come_from_config_unless_the_command_line_says(timed_project):
    p = timed_project
    p.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=4)
    assert {(t, c) for t, c, _ in _timer_cache(p)} == {("cpu", "hot")}  # auto on a CPU
    (p.path / "results" / "cpu.db").unlink()
    write_config(p, "add", ADD_FP32 + "timer: fixed\ncache: cold\n")
    p.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=1)
    assert _timer_cache(p) == [("fixed", "cold", 5.0)]
    p.runpytest("benches", "-k", "add", "--opperf-timer=cpu", "--opperf-cache=hot", *FAST).assert_outcomes(passed=1)
    # timer and cache are key columns: the command line's choice is a row of its own
    got = sorted(_timer_cache(p))
    assert [(t, c) for t, c, _ in got] == [("cpu", "hot"), ("fixed", "cold")] and got[0][2] != 5.0


BAD_TIMER_CONFIGS = [
    ("timer: stopwatch\n", "add.yaml: timer: expected one of [[]'cpu', 'cuda_graph', 'event', 'fixed', 'noisy', 'profiler', 'stalling', 'stepping'[]], got str 'stopwatch'"),
    ("timer: [cpu]\n", "add.yaml: timer: expected one of*got list"),
    ("cache: lukewarm\n", "add.yaml: cache: expected one of [[]'cold', 'hot', 'resident'[]], got str 'lukewarm'"),
    ("timer: cuda_graph\n", "add.yaml: timer: the cuda_graph timer needs a CUDA device, and this session runs on cpu*"),
]


def test_a_bad_timer_or_cache_in_a_config_is_a_collection_error(timed_project):
    p = timed_project
    p.runpytest("benches", "-k", "gemm", *FAST).assert_outcomes(passed=2)
    before = db_bytes(p)
    for text, message in BAD_TIMER_CONFIGS:
        write_config(p, "add", ADD_FP32 + text)
        result = p.runpytest("benches", *FAST)
        assert result.ret == pytest.ExitCode.INTERRUPTED, text
        result.stdout.fnmatch_lines(["*ERROR collecting benches/test_ops.py*", f"*{message}*"])
        result.stdout.no_fnmatch_line("*Traceback*")
        assert db_bytes(p) == before  # nothing ran, nothing was written


def test_the_command_line_overrides_a_config_timer_this_device_cannot_run(timed_project):
    write_config(timed_project, "add", ADD_FP32 + "timer: cuda_graph\n")
    timed_project.runpytest("benches", "-k", "add", "--opperf-timer=cpu", *FAST).assert_outcomes(passed=1)
    assert [t for t, _, _ in _timer_cache(timed_project)] == ["cpu"]


@pytest.mark.parametrize("args, message", [
    (["--opperf-timer=event"], "--opperf-timer=event: the event timer needs an accelerator; use 'cpu' on a CPU, and this session runs on cpu"),
    (["--opperf-timer=cuda_graph"], "--opperf-timer=cuda_graph: the cuda_graph timer needs a CUDA device*"),
    (["--opperf-kernel-names=always"], "--opperf-kernel-names=always: expected auto or off"),
])
def test_timer_options_the_device_cannot_run_are_usage_errors(project, args, message):
    result = project.runpytest("benches", *FAST, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_an_unstable_case_is_flagged_in_the_row_and_the_summary(timed_project):
    write_config(timed_project, "add", ADD_FP32 + "timer: stepping\n")
    result = timed_project.runpytest("benches", "-k", "add", *FAST, *HUNDRED)
    result.assert_outcomes(passed=1)
    (row,) = rows(timed_project, "add")
    # 50 samples at 10 us, then 50 at 11: the halves' medians differ by 10%; no sample is far out
    assert row["unstable"] == 1 and row["median_drift"] == pytest.approx(0.1) and row["outliers"] == 0
    assert row["cv"] == pytest.approx(0.5 / 10.5, rel=0.02) and row["target_met"] == 0
    result.stdout.fnmatch_lines(["*test_add?torch-fp32-n=64?*unstable target-missed*",
                                 "opperf: 1 cases measured, 1 unstable (the median moved over 3% between the "
                                 "samples' halves), 1 missed the 1.0% target*"])


def test_a_wide_case_whose_median_holds_is_not_flagged_unstable(timed_project):
    write_config(timed_project, "add", ADD_FP32 + "timer: noisy\n")
    result = timed_project.runpytest("benches", "-k", "add", *FAST, *HUNDRED)
    result.assert_outcomes(passed=1)
    (row,) = rows(timed_project, "add")
    # samples alternate 1 and 3 us: CV about 0.5 and the median's CI spans 1..3 (target missed), but
    # each half is the same mix, its median 2 us as the whole's: the median reproduces
    assert row["unstable"] == 0 and row["median_drift"] == 0.0 and row["cv"] > 0.15 and row["target_met"] == 0
    result.stdout.fnmatch_lines(["*test_add?torch-fp32-n=64?*target-missed*",
                                 "opperf: 1 cases measured, 1 missed the 1.0% target*"])
    for line in ("*n=64?*unstable*", "*cases measured*unstable*"):  # (the test's own name is in the paths)
        result.stdout.no_fnmatch_line(line)


def test_a_row_with_stalls_has_a_steady_cv_counts_its_outliers_and_is_not_unstable(timed_project):
    # Before, the flag read the raw CV (0.35 here: unstable) while a collective's cv left the stalls
    # out (0.008): a row said cv 0.008 and unstable 1. The flag, the cv and the count now agree.
    write_config(timed_project, "add", ADD_FP32 + "timer: stalling\n")
    result = timed_project.runpytest("benches", "-k", "add", *FAST, *HUNDRED)
    result.assert_outcomes(passed=1)
    (row,) = rows(timed_project, "add")
    assert (row["samples"], row["outliers"], row["outlier_share"]) == (100, 10, 0.1)
    assert row["outlier_us"] == pytest.approx(13.0) and row["time_us"] == 10.0
    assert row["cv"] < 0.01 and row["median_drift"] == 0.0 and row["unstable"] == 0
    result.stdout.fnmatch_lines(["opperf: 1 cases measured, 1 with outliers (10.0% of their samples, not in cv)*"])
    for line in ("*n=64?*unstable*", "*cases measured*unstable*"):  # (the test's own name is in the paths)
        result.stdout.no_fnmatch_line(line)


def test_a_cpu_row_says_how_it_was_measured_and_has_no_device_state(project):
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    for row in rows(project, "add"):
        assert (row["timer"], row["cache"], row["calls_per_sample"]) == ("cpu", "hot", 1)
        assert row["warmup_calls"] >= sampler.WARMUP_CALLS and row["samples"] >= 3
        assert row["kernels"] is None and row["extra_info"] is None
        for column in devstate.COLUMNS:
            assert row[column] is None, column


@cuda
@pytest.mark.parametrize("timer_name", ["cuda_graph", "event", "cpu"])
def test_other_timers_learn_kernel_names_from_one_profiled_call(timer_name):
    rule = StoppingRule(target_rel=0.05, min_samples=10, budget_s=0.5)
    m = sampler.measure(_gemm(1024), torch.device("cuda"), timer_name, "hot", rule, kernel_names=True)
    assert m.kernels and any("gemm" in k.lower() or "cutlass" in k.lower() or "sm90" in k.lower() for k in m.kernels)
    assert len(m.kernels) == len(set(m.kernels))
    assert (m.calls_per_sample > 1) == (timer_name == "cuda_graph")
    off = sampler.measure(_gemm(1024), torch.device("cuda"), timer_name, "hot", rule, kernel_names=False)
    assert off.kernels is None


def test_the_profiler_timer_times_one_call_a_sample():
    tmr = timers.TIMERS["profiler"](inputs.Workload(torch.add, (torch.ones(2), 1)), CPU, "hot", None, 4)
    assert tmr.calls_per_sample == 1


# --- the check of a timed call ---------------------------------------------------------------


def test_measure_hands_one_timed_call_to_the_check():
    a = torch.randn(1024)
    seen = []

    def check(args, out):
        seen.append((args, out))
        return None

    rule = StoppingRule(min_samples=3, max_samples=3)
    sampler.measure(inputs.Workload(torch.neg, (a,)), CPU, "cpu", "cold", rule, warmup_s=0, cache_bytes=64 << 10,
                    check=check)
    ((args, out),) = seen
    assert args[0] is a and torch.equal(out, -a)  # cold flushes the cache: the inputs are the originals
    sampler.measure(inputs.Workload(torch.neg, (a,)), CPU, "cpu", "hot", rule, warmup_s=0, check=check)
    assert seen[1][0][0] is a
    with pytest.raises(timers.TimerError, match="^the output is wrong$"):
        sampler.measure(inputs.Workload(torch.neg, (a,)), CPU, "cpu", "hot", rule, warmup_s=0,
                        check=lambda args, out: "the output is wrong")


class KernelSkippingTimer(timers.CpuTimer):
    """Reports the kernels a profiled timed call and a plain call would give, set by the test."""

    name = "kernel_skipping"
    kernels_seen: tuple = ([], [])

    def verify(self, trace):
        return timers.TimedCall(*self.timed_call(), *type(self).kernels_seen)


@pytest.fixture
def kernel_skipping():
    with timers.registered(KernelSkippingTimer):
        yield KernelSkippingTimer


def test_measure_fails_when_the_timed_call_skipped_a_kernel_of_the_checked_call(monkeypatch, kernel_skipping):
    rule = StoppingRule(min_samples=3, max_samples=3)

    def run(checked, timed):
        monkeypatch.setattr(KernelSkippingTimer, "kernels_seen", (checked, timed))
        return sampler.measure(inputs.Workload(torch.neg, (torch.ones(4),)), CPU, "kernel_skipping", "hot", rule,
                               warmup_s=0, check=lambda args, out: None)

    with pytest.raises(timers.TimerError, match=r"did not run kernels the checked call ran: missing \['reduce'\]$"):
        run(["gemm", "reduce"], ["gemm"])
    with pytest.raises(timers.TimerError, match=r"missing \['add'\], ran instead \['copy'\]"):
        run(["add"], ["copy"])
    assert run(["gemm"], ["fill", "gemm"]).kernels == ["gemm"]  # an extra kernel alone (RNG fills) is no skip
    assert run([], []).kernels is None  # no names recorded: nothing to compare


def test_kernel_mismatch_by_hand():
    assert timers.kernel_mismatch(["a", "b"], ["b", "a"]) is None
    assert timers.kernel_mismatch(None, ["a"]) is None and timers.kernel_mismatch(["a"], None) is None
    assert timers.kernel_mismatch(["a", "b"], []) == (
        "the timed call did not run kernels the checked call ran: missing ['a', 'b']")


def test_range_kernels_from_the_cpu_side_range_or_its_device_copy():
    checked, timed, dev = CHECKED_RANGE, TIMED_RANGE, "DeviceType.CUDA"
    attributed = [_event(checked, children=[_event("aten::add", kernels=["add_kernel", "add_kernel"])]),
                  _event(timed, children=[_event("cudaGraphLaunch", kernels=["copy_kernel"])])]
    assert profiler_records.range_kernels(attributed, checked) == ["add_kernel"]  # unique names
    assert profiler_records.range_kernels(attributed, timed) == ["copy_kernel"]
    # Not attributed on the host side: the kernels inside each range's device-side copy.
    device_side = [_event(checked), _event(timed), _event(checked, dev, 0, 10), _event(timed, dev, 20, 40),
                   _event("gemm", dev, 2, 8), _event("reduce", dev, 25, 30), _event("late", dev, 50, 60)]
    assert profiler_records.range_kernels(device_side, checked) == ["gemm"]
    assert profiler_records.range_kernels(device_side, timed) == ["reduce"]
    assert profiler_records.range_kernels(device_side, CALL_RANGE) == []


fp8_capable = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                                 reason="fp8 GEMM needs CUDA sm_89 or newer")


@cuda
@fp8_capable
@pytest.mark.parametrize("cache", ["cold", "hot"])
@pytest.mark.parametrize("timer_name", ["cpu", "event", "cuda_graph", "profiler"])
def test_fp8_gemm_runs_through_every_timer_and_cache(timer_name, cache):
    # The case that stopped `pytest benches/` on an H100: cold copies of the 4-byte scales were misaligned.
    from pytest_opperf import dtypes
    from pytest_opperf.catalog.ops.matmul import gemm
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.measure import check

    dev = torch.device("cuda")
    fp8 = DTypes(dtypes.lookup("fp8"), dtypes.lookup("bf16"))
    args = gemm.inputs({"m": 256, "n": 256, "k": 256}, fp8, dev, torch.Generator(device=dev).manual_seed(0))
    ref = gemm.reference(*args)
    timed_inputs = []

    def check_output(call_args, out):
        timed_inputs.append(call_args)
        return check.compare(out, ref, fp8.output, gemm.OP.check_bound({"k": 256}, fp8))

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    m = sampler.measure(inputs.Workload(gemm.gemm_torch, args), dev, timer_name, cache,
                        StoppingRule(target_rel=0.05, min_samples=10, budget_s=0.5), cache_bytes=l2,
                        kernel_names=True, check=check_output)
    assert m.stats.median > 0 and m.kernels and len(timed_inputs) == 1
    (call_args,) = timed_inputs
    if cache == "hot":
        assert call_args[2] is args[2]
    assert all(t.data_ptr() % 256 == 0 for t in call_args if isinstance(t, torch.Tensor))


def test_timed_kernels_found_by_start_time_when_the_profiler_tied_none_to_the_range():
    # A graph replay's kernels tied to cudaGraphLaunch but not to the range around it, nor in a device range.
    dev = "DeviceType.CUDA"
    events = [_event(CHECKED_RANGE, start=0, end=5), _event(TIMED_RANGE, start=10, end=12),
              _event("add_kernel", dev, 1, 4), _event("copy_kernel", dev, 11, 13), _event("fill", dev, 14, 15)]
    assert profiler_records.range_kernels(events, TIMED_RANGE) == []
    assert profiler_records.kernels_after(events, TIMED_RANGE) == ["copy_kernel", "fill"]
    assert profiler_records.kernels_after(events, "opperf::absent") == []


def test_the_profiler_starts_once_a_process_and_only_for_the_profiler_timer(monkeypatch):
    sessions = []

    @contextlib.contextmanager
    def fake_profiling(device_type):
        sessions.append(device_type)
        yield None
        profiler_records._STARTED.add(device_type)  # as a real session does

    monkeypatch.setattr(profiler_records, "_STARTED", set())
    monkeypatch.setattr(profiler_records, "profiling", fake_profiling)
    monkeypatch.setattr(timers.ProfilerTimer, "unsupported", classmethod(lambda cls, device_type: None))
    assert timers.start_profiler("cpu", "auto") is None  # the CPU's default timer is not the profiler
    assert timers.start_profiler("cpu", "event") is None
    assert sessions == []
    spent = timers.start_profiler("cpu", "profiler")
    assert sessions == ["cpu"] and spent is not None and spent >= 0
    assert timers.start_profiler("cpu", "profiler") is None  # paid once a process
    assert sessions == ["cpu"]


def test_the_profiler_does_not_start_where_it_cannot_trace(monkeypatch):
    monkeypatch.setattr(profiler_records, "_STARTED", set())
    monkeypatch.setattr(profiler_records, "profiling", None)  # any session would raise
    assert timers.start_profiler("cpu", "profiler") is None


@cuda
def test_profiler_timer_samples_after_the_profilers_start():
    spent = timers.start_profiler("cuda", "auto")
    assert spent is None or spent > 0  # None: an earlier test in this process started it
    assert profiler_records.started("cuda")
    rule = StoppingRule(target_rel=0.05, min_samples=20, budget_s=0.5)
    m = sampler.measure(_gemm(1024), torch.device("cuda"), "profiler", "hot", rule)
    assert m.stats.n >= 20 and 0 < m.stats.median < 1e4
    assert m.kernels
