"""opperf import on public Ascend kernel_details.csv files: matmul sizes, collectives, refusals.

The files under tests/data/ascend are real profiler output (see its PROVENANCE.md); the few
hand-written rows below are copies of real rows with one field changed, each saying which.
"""

import csv
import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.reading import ascend, hccl
from pytest_opperf.pipeline.mapping import rules as mapping, matmul
from pytest_opperf.pipeline.reading.signature import ProfileError, parse_shapes

DATA = Path(__file__).parent / "data" / "ascend"
FOLDERS = sorted(p.name for p in DATA.iterdir() if p.is_dir())
# Published as they are: a Level0 profile has no shape columns; one file has a row a field short.
REFUSED = {
    "msinsight_level0_rank0_ascend_pt": "missing column(s) ['Input Shapes'",
    "msinsight_server_rank_0": "kernel_details.csv:17: 31 fields where the header has 32",
}
MATMULS = ("MatMul", "MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"}
# (sized, not sized) matmul signatures per readable file; msprof_analyze_matmul's three
# unsized ones have a k that differs between the operands (81920 vs 8192, 15365 vs 4096) as
# published in that unit-test file.
GEMM_COUNTS = {
    "msinsight_level1_rank0_ascend_pt": (9, 0),
    "msinsight_level2_rank_0_ascend_pt": (11, 0),
    "msinsight_level2_rank_2_ascend_pt": (14, 0),
    "msprof_analyze_advisor": (7, 0),
    "msprof_analyze_matmul": (0, 3),
}
RULES = mapping.load()


def resolved(folder, world_size=None):
    return [(sig, RULES.resolve(sig)) for sig in ascend.read(DATA / folder, world_size)]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_public_file_imports_or_is_refused_in_one_line(folder):
    if folder in REFUSED:
        with pytest.raises(ProfileError) as info:
            ascend.read(DATA / folder)
        assert REFUSED[folder] in str(info.value) and "\n" not in str(info.value)
        return
    rows = resolved(folder)
    assert rows
    assert {res.status for _, res in rows} <= {mapping.MAPPED, mapping.UNMAPPED, mapping.UNREPLAYABLE}
    assert all(res.reason for _, res in rows if res.status == mapping.UNREPLAYABLE)


@pytest.mark.parametrize("folder", sorted(GEMM_COUNTS))
def test_every_matmul_is_sized_to_its_output_or_says_why_not(folder):
    sized = unsized = 0
    for sig, res in resolved(folder):
        if sig.op_type not in MATMULS:
            continue
        if res.status == mapping.MAPPED:
            p = res.params
            out = parse_shapes(sig.output_shapes)[0]
            assert p.get("b", 1) * p["m"] * p["n"] == math.prod(out), (sig.input_shapes, sig.output_shapes, p)
            sized += 1
        else:
            assert res.status == mapping.UNREPLAYABLE and "cannot size the matmul" in res.reason
            unsized += 1
    assert (sized, unsized) == GEMM_COUNTS[folder]


def params_of(folder, op_type, input_shapes):
    [res] = [res for sig, res in resolved(folder) if sig.op_type == op_type and sig.input_shapes == input_shapes]
    return res


def test_a_transposed_first_operand_is_read_from_the_output():
    # MatMulV3 [4096,1024; 4096,3072] -> [1024,3072] in a Qwen training step: A^T @ B
    res = params_of("msinsight_level2_rank_0_ascend_pt", "MatMulV3", "4096,1024;4096,3072")
    assert (res.op, res.params) == ("gemm", {"m": 1024, "n": 3072, "k": 4096})
    # and a transposed second operand: [4096,1024; 6144,1024] -> [4096,6144], A @ B^T
    res = params_of("msinsight_level2_rank_0_ascend_pt", "MatMulV3", "4096,1024;6144,1024")
    assert res.params == {"m": 4096, "n": 6144, "k": 1024}


