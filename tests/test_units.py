"""Formulas, metrics, statistics, specs: each on a case worked by hand."""

import math
import re

import pytest
import torch

from pytest_opperf import dtypes
from pytest_opperf.catalog.ops.activation import gelu, softmax
from pytest_opperf.catalog.ops.matmul import gemm
from pytest_opperf.catalog.ops.memory import add
from pytest_opperf.catalog.ops.norm import rmsnorm
from pytest_opperf.catalog.registry import DTypes, version_matches
from pytest_opperf.hardware import metrics
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure.check import compare
from pytest_opperf.measure.stats import UNSTABLE_DRIFT, Stats, StoppingRule, is_unstable, median_ci, percentile


def dt(i, o=None):
    return DTypes(dtypes.lookup(i), dtypes.lookup(o or i))


# --- FLOPs and bytes --------------------------------------------------------------------------


def test_gemm_flops_and_bytes_by_hand():
    p = {"m": 2, "n": 3, "k": 4}
    assert gemm.flops(p, dt("bf16")) == 48  # 2*3 outputs, each 4 multiplies + 4 adds
    assert gemm.nbytes(p, dt("bf16")) == (8 + 12 + 6) * 2  # A 2x4, B 4x3, C 2x3, two bytes each
    assert gemm.nbytes(p, dt("fp8", "bf16")) == (8 + 12) * 1 + 6 * 2


def test_elementwise_flops_and_bytes_by_hand():
    assert add.flops({"n": 10}, dt("fp32")) == 10
    assert add.nbytes({"n": 10}, dt("fp32")) == 120  # read a, b; write c: 3 * 10 * 4
    assert gelu.flops({"n": 10}, dt("bf16")) == 90
    assert gelu.nbytes({"n": 10}, dt("bf16")) == 40
    assert softmax.flops({"m": 2, "n": 3}, dt("fp32")) == 30
    assert softmax.nbytes({"m": 2, "n": 3}, dt("fp32")) == 48
    assert rmsnorm.flops({"m": 2, "n": 3}, dt("fp32")) == 4 * 6 + 3 * 2
    assert rmsnorm.nbytes({"m": 2, "n": 3}, dt("bf16")) == (6 + 3) * 2 + 6 * 2


def test_references_on_worked_values():
    x = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    # tanh-GeLU(1) = 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841191990...
    assert gelu.reference(x)[1].item() == pytest.approx(0.8411919906, abs=1e-9)
    assert gelu.reference(x)[0].item() == 0.0
    s = softmax.reference(torch.tensor([[0.0, math.log(3.0)]]))
    assert s[0].tolist() == pytest.approx([0.25, 0.75])
    r = rmsnorm.reference(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]))
    rms = math.sqrt((9 + 16) / 2 + rmsnorm.EPS)
    assert r[0].tolist() == pytest.approx([3 / rms, 8 / rms])


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_by_hand():
    spec = hardware.HardwareSpec("x", matrix_tflops={"bf16": 1000}, vector_tflops={"bf16": 100},
                                 mem_bw_gbytes_per_s=2000)
    # 8192^3 bf16 GEMM in 1.4 ms: 2*8192^3 = 1,099,511,627,776 FLOP / 1.4e-3 s
    #   = 785,365.45 GFLOP/s -> MFU 0.78537 of 1000 TFLOP/s
    # bytes 3 * 8192^2 * 2 = 402,653,184 / 1.4e-3 s = 287.609 GB/s -> MBU 0.14380 of 2000 GB/s
    flops = 2 * 8192**3
    nbytes = 3 * 8192**2 * 2
    m = metrics.derive(flops, nbytes, 1400.0, spec, "bf16", "matrix")
    assert m["gflops"] == pytest.approx(785_365.45, rel=1e-6)
    assert m["mfu"] == pytest.approx(0.78536545, rel=1e-6)
    assert m["gbytes_per_s"] == pytest.approx(287.609417, rel=1e-6)
    assert m["mbu"] == pytest.approx(0.1438047, rel=1e-6)
    v = metrics.derive(100e9, 0, 1e6, spec, "bf16", "vector")  # 100 GFLOP in 1 s against 100 TFLOP/s
    assert v["mfu"] == pytest.approx(1e-3)
    unknown = metrics.derive(1, 1, 1.0, hardware.HardwareSpec("cpu"), "bf16", "matrix")
    assert unknown["mfu"] is None and unknown["mbu"] is None and unknown["gflops"] == pytest.approx(1e-3)


