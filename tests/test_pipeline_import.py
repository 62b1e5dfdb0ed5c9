"""opperf import: Ascend kernel_details.csv files and torch.profiler traces -> signatures -> mapping."""

import csv
import json
import sqlite3

import pytest
import torch

from pytest_opperf.cli import main
from pytest_opperf.pipeline.mapping import rules as mapping, profile
from pytest_opperf.pipeline.reading.signature import parse_shapes

# The published column layout (torch_npu's kernel_details.csv), counters and OP State included.
HEADER = ["Device_id", "Name", "Type", "OP State", "Accelerator Core", "Start Time(us)", "Duration(us)",
          "Wait Time(us)", "Block Num", "Mix Block Num", "Input Shapes", "Input Data Types", "Input Formats",
          "Output Shapes", "Output Data Types", "Output Formats", "aic_total_cycles", "aic_mac_time(us)",
          "aiv_time(us)"]


def kernel_row(type_, duration, shapes, dtypes, formats, out_shapes, out_dtypes, name=None):
    return {"Device_id": 0, "Name": name or f"aclnn_{type_}", "Type": type_, "OP State": "dynamic",
            "Accelerator Core": "AI_CORE", "Start Time(us)": "1000.0", "Duration(us)": duration,
            "Wait Time(us)": 0.5, "Block Num": 24, "Mix Block Num": 0, "Input Shapes": shapes,
            "Input Data Types": dtypes, "Input Formats": formats, "Output Shapes": out_shapes,
            "Output Data Types": out_dtypes, "Output Formats": "ND", "aic_total_cycles": 1234,
            "aic_mac_time(us)": 1.0, "aiv_time(us)": 0.0}


ROWS = [
    kernel_row("MatMulV2", 10.0, "136,7168;7168,3584", "DT_BF16;DT_BF16", "ND;ND", "136,3584", "DT_BF16"),
    kernel_row("MatMulV2", 14.0, "136,7168;7168,3584", "DT_BF16;DT_BF16", "ND;ND", "136,3584", "DT_BF16"),
    kernel_row("MatMulV2", 12.0, "136,7168;7168,3584", "DT_BF16;DT_BF16", "ND;ND", "136,3584", "DT_BF16"),
    # the weight in FRACTAL_NZ: (n1, m1, m0, n0) of the [7168, 3584] matrix
    kernel_row("MatMulV3", 20.0, "136,7168;224,448,16,16", "DT_BF16;DT_BF16", "ND;FRACTAL_NZ", "136,3584",
               "DT_BF16"),
    # variant names of one kernel type
    kernel_row("split_qkv_rmsnorm_rope_kernel_0", 5.0, "136,2112;64;64", "DT_BF16;DT_BF16;DT_BF16", "ND;ND;ND",
               "136,1536;136,576", "DT_BF16;DT_BF16"),
    kernel_row("split_qkv_rmsnorm_rope_kernel_1", 7.0, "136,2112;64;64", "DT_BF16;DT_BF16;DT_BF16", "ND;ND;ND",
               "136,1536;136,576", "DT_BF16;DT_BF16"),
    # FIA with its optional inputs left empty, BSH layout (head counts are attributes)
    kernel_row("FusedInferAttentionScore", 30.0, "136,1,7168;136,2048,512;136,2048,512;;;;136", "DT_BF16;DT_BF16;DT_BF16;;;;INT64",
               "ND;ND;ND;;;;ND", "136,1,7168", "DT_BF16"),
    kernel_row("RmsNorm", 3.0, "136,7168;7168", "DT_BF16;DT_BF16", "ND;ND", "136,7168;136,1", "DT_BF16;FLOAT"),
]


def write_kernel_details(path, rows=ROWS):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=HEADER)
        writer.writeheader()
        writer.writerows(rows)
    return path


def by_type(rows):
    out = {}
    for r in rows:
        out.setdefault(r["op_type"], []).append(r)
    return out