def test_fractal_nz_operands_and_output():
    # MatMulV2 with both operands and its output in NZ (the LM head's weight gradient):
    # A (9496,256,16,16) is ND [4096, 151936], B (64,256,16,16) is [4096, 1024], the output
    # (64,9496,16,16) is [151936, 1024]: A^T @ B
    res = params_of("msinsight_level2_rank_2_ascend_pt", "MatMulV2", "9496,256,16,16;64,256,16,16")
    assert res.params == {"m": 151936, "n": 1024, "k": 4096}
    # a weight [n=1152, k=4352] in NZ: (k/16, n/16, 16, 16)
    assert matmul.size([(2048, 4352), (272, 72, 16, 16)], ["ND", "FRACTAL_NZ"], [(2048, 1152)]).mnk == \
        (2048, 1152, 4352)
    # a padded NZ dim: n=1000 stored as 63 tiles of 16 (1008); the output says 1000
    assert matmul.size([(32, 4096), (256, 63, 16, 16)], ["ND", "FRACTAL_NZ"], [(32, 1000)]).mnk == (32, 1000, 4096)
    # a batched NZ operand (5-D) against a batched output
    sizes = matmul.size([(8, 128, 512), (8, 32, 32, 16, 16)], ["ND", "FRACTAL_NZ"], [(8, 128, 512)])
    assert (sizes.b, *sizes.mnk) == (8, 128, 512, 512)


def test_a_batched_matmul_keeps_its_batch():
    res = params_of("msprof_analyze_advisor", "BatchMatMul", "12,1024,512;12,512,1024")
    assert (res.op, res.params) == ("bmm", {"b": 12, "m": 1024, "n": 1024, "k": 512})


def test_a_matmul_that_cannot_be_sized_says_so():
    # published with k = 81920 on one side and 8192 on the other
    res = params_of("msprof_analyze_matmul", "MatMulV2", "81920,4096;8192,512")
    assert res.status == mapping.UNREPLAYABLE
    assert "no reading of [81920,4096] x [8192,512] (ND; ND) gives the output [4096,512]" in res.reason
    with pytest.raises(matmul.Unsized, match="several sizes"):
        matmul.size([(64, 32), (32, 64)], ["ND", "ND"], [])  # no output: A @ B (64x64) or A^T @ B^T (32x32)?
    with pytest.raises(matmul.Unsized, match="input 1 has no shape"):
        matmul.size([(64, 64), None], ["ND", "ND"], [(64, 64)])


def test_collectives_are_sized_from_communication_json_and_their_group():
    """kernel_details writes N/A for the hcom kernels' tensors; communication.json beside it holds what
    each op sent, its @suffix the group (communication_matrix.json: its ranks), so they replay."""
    sized = {}
    for folder in ("msinsight_level2_rank_0_ascend_pt", "msinsight_level2_rank_2_ascend_pt"):
        for sig, res in resolved(folder):
            if sig.op_type.startswith("hcom_"):
                assert res.op in COLLECTIVES and res.backend == "torch_dist"
                assert "Error" not in res.reason and "pytest_opperf" not in res.reason
                if res.status == mapping.MAPPED:
                    sized.setdefault((folder.split("_")[-3], sig.op_type), []).append(res.params)
                    assert "sized from communication.json of " + folder in res.note
                else:  # a group of one rank (tp = 1), or no bytes sent by this rank: said in words
                    assert "group of one rank" in res.reason or "shows no bytes sent" in res.reason
    # rank 0, hcom_allReduce__170_1_1@...: 622.329856 MB over HCCS in a group of 2 ranks: a ring
    # all-reduce sends 2(n-1)/n of the message, so the message is 622329856 bytes
    assert {"num_devices": 2, "message_bytes": 622329856, "reduce_op": "sum"} in sized[("0", "hcom_allReduce_")]
    # reduce-scatter of 2 ranks sends (n-1)/n of its send buffer: 440.466432 MB sent, 880932864 bytes
    assert {"num_devices": 2, "message_bytes": 880932864, "reduce_op": "sum"} in sized[("0", "hcom_reduceScatter_")]
    # all-gather on the 4-rank default group: 0.000288 MB sent is (n-1) x 96 bytes
    assert {"num_devices": 4, "message_bytes": 96} in sized[("0", "hcom_allGather_")]
    assert {"num_devices": 2, "message_bytes": 8388608} in sized[("2", "hcom_batchSendRecv_")]
    [(sig, res)] = [(s, r) for s, r in resolved("msprof_analyze_advisor") if s.op_type == "hcom_broadcast_"]
    assert res.op == "broadcast" and "no communication.json beside it" in res.reason  # a CSV alone


