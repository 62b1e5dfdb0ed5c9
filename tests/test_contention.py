"""Contention: the readings by hand (a fake /proc, a fake NVML), then real sessions with busy
processes of our own beside them, and the gate's inconclusive verdict (issue 28).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import FAST, rows, rows_at, write_config
from pytest_opperf.gate.drift import uncertainty
from pytest_opperf.gate.rules import judge
from pytest_opperf.measure import contention
from pytest_opperf.measure.contention import CpuReading, Probe, allowed_cpus, cpu_seen, free_threads, read_cpu
from pytest_opperf.measure.devstate import Monitor
from test_gate import BASELINE, STEADY, edit_baseline, gated, no_machine_reference, run  # noqa: F401
from test_gate_noise import nominal

linux = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")

# --- by hand ------------------------------------------------------------------------------------


def reading(wall_s, busy, total, own, waits=None, pressure_us=None):
    return CpuReading(wall_s, busy, total, own, waits or {}, pressure_us)


def test_others_beyond_the_free_cores_are_contention():
    quiet = reading(0.0, 0, 0, 0, {"1": 0}), reading(0.5, 55, 100, 50, {"1": 10_000_000})
    # 5 ticks not ours in 0.5 s at 100 Hz: 0.10 cores, within 1 free + 0.1; waited 2%.
    assert cpu_seen(*quiet, threads=1, cores=2, tick_hz=100) == (
        False, "cpu: others took 0.10 of 2 cores (1 free beside 1 thread); our threads waited 2% of 0.50 s")
    # 61 ticks not ours: 1.22 cores > 1 + 0.1 -> contended, though our thread hardly waited.
    busy = reading(0.0, 0, 0, 0, {"1": 0}), reading(0.5, 111, 100, 50, {"1": 1_000_000})
    assert cpu_seen(*busy, threads=1, cores=2, tick_hz=100)[0] is True
    # The same others beside two threads: none free, 1.22 > 0.1.
    assert cpu_seen(*busy, threads=2, cores=4, tick_hz=100)[0] is False  # 4 cores: 2 free
    assert cpu_seen(*busy, threads=2, cores=2, tick_hz=100)[0] is True


def test_waiting_for_a_cpu_is_contention_at_any_window_and_others_only_on_long_ones():
    # A 50 ms window: others' 2 cores are not judged (too few ticks), the thread's 30% wait is.
    before, after = reading(0.0, 0, 0, 0, {"1": 0, "2": 5}), reading(0.05, 10, 10, 0, {"1": 15_000_000, "3": 0})
    contended, text = cpu_seen(before, after, threads=1, cores=2, tick_hz=100)
    assert contended and "[0.05 s window: ticks too coarse to judge]" in text and "waited 30% of 0.05 s" in text
    contended, text = cpu_seen(before, reading(0.05, 10, 10, 0, {"1": 0}), threads=1, cores=2, tick_hz=100)
    assert not contended  # no wait, and the others' share is not judged on 50 ms
    # No schedstat: the others alone decide; more threads than cores oversubscribe by themselves.
    contended, text = cpu_seen(reading(0.0, 0, 0, 0), reading(1.0, 0, 200, 0), threads=4, cores=2, tick_hz=100)
    assert contended and text == "cpu: 4 threads oversubscribe 2 cores; others took 0.00 of 2 cores (0 free beside 4 threads)"


def test_oversubscribed_cpus_are_contention_on_short_windows_when_others_ran():
    # 50 ms, our thread never waited, others took ~1 core beside it (the loaded VM's missed rows of
    # stop 25): the ticks alone cannot judge, PSI says a thread waited for a CPU half the time.
    before = reading(0.0, 0, 0, 0, {"1": 0}, pressure_us=1_000_000)
    after = reading(0.05, 9, 10, 4, {"1": 0}, pressure_us=1_025_000)
    contended, text = cpu_seen(before, after, threads=1, cores=2, tick_hz=100)
    assert contended and text == ("cpu: others took 1.00 of 2 cores (1 free beside 1 thread) [0.05 s window: ticks "
                                  "too coarse to judge]; our threads waited 0% of 0.05 s; CPUs oversubscribed 50% of "
                                  "the time")
    # Our threads' waits summed to 16% of a 40 ms window on an idle 16-core host (wake-up latencies of
    # many threads): with PSI at 1% and nobody else running, not contention.
    idle = reading(0.0, 0, 0, 0, {"1": 0, "2": 0}, pressure_us=0), reading(0.04, 4, 64, 4, {"1": 3_200_000, "2": 3_200_000}, pressure_us=400)
    assert cpu_seen(*idle, threads=1, cores=16, tick_hz=100) == (
        False, "cpu: others took 0.00 of 16 cores (15 free beside 1 thread) [0.04 s window: ticks too coarse to "
               "judge]; our threads waited 16% of 0.04 s; CPUs oversubscribed 1% of the time")
    # The same pressure with nobody else on the CPUs: this process's own threads, not contention.
    alone = reading(0.05, 4, 10, 4, {"1": 0}, pressure_us=1_025_000)
    assert cpu_seen(before, alone, threads=1, cores=2, tick_hz=100)[0] is False
    # Others ran, but nobody waited for a CPU (5% is within PRESSURE_SHARE): the free core held them.
    calm = reading(0.05, 9, 10, 4, {"1": 0}, pressure_us=1_002_500)
    assert cpu_seen(before, calm, threads=1, cores=2, tick_hz=100) == (
        False, "cpu: others took 1.00 of 2 cores (1 free beside 1 thread) [0.05 s window: ticks too coarse to judge]; "
               "our threads waited 0% of 0.05 s; CPUs oversubscribed 5% of the time")


def test_read_cpu_sums_the_allowed_cpus_and_this_process(tmp_path):
    (tmp_path / "self" / "task" / "7").mkdir(parents=True)
    (tmp_path / "self" / "task" / "8").mkdir(parents=True)
    (tmp_path / "stat").write_text("cpu  9 9 9 9 9 9 9 9 0 0\n"
                                   "cpu0 10 1 2 100 5 3 4 6 0 0\n"   # busy 10+1+2+3+4+6 = 26
                                   "cpu1 1000 0 0 0 0 0 0 0 0 0\n"   # not allowed
                                   "cpu2 20 0 0 50 0 0 0 0 0 0\n"    # busy 20
                                   "intr 5 0\n")
    (tmp_path / "self" / "stat").write_text("42 (py thon) S " + " ".join(["0"] * 10) + " 30 12 0 0\n")
    (tmp_path / "self" / "task" / "7" / "schedstat").write_text("100 2500 3\n")
    (tmp_path / "self" / "task" / "8" / "schedstat").write_text("100 500 3\n")
    r = read_cpu([0, 2], tmp_path)
    assert (r.busy_ticks, r.total_ticks, r.own_ticks, r.waits_ns) == (46, 201, 42, {"7": 2500, "8": 500})
    assert r.pressure_us is None  # a kernel without PSI
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.62 avg300=1.24 total=6926871258\n"
                                               "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert read_cpu([0, 2], tmp_path).pressure_us == 6926871258
    assert read_cpu([0], tmp_path / "missing") is None
    # One thread of work: the calling thread's wait alone (/proc/thread-self), not the process's threads.
    (tmp_path / "thread-self").mkdir()
    (tmp_path / "thread-self" / "schedstat").write_text("100 1700 3\n")
    assert read_cpu([0, 2], tmp_path, calling_thread=True).waits_ns == {"self": 1700}
    assert read_cpu([0, 2], tmp_path).waits_ns == {"7": 2500, "8": 500}


def test_the_calling_threads_wait_is_read_from_the_real_proc():
    if not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("no schedstat for threads (not Linux, or a kernel without it)")
    before = read_cpu(allowed_cpus(), calling_thread=True)
    time.sleep(0.01)
    after = read_cpu(allowed_cpus(), calling_thread=True)
    assert set(before.waits_ns) == {"self"} and after.waits_ns["self"] >= before.waits_ns["self"] >= 0


class FakeNvml:
    """NVML's names for the process list and utilisation, answering from attributes."""

    def __init__(self, pids, util=None, mps=None):
        self.pids, self.util, self.mps = pids, util, mps

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in self.pids]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        if self.mps is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [SimpleNamespace(pid=p) for p in self.mps]

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.util is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=self.util, memory=0)


