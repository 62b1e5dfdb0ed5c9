"""Clock warm-up: the stopping rule with a fake clock reader and a fake time, the warmer's
idle-gap logic, the option, and the rows and runs row of a real session (fake NVML, fake busy
work: a CPU has no SM clock). On a GPU: the clock after a real warm-up."""

import sqlite3
import time
from types import SimpleNamespace

import pytest
import torch
from test_devstate import FakeNVML

from conftest import FAST, rows
from pytest_opperf.measure import clocks, devstate
from pytest_opperf.run import options


class FakeTime:
    """A clock that moves only when busy() runs: each burst of work takes `step` seconds."""

    def __init__(self, step=0.01):
        self.t = 100.0
        self.step = step
        self.bursts = 0

    def __call__(self):
        return self.t

    def busy(self):
        self.bursts += 1
        self.t += self.step


def reader(fake, curve):
    """An SM clock that follows curve(seconds since the first reading), in MHz."""
    start = fake.t
    return lambda: curve(fake.t - start)


def idle_then_ramp(idle_s=0.3, ramp_s=0.4, low=345, high=1980):
    def curve(t):
        if t < idle_s:
            return low
        return int(min(high, low + (high - low) * (t - idle_s) / ramp_s))
    return curve


def test_settled_wants_agreeing_readings_near_the_target_or_a_long_plateau():
    assert clocks.settled([(0.0, 1950), (0.05, 1965), (0.1, 1980)], 1980)  # within 2%, near the target
    assert not clocks.settled([(0.0, 1800), (0.05, 1900), (0.1, 1980)], 1980)  # still rising
    assert not clocks.settled([(0.0, 1965), (0.05, 1980)], 1980)  # too few
    idle = [(i * 0.05, 345) for i in range(9)]  # 0.4 s flat at the idle clock: not yet a plateau
    assert not clocks.settled(idle, 1980)
    capped = [(i * 0.05, 1400) for i in range(11)]  # 0.5 s flat below the target: a clock held down
    assert clocks.settled(capped, 1980)
    assert clocks.settled(capped, None)  # no target known: a plateau only
    assert not clocks.settled(capped[:5], None)


def test_warmup_stops_once_the_clock_is_steady():
    fake = FakeTime()
    w = clocks.hold_until_steady(fake.busy, reader(fake, idle_then_ramp()), 1980, bound_s=3.0, now=fake)
    # On the ramp, readings 0.05 s apart differ by 200 MHz (10%): they agree within 2% only at the
    # top, from 0.7 s on, and the third reading there comes 0.1 s later.
    assert w.method == "steady" and 0.75 <= w.seconds <= 0.85
    assert w.mhz_start == 345 and w.mhz_end >= 0.9 * 1980
    assert w.columns() == {"clock_warmup_s": round(w.seconds, 4), "clock_warmup_method": "steady",
                           "clock_warmup_mhz_start": 345, "clock_warmup_mhz_end": w.mhz_end}


def test_warmup_stops_on_a_plateau_below_the_target():
    fake = FakeTime()
    w = clocks.hold_until_steady(fake.busy, reader(fake, lambda t: 345 if t < 0.1 else 1400), 1980, 3.0, now=fake)
    assert w.method == "steady" and 0.6 <= w.seconds <= 0.7 and w.mhz_end == 1400


def test_warmup_stops_at_the_bound():
    fake = FakeTime()
    w = clocks.hold_until_steady(fake.busy, reader(fake, lambda t: int(345 * 1.5 ** (t / 0.05))), 1980, 3.0, now=fake)
    assert w.method == "bound" and 3.0 <= w.seconds < 3.0 + 2 * fake.step
    fake = FakeTime()  # a clock that cannot be read at all: nothing settles, the bound still holds
    w = clocks.hold_until_steady(fake.busy, lambda: None, 1980, 0.5, now=fake)
    assert w.method == "bound" and 0.5 <= w.seconds < 0.52 and w.mhz_start is None


def test_a_fixed_warmup_keeps_the_device_busy_for_its_time():
    fake = FakeTime()
    w = clocks.hold_for(fake.busy, 1.0, now=fake)
    assert w.method == "fixed" and 1.0 <= w.seconds < 1.0 + fake.step and fake.bursts == 100
    assert w.columns()["clock_warmup_mhz_start"] is None