def test_a_group_hash_in_parallel_group_info_names_the_group(tmp_path):
    out = tmp_path / "rank_0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "communication.json").write_text(json.dumps({"step1": {"collective": {"hcom_allReduce__1_1_1@77": {
        "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 6.0}, "SDMA": {"Transit Size(MB)": 6.0}}}}}}))
    (out.parent / "profiler_metadata.json").write_text(json.dumps({"parallel_group_info": {
        "77": {"group_name": "tp", "group_rank": 0, "global_ranks": [0, 1, 2, 3]}}}))
    run = hccl.read_run(out)
    # 4 ranks, 6 MB sent = 2(n-1)/n x S: S = 4 MB; SDMA, the engine of the HCCS traffic, not added
    assert hccl.describe(run, "hcom_allReduce__1_1_1", "hcom_allReduce_") == {
        "message_bytes": 4000000, "ranks": 4, "group": "tp", "from": "communication.json of rank_0_ascend_pt"}


def real_rows(folder):
    path = DATA / folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def write(path, header, rows):
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    return path


def test_an_hcom_row_with_shapes_gets_its_message_bytes(tmp_path, capsys):
    header, rows = real_rows("msinsight_level2_rank_0_ascend_pt")
    hcom = next(r for r in rows if r[header.index("Type")] == "hcom_allReduce_")
    changed = dict(zip(header, hcom))
    # the real row with its N/A tensor fields filled in: one bf16 [1024, 4096] buffer
    changed.update({"Input Shapes": "1024,4096", "Input Data Types": "DT_BF16", "Input Formats": "ND",
                    "Output Shapes": "1024,4096", "Output Data Types": "DT_BF16"})
    csv_path = write(tmp_path / "kernel_details.csv", header, [[changed[h] for h in header]])
    assert main(["import", str(csv_path), "-o", str(tmp_path / "p.db"), "--world-size", "8"]) == 0
    with sqlite3.connect(tmp_path / "p.db") as db:
        op, params, note = db.execute("SELECT op, params, note FROM signatures").fetchone()
    assert op == "all_reduce" and json.loads(params) == {"num_devices": 8, "message_bytes": 1024 * 4096 * 2,
                                                         "reduce_op": "sum"}
    assert "num_devices from --world-size" in note


def test_world_size_option_wins_over_the_metadata_and_is_recorded():
    rows = resolved("msinsight_level2_rank_0_ascend_pt", world_size=2)
    assert {sig.context["world_size_from"] for sig, _ in rows} == {"--world-size"}
    with pytest.raises(ProfileError, match="--world-size=0: expected a positive int"):
        ascend.read(DATA / "msinsight_level2_rank_0_ascend_pt", 0)