def test_another_process_on_the_gpu_is_contention(tmp_path):
    me = os.getpid()
    nvml = FakeNvml([me], util=97, mps=[])
    probe = Probe(Monitor(nvml, "gpu0"), proc=tmp_path / "no-proc", cpus=[0])  # no /proc: the GPU alone
    probe.start(threads=1)
    assert probe.stop() == {"contended": 0, "contention": "gpu: no other process, utilisation 97% before the case"}
    nvml.pids = [me, 4242]
    probe.start(threads=1)
    nvml.pids, nvml.mps = [me], [5151]  # one gone, an MPS client come: both competed
    assert probe.stop() == {"contended": 1, "contention": "gpu: 2 other processes (pid 4242, 5151), utilisation 97% "
                                                          "before the case"}
    assert Probe(Monitor(), proc=tmp_path / "no-proc", cpus=[0]).stop() == {"contended": None, "contention": None}


def test_threads_from_the_free_cores():
    assert free_threads(2, 0.0, 2) == 2 and free_threads(2, 1.6, 2) == 1 and free_threads(16, 3.4, 8) == 8
    assert free_threads(16, 3.4, 16) == 13 and free_threads(16, 0.0, 16, workers=4) == 4


# --- the gate, by hand ----------------------------------------------------------------------------


