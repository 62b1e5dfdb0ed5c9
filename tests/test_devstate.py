"""Device state through NVML: decoding, readings and the handle choice with a fake NVML on CPU;
the whole path (columns, summary flag) in a real session with the fake in place of pynvml."""

import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import FAST, rows
from pytest_opperf.measure import devstate


class NotSupported(Exception):
    pass


class FakeNVML:
    """The pynvml names devstate uses; readings set per test, `asked` lists the handle lookups."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm=1980, mem=2619, temp=41, power_mw=123456, reasons=0x1, uuids=("GPU-abc",), legacy=False):
        self.values = {"sm": sm, "mem": mem, "temp": temp, "power": power_mw, "reasons": reasons}
        self.uuids = uuids
        self.asked = []
        if legacy:  # bindings older than NVML 12.2 know only the "throttle" name
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons
        else:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    def _value(self, key):
        value = self.values[key]
        if value is None:
            raise NotSupported(key)
        return value

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(("uuid", uuid))
        if uuid not in self.uuids:
            raise NotSupported(uuid)
        return ("handle", uuid)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.asked.append(("index", index))
        return ("handle", index)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._value("sm" if clock == self.NVML_CLOCK_SM else "mem")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._value("temp")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._value("power")

    def _reasons(self, handle):
        return self._value("reasons")


def test_decode_names_reasons_and_only_slowdowns_throttle():
    assert devstate.decode(None) == (None, None)
    assert devstate.decode(0) == ("", 0)
    assert devstate.decode(0x1) == ("gpu_idle", 0)
    assert devstate.decode(0x2 | 0x100) == ("applications_clocks_setting,display_clock_setting", 0)
    for bit, name in [(0x4, "sw_power_cap"), (0x8, "hw_slowdown"), (0x10, "sync_boost"),
                      (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown")]:
        assert devstate.decode(bit) == (name, 1)
    assert devstate.decode(0x1 | 0x4 | 0x1000) == ("gpu_idle,sw_power_cap,0x1000", 1)  # unknown bits kept, in hex


def test_readings_and_columns():
    monitor = devstate.Monitor(FakeNVML(reasons=0x1), "handle")
    before = monitor.read()
    assert before == {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temp_c": 41, "power_w": 123.456, "reasons": 0x1}
    monitor.nvml.values.update(sm=1500, temp=83, reasons=0x20)
    after = monitor.read()
    cols = devstate.columns(before, after)
    assert cols == {"sm_clock_mhz_before": 1980, "sm_clock_mhz_after": 1500, "mem_clock_mhz": 2619,
                    "temp_c_before": 41, "temp_c_after": 83, "power_w_before": 123.456, "power_w_after": 123.456,
                    "throttle_reasons": "gpu_idle,sw_thermal_slowdown", "throttled": 1}
    assert set(cols) == set(devstate.COLUMNS)


def test_an_unsupported_reading_is_null_and_the_others_stand():
    reading = devstate.Monitor(FakeNVML(sm=None, reasons=None), "handle").read()
    assert reading["sm_clock_mhz"] is None and reading["reasons"] is None and reading["temp_c"] == 41
    cols = devstate.columns(reading, reading)
    assert cols["throttle_reasons"] is None and cols["throttled"] is None and cols["temp_c_after"] == 41
    legacy = devstate.Monitor(FakeNVML(reasons=0x8, legacy=True), "handle").read()
    assert legacy["reasons"] == 0x8


def test_no_nvml_means_null_columns():
    assert devstate.Monitor().read() is None
    assert devstate.columns(None, None) == dict.fromkeys(devstate.COLUMNS)
    assert devstate.open_monitor(torch.device("cpu"), FakeNVML()).read() is None


def test_missing_pynvml_gives_an_empty_monitor(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert devstate.open_monitor(torch.device("cuda", 0)).read() is None


def _props(uuid):
    return lambda index: SimpleNamespace(uuid=uuid)


def test_the_handle_is_the_gpu_this_process_uses(monkeypatch):
    # torch reports the bare UUID; NVML names it with a GPU- prefix.
    monkeypatch.setattr(torch.cuda, "get_device_properties", _props("abc"))
    nvml = FakeNVML(uuids=("GPU-abc",))
    monitor = devstate.open_monitor(torch.device("cuda", 1), nvml)
    assert monitor.handle == ("handle", "GPU-abc") and ("index", 1) not in nvml.asked
    # No UUID match: the physical index that CUDA_VISIBLE_DEVICES maps visible device 1 to.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    nvml = FakeNVML(uuids=())
    assert devstate.open_monitor(torch.device("cuda", 1), nvml).handle == ("handle", 7)
    assert devstate.physical_index(1, "") == 1 and devstate.physical_index(0, "GPU-abc,GPU-def") == 0


def test_a_throttled_case_is_flagged_in_its_row_and_the_summary(project, monkeypatch):
    # The session's monitor comes from open_monitor: hand it a fake GPU that thermally throttles.
    nvml = FakeNVML(reasons=0x20 | 0x1)
    monkeypatch.setattr(devstate, "open_monitor", lambda device: devstate.Monitor(nvml, "handle"))
    result = project.runpytest("benches", "-k", "add and fp32 and 1024", *FAST)
    result.assert_outcomes(passed=1)
    (row,) = rows(project, "add")
    assert (row["throttled"], row["throttle_reasons"], row["sm_clock_mhz_before"], row["temp_c_after"]) == \
        (1, "gpu_idle,sw_thermal_slowdown", 1980, 41)
    result.stdout.fnmatch_lines(["*test_add?torch-fp32-n=1024?*throttled(gpu_idle,sw_thermal_slowdown)*",
                                 "opperf: 1 cases measured*1 throttled (clocks held down during the case*"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_nvml_reads_this_gpu():
    pytest.importorskip("pynvml")
    reading = devstate.open_monitor(torch.device("cuda", torch.cuda.current_device())).read()
    assert reading is not None and reading["sm_clock_mhz"] > 0 and reading["temp_c"] > 0
    assert reading["reasons"] is not None