def test_the_warmer_warms_up_first_and_after_an_idle_gap_only():
    fake = FakeTime()
    warmer = clocks.ClockWarmer(3.0, lambda: fake.busy, reader(fake, idle_then_ramp()), 1980, now=fake)
    first = warmer.before_case()
    assert first["clock_warmup_method"] == "steady" and first["clock_warmup_s"] > 0.6
    warmer.after_case()
    fake.t += clocks.IDLE_GAP_S - 1  # the next case follows within the gap: the clock is still up
    assert warmer.before_case() == {"clock_warmup_s": 0.0, "clock_warmup_method": None,
                                    "clock_warmup_mhz_start": None, "clock_warmup_mhz_end": None}
    warmer.after_case()
    fake.t += clocks.IDLE_GAP_S + 1
    bursts = fake.bursts
    assert warmer.before_case()["clock_warmup_s"] > 0 and fake.bursts > bursts
    off = clocks.ClockWarmer(None, lambda: fake.busy, now=fake)
    assert off.before_case() == dict.fromkeys(clocks.COLUMNS)


def test_after_a_case_that_pulled_the_clock_down_the_next_one_waits_for_it_to_come_back():
    """Issue 36: a small kernel read 12-29% slower right after large GEMMs at the power cap."""
    fake = FakeTime()
    clock = {"mhz": 1980}
    sleeps = []

    def sleep(seconds):  # resting: the clock climbs back 100 MHz every 5 ms
        sleeps.append(seconds)
        fake.t += seconds
        clock["mhz"] = min(1980, clock["mhz"] + 100)

    warmer = clocks.ClockWarmer(3.0, lambda: fake.busy, lambda: clock["mhz"], 1980, now=fake, sleep=sleep)
    assert warmer.before_case()["clock_warmup_method"] == "steady"
    warmer.after_case()  # a light case: the clock stayed up, the next case does not wait
    assert warmer.before_case()["clock_warmup_s"] == 0.0 and not sleeps
    clock["mhz"] = 1500  # a heavy case at the power cap
    warmer.after_case()
    settled = warmer.before_case()
    assert settled["clock_warmup_method"] == "settled" and settled["clock_warmup_mhz_start"] == 1500
    assert settled["clock_warmup_mhz_end"] >= 0.98 * 1980 and len(sleeps) == 5  # 1500 -> 1950 in 5 polls
    assert settled["clock_warmup_s"] == pytest.approx(5 * clocks.SETTLE_POLL_S)
    clock["mhz"] = 1000
    warmer.after_case()
    sleeps.clear()
    clock_stuck = clocks.settle(lambda: 1000, 1980, 0.02, now=fake, sleep=lambda s: setattr(fake, "t", fake.t + s))
    assert clock_stuck.method == "settle-bound" and 0.02 <= clock_stuck.seconds < 0.03
    # A settle is no warm-up in the runs row's count.
    assert clocks.run_columns([settled, {"clock_warmup_s": 0.5, "clock_warmup_method": "steady"}]) == \
        {"clock_warmups": 1, "clock_warmup_s": 0.5}


def settings(value="auto"):
    """The two Settings fields the warmer reads, parsed as the option parses them."""
    return SimpleNamespace(**options._clock_warmup(value))


def test_the_bound_follows_the_option_and_what_can_be_read():
    gpu = SimpleNamespace(type="cuda", index=0)
    nvml = devstate.Monitor(FakeNVML(sm=1410), "handle")
    blind = devstate.Monitor()
    assert clocks.open_warmer(settings("auto"), torch.device("cpu"), nvml).bound_s is None  # never on a CPU
    assert clocks.open_warmer(settings("off"), gpu, nvml).bound_s is None
    auto = clocks.open_warmer(settings("auto"), gpu, nvml)
    assert (auto.bound_s, auto.read_mhz(), auto.target_mhz) == (clocks.AUTO_BOUND_S, 1410, None)
    fixed = clocks.open_warmer(settings("auto"), gpu, blind)
    assert (fixed.bound_s, fixed.read_mhz) == (clocks.AUTO_FIXED_S, None)
    assert clocks.open_warmer(settings("2.5"), gpu, nvml).bound_s == 2.5
    assert clocks.open_warmer(settings("0.2"), gpu, blind).bound_s == 0.2


def test_the_target_is_the_applications_clock_else_the_max_clock():
    nvml = FakeNVML()
    assert devstate.Monitor(nvml, "handle").sm_clock_target() is None
    nvml.nvmlDeviceGetMaxClockInfo = lambda handle, clock: 1980
    assert devstate.Monitor(nvml, "handle").sm_clock_target() == 1980
    nvml.nvmlDeviceGetApplicationsClock = lambda handle, clock: 1755
    assert devstate.Monitor(nvml, "handle").sm_clock_target() == 1755
    assert devstate.Monitor().sm_clock() is None and devstate.Monitor().sm_clock_target() is None