def entry(time_us, **extra):
    return {"op": "add", "backend": "paced", "dtype_in": "fp32", "dtype_out": "fp32", "params": {"n": 4},
            "time_us": time_us, "ci_rel": 0.01, "timer": "cpu", "cache": "hot", **extra}


def test_contended_and_drifted_verdicts_are_inconclusive_and_a_2x_regression_is_not():
    base = entry(100.0, runs=[100.0, 100.0, 100.0])
    # Contended: a slowdown within 1.5 x the CPU's default allowance (50%) is inconclusive, one beyond
    # it stands (a neighbour does not excuse 3x); a contended case is never judged the same or faster.
    v = judge(base, entry(160.0, contended=1, contention="cpu: others took 1.90 of 2 cores"), 0.05, "ci")
    assert (v["verdict"], v["fails"]) == ("inconclusive", False)
    assert v["reason"] == ("contended while measured (cpu: others took 1.90 of 2 cores); 1.600x is within 1.5 x its "
                           "allowance of 50%") and v["ratio"] == 1.6
    assert judge(base, entry(300.0, contended=1), 0.05, "ci")["verdict"] == "regressed"
    assert judge(base, entry(100.0, contended=1), 0.05, "ci")["verdict"] == "inconclusive"  # never judged
    assert judge(base, entry(160.0, contended=1), 0.05, "ci", strict=True)["fails"] is True
    assert judge(base, entry(160.0, contended=0), 0.05, "ci")["verdict"] == "regressed"
    # A machine 4% slower (start factor 1.04): 1.07x could be 1.03x (same); 2x cannot be anything but regressed.
    drift = uncertainty([1.04], "off")
    assert drift == pytest.approx(0.04)
    v = judge(base, entry(107.0), 0.05, "ci", drift=drift)
    assert v["verdict"] == "inconclusive" and v["reason"].startswith("the machine drifted 4.0%") and not v["fails"]
    v = judge(base, entry(200.0), 0.05, "ci", drift=drift)
    assert v["verdict"] == "regressed" and v["fails"]
    # Within half the threshold the drift is the run-to-run noise's business: judged as before.
    assert judge(base, entry(107.0), 0.05, "ci", drift=0.02)["verdict"] == "regressed"
    # Normalised by the factor: only its change during the run counts.
    assert uncertainty([1.30], "reference") is None and uncertainty([1.30, 1.30], "reference") == pytest.approx(0.0)


# --- real sessions --------------------------------------------------------------------------------


SPIN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture
def busy():
    """busy() starts a busy process on every core and one more, for the rest of the test (ended
    after it): they slow the suite's other worker too, so no longer than a test needs them."""
    procs = []

    def start():
        procs.extend(subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(len(contention.allowed_cpus()) + 1))
        time.sleep(0.3)  # up and spinning

    yield start
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(5)


@pytest.fixture
def load(busy):
    """The busy processes, for the test's length."""
    busy()


@linux
def test_a_case_measured_beside_busy_processes_is_flagged(project, load):
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams:\n  N: [1048576]\n")
    result = project.runpytest("benches", "-k", "add", *FAST, "--opperf-contention=auto", "--opperf-budget=0.3",
                               "--opperf-min-samples=10")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["opperf: warning: the machine is busy at the start: other processes kept * of * "
                                 "cores busy (intra-op threads: *)*",
                                 "test_add[[]torch-fp32-n=1048576[]] * contended*",
                                 "opperf: 1 cases measured, *1 contended (other processes competed for the machine*"])
    row = rows(project, "add")[0]
    assert row["contended"] == 1 and row["contention"].startswith("cpu: others took ")
    run_row = rows(project, "runs")[0]
    assert run_row["busy_cores_at_start"] >= 1 and run_row["threads"] >= 1


@linux
@pytest.mark.skipif(not os.path.exists("/proc/pressure/cpu"), reason="reads PSI (/proc/pressure/cpu)")
def test_a_short_case_beside_busy_processes_is_flagged(project, load):
    # Sampling windows of a few tens of milliseconds: /proc/stat's ticks cannot judge them, PSI can.
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams:\n  N: [1024]\n")
    result = project.runpytest("benches", "-k", "add", *FAST, "--opperf-contention=auto", "--opperf-budget=0.02",
                               "--opperf-min-samples=5", "--opperf-warmup=0.005")
    result.assert_outcomes(passed=1)
    row = rows(project, "add")[0]
    assert row["contended"] == 1, row["contention"]
    assert "CPUs oversubscribed" in row["contention"]


def test_contention_off_reads_nothing(project):
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams:\n  N: [1024]\n")
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=1)
    assert (rows(project, "add")[0]["contended"], rows(project, "add")[0]["contention"]) == (None, None)
    assert rows(project, "runs")[0]["busy_cores_at_start"] is None