def test_kernel_details_csv_imports_to_the_expected_signatures(tmp_path):
    # A profiling directory as torch_npu leaves it: the CSV is found below it.
    write_kernel_details(tmp_path / "prof" / "PROF_000001" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
    rows = profile.import_profile(tmp_path / "prof", tmp_path / "profile.db")
    types = by_type(rows)
    assert sorted(types) == ["FusedInferAttentionScore", "MatMulV2", "MatMulV3", "RmsNorm",
                             "split_qkv_rmsnorm_rope_kernel"]

    (mm,) = types["MatMulV2"]
    assert (mm["count"], mm["profiled_us_mean"], mm["profiled_us_median"]) == (3, 12.0, 12.0)
    assert mm["profiled_us_std"] == pytest.approx(2.0)  # sample std of 10, 12, 14
    assert mm["profiled_total_us"] == 36.0
    assert mm["share"] == pytest.approx(36.0 / (36 + 20 + 12 + 30 + 3))
    assert (mm["status"], mm["op"], json.loads(mm["params"]), mm["dtype"]) == (
        "mapped", "gemm", {"m": 136, "n": 3584, "k": 7168}, "bf16")

    (nz,) = types["MatMulV3"]
    assert nz["input_formats"] == "ND;FRACTAL_NZ" and nz["input_shapes"] == "136,7168;224,448,16,16"  # as profiled
    assert json.loads(nz["params"]) == {"m": 136, "n": 3584, "k": 7168}  # read as its ND shape

    (fused,) = types["split_qkv_rmsnorm_rope_kernel"]
    assert fused["count"] == 2 and fused["profiled_us_median"] == 6.0
    assert fused["status"] == "unmapped"

    (fia,) = types["FusedInferAttentionScore"]
    assert fia["input_shapes"] == "136,1,7168;136,2048,512;136,2048,512;;;;136"  # the empty slots kept
    assert fia["input_dtypes"] == "DT_BF16;DT_BF16;DT_BF16;;;;INT64"
    assert fia["status"] == "unreplayable"
    assert "not given" in fia["reason"] and "head counts" in fia["reason"]

    (norm,) = types["RmsNorm"]
    assert json.loads(norm["params"]) == {"m": 136, "n": 7168}
    assert norm["output_shapes"] == "136,7168;136,1" and norm["output_dtypes"] == "DT_BF16;FLOAT"


def test_a_kernel_details_file_without_a_required_column_is_one_line_and_no_file(tmp_path, capsys):
    bad = tmp_path / "kernel_details.csv"
    bad.write_text("Type,Duration(us),Input Shapes\nMatMulV2,1.0,\"2,2;2,2\"\n")
    assert main(["import", str(bad), "-o", str(tmp_path / "p.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"opperf import: {bad}: missing column(s)") and "Input Data Types" in err
    assert "\n" not in err
    assert not (tmp_path / "p.db").exists()


def test_an_existing_profile_database_is_not_replaced_without_force(tmp_path, capsys):
    csv_path = write_kernel_details(tmp_path / "kernel_details.csv")
    out = tmp_path / "p.db"
    assert main(["import", str(csv_path), "-o", str(out)]) == 0
    before = out.read_bytes()
    assert main(["import", str(csv_path), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["import", str(csv_path), "-o", str(out), "--force"]) == 0


def test_a_user_mapping_comes_first_and_a_bad_one_names_its_key(tmp_path, capsys):
    csv_path = write_kernel_details(tmp_path / "kernel_details.csv")
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - match: [split_qkv_rmsnorm_rope_kernel]\n    op: rmsnorm\n"
                    "    params: {m: 'in0[0]', n: 'in0[1]'}\n    proxy: true\n")
    rows = profile.import_profile(csv_path, tmp_path / "p.db", mapping_files=[mine])
    (fused,) = by_type(rows)["split_qkv_rmsnorm_rope_kernel"]
    assert (fused["status"], fused["op"], json.loads(fused["params"]), fused["proxy"]) == (
        "mapped", "rmsnorm", {"m": 136, "n": 2112}, 1)

    mine.write_text("rules:\n  - match: [X]\n    op: gemm\n    params: {m: 'in0.shape'}\n")
    assert main(["import", str(csv_path), "-o", str(tmp_path / "q.db"), "--mapping", str(mine)]) == 2
    assert "rules[0].params.m" in capsys.readouterr().err


def test_a_rule_whose_op_is_not_registered_makes_the_signature_unreplayable(tmp_path):
    csv_path = write_kernel_details(tmp_path / "kernel_details.csv")
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - match: [RmsNorm]\n    op: no_such_op\n    params: {m: 'in0[0]'}\n")
    rows = profile.import_profile(csv_path, tmp_path / "p.db", mapping_files=[mine])
    (norm,) = by_type(rows)["RmsNorm"]
    assert norm["status"] == "unreplayable" and "'no_such_op' is not registered" in norm["reason"]


def test_profiler_dtype_spellings():
    assert [mapping.profiled_dtype(t) for t in ("DT_BF16", "FLOAT16", "FLOAT", "c10::BFloat16", "c10::Half",
                                                "float", "long int", "INT8", "Scalar", "")] == [
        "bf16", "fp16", "fp32", "bf16", "fp16", "fp32", "int64", "int8", None, None]


def test_shape_fields_keep_empty_slots_and_tensor_lists():
    assert parse_shapes("2,3;;4") == [(2, 3), None, (4,)]
    assert parse_shapes("1,8,16,64+1,8,1,64;") == [[(1, 8, 16, 64), (1, 8, 1, 64)], None]


# ---- torch.profiler traces ----

def record_trace(path, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.SiLU(), torch.nn.Linear(128, 32))
    x = torch.randn(16, 64)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                 record_shapes=True) as prof:
        for _ in range(steps):
            torch.softmax(model(x), dim=-1)
    prof.export_chrome_trace(str(path))
    return path


def top_level_us(trace_path) -> float:
    """The CPU ops' time not inside another CPU op, straight from the trace's events."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    total = 0.0
    for thread in {(e["pid"], e["tid"]) for e in events if e.get("cat") == "cpu_op"}:
        ops = sorted((e for e in events if e.get("cat") == "cpu_op" and (e["pid"], e["tid"]) == thread),
                     key=lambda e: (e["ts"], -e["dur"]))
        end = float("-inf")
        for e in ops:
            if e["ts"] >= end:
                total += e["dur"]
                end = e["ts"] + e["dur"]
    return total


def test_a_recorded_profiler_trace_imports(tmp_path):
    trace = record_trace(tmp_path / "trace.json", steps=3)
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    assert {r["time_source"] for r in rows} == {"cpu_op"} and {r["source"] for r in rows} == {"torch.profiler"}
    types = by_type(rows)
    # The bias-free layer's mm multiplies by W.t() (strides 1,64): not the catalogue's dense gemm, so
    # the whole aten::linear replays as itself, with the recorded shapes and strides.
    assert "aten::mm" not in types
    (linear,) = [r for r in types["aten::linear"] if r["input_shapes"] == "16,64;128,64;"]
    assert (linear["count"], linear["status"], linear["op"], linear["proxy"]) == (3, "mapped", "aten", 0)
    assert json.loads(linear["params"]) == {"call": "aten::linear.default",
                                            "args": '["T:fp32[16,64]","T:fp32[128,64]",null]'}
    assert linear["dtype"] == "fp32" and linear["note"].startswith("replayed as itself")
    (addmm,) = types["aten::addmm"]
    assert json.loads(addmm["params"]) == {"m": 16, "n": 32, "k": 128, "activation": "none"}
    # softmax claims the time of the _softmax it calls: one signature, not two
    assert "aten::_softmax" not in types and types["aten::softmax"][0]["status"] == "mapped"
    # every microsecond of CPU time is in exactly one signature
    assert sum(r["profiled_total_us"] for r in rows) == pytest.approx(top_level_us(trace), rel=1e-9)


def test_a_trace_without_shapes_is_refused_with_the_fix(tmp_path, capsys):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.randn(8, 8) @ torch.randn(8, 8)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert main(["import", str(tmp_path / "t.json"), "-o", str(tmp_path / "p.db")]) == 2
    assert "record_shapes=True" in capsys.readouterr().err


def cpu_op(name, ts, dur, ext, dims, types, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Input Dims": dims, "Input type": types}}


def test_device_kernels_are_the_time_of_the_op_that_launched_them(tmp_path):
    bf16 = "c10::BFloat16"
    events = [
        cpu_op("aten::linear", 0, 100, 1, [[8, 64], [32, 64], []], [bf16, bf16, ""]),
        cpu_op("aten::matmul", 10, 80, 2, [[8, 64], [64, 32]], [bf16, bf16]),
        cpu_op("aten::mm", 20, 60, 3, [[8, 64], [64, 32]], [bf16, bf16]),
        cpu_op("aten::add", 200, 30, 4, [[8, 32], [8, 32], []], [bf16, bf16, "Scalar"]),
        cpu_op("aten::mul", 300, 30, 5, [[8, 32], []], [bf16, "Scalar"]),
        # the runtime calls, on the same thread, inside the op that launched them
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 30, "dur": 5,
         "args": {"External id": 3, "correlation": 70}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 210, "dur": 5,
         "args": {"correlation": 71}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 310, "dur": 5,
         "args": {"correlation": 72}},
        # GEMM: by External id; the add: by its correlation id; the mul: by the ac2g flow only
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 40, "dur": 12.5,
         "args": {"External id": 3, "correlation": 70}},
        {"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 220, "dur": 3.0,
         "args": {"correlation": 71}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 72, "pid": 1, "tid": 1, "ts": 310},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 72, "pid": 0, "tid": 7, "ts": 320, "bp": "e"},
        {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7, "ts": 320, "dur": 2.0, "args": {}},
        # device work no CPU op launched
        {"ph": "X", "cat": "kernel", "name": "nccl_kernel", "pid": 0, "tid": 8, "ts": 500, "dur": 4.0, "args": {}},
    ]
    trace = tmp_path / "cuda.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = profile.import_profile(trace, tmp_path / "p.db")
    types = by_type(rows)
    assert {r["time_source"] for r in rows} == {"kernel"}
    (mm,) = types["aten::mm"]
    assert mm["profiled_us_mean"] == 12.5 and json.loads(mm["kernels"]) == {"sm90_gemm": 1}
    assert json.loads(mm["params"]) == {"m": 8, "n": 32, "k": 64} and mm["dtype"] == "bf16"
    assert "aten::linear" not in types and "aten::matmul" not in types  # they launched nothing themselves
    (add,) = types["aten::add"]
    assert (add["profiled_us_mean"], add["status"], json.loads(add["params"])) == (3.0, "mapped", {"n": 256})
    (mul,) = types["aten::mul"]
    assert mul["profiled_us_mean"] == 2.0 and mul["op"] == "gelu" and mul["proxy"] == 1
    (nccl,) = types["nccl_kernel"]
    assert nccl["status"] == "unmapped" and nccl["profiled_us_mean"] == 4.0
    assert sum(r["profiled_total_us"] for r in rows) == 12.5 + 3.0 + 2.0 + 4.0


def test_integer_index_arithmetic_is_not_replayed_as_a_float_op(tmp_path):
    events = [cpu_op("aten::add", 0, 10, 1, [[2048], [2048], []], ["long int", "long int", "Scalar"]),
              cpu_op("aten::add", 20, 10, 2, [[2048], [2048], []], ["float", "float", "Scalar"]),
              {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 1, "dur": 2.0,
               "args": {"External id": 1}},
              {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 21, "dur": 2.0,
               "args": {"External id": 2}}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = {r["input_dtypes"]: r for r in profile.import_profile(trace, tmp_path / "p.db")}
    assert rows["long int;long int;Scalar"]["status"] == "unmapped"
    assert (rows["float;float;Scalar"]["op"], rows["float;float;Scalar"]["dtype"]) == ("add", "fp32")


def test_the_profile_database_has_the_documented_tables(tmp_path):
    csv_path = write_kernel_details(tmp_path / "kernel_details.csv")
    profile.import_profile(csv_path, tmp_path / "p.db")
    with sqlite3.connect(tmp_path / "p.db") as db:
        columns = [r[1] for r in db.execute("pragma table_info(signatures)")]
        imports = db.execute("select path, source, signatures from imports").fetchall()
    db.close()
    assert columns == list(profile.COLUMNS)
    assert imports == [(str(csv_path), "ascend", 5)]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_a_recorded_cuda_trace_takes_kernel_time(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(512, 256, bias=False)).cuda().to(torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        model(x)
        torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
            for _ in range(3):
                torch.softmax(model(x), dim=-1)
            torch.cuda.synchronize()
    trace = tmp_path / "cuda.json"
    prof.export_chrome_trace(str(trace))
    rows = profile.import_profile(trace, tmp_path / "p.db")
    assert {r["time_source"] for r in rows} == {"kernel"}
    # bias-free layers multiply by W.t(): each aten::linear replays whole, as itself, with its kernel time
    gemms = [r for r in rows if r["op_type"] == "aten::linear"]
    assert {json.loads(json.loads(r["params"])["args"])[0] for r in gemms} == {"T:bf16[64,256]", "T:bf16[64,512]"}
    assert all(r["count"] == 3 and r["op"] == "aten" and r["kernels"] and r["dtype"] == "bf16" for r in gemms)
    events = json.loads(trace.read_text())["traceEvents"]
    device_us = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                          "gpu_memset"))
    assert sum(r["profiled_total_us"] for r in rows) == pytest.approx(device_us, rel=1e-9)


def test_the_rules_are_read_once_a_process_until_a_file_changes(tmp_path):
    from pytest_opperf.pipeline.mapping import rules

    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - match: [RmsNorm]\n    op: rmsnorm\n    params: {m: 'in0[0]', n: 'in0[1]'}\n")
    first = rules.load([mine])
    assert rules.load([mine]) is first and first.rules[0].names == frozenset({"RmsNorm"})
    mine.write_text("rules:\n  - match: [LayerNormV2]\n    op: rmsnorm\n    params: {m: 'in0[0]', n: 'in0[1]'}\n")
    again = rules.load([mine])
    assert again is not first and again.rules[0].names == frozenset({"LayerNormV2"})
    assert rules.load() is not again and rules.load() is rules.load()