# --- statistics -------------------------------------------------------------------------------


def test_stats_by_hand():
    s = Stats([4.0, 1.0, 3.0, 2.0, 100.0])
    assert (s.min, s.max, s.median, s.mean) == (1.0, 100.0, 3.0, 22.0)
    assert s.p95 == pytest.approx(80.8)  # between 4 and 100 at 0.8 of the way
    assert s.std == pytest.approx(math.sqrt(sum((x - 22) ** 2 for x in [1, 2, 3, 4, 100]) / 4))
    assert s.cv == pytest.approx(s.std / 22)
    # in the order taken: 4, 1 | 3 (the middle one, in neither half) | 2, 100: medians 2.5 and 51
    assert s.drift == pytest.approx(51 / 2.5 - 1) and s.unstable
    assert percentile([1.0, 2.0], 50) == 1.5


# A steady stream with periodic stalls: 100 samples at 10.0 +- 0.1, every 10th a stall of 23.0 (a
# process group's watchdog). Its median reproduces: it is steady, with outliers counted apart.
STALLED = [23.0 if i % 10 == 9 else 10.0 + 0.1 * (i % 3 - 1) for i in range(100)]


def test_periodic_stalls_are_outliers_counted_apart_not_an_unstable_row():
    s = Stats(STALLED)
    assert s.cv > 0.3  # the raw spread: the stalls blended in (the old rows' cv, and their flag)
    assert s.outliers == 10 and s.outlier_share == 0.1
    assert s.outlier_us == pytest.approx(13.0)  # 23.0 over the median 10.0
    assert s.steady.n == 90 and s.steady.cv < 0.01  # 9.9, 10.0 and 10.1: std 0.082 over mean 10
    assert s.median == 10.0 and s.drift == 0.0 and not s.unstable  # five stalls in each half


def test_a_level_that_moves_halfway_is_unstable():
    s = Stats([10.0] * 50 + [11.0] * 50)
    assert s.drift == pytest.approx(0.1) and s.unstable
    assert Stats([11.0] * 50 + [10.0] * 50).drift == pytest.approx(-1 / 11)  # faster later: unstable too
    assert Stats([11.0] * 50 + [10.0] * 50).unstable
    # no far-out sample: a shift of the whole level is spread, not stalls
    assert s.outliers == 0 and s.outlier_us is None and s.steady.cv == pytest.approx(s.cv)


def test_two_interleaved_levels_in_a_steady_mix_are_not_unstable():
    # Alternating 10 and 12: each half holds both levels half and half, so each half's median is the
    # whole stream's (11). A median of two levels reproduces as long as their mix does; here the mix is
    # the same in both halves, so the row is not flagged, and its cv (0.09) says how wide it is. Where
    # the mix moves (below), the median jumps between the levels, and the flag says so.
    s = Stats([10.0, 12.0] * 50)
    assert s.median == 11.0 and s.drift == 0.0 and not s.unstable
    assert s.steady.cv == pytest.approx(s.cv) and s.cv == pytest.approx(0.0913, abs=1e-4)
    shifting = Stats([10.0, 10.0, 10.0, 12.0] * 13 + [12.0, 12.0, 12.0, 10.0] * 12)  # 3:1 low, then 3:1 high
    assert shifting.drift == pytest.approx(0.2) and shifting.unstable


def test_under_four_samples_there_is_no_drift_and_no_flag():
    # Halves of one sample are not medians: no drift (NULL in the row) and never unstable. Such a row
    # has no CI either (ci_rel NULL, target_met 0): that is what says it cannot be trusted.
    for samples in ([10.0], [10.0, 20.0], [10.0, 20.0, 30.0]):
        s = Stats(samples)
        assert s.drift is None and not s.unstable and s.outliers == 0 and s.steady.n == s.n
    assert Stats([10.0, 10.0, 20.0, 20.0]).drift == 1.0  # four: halves of two


def test_the_flag_is_the_drift_beyond_its_bound():
    assert UNSTABLE_DRIFT == 0.03  # the acceptance compares two runs' rows at 3%
    assert not is_unstable(UNSTABLE_DRIFT) and is_unstable(0.0301) and is_unstable(-0.0301)
    assert not is_unstable(None)


def test_median_ci_ranks():
    data = list(map(float, range(1, 101)))
    lo, hi = median_ci(data)
    assert (lo, hi) == (40.0, 61.0)  # ranks 50 -+ 9.8 -> 40 and 61 (1-based)
    assert median_ci([1.0] * 7) == (None, None)
    assert Stats(data).median_ci_rel == pytest.approx((61 - 40) / 2 / 50.5)


