"""Names a user can tell apart: a node id read once (its parameters may hold '::'), and the tables
of cases fitted to 100 columns never show one name for two cases."""

import pytest

from pytest_opperf import testid
from pytest_opperf.record import Record
from pytest_opperf.view import cases, fit
from pytest_opperf.view.cases import case_name
from pytest_opperf.view.progress import status
from pytest_opperf.view.text import Section

ATEN = 'benches/test_aten.py::test_aten[torch-bf16-call=aten::topk.default-args=["T:bf16[64,32000]",50,-1,true,true]]'
# The shipped sweep's gemm cases that differ in one size only, as the issue saw them cut alike.
GEMMS = [f"benches/test_ops.py::test_gemm[torch-{dt}-m=4096-n=4096-k={k}]"
         for dt in ("fp16", "bf16") for k in (256, 512, 1024, 2048, 4096)]
FLAGS = {"unstable": 1, "contended": 1, "target_met": 0, "throttled": 1,
         "throttle_reasons": "sw_power_cap,hw_slowdown,sw_thermal_slowdown"}


def test_a_replayed_aten_id_keeps_its_test_backend_and_dtype():
    t = testid.parse(ATEN)
    assert (t.path, t.test) == ("benches/test_aten.py", "test_aten")
    assert t.params == 'torch-bf16-call=aten::topk.default-args=["T:bf16[64,32000]",50,-1,true,true]'
    assert case_name({"test_id": ATEN}) == ATEN.split("::", 1)[1]  # before: 'topk.default-args=[...]]'
    assert testid.parse("benches/test_ops.py::TestGemm::test_gemm[torch]").name == "test_gemm[torch]"


def test_the_benchmark_json_entry_names_the_test_and_its_parameters():
    record = Record({"op": "aten", "_params": [], "test_id": ATEN, "dtype_in": "bf16", "dtype_out": "bf16",
                     "backend": "torch", "backend_version": "2", "timer": "cpu", "cache": "hot", "warmup_calls": 1,
                     "calls_per_sample": 1, "target_met": 1})
    entry = record.to_benchjson({})
    assert entry["name"] == ATEN.split("::", 1)[1] and entry["fullname"] == ATEN
    assert entry["param"] == testid.parse(ATEN).params


def test_the_progress_line_keeps_op_backend_and_dtype_of_an_aten_case():
    line = status(3, 10, 30.0, [(ATEN, "sampling", 12.0)], 100)
    assert "test_aten[torch-bf16" in line, line


def test_tokens_keep_negative_numbers_and_bracketed_lists_whole():
    assert testid.tokens("torch-fp32-n=-4-shape=[2,-1]") == ["torch", "fp32", "n=-4", "shape=[2,-1]"]


def _names(lines: list, skip: int = 1) -> list[str]:
    """The first column of a fitted table's rows (a name holds no two spaces in a row)."""
    return [fit.plain(line).split("  ")[0].strip() for line in lines[skip:] if fit.plain(line).strip()]


def _rows() -> list[dict]:
    return [{"test_id": t, "time_us": 12345.6 + i, "gflops": 1234.5, "gbytes_per_s": 10850.0, "cv": 0.2, **FLAGS}
            for i, t in enumerate([*GEMMS, ATEN])]


def test_the_summary_at_100_columns_shows_a_name_per_case():
    lines = cases.case_table(_rows(), list(cases.SUMMARY_DEFAULT)).lines(100)
    names = _names([line for line in lines if not fit.plain(line).startswith("(left out")])
    assert len(names) == len(GEMMS) + 1 and len(set(names)) == len(names), names
    assert all(f"k={k}]" in name for name, k in zip(names, [256, 512, 1024, 2048, 4096] * 2))
    assert all(len(fit.plain(line)) <= 100 for line in lines)


def test_the_gate_table_at_100_columns_shows_a_name_per_case():
    verdicts = [{"case": testid.parse(r["test_id"]).name.removeprefix("test_"), "verdict": "inconclusive",
                 "base_time_us": 1.0, "time_us": 2.0, "ratio": 2.0, "threshold": 0.05, "noise_rel": 0.3,
                 "notes": "the machine was busy: other processes took 80% of the cores while it ran"}
                for r in _rows()]
    lines = cases.verdict_table(verdicts).lines(100)
    names = _names([line for line in lines if not fit.plain(line).startswith("(left out")])
    assert len(set(names)) == len(verdicts), names
    assert all(len(fit.plain(line)) <= 100 for line in lines)


def test_a_report_table_cuts_its_explanation_before_the_case():
    # The report's flags table: case, flag, cv, detail (before: the case cut to 12, the detail kept 67).
    rows = [[testid.parse(t).params, "throttled", "0.200", "sw_power_cap,hw_slowdown,sw_thermal_slowdown " * 2]
            for t in GEMMS]
    lines = Section("gemm: flags", ["case", "flag", "cv", "detail"], rows).table().lines(100)
    names = _names(lines, skip=2)
    assert len(set(names)) == len(rows), names


@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_names_stay_apart_at_any_width_that_holds_them(width):
    lines = cases.case_table(_rows(), ["case", "time_us", "flags"]).lines(width)
    names = _names([line for line in lines if not fit.plain(line).startswith("(left out")])
    assert len(set(names)) == len(names) == len(GEMMS) + 1, (width, names)
