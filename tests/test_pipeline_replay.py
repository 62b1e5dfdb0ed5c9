"""The chain after import: replay through pytest, backfill, the replay report, lookup."""

import csv
import json
import math

import pytest

from conftest import FAST, rows_at
from pytest_opperf.cli import main
from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.pipeline.replay import backfill, lookup, report as replay_report
from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.store import database
from test_pipeline_import import kernel_row, write_kernel_details

BENCH = """
def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)


def test_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)
"""


def test_a_profile_replays_through_pytest_and_backfills(pytester):
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_ops.py").write_text(BENCH)
    (pytester.path / "configs").mkdir()
    csv_path = write_kernel_details(pytester.path / "prof" / "kernel_details.csv", [
        kernel_row("MatMulV2", 4.0, "8,16;16,32", "FLOAT;FLOAT", "ND;ND", "8,32", "FLOAT"),
        kernel_row("MatMulV2", 6.0, "8,16;16,32", "FLOAT;FLOAT", "ND;ND", "8,32", "FLOAT"),
        kernel_row("RmsNorm", 2.0, "8,64;64", "FLOAT;FLOAT", "ND;ND", "8,64;8,1", "FLOAT;FLOAT"),
        kernel_row("MysteryKernel", 1.0, "8", "FLOAT", "ND", "8", "FLOAT"),
    ])
    assert main(["import", str(csv_path), "-o", str(pytester.path / "profile.db"),
                 "--configs", str(pytester.path / "replay")]) == 0
    files = sorted((pytester.path / "replay").glob("*.yaml"))
    assert [f.name for f in files] == ["gemm.yaml", "rmsnorm.yaml"]

    tagged = ["-p", "pytest_opperf.pipeline.mapping.tag", f"--opperf-signatures={pytester.path / 'replay' / 'signatures.json'}"]
    result = pytester.runpytest("benches/", *FAST, *[f"--opperf-config={f}" for f in files], "-m", "gemm or rmsnorm",
                                *tagged)
    result.assert_outcomes(passed=2)
    results_db = pytester.path / "results" / "cpu.db"
    gemm_rows, norm_rows = rows_at(results_db, "gemm"), rows_at(results_db, "rmsnorm")
    assert [(r["m"], r["n"], r["k"], r["dtype_in"]) for r in gemm_rows] == [(8, 32, 16, "fp32")]
    assert [(r["m"], r["n"]) for r in norm_rows] == [(8, 64)]

    assert main(["backfill", str(pytester.path / "profile.db"), str(results_db)]) == 0
    sigs = {r["op_type"]: r for r in profile.load(pytester.path / "profile.db")}
    assert sigs["MatMulV2"]["replayed_us"] == gemm_rows[0]["time_us"]
    assert sigs["RmsNorm"]["replayed_us"] == norm_rows[0]["time_us"]
    assert sigs["MatMulV2"]["replayed_run_id"] == gemm_rows[0]["run_id"] and sigs["MatMulV2"]["replayed_timer"] == "cpu"
    assert sigs["MysteryKernel"]["replayed_us"] is None and sigs["MysteryKernel"]["status"] == "unmapped"

    assert main(["replay-report", str(pytester.path / "profile.db"), "-o", str(pytester.path / "reports")]) == 0
    text = (pytester.path / "reports" / "replay_report.md").read_text()
    assert "| unmapped | 1.0 | 7.7% |" in text  # 1 us of 13
    assert "`MysteryKernel`: 1 signature(s), 1.0 us, 7.69%" in text


def results_with(path, rows, profile_db=None):
    """A results database holding these gemm rows (written by the plugin's own writer), tagged as the
    replay run tags them (tag.py) with the signature of profile_db whose m they have."""
    token = profile.import_token(profile_db) if profile_db else ""
    ids = {json.loads(r["params"])["m"]: r["id"] for r in profile.load(profile_db)} if profile_db else {}
    records = []
    for i, (m, n, k, backend, time_us, created, *more) in enumerate(rows):
        cache, tag_token = (more + ["cold", token])[:2] if more else ("cold", token)
        records.append({"op": "gemm", "_params": ["m", "n", "k"], "m": m, "n": n, "k": k, "dtype_in": "bf16",
                        "dtype_out": "bf16", "backend": backend, "backend_version": "1", "knobs": "",
                        "timer": "profiler", "cache": cache, "time_us": time_us, "run_id": f"r{i}",
                        "created_at": created, "kernels": json.dumps([f"k{i}"]),
                        "extra_info": {"profile": tag_token, "signatures": [ids[m]]} if m in ids else None})
    database.write(path, {"run_id": "r0", "device": "h100", "started_at": "2026-11-23T00:00:00+00:00"}, records)
    return path