def test_ranks_that_disagree_on_the_device_count_are_refused(tmp_path):
    for rank, size in ((0, 4), (1, 8)):
        folder = tmp_path / f"rank{rank}_ascend_pt"
        shutil.copytree(DATA / "msinsight_level2_rank_0_ascend_pt", folder)
        meta = json.loads((folder / "profiler_metadata.json").read_text())
        meta["distributed_args"]["world_size"] = size
        (folder / "profiler_metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError, match="disagree on the device count"):
        ascend.read(tmp_path)


@pytest.mark.parametrize("change, message", [
    (lambda r: r[:-1], ":2: 31 fields where the header has 32 (a field missing"),
    (lambda r: [*r, "x"], ":2: 33 fields where the header has 32 (a field too many"),
    (lambda r: [v if i != 8 else "fast" for i, v in enumerate(r)], ":2: Duration(us): expected a number, got 'fast'"),
    (lambda r: [v if i != 13 else "a,b" for i, v in enumerate(r)], ":2: Input Shapes: 'a,b' is not a shape list"),
])
def test_a_bad_row_is_one_line_with_its_line(tmp_path, capsys, change, message):
    header, rows = real_rows("msinsight_server_rank_0")
    assert (header[8], header[13]) == ("Duration(us)", "Input Shapes")
    csv_path = write(tmp_path / "kernel_details.csv", header, [change(rows[0]), rows[1]])
    assert main(["import", str(csv_path), "-o", str(tmp_path / "p.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{csv_path}{message}" in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "p.db").exists()


def test_scalars_odd_dtypes_and_formats_import_without_error(tmp_path):
    header, rows = real_rows("msinsight_server_rank_0")
    base = dict(zip(header, rows[0]))  # a ZerosLike row
    odd = [
        {"Type": "Range", "Input Shapes": ";;", "Input Data Types": "DOUBLE;DOUBLE;DOUBLE"},  # 0-dim inputs
        {"Type": "Muls", "Input Shapes": "[]", "Input Data Types": "FLOAT"},  # a scalar written as []
        {"Type": "MatMulV2", "Input Shapes": "[];[]", "Input Data Types": "DT_BF16;DT_BF16", "Output Shapes": "[]"},
        {"Type": "Add", "Input Shapes": "[2,4096];[2,4096]", "Input Data Types": "DT_COMPLEX64;HIFLOAT8",
         "Input Formats": "FORMAT_WEIRD;NC1HWC0"},
        {"Type": "MatMulV3", "Input Shapes": "4,8", "Input Data Types": "DT_BF16", "Output Shapes": "4,8"},
        {"Type": "hcom_allGather_", "Input Shapes": "", "Input Data Types": "UNKNOWN"},
    ]
    csv_path = write(tmp_path / "kernel_details.csv", header, [[{**base, **o}.get(h, "") for h in header] for o in odd])
    results = {sig.op_type: RULES.resolve(sig) for sig in ascend.read(csv_path, world_size=2)}
    assert results["Range"].status == mapping.UNMAPPED
    assert results["Muls"].status == mapping.UNREPLAYABLE and "largest has no shape" in results["Muls"].reason
    assert "cannot size the matmul: input 0 has no shape" in results["MatMulV2"].reason
    assert results["Add"].status == mapping.UNMAPPED  # no catalogue dtype: not replayed as something else
    assert "input 1 has no shape" in results["MatMulV3"].reason
    assert "no communication.json beside it" in results["hcom_allGather_"].reason


def test_a_type_less_communication_row_is_named_from_its_kernel():
    header, rows = real_rows("msinsight_level0_rank0_ascend_pt")
    row = dict(zip(header, next(r for r in rows if r[1].startswith("hcom_"))))
    assert (row["Type"], ascend._type(row)) == ("N/A", "hcom_allReduce_")


def test_attention_layouts_read_their_heads_from_the_softmax_output():
    res = params_of("msinsight_level2_rank_0_ascend_pt", "FlashAttentionScore",
                    "4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048;;;;;;;;")
    assert (res.op, res.params) == ("attention_prefill",
                                    {"batch": 1, "seq": 4096, "heads_q": 16, "heads_kv": 8, "head_dim": 128})


def test_sort_from_seed_001s_replay_list_maps_to_the_catalogue_sort():
    res = params_of("msinsight_level2_rank_0_ascend_pt", "Sort", "4096")
    assert (res.status, res.op, res.params, res.dtype) == (mapping.MAPPED, "sort", {"m": 1, "n": 4096}, "fp32")
