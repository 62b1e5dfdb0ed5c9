"""The model's time rebuilt from the replays: the cache state per signature and the model-level
figures of the replay report (issue 37)."""

import argparse
import json
from pathlib import Path

import pytest
import torch

from pytest_opperf.catalog import replay
from pytest_opperf.cli import main
from pytest_opperf.pipeline import cachestate, profile, replay_report, tag
from test_pipeline_replay import signature_row

TRACES = Path(__file__).parent / "data" / "traces"


def test_the_cache_state_follows_the_inputs_against_the_l2():
    l2 = 50 * 2**20
    # 2048 x 4096 bf16 = 16 MiB: fits half the H100's 50 MiB L2
    assert cachestate.choose("2048,4096", "c10::BFloat16", l2)[0] == "hot"
    # with a 4096 x 4096 bf16 weight (32 MiB) beside it: 48 MiB, more than half
    cache, why = cachestate.choose("2048,4096;4096,4096", "c10::BFloat16;c10::BFloat16", l2)
    assert cache == "cold" and "48.00 MiB of inputs exceed half the 50 MiB L2" in why
    assert cachestate.choose("8,8", "float", None)[0] == "cold"


def test_an_h100_trace_names_its_l2_and_its_signatures_get_a_cache_state(tmp_path):
    trace = TRACES / "h100_deepseek_v3_tf517.json.gz"
    assert cachestate.l2_bytes_of_trace(trace) == 50 * 2**20
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    assert {r["cache"] for r in rows} == {"hot", "cold"}
    for r in rows:
        size = cachestate.input_bytes(r["input_shapes"], r["input_dtypes"])
        assert (r["cache"] == "hot") == (size is not None and size <= 25 * 2**20), r


def test_the_report_sums_the_model_and_names_what_dominates_its_error(tmp_path):
    rows = [signature_row(1, "aten::mm", 10, 10.0, 100.0, replayed_us=12.0),   # +20 us
            signature_row(2, "aten::add", 20, 2.5, 50.0, replayed_us=2.0),     # -10 us
            signature_row(3, "aten::cat", 1, 50.0, 50.0)]                      # not replayed
    m = replay_report.model_figures(rows)
    assert (m.replayed_sum_us, m.profiled_sum_us, m.abs_error_us) == (160.0, 150.0, 30.0)
    assert abs(m.covered - 0.75) < 1e-12 and [r["op_type"] for r, _ in m.dominant] == ["aten::mm", "aten::add"]
    text = replay_report.markdown(rows, tmp_path / "p.db")
    assert "a sum ratio of 1.0667 (+6.7%); time-weighted |error| 20.0%" in text
    assert "| `aten::mm` | `1,1` | - | 100.0 | 120.0 | 66.7% |" in text


CAPTURED = """
import torch
from pytest_opperf.pipeline.capture import capture

x, w = torch.randn(12, 16, dtype=torch.bfloat16), torch.randn(3, 16, 8, dtype=torch.bfloat16)
rows, ids = torch.randn(10, 16), torch.tensor([1, 3, 5, 7])
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}"):
    for offs in ([2, 9, 12], [5, 6, 12]):  # routing that is not even, and differs per call
        torch._grouped_mm(x, w, offs=torch.tensor(offs, dtype=torch.int32))
        rows[ids]
prof.export_chrome_trace(r"{path}")
"""


def test_captured_routing_and_index_counts_replay_as_they_ran(tmp_path):
    trace = tmp_path / "trace.json"
    exec(CAPTURED.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    assert (tmp_path / "trace.capture.json").is_file()
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    experts = {json.loads(r["params"])["args"] for r in rows if r["op_type"] == "aten::_grouped_mm"}
    assert experts == {'["T:bf16[12,16]","T:bf16[3,16,8]","T:i32[3]=2,9,12",null,null]',
                       '["T:bf16[12,16]","T:bf16[3,16,8]","T:i32[3]=5,6,12",null,null]'}
    (index,) = [r for r in rows if r["op_type"] == "aten::index"]
    assert json.loads(json.loads(index["params"])["args"])[1] == ["T:i64[4]"] and not index["proxy"]
    # the replay uses the offsets that ran
    args = replay.build("aten::_grouped_mm.default", sorted(experts)[1], "cpu", torch.Generator().manual_seed(0))
    assert args[3].tolist() == [5, 6, 12]
    # a capture of another run (one call fewer) is refused, not joined wrongly
    saved = json.loads((tmp_path / "trace.capture.json").read_text())
    saved["grouped_mm_offsets"].pop()
    (tmp_path / "trace.capture.json").write_text(json.dumps(saved))
    assert main(["import", str(trace), "-o", str(tmp_path / "other.db")]) == 2
    # without a capture: even groups, and the report says it assumed them
    (tmp_path / "trace.capture.json").unlink()
    rows = profile.import_profile(trace, tmp_path / "even.db")
    assert {r["op"] for r in rows if r["op_type"] == "aten::_grouped_mm"} == {"grouped_gemm"}
    text = replay_report.markdown(profile.load(tmp_path / "even.db"), tmp_path / "even.db")
    assert "replay with tokens split evenly over the experts" in text


def test_the_replay_tag_reads_the_import_s_table_or_says_what_is_wrong(tmp_path):
    table = tmp_path / "signatures.json"
    table.write_text(json.dumps({"profile": "t0k3n", "cases": {tag.case_key("gemm", "torch", "bf16", {"m": 8}, "hot"): [3]}}))
    read = tag.read_table(str(table))
    assert read["cases"]['["gemm", "torch", "bf16", {"m": 8}, "hot"]'] == [3]
    table.write_text("[]")
    with pytest.raises(argparse.ArgumentTypeError, match="not a signatures.json of opperf import --configs"):
        tag.read_table(str(table))


def test_hot_and_cold_cases_go_to_their_own_configs_and_the_tag_table(tmp_path, capsys):
    trace = TRACES / "h100_deepseek_v3_tf517.json.gz"
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db"), "--configs", str(tmp_path / "replay")]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("pytest ")]
    assert len(printed) == 2 and all("-p pytest_opperf.pipeline.tag --opperf-signatures=" in ln for ln in printed)
    assert {p.read_text().splitlines()[-1] for p in (tmp_path / "replay").glob("*.yaml")} == {"cache: cold"}
    assert {p.read_text().splitlines()[-1] for p in (tmp_path / "replay" / "hot").glob("*.yaml")} == {"cache: hot"}
    table = json.loads((tmp_path / "replay" / "signatures.json").read_text())
    assert table["profile"] == profile.import_token(tmp_path / "profile.db")
    rows = {r["id"]: r for r in profile.load(tmp_path / "profile.db")}
    for key, ids in table["cases"].items():
        assert all(rows[i]["cache"] == json.loads(key)[-1] and rows[i]["op"] == json.loads(key)[0] for i in ids)
    assert sorted(i for ids in table["cases"].values() for i in ids) == sorted(
        i for i, r in rows.items() if r["status"] == "mapped")