def gemm_profile(tmp_path):
    csv_path = write_kernel_details(tmp_path / "kernel_details.csv", [
        kernel_row("MatMulV2", 10.0, "64,128;128,256", "DT_BF16;DT_BF16", "ND;ND", "64,256", "DT_BF16"),
        kernel_row("MatMulV2", 20.0, "32,128;128,256", "DT_BF16;DT_BF16", "ND;ND", "32,256", "DT_BF16"),
    ])
    out = tmp_path / "profile.db"
    profile.import_profile(csv_path, out)
    return out


def replayed(profile_db):
    return {json.loads(r["params"])["m"]: r["replayed_us"] for r in profile.load(profile_db)}


def test_backfill_all_and_missing_only(tmp_path):
    prof = gemm_profile(tmp_path)
    first = results_with(tmp_path / "first.db", [(64, 256, 128, "torch", 11.0, "2026-11-23T01:00:00+00:00")], prof)
    done = backfill.backfill(prof, first, "all")
    assert (done.filled, [s["op_type"] for s in done.not_measured]) == (1, ["MatMulV2"])
    assert replayed(prof) == {64: 11.0, 32: None}

    # a second replay: both shapes, m=64 newer and slower; of two tagged rows of one signature the newest wins
    second = results_with(tmp_path / "second.db", [
        (64, 256, 128, "torch", 13.0, "2026-11-23T02:00:00+00:00"),
        (32, 256, 128, "torch", 7.0, "2026-11-23T02:00:00+00:00"),
    ], prof)
    done = backfill.backfill(prof, second, "missing-only")
    assert (done.filled, done.kept) == (1, 1)
    assert replayed(prof) == {64: 11.0, 32: 7.0}  # the m=64 time kept
    done = backfill.backfill(prof, second, "all")
    assert done.filled == 2 and replayed(prof) == {64: 13.0, 32: 7.0}
    with pytest.raises(ProfileError, match="--mode=some: expected all or missing-only"):
        backfill.backfill(prof, second, "some")


def test_backfill_takes_only_rows_tagged_with_the_signature_in_its_cache_state(tmp_path):
    prof = gemm_profile(tmp_path)
    assert {r["cache"] for r in profile.load(prof)} == {"cold"}  # no L2 size known for a CSV: cold
    # the same parameters, but untagged (a run by hand), of another import, or hot: none is the replay
    untagged = results_with(tmp_path / "untagged.db", [(64, 256, 128, "torch", 5.0, "2026-11-23T01:00:00+00:00")])
    other = results_with(tmp_path / "other.db", [(64, 256, 128, "torch", 5.0, "2026-11-23T01:00:00+00:00", "cold",
                                                  "another-import")], prof)
    hot = results_with(tmp_path / "hot.db", [(64, 256, 128, "torch", 5.0, "2026-11-23T01:00:00+00:00", "hot")], prof)
    assert [backfill.backfill(prof, db).filled for db in (untagged, other, hot)] == [0, 0, 0]


def signature_row(i, op_type, count, median, total, status="mapped", replayed_us=None, proxy=0, kernels=None,
                  replayed_kernels=None, op="gemm"):
    row = {c: None for c in profile.COLUMNS}
    row.update(id=i, source="torch.profiler", time_source="kernel", op_type=op_type, input_shapes=f"{i},{i}",
               input_dtypes="c10::BFloat16", input_formats="", output_shapes="", output_dtypes="", count=count,
               profiled_us_mean=total / count, profiled_us_median=median, profiled_us_std=0.0,
               profiled_total_us=total, share=total / 1000.0, status=status, proxy=proxy, replayed_us=replayed_us,
               kernels=json.dumps(kernels) if kernels else None,
               replayed_kernels=json.dumps(replayed_kernels) if replayed_kernels else None)
    if status == "mapped":
        row.update(op=op, backend="torch", dtype="bf16", params=json.dumps({"m": i, "n": i, "k": i}))
    if status == "unreplayable":
        row.update(reason="op 'x' is not registered")
    return row