def test_stopping_rule():
    rule = StoppingRule(target_rel=0.01, min_samples=10, max_samples=50, budget_s=1.0)
    tight = Stats([100.0 + 0.01 * i for i in range(20)])
    loose = Stats([100.0 * (1 + (i % 5)) for i in range(20)])
    assert not rule.done(None, 0.0)
    assert not rule.done(Stats([1.0] * 5), 10.0)  # below min_samples even past the budget
    assert rule.done(tight, 0.0) and rule.met(tight)
    assert not rule.done(loose, 0.1) and not rule.met(loose)
    assert rule.done(loose, 1.0)  # budget spent
    assert rule.done(Stats([100.0 * (1 + (i % 5)) for i in range(50)]), 0.0)  # max samples


# --- specs ------------------------------------------------------------------------------------


def test_every_builtin_spec_cites_a_source_and_has_valid_numbers():
    specs = hardware.load_specs()
    required = {"b200", "gb200", "h200", "h100", "h100-pcie", "h20", "a100", "l40s", "mi300x", "ascend910b", "cpu"}
    assert required <= set(specs)
    for spec in specs.values():
        assert re.search(r"https?://", spec.source) or spec.name == "cpu", spec.name
        for table in (spec.matrix_tflops, spec.vector_tflops):
            for name, value in table.items():
                assert name in {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4"}, (spec.name, name)
                assert value is None or value > 0
    assert specs["h100"].peak_flops("bf16") == pytest.approx(989.4e12, rel=0.01)
    assert specs["h100"].mem_bw_bytes_per_s == pytest.approx(3.35e12, rel=0.01)


def test_aliases_resolve_driver_names():
    specs = hardware.load_specs()
    assert hardware.resolve_alias(specs, "NVIDIA H100 80GB HBM3").name == "h100"
    assert hardware.resolve_alias(specs, "nvidia h100 80gb hbm3").name == "h100"
    assert hardware.resolve_alias(specs, "Some Future GPU") is None
    assert hardware.slug("NVIDIA RTX 6000 Ada Generation") == "nvidia-rtx-6000-ada-generation"


@pytest.mark.parametrize("name, ok", [("h100", True), ("b200-sxm", True), ("../etc", False), ("a/b", False),
                                      ("", False), (".hidden", False), ("x..y", False), ("H100", False)])
def test_device_names_cannot_leave_results(name, ok):
    assert hardware.valid_name(name) is ok


def test_user_spec_file_overrides_and_is_validated(tmp_path):
    good = tmp_path / "hw.yaml"
    good.write_text("devices:\n  mygpu:\n    backend: cuda\n    matrix_tflops: {bf16: 10}\n    source: http://x\n")
    specs = hardware.load_specs(good)
    assert specs["mygpu"].peak_flops("bf16") == 1e13 and "h100" in specs
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  mygpu:\n    peak: 3\n")
    with pytest.raises(hardware.SpecError, match=r"bad.yaml: devices.mygpu.peak: unknown key"):
        hardware.load_specs(bad)


# --- versions and the functional check ---------------------------------------------------------


def test_version_pins():
    assert version_matches("2.1.1+c9f8b34", "2.1.1+c9f8b34")
    assert not version_matches("2.1.1+c9f8b34", "2.1.1+deadbee")
    assert version_matches("2.13.0", "2.13.0+cpu")
    assert not version_matches("2.13.1", "2.13.0+cpu")
    assert version_matches(">=2.4,<3", "2.13.0+cpu")
    assert not version_matches("<2", "2.13.0")


def test_compare_catches_wrong_outputs():
    ref = torch.randn(64, 64, dtype=torch.float64)
    good = ref.float()
    assert compare(good, ref, dtypes.lookup("fp32"), 1e-4) is None
    assert "normwise relative error" in compare(good * 1.01, ref, dtypes.lookup("fp32"), 1e-4)
    assert "shape" in compare(good.t()[:10], ref, dtypes.lookup("fp32"), 1e-4)
    assert "dtype" in compare(good.half(), ref, dtypes.lookup("fp32"), 1e-4)
    nan = good.clone()
    nan[3, 3] = float("nan")
    assert "1 of 4096 elements are NaN" in compare(nan, ref, dtypes.lookup("fp32"), 1e-4)
    assert "expected a tensor" in compare(None, ref, dtypes.lookup("fp32"), 1e-4)
