"""The model's time rebuilt from the replays: the cache state per signature and the model-level
figures of the replay report (issue 37)."""

import argparse
import json
from pathlib import Path

import pytest
import torch

from pytest_opperf.catalog import replay
from pytest_opperf.cli import main
from pytest_opperf.pipeline.mapping import bind, cachestate, profile, tag
from pytest_opperf.pipeline.replay import report as replay_report
from test_pipeline_replay import signature_row

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(__file__).parent / "data" / "traces"


def test_the_cache_state_follows_the_inputs_against_the_l2_and_weights_replay_cold():
    l2 = 50 * 2**20
    # two 1024 x 4096 bf16 = 16 MiB: fit half the H100's 50 MiB L2
    assert cachestate.choose("aten::add", "1024,4096;1024,4096", "c10::BFloat16;c10::BFloat16", l2)[0] == "hot"
    # with a 4096 x 4096 bf16 operand (32 MiB) beside it: 48 MiB, more than half
    cache, why = cachestate.choose("aten::mm", "2048,4096;4096,4096", "c10::BFloat16;c10::BFloat16", l2)
    assert cache == "cold" and "48.00 MiB of inputs exceed half the 50 MiB L2" in why
    assert cachestate.choose("aten::add", "8,8", "float", None)[0] == "cold"
    # a decode step's linear: a 2 MiB weight against a 1 KiB activation: the weight was not just written
    cache, why = cachestate.choose("aten::linear", "1,1,512;2048,512;2048", "c10::BFloat16;c10::BFloat16;"
                                   "c10::BFloat16", l2)
    assert cache == "cold" and "its weights (2.00 MiB) outweigh its other inputs" in why
    # GPT-2's Conv1D: addmm(bias, x, weight); a prefill whose activations outweigh the weight stays hot
    assert cachestate.choose("aten::addmm", "384;1,384;384,1152", "float;float;float", l2)[0] == "cold"
    assert cachestate.choose("aten::linear", "1,4096,512;512,512;", "c10::BFloat16;c10::BFloat16;", l2)[0] == "hot"
    # a norm's weight is a weight of no slot in the table: the norm reads the activation, hot
    assert cachestate.choose("aten::mul", "512;1,1,512", "c10::BFloat16;c10::BFloat16", l2)[0] == "hot"


def test_an_h100_trace_names_its_l2_and_its_signatures_get_a_cache_state(tmp_path):
    trace = TRACES / "h100_deepseek_v3_tf517.json.gz"
    assert cachestate.l2_bytes_of_trace(trace) == 50 * 2**20
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    assert {r["cache"] for r in rows} == {"hot", "cold"}
    for r in rows:
        sizes = cachestate.slot_bytes(r["input_shapes"], r["input_dtypes"])
        weights = sum(sizes[i] for i in cachestate.WEIGHTS.get(r["op_type"], ()) if i < len(sizes)) if sizes else 0
        fits = sizes is not None and sum(sizes) <= 25 * 2**20
        assert (r["cache"] == "hot") == (fits and 2 * weights <= sum(sizes)), r
    decode = [r for r in rows if r["op_type"] == "aten::linear" and r["input_shapes"].startswith("1,1,")]
    assert decode and {r["cache"] for r in decode} == {"cold"}


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
from pytest_opperf.pipeline.reading.capture import capture

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
    table.write_text(json.dumps({"profile": "t0k3n", "cases": {tag.case_key("gemm", "torch", "bf16", {"m": 8}): [3]}}))
    read = tag.read_table(str(table))
    assert read["cases"]['["gemm", "torch", "bf16", {"m": 8}]'] == [3]
    table.write_text("[]")
    with pytest.raises(argparse.ArgumentTypeError, match="not a signatures.json of opperf import --configs"):
        tag.read_table(str(table))


def test_hot_and_cold_cases_go_to_their_own_configs_and_the_tag_table(tmp_path, capsys):
    trace = TRACES / "h100_deepseek_v3_tf517.json.gz"
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db"), "--configs", str(tmp_path / "replay")]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("pytest ")]
    assert len(printed) == 2 and all("-p pytest_opperf.pipeline.mapping.tag --opperf-signatures=" in ln for ln in printed)
    assert {p.read_text().splitlines()[-1] for p in (tmp_path / "replay").glob("*.yaml")} == {"cache: cold"}
    assert {p.read_text().splitlines()[-1] for p in (tmp_path / "replay" / "hot").glob("*.yaml")} == {"cache: hot"}
    table = json.loads((tmp_path / "replay" / "signatures.json").read_text())
    assert table["profile"] == profile.import_token(tmp_path / "profile.db")
    rows = {r["id"]: r for r in profile.load(tmp_path / "profile.db")}
    for key, ids in table["cases"].items():
        assert all(rows[i]["op"] == json.loads(key)[0] for i in ids)
    assert sorted(i for ids in table["cases"].values() for i in ids) == sorted(
        i for i, r in rows.items() if r["status"] == "mapped")