def test_replay_report_gap_and_share_on_a_hand_made_profile(tmp_path):
    # 1000 us profiled: A 400 (gap +10%), B 300 (gap +100%, other kernels), C 100 (a stand-in, gap -50%),
    # D unreplayable 100, E unmapped 60, F mapped but not replayed 40.
    rows = [
        signature_row(1, "aten::mm", 4, 100.0, 400.0, replayed_us=110.0, kernels={"sm90_gemm": 4},
                      replayed_kernels=["sm90_gemm"]),
        signature_row(2, "aten::bmm", 2, 150.0, 300.0, replayed_us=300.0, kernels={"cutlass_a": 2},
                      replayed_kernels=["cutlass_b"]),
        signature_row(3, "aten::silu", 5, 20.0, 100.0, replayed_us=10.0, proxy=1, op="gelu"),
        signature_row(4, "aten::weird", 1, 100.0, 100.0, status="unreplayable"),
        signature_row(5, "aten::index", 3, 20.0, 60.0, status="unmapped"),
        signature_row(6, "aten::addmm", 2, 20.0, 40.0),
    ]
    db = tmp_path / "p.db"
    profile._write(db, rows, {c: "" for c in profile.IMPORT_COLUMNS})
    md, csv_path = replay_report.write(db, tmp_path / "out")
    with open(csv_path) as fh:
        table = list(csv.DictReader(fh))
    assert [r["op_type"] for r in table] == ["aten::mm", "aten::bmm", "aten::silu", "aten::weird", "aten::index",
                                             "aten::addmm"]
    assert [r["gap"] for r in table] == ["0.1", "1", "-0.5", "", "", ""]
    assert [float(r["share"]) for r in table] == [0.4, 0.3, 0.1, 0.1, 0.06, 0.04]
    text = md.read_text()
    for line in ("| mapped, replayed (same computation) | 700.0 | 70.0% |",
                 "| mapped, replayed by a stand-in op | 100.0 | 10.0% |",
                 "| mapped, not replayed yet | 40.0 | 4.0% |",
                 "| mapped (all of the above) | 840.0 | 84.0% |",
                 "| unreplayable | 100.0 | 10.0% |",
                 "| unmapped | 60.0 | 6.0% |"):
        assert line in text, line
    # signatures of 20 us or more with a replay: A (10%), B (100%), C (50%): median |gap| 50%, two beyond 25%
    assert "with a replay: 3; median |gap| 50.0%; 2 beyond 25%" in text
    notes = text.split("## Notes", 1)[1].split("##", 1)[0]
    assert "`aten::mm`" not in notes
    assert "`aten::bmm` `2,2` (+100.0%, 30.00% of the profile): different kernels: the profile ran cutlass_a" in notes
    assert "`aten::silu` `3,3` (-50.0%, 10.00% of the profile): replayed by a stand-in op" in notes
    assert "- `aten::weird`: 1 signature(s), 100.0 us, 10.00%: unreplayable: op 'x' is not registered" in text


def test_lookup_measured_interpolated_and_roofline(tmp_path):
    db = results_with(tmp_path / "h100.db", [
        (256, 512, 512, "torch", 10.0, "2026-11-23T01:00:00+00:00"),
        (1024, 512, 512, "torch", 40.0, "2026-11-23T01:00:00+00:00"),
        (1024, 512, 512, "cublaslt", 30.0, "2026-11-23T01:00:00+00:00"),
        (256, 512, 512, "torch", 12.0, "2026-11-23T00:00:00+00:00", "0.9"),  # an older version's: not the answer
    ])
    measured = lookup.lookup(db, "gemm", {"m": 256, "n": 512, "k": 512})
    assert (measured.kind, measured.time_us, measured.backend, measured.device) == ("measured", 10.0, "torch", "h100")
    fastest = lookup.lookup(db, "gemm", {"m": 1024, "n": 512, "k": 512})
    assert (fastest.time_us, fastest.backend) == (30.0, "cublaslt")
    named = lookup.lookup(db, "gemm", {"m": 1024, "n": 512, "k": 512}, backend="torch")
    assert named.time_us == 40.0

    # m=512 is the geometric middle of 256 and 1024: log-log gives sqrt(10 * 40) = 20 for torch
    inter = lookup.lookup(db, "gemm", {"m": 512, "n": 512, "k": 512}, backend="torch")
    assert inter.kind == "interpolated" and inter.time_us == pytest.approx(math.sqrt(10.0 * 40.0))
    assert "between m=256" in inter.detail and "m=1024" in inter.detail

    # two parameters off every row: no neighbours on one axis, so the roofline of the spec
    roof = lookup.lookup(db, "gemm", {"m": 512, "n": 1024, "k": 512})
    spec = load_specs()["h100"]
    flops, nbytes = 2 * 512 * 1024 * 512, (512 * 512 + 512 * 1024 + 512 * 1024) * 2
    expected = max(flops / spec.peak_flops("bf16", "matrix"), nbytes / spec.mem_bw_bytes_per_s) * 1e6
    assert roof.kind == "roofline" and roof.time_us == pytest.approx(expected) and roof.backend is None


