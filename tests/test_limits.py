"""view/limits.py: the compute/memory limit of each op, from its formulas, and the limit a measured op hits."""

from pathlib import Path

import pytest

from pytest_opperf.catalog import load_builtin
from pytest_opperf.hardware.specs import HardwareSpec, load_specs
from pytest_opperf.view import limits

ROOT = Path(__file__).resolve().parent.parent
H100 = load_specs()["h100"]  # bf16 matrix 989.4 TFLOP/s, fp32 vector 66.9 TFLOP/s, 3350 GB/s


def test_a_square_bf16_gemm_is_compute_bound_by_hand():
    load_builtin()
    r = limits.limit("gemm", (("m", 4096), ("n", 4096), ("k", 4096)), "bf16", "bf16", H100)
    # 2 * 4096^3 FLOPs over 3 * 4096^2 * 2 bytes = 4096 / 3 FLOP/B; ridge 989.4e12 / 3350e9 = 295.3
    assert r["intensity"] == pytest.approx(4096 / 3)
    assert r["ridge"] == pytest.approx(295.343, rel=1e-5)
    assert r["bound"] == "compute"
    assert r["roofline_us"] == pytest.approx(2 * 4096**3 / 989.4e12 * 1e6)  # 138.9 us


def test_a_small_gemm_and_an_add_are_memory_bound_by_hand():
    load_builtin()
    small = limits.limit("gemm", (("m", 512), ("n", 512), ("k", 512)), "bf16", "bf16", H100)
    assert small["intensity"] == pytest.approx(512 / 3) and small["bound"] == "memory"  # 170.7 < 295.3
    add = limits.limit("add", (("n", 1024),), "fp32", "fp32", H100)
    # n FLOPs over 12 n bytes; fp32 vector ridge 66.9e12 / 3350e9 = 19.97 FLOP/B
    assert add["intensity"] == pytest.approx(1 / 12) and add["ridge"] == pytest.approx(19.97, rel=1e-3)
    assert add["bound"] == "memory" and add["roofline_us"] == pytest.approx(12 * 1024 / 3350e9 * 1e6)


def test_data_movement_is_memory_bound_and_a_missing_peak_is_said():
    load_builtin()
    moved = limits.limit("transpose", (("m", 64), ("n", 64)), "bf16", "bf16", H100)
    assert moved["flops"] == 0 and moved["bound"] == "memory"
    bf16_only = HardwareSpec("x", matrix_tflops={"bf16": 1000}, mem_bw_gbytes_per_s=2000)
    fp32 = limits.limit("gemm", (("m", 256), ("n", 256), ("k", 256)), "fp32", "fp32", bf16_only)
    assert fp32["ridge"] is None and fp32["bound"] is None
    assert fp32["roofline_us"] == pytest.approx(3 * 256**2 * 4 / 2000e9 * 1e6)  # the bytes side alone
    row = {"unknown": 1, "kind": "matrix", "dtype": "fp32", "cases": 1, "memory": 0, "compute": 0}
    assert limits.verdict(row) == "no matrix peak for fp32: bytes give the only bound"


def test_a_mixed_op_says_how_many_cases_lie_on_each_side():
    row = {"unknown": 0, "kind": "matrix", "dtype": "bf16", "cases": 6, "memory": 2, "compute": 4}
    assert limits.verdict(row) == "memory-bound at 2 of 6 (the smaller), compute-bound at 4"


def test_docs_catalog_holds_the_generated_table():
    doc = (ROOT / "docs" / "catalog.md").read_text()
    section = limits.section(doc)
    assert section == limits.roofline_markdown("h100", ROOT / "configs"), \
        "docs/catalog.md is stale: python benchmarks/probes/roofline_limits.py --device h100 --write docs/catalog.md"
    ops = {line.split(" | ")[0].strip("| ") for line in section.splitlines() if line.startswith("| ")}
    assert {"gemm", "attention_decode", "quant_int8"} <= ops


def test_limit_diagnosis_names_the_limit_by_hand():
    # 8 us over 3 kernels is under 5 us a kernel; 600 us over 4 kernels re-reads data each pass
    assert limits.classify(0.1, 8.0, 3) == "launch-bound"
    assert limits.classify(0.2, 600.0, 4) == "multi-pass"
    assert limits.classify(0.3, 600.0, 1) == "latency/occupancy"
    assert limits.classify(0.5, 600.0, 4) == "near the roofline"
    # 2e12 FLOP at 1e15 FLOP/s is 2 ms; 1e9 B at 1e12 B/s is 1 ms: the longer one bounds it
    assert limits.roofline_us(2e12, 1e9, 1e15, 1e12) == pytest.approx(2000.0)
    assert limits.roofline_us(2e12, 1e9, None, 1e12) == pytest.approx(1000.0)  # no peak: bytes alone


def test_limit_diagnosis_of_a_database_by_hand(tmp_path):
    import json
    import sqlite3

    db = tmp_path / "h100.db"
    con = sqlite3.connect(db)
    con.execute("create table runs (run_id text, started_at text, device text)")
    con.execute("insert into runs values ('r', '2026-11-23T00:00:00+00:00', 'h100')")
    con.execute("create table [add] (n int, dtype_in text, dtype_out text, backend text, backend_version text, "
                "knobs text, timer text, cache text, time_us real, flops real, bytes real, peak_dtype text, "
                "peak_kind text, kernels text)")
    con.execute("create unique index idx on [add] (n, dtype_in, dtype_out, backend, backend_version, knobs, timer, cache)")
    # 3.35e9 bytes at 3350 GB/s is 1000 us: the fused kernel at 1100 us is near it, the
    # three-kernel one at 4000 us is slower and not the best
    for backend, time_us, kernels in (("fused", 1100.0, ["k"]), ("eager", 4000.0, ["a", "b", "c"])):
        con.execute("insert into [add] values (?, 'fp32', 'fp32', ?, '', '', 'profiler', 'cold', ?, ?, ?, 'fp32', "
                    "'vector', ?)", (1, backend, time_us, 0.0, 3.35e9, json.dumps(kernels)))
    con.commit()
    device, found = limits.diagnose(db)
    assert device == "h100" and len(found) == 1
    row = found[0]
    assert row["backend"] == "fused" and row["roofline_us"] == pytest.approx(1000.0)
    assert row["fraction"] == pytest.approx(1000 / 1100) and row["limit"] == "near the roofline"