@pytest.mark.parametrize("args, message", [
    (("--opperf-threads=0",), "--opperf-threads=0: expected auto or an integer >= 1"),
    (("--opperf-inconclusive=maybe",), "--opperf-inconclusive=maybe: expected pass or fail"),
    (("--opperf-contention=on",), "--opperf-contention=on: expected auto or off"),
])
def test_bad_options_are_usage_errors(project, args, message):
    result = project.runpytest("benches", *FAST, *args)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*{message}*"])


@linux
def test_contended_cases_are_inconclusive_and_strict_fails_them(gated, busy):
    # The baseline is the paced backends' design (nominal): no quiet session needed on shared cores.
    run(gated, f"--opperf-save-baseline={BASELINE}", "--opperf-sample-only", *STEADY).assert_outcomes(passed=3)
    edit_baseline(gated, nominal)
    busy()
    gate = (f"--opperf-baseline={BASELINE}", "--opperf-contention=auto", "--opperf-report-json=out/report.json",
            *STEADY)
    result = run(gated, *gate)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["add[[]paced-fp32-n=* INCONCLUSIVE  (contended while measured (cpu: *",
                                 "gate: passed: 0 regressed, 3 inconclusive*"])
    cases = json.loads((gated.path / "out" / "report.json").read_text())["cases"]
    assert [(c["verdict"], c["contended"]) for c in cases] == [("inconclusive", 1)] * 3
    assert all(c["reason"].startswith("contended while measured (cpu: others took") for c in cases)

    result = run(gated, *gate, "--opperf-inconclusive=fail", "--opperf-confirm=0")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*performance inconclusive, failed by --opperf-inconclusive=fail: "
                                 "add[[]paced-fp32-n=1024[]] (*x its baseline): contended while measured*",
                                 "gate: FAILED: 0 regressed, 3 inconclusive*; 3 inconclusive failed*"])
    assert len(rows(gated, "add")) == 3  # failed by the gate, still stored


def test_a_2x_slower_backend_still_fails(gated, monkeypatch):
    monkeypatch.setenv("OPPERF_TEST_SLOW_FACTOR", "2.0")
    run(gated, f"--opperf-save-baseline={BASELINE}", "--opperf-sample-only", *STEADY).assert_outcomes(passed=3)
    edit_baseline(gated, nominal)
    monkeypatch.setenv("OPPERF_TEST_SLOW_N", "2048")
    result = run(gated, f"--opperf-baseline={BASELINE}", *STEADY)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*performance regression: add[[]paced-fp32-n=2048[]]: * us against * us in *: 2.*x*",
                                 "gate: FAILED: 1 regressed*"])


GPU_SPIN = """
import time, torch
a = torch.randn(4096, 4096, device="cuda")
end = time.monotonic() + 120
while time.monotonic() < end:
    a @ a
    torch.cuda.synchronize()
"""


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


@pytest.mark.exclusive_gpu  # alone on the GPU: under -n the other workers are other processes on it too
@pytest.mark.skipif(not torch.cuda.is_available() or not _nvml(), reason="needs a CUDA GPU and nvidia-ml-py")
def test_another_process_computing_on_the_gpu_is_flagged(project):
    write_config(project, "gemm", "backend: torch\ndtypes: bf16\nparams:\n  M: [4096]\n  N: [4096]\n  K: [4096]\n")
    other = subprocess.Popen([sys.executable, "-c", GPU_SPIN])
    try:
        time.sleep(10)  # CUDA up and computing in the other process
        assert other.poll() is None, "the competing GPU process ended early"
        result = project.runpytest("benches", "-k", "gemm and torch", "--opperf-contention=auto",
                                   "-p", "no:cacheprovider", "-p", "no:randomly", "--opperf-budget=0.3")
    finally:
        other.kill()
        other.wait(10)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*the machine is busy at the start: *1 other process on the GPU (pid *",
                                 "test_gemm[[]torch-bf16-* contended*"])  # throttled may follow
    row = rows_at(next((project.path / "results").glob("*.db")), "gemm")[0]
    assert row["contended"] == 1 and "gpu: 1 other process (pid " in row["contention"]


def test_a_serial_sessions_own_children_are_others_an_xdist_controllers_are_its_workers():
    # The controller's look at the GPU: a process this one started is a worker only once xdist
    # started workers; in a serial session it is someone else's work (as in the GPU test above).
    from pytest_opperf.run.machine import _ours

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _ours(os.getpid(), False) and _ours(os.getpid(), True)
        if Path(f"/proc/{child.pid}/stat").exists():
            assert not _ours(child.pid, False) and _ours(child.pid, True)
        assert not _ours(os.getppid(), True)  # the parent is no child of ours
    finally:
        child.kill()
        child.wait(10)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