def test_lookup_errors_are_one_line(tmp_path, capsys):
    db = results_with(tmp_path / "h100.db", [(256, 512, 512, "torch", 10.0, "2026-11-23T01:00:00+00:00")])
    assert main(["lookup", "gemm", "m=256", "n=512", "k=512", "--db", str(db)]) == 0
    assert "[measured]" in capsys.readouterr().out
    assert main(["lookup", "gemm", "m=256", "n=512", "--db", str(db)]) == 2
    assert "parameter(s) ['k'] not given" in capsys.readouterr().err
    assert main(["lookup", "gemm", "m=big", "n=512", "k=1", "--db", str(db)]) == 2
    assert "m of op 'gemm' takes int values" in capsys.readouterr().err
    assert main(["lookup", "nope", "--db", str(db)]) == 2
    assert "unknown op 'nope'" in capsys.readouterr().err
    assert main(["lookup", "gemm", "m=3", "n=3", "k=3", "--db", str(tmp_path / "none.db")]) == 2
    assert "pass --device NAME" in capsys.readouterr().err


def test_backfill_and_report_refuse_a_file_that_is_not_a_profile(tmp_path, capsys):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    assert main(["replay-report", str(junk)]) == 2
    assert f"{junk}: not a profile database" in capsys.readouterr().err
    assert main(["backfill", str(tmp_path / "missing.db"), str(junk)]) == 2
    assert "no such profile database" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    prof = gemm_profile(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["replay-report", str(prof), "-o", str(blocker / "reports")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opperf replay-report: ") and str(blocker) in err and "\n" not in err
    csv_path = tmp_path / "kernel_details.csv"
    assert main(["import", str(csv_path), "-o", str(blocker / "p.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert "p.db: cannot write" in err and "\n" not in err  # refused before the import reads anything


# --- the replay configs: written by YAML's dumper, read back by the users' loader ----------------


def test_a_written_config_round_trips_through_the_loader_with_each_rows_backend_and_dtype(tmp_path):
    from pytest_opperf import config
    from pytest_opperf.catalog import OPS, load_builtin
    from pytest_opperf.pipeline.mapping import configs

    load_builtin()
    planned = [configs.PlannedCase("gemm", "torch", "bf16", (("m", 64), ("n", 512), ("k", 128)), "aten::mm x3"),
               configs.PlannedCase("gemm", "triton", "bf16", (("m", 1), ("n", 8), ("k", 8))),
               configs.PlannedCase("gemm", "torch", "fp8-bf16", (("m", 1), ("n", 8), ("k", 8)), "a: 'quoted' # not a comment")]
    (path,) = configs.write(planned, tmp_path, "replay of a test\nsecond line")
    text = path.read_text()
    assert "exclude" not in text and text.startswith("# replay of a test\n# second line\n")
    assert "# cases[2]: a: 'quoted' # not a comment" in text
    spec = OPS["gemm"]
    cfg = config.load(path, spec.params, spec.defaults, op_name="gemm", op_types=spec.types)
    got = sorted((c.backend, c.dtype_in, c.dtype_out, c.param_dict["m"]) for c in cfg.expand(spec.params, "h100"))
    assert got == [("torch", "bf16", "bf16", 64), ("torch", "fp8", "bf16", 1), ("triton", "bf16", "bf16", 1)]


def test_a_written_config_the_loader_refuses_is_a_bug_naming_the_file(tmp_path, monkeypatch):
    from pytest_opperf.pipeline.mapping import configs

    real = configs.document
    monkeypatch.setattr(configs, "document", lambda op, chosen: {**real(op, chosen), "dtypes": ["fp17"]})
    with pytest.raises(configs.WrittenConfigError, match=r"gemm\.yaml: the config opperf wrote does not load .*fp17"):
        configs.write([configs.PlannedCase("gemm", "torch", "bf16", (("m", 1), ("n", 8), ("k", 8)))], tmp_path, "h")
    monkeypatch.setattr(configs, "document", lambda op, chosen: {**real(op, chosen), "backends": ["torch", "triton"]})
    with pytest.raises(configs.WrittenConfigError, match=r"gemm\.yaml: .* loads as 2 cases, not the 1 planned"):
        configs.write([configs.PlannedCase("gemm", "torch", "bf16", (("m", 1), ("n", 8), ("k", 8)))], tmp_path, "h")