INDEXED = """
import torch
from pytest_opperf.pipeline.reading.capture import capture

rows, ids, vals = torch.randn(10, 16), torch.tensor([1, 3, 5, 7]), torch.randn(4, 16)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}"):
    rows[ids]
    rows[ids] = vals          # index_put_: its count is its values' rows, which the trace holds
    rows[ids[:2]]
prof.export_chrome_trace(r"{path}")
"""


def test_the_capture_counts_the_index_calls_the_trace_holds_and_nothing_else(tmp_path):
    trace = tmp_path / "trace.json"
    exec(INDEXED.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    assert json.loads((tmp_path / "trace.capture.json").read_text())["index_counts"] == [4, 2]
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    counts = sorted(json.loads(json.loads(r["params"])["args"])[1][0] for r in rows if r["op_type"] == "aten::index")
    assert counts == ["T:i64[2]", "T:i64[4]"]
    assert all(not r["proxy"] for r in rows if r["op_type"] in ("aten::index", "aten::index_put_"))


LATER_DIM = """
import torch
from pytest_opperf.pipeline.reading.capture import capture

fused = torch.randn(1, 8, 6, 16)  # Falcon's fused query, key and value: [batch, tokens, heads + 2, head_dim]
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}"):
    fused[..., [-2], :]       # the key head: indices [None, None, tensor([-2])]
    fused[[0]]                # dim 0, as before
prof.export_chrome_trace(r"{path}")
"""


def test_an_index_over_a_later_dim_replays_over_that_dim(tmp_path):
    """x[..., [-2], :] gathers one head of dim 2; replayed over dim 0 it copied the whole tensor
    (Falcon-7B on an H200: 19.6 us in sequence where the model took 3.5 us)."""
    trace = tmp_path / "trace.json"
    exec(LATER_DIM.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    assert json.loads((tmp_path / "trace.capture.json").read_text())["index_counts"] == [[1, 2], 1]
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    args = sorted((json.loads(r["params"])["args"] for r in rows if r["op_type"] == "aten::index"), key=len)
    assert json.loads(args[1])[1] == [None, None, "T:i64[1]"] and json.loads(args[0])[1] == ["T:i64[1]"]
    built = replay.build("aten::index.Tensor", args[1], "cpu", torch.Generator().manual_seed(0))
    fn, inputs = built[0], built[1:]
    assert fn(*inputs).shape == (1, 8, 1, 16)  # one head gathered, not the whole tensor
    assert 0 <= int(inputs[1][2]) < 6  # an index within the dim it indexes
    assert all(not r["proxy"] for r in rows if r["op_type"] == "aten::index")


def test_a_first_version_capture_of_an_h100_deepseek_v3_run_imports_with_its_counts(tmp_path, capsys):
    # capture files of version 1 also counted index_put_: 36 counts for 27 aten::index calls
    trace = TRACES / "h100_deepseek_v3_capture_v1.json.gz"
    saved = json.loads((TRACES / "h100_deepseek_v3_capture_v1.capture.json").read_text())
    assert saved["version"] == 1 and len(saved["index_counts"]) == 36
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db")]) == 0, capsys.readouterr().err
    rows = profile.load(tmp_path / "profile.db")
    index = {r["input_shapes"]: json.loads(json.loads(r["params"])["args"])[1][0]
             for r in rows if r["op_type"] == "aten::index"}
    # the prefill's routing picks 4096 of 512 x 8 slots; each decode step 8
    assert index["512,512;"] == "T:i64[4096]" and index["8,512;"] == "T:i64[8]", index
    assert all(not r["proxy"] for r in rows if r["op_type"] == "aten::index")
    experts = [json.loads(json.loads(r["params"])["args"])[2] for r in rows if r["op_type"] == "aten::_grouped_mm"]
    assert experts and all("=" in e for e in experts)  # the routing that ran


def test_a_host_number_copied_to_the_device_imports_from_the_h100_gemma2_trace(tmp_path, capsys):
    # generate()-style torch.tensor(5).to("cuda"): a 0-dim int64 read from host memory, marked so once
    b = bind.bind("aten::_to_copy", [None, None, None, None, None, None, None], [None] * 7,
                  ["long int", "Scalar", "Scalar", "", "", "Scalar", ""], ["", "4", "0", "", "", "False", ""],
                  host_input=True)
    assert json.loads(b.args)[0] == "T:i64[]@host"
    trace = TRACES / "h100_gemma2_tf517.json.gz"
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db")]) == 0, capsys.readouterr().err
    rows = profile.load(tmp_path / "profile.db")
    assert sum(r["share"] for r in rows if r["status"] == "mapped") > 0.99
    host = [r for r in rows if "@host" in (r["params"] or "")]
    assert host and not any("@host@host" in r["params"] for r in host)
    built = replay.build(json.loads(host[0]["params"])["call"], json.loads(host[0]["params"])["args"], "cpu",
                         torch.Generator().manual_seed(0))
    assert built[1].dim() == 0 and built[1].device.type == "cpu"  # [0] is the call, [1] its first input


def test_one_signature_that_cannot_be_built_is_its_reason_never_the_import_s_end(tmp_path, monkeypatch, capsys):
    from pytest_opperf.pipeline.mapping import rules as mapping

    real = mapping.Mapping.resolve

    def resolve(self, sig):
        if sig.op_type == "aten::mean":
            raise ValueError("aten: 'T:i64[]@host@host' is not a tensor's text")
        return real(self, sig)

    monkeypatch.setattr(mapping.Mapping, "resolve", resolve)
    trace = TRACES / "h100_gemma2_tf517.json.gz"
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db")]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "unreplayable: aten::mean" in out.out
    means = [r for r in profile.load(tmp_path / "profile.db") if r["op_type"] == "aten::mean"]
    assert means and all(r["status"] == "unreplayable" and "opperf cannot build a replay of this call" in r["reason"]
                         and "Error" not in r["reason"] and "pytest_opperf" not in r["reason"] for r in means)


BOTH = """
import torch

x, w, b, a = torch.randn(1, 64), torch.randn(4096, 64), torch.randn(4096), torch.randn(64, 64)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof:
    for _ in range(3):
        torch.nn.functional.linear(x, w, b)   # a 1 MiB weight: cold
        torch.cumsum(a, 0)                    # 16 KiB of activations: hot
prof.export_chrome_trace(r"{path}")
"""


def test_every_signature_replays_in_both_states_and_backfill_keeps_the_chosen_one(pytester):
    from pytest_opperf.pipeline.replay import backfill
    from conftest import FAST

    trace = pytester.path / "trace.json"
    exec(BOTH.format(path=trace), {})  # noqa: S102  (our own script: a real torch.profiler trace)
    db, results = pytester.path / "profile.db", pytester.path / "results" / "cpu.db"
    assert main(["import", str(trace), "-o", str(db), "--configs", str(pytester.path / "replay"), "--l2-mb", "1"]) == 0
    rows = {r["id"]: r for r in profile.load(db) if r["status"] == "mapped"}
    assert {r["cache"] for r in rows.values()} == {"hot", "cold"}
    (pytester.path / "benches").mkdir()
    for state in ("hot", "cold"):  # every config in both states, the way benchmarks/acceptance/pipeline_models.py runs them
        for where in (pytester.path / "replay", pytester.path / "replay" / "hot"):
            configs = sorted(where.glob("*.yaml"))
            (pytester.path / "benches" / "test_replay.py").write_text("".join(
                f"def test_{c.stem}(backend, inputs, bench):\n    bench(backend, *inputs)\n\n\n" for c in configs))
            result = pytester.runpytest("benches/", *FAST, *[f"--opperf-config={c}" for c in configs],
                                        f"--opperf-cache={state}", "-p", "pytest_opperf.pipeline.mapping.tag",
                                        f"--opperf-signatures={pytester.path / 'replay' / 'signatures.json'}")
            assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()[-3000:]
    times = backfill.replayed_by_state(db, results)
    assert set(times) == set(rows) and all(set(t) == {"hot", "cold"} for t in times.values())
    assert main(["backfill", str(db), str(results)]) == 0
    for r in profile.load(db):
        if r["status"] == "mapped":
            assert r["replayed_us"] == times[r["id"]][r["cache"]], r
    # the benchmark's second line: the sums under the chosen states, all cold and all hot
    import importlib.util

    spec = importlib.util.spec_from_file_location("pipeline_models", ROOT / "benchmarks" / "acceptance" / "pipeline_models.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = bench.state_figures(db, results)
    assert figures["signatures"] == len(rows) and abs(figures["share"] - 1) < 1e-9
    for name, state in (("cold", "cold"), ("hot", "hot")):
        replayed = sum(times[i][state] * r["count"] for i, r in rows.items())
        assert abs(figures[name]["sum_ratio"] - replayed / sum(r["profiled_total_us"] for r in rows.values())) < 1e-9
    # the replay report puts the same bounds beside the estimate; without the results database it says how
    reports = pytester.path / "reports"
    assert main(["replay-report", str(db), "-o", str(reports), "--results", str(results)]) == 0
    text = (reports / "replay_report.md").read_text()
    assert (f"sum ratio {figures['chosen']['sum_ratio']:.4f} in the chosen states, between "
            f"{figures['hot']['sum_ratio']:.4f} all hot and {figures['cold']['sum_ratio']:.4f} all cold") in text
    assert main(["replay-report", str(db), "-o", str(reports)]) == 0
    assert "All-cold and all-hot bounds: not measured" in (reports / "replay_report.md").read_text()
    line = bench._line("tiny", {"mapped_share": 1.0, "states": figures, "sum_ratio": 1.0, "weighted_error": 0.0})
    assert "replayed in both states: chosen " in line and ", cold " in line and ", hot " in line
    printed = "replay configs (cold cache) in R; run them with:\n  pytest a\nreplay configs (hot cache) in R/hot; " \
              "run them with:\n  pytest b\n"
    assert bench._sweeps(printed) == [("pytest a", "cold"), ("pytest b", "hot")]


BELOW_THE_HOOK = """
import torch
from pytest_opperf.pipeline.reading.capture import capture

lib = torch.library.Library("opperf_test_hook", "DEF")
lib.define("pick(Tensor x, Tensor ids) -> Tensor")
lib.impl("pick", lambda x, ids: x[ids] * 1, "CompositeExplicitAutograd")
rows, ids = torch.randn(10, 16), torch.tensor([1, 3, 5, 7])
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}"):
    rows[ids]
    torch.ops.opperf_test_hook.pick(rows, ids[:2])   # its kernel indexes below the capture's hook
prof.export_chrome_trace(r"{path}")
"""


def test_an_index_call_the_capture_s_hook_never_saw_is_not_one_of_its_calls(tmp_path):
    trace = tmp_path / "trace.json"
    exec(BELOW_THE_HOOK.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    assert json.loads((tmp_path / "trace.capture.json").read_text())["index_counts"] == [4]
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    counted = {json.loads(json.loads(r["params"])["args"])[1][0]: r["proxy"] for r in rows
               if r["op_type"] == "aten::index"}
    # the call the hook saw has its count; the one inside pick keeps the stated assumption (all 10 rows)
    assert counted == {"T:i64[4]": 0, "T:i64[10]": 1}


def test_the_models_benchmark_runs_every_sweep_to_its_end_and_each_in_cold_and_hot_too(tmp_path, monkeypatch):
    import importlib.util
    import subprocess
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("pipeline_models", ROOT / "benchmarks" / "acceptance" / "pipeline_models.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    printed = ("replay configs (cold cache) in R; run them with:\n  pytest a\n"
               "replay configs (resident cache) in R/resident; run them with:\n  pytest b\n")
    imported = []
    monkeypatch.setattr(bench, "cli", lambda args, log, timeout: (imported.append(args), (0, printed))[1])
    ran = []

    def run(cmd, timeout=None, **kw):
        ran.append((cmd[3], [c for c in cmd if c.startswith("--opperf-cache=")][0], timeout))
        return SimpleNamespace(stdout="1 passed", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    out = bench.replay("tiny", tmp_path, "0.05", 0, "both", "inputs")
    assert "no results database" in out["error"]  # the sweeps were faked: nothing was written
    assert imported[0][-3:] == ["--cache-rule", "inputs", "--force"]
    # no timeout on any sweep; the resident sweep again all cold and all hot, the cold one again hot
    assert ran == [("a", "--opperf-cache=cold", None), ("b", "--opperf-cache=resident", None),
                   ("a", "--opperf-cache=hot", None), ("b", "--opperf-cache=cold", None),
                   ("b", "--opperf-cache=hot", None)]