class RampingNVML(FakeNVML):
    """A GPU that sat idle at 345 MHz and runs at 1975 MHz from 0.1 s after its first clock reading."""

    def __init__(self):
        super().__init__(reasons=0)
        self.since = None
        self.nvmlDeviceGetApplicationsClock = lambda handle, clock: 1980

    def nvmlDeviceGetClockInfo(self, handle, clock):
        if clock != self.NVML_CLOCK_SM:
            return super().nvmlDeviceGetClockInfo(handle, clock)
        self.since = self.since or time.monotonic()
        return 345 if time.monotonic() - self.since < 0.1 else 1975


@pytest.fixture
def fake_gpu_clock(monkeypatch):
    """The session's device reads as a GPU to the warmer, with a ramping NVML clock and sleeps for work."""
    nvml = RampingNVML()
    monkeypatch.setattr(devstate, "open_monitor", lambda device: devstate.Monitor(nvml, "handle"))
    monkeypatch.setattr(clocks, "Burner", lambda device: lambda: time.sleep(0.005))
    real = clocks.open_warmer
    monkeypatch.setattr(clocks, "open_warmer", lambda s, device, monitor: real(s, SimpleNamespace(type="cuda"), monitor))
    return nvml


def runs_row(project):
    con = sqlite3.connect(project.path / "results" / "cpu.db")
    con.row_factory = sqlite3.Row
    return dict(con.execute("select * from runs").fetchone())


def test_the_rows_and_the_runs_row_record_the_warmup(project, fake_gpu_clock):
    result = project.runpytest("benches", "-k", "add and fp32", *FAST)
    result.assert_outcomes(passed=2)
    first, second = rows(project, "add")
    assert first["clock_warmup_method"] == "steady" and first["clock_warmup_mhz_start"] == 345
    assert first["clock_warmup_mhz_end"] == 1975 and 0.1 <= first["clock_warmup_s"] < clocks.AUTO_BOUND_S
    assert first["sm_clock_mhz_before"] == 1975  # the case was timed at the warmed-up clock
    assert second["clock_warmup_s"] == 0.0 and second["clock_warmup_method"] is None  # no idle gap between
    run = runs_row(project)
    assert run["clock_warmups"] == 1 and run["clock_warmup_s"] == pytest.approx(first["clock_warmup_s"])
    assert "clock_warmup=auto" in run["settings"]


def test_clock_warmup_off_records_nothing(project, fake_gpu_clock):
    project.runpytest("benches", "-k", "add and fp32", "--opperf-clock-warmup=off", *FAST).assert_outcomes(passed=2)
    assert all(r[c] is None for r in rows(project, "add") for c in clocks.COLUMNS)
    run = runs_row(project)
    assert (run["clock_warmups"], run["clock_warmup_s"]) == (0, 0.0) and "clock_warmup=off" in run["settings"]


def test_a_cpu_session_has_no_clock_warmup(project):
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    assert all(r[c] is None for r in rows(project, "add") for c in clocks.COLUMNS)


@pytest.mark.parametrize("value", ["warm", "0", "-1", "inf", "nan", ""])
def test_a_bad_clock_warmup_is_a_usage_error(project, value):
    result = project.runpytest("benches", *FAST, f"--opperf-clock-warmup={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --opperf-clock-warmup={value}: expected auto, off or a number of seconds > 0"])


def test_the_ini_key_sets_the_clock_warmup(project, fake_gpu_clock):
    project.makeini("[pytest]\nopperf_clock_warmup = off\n")
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    assert "clock_warmup=off" in runs_row(project)["settings"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_after_warmup_the_sm_clock_is_near_its_target():
    pytest.importorskip("pynvml")
    device = torch.device("cuda", torch.cuda.current_device())
    monitor = devstate.open_monitor(device)
    if monitor.sm_clock() is None:
        pytest.skip("NVML reads no SM clock here (a MIG slice?)")
    target = monitor.sm_clock_target()
    warmer = clocks.open_warmer(settings("auto"), device, monitor)
    columns = warmer.before_case()
    after = monitor.sm_clock()
    assert columns["clock_warmup_method"] in ("steady", "bound") and columns["clock_warmup_s"] <= clocks.AUTO_BOUND_S + 0.5
    # 75%: a power-capped GPU may settle below its applications clock; an idle one reads far lower.
    assert after >= 0.75 * target, (columns, after, target)
