"""From the database alone (issue 75): kernel families, interpolation along them, the grid's plan."""

import json
import math
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.predict import grid
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay import families, lookup
from pytest_opperf.store import database


def _linear(tokens, batch=1, weight=(1024, 4096), view=False):
    x = f"T:bf16[{batch},{tokens},{weight[1]}]" + (f"/{tokens * 2 * weight[1]},{weight[1]},1" if view else "")
    return {"call": "aten::linear.default", "args": json.dumps([x, f"T:bf16[{weight[0]},{weight[1]}]", None])}


def test_a_linears_family_is_its_weight_and_its_axis_the_rows_whatever_the_batch():
    a = families.place("aten", _linear(512, batch=8), ("call", "args"))
    b = families.place("aten", _linear(4096, batch=1), ("call", "args"))
    assert a[0] == b[0] and a[1] == ("m",) and (a[2], b[2]) == ((4096,), (4096,))
    assert families.place("aten", _linear(512, weight=(4096, 4096)), ())[0] != a[0]   # another weight
    assert families.place("aten", _linear(512, batch=8, view=True), ())[0] != a[0]    # a view with gaps


def test_a_memory_bound_family_ignores_which_dims_are_1_and_sits_at_its_bytes():
    mul = lambda shape, rope: {"call": "aten::mul.Tensor", "args": json.dumps([f"T:bf16[{shape}]", f"T:bf16[{rope}]"])}
    one = families.place("aten", mul("1,32,4096,128", "1,1,4096,128"), ())
    many = families.place("aten", mul("8,32,512,128", "1,1,512,128"), ())
    assert one[0] == many[0] and one[1] == ("bytes",)
    assert one[2] == ((32 * 4096 * 128 + 4096 * 128) * 2,)
    norm = families.place("aten", {"call": "aten::mean.dim", "args": '["T:fp32[8,512,128]",[-1],true,null]'}, ())
    wide = families.place("aten", {"call": "aten::mean.dim", "args": '["T:fp32[8,512,4096]",[-1],true,null]'}, ())
    assert norm[0] != wide[0]  # a row of 128 is not a row of 4096


def test_estimate_interpolates_in_log_space_and_says_when_it_extrapolates():
    points = {(256,): math.log(10.0), (1024,): math.log(40.0), (4096,): math.log(320.0)}
    at, how, extrapolated = families.estimate(points, (512,), ("m",))
    assert math.exp(at) == pytest.approx(20.0) and not extrapolated and "between m=256 and m=1024" in how
    below = families.estimate(points, (16,), ("m",))
    assert math.exp(below[0]) == pytest.approx(10.0) and below[2]            # flat below the smallest
    above = families.estimate(points, (8192,), ("m",))                         # slope 1.5 of the last segment
    assert math.exp(above[0]) == pytest.approx(320.0 * 2 ** 1.5) and above[2]
    assert families.estimate(points, (8193 * 2,), ("m",)) is None              # past twice the largest
    assert families.estimate({(256,): 1.0}, (512,), ("m",)) is None            # one point is no line


def test_two_axes_bilinear_where_the_four_corners_were_measured():
    # time = batch * length: bilinear in log space is exact on it
    points = {(b, s): math.log(b * s) for b in (2, 8) for s in (128, 1024)}
    at, how, extrapolated = families.estimate(points, (4, 512), ("batch", "seq"))
    assert math.exp(at) == pytest.approx(4 * 512) and not extrapolated


def test_held_out_errors_are_each_point_from_its_neighbours():
    points = {(m,): math.log(m) for m in (1, 2, 4, 8, 16)}  # a straight line in log-log: no error
    assert families.held_out(points, ("m",)) == pytest.approx([0.0, 0.0, 0.0])
    bent = {**points, (4,): math.log(4 * 1.1)}
    errors = families.held_out(bent, ("m",))
    assert max(abs(e) for e in errors) == pytest.approx(1 - 1 / 1.1)


def _db(path, rows, dtypes=("bf16", "bf16")):
    database.write(path, {"run_id": "r0", "device": "h100", "started_at": "2026-11-29T00:00:00+00:00"},
                   [{"op": "aten", "_params": ["call", "args"], **params, "dtype_in": dtypes[0], "dtype_out": dtypes[1],
                     "backend": "torch", "backend_version": "1", "knobs": "", "timer": "profiler", "cache": "cold",
                     "time_us": t, "run_id": "r0", "created_at": "2026-11-29T00:00:00+00:00"} for params, t in rows])
    return path


def _cast(tokens, src="bf16", dst="float32"):
    return {"call": "aten::to.dtype", "args": json.dumps([f"T:{src}[{tokens},4096]", f"D:{dst}", False, False, None])}


def test_a_cast_is_priced_from_the_rows_of_its_input_and_output_dtypes(tmp_path):
    """A signature's label bf16-fp32 (RMSNorm's upcast) reads rows of dtype_in bf16 and dtype_out fp32:
    before, the label was no dtype, and every cast of a step went unpriced."""
    db = _db(tmp_path / "h100.db", [(_cast(t), us) for t, us in ((256, 4.0), (4096, 64.0))], ("bf16", "fp32"))
    _db(db, [(_cast(t, "fp32", "bfloat16"), 100 * us) for t, us in ((256, 4.0), (4096, 64.0))], ("fp32", "bf16"))
    table = lookup.Table(db)
    up = table.answer("aten", _cast(1024), "bf16-fp32", "torch", "cold")
    assert up.kind == "interpolated" and up.time_us == pytest.approx(16.0) and up.dtype == "bf16-fp32"
    down = table.answer("aten", _cast(1024, "fp32", "bfloat16"), "fp32-bfloat16", "torch", "cold")
    assert down.time_us == pytest.approx(1600.0) and down.dtype == "fp32-bf16"
    with pytest.raises(ProfileError, match="--dtype=bf16-nope: unknown dtype"):
        table.answer("aten", _cast(256), "bf16-nope", "torch")


def test_a_table_answers_an_unmeasured_linear_from_its_family_and_holds_out_its_sizes(tmp_path):
    db = _db(tmp_path / "h100.db", [(_linear(t), us) for t, us in ((256, 10.0), (1024, 40.0), (4096, 160.0))])
    table = lookup.Table(db)
    answer = table.answer("aten", _linear(64, batch=8), "bf16", "torch", "cold")
    assert answer.kind == "interpolated" and answer.time_us == pytest.approx(20.0)
    assert table.held_out([answer]) == pytest.approx([0.0])  # 1024 from 256 and 4096 on a line of slope 1
    assert table.answer("aten", _linear(1024), "bf16", "torch").kind == "measured"
    assert table.answer("aten", _linear(6000), "bf16", "torch").kind == "extrapolated"


def test_grid_sizes_and_their_errors():
    assert grid.sizes("1:64:6", "--batches") == [1, 2, 5, 12, 28, 64]
    assert grid.configurations([1, 64], [16, 8192], 65536) == [(1, 16), (1, 8192), (64, 16)]
    for bad in ("0:8:3", "8:1:3", "1:8:1", "a,b", "-2"):
        with pytest.raises(ProfileError, match="--batches="):
            grid.sizes(bad, "--batches")


def test_grid_plans_a_models_cases_spaced_along_their_families(tmp_path, capsys):
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
                                  "vocab_size": 256, "dtype": "float32"}))
    assert main(["grid", str(config), "--device", "h100", "--batches", "1,4", "--prompts", "8,32,128",
                 "--max-tokens", "256", "-o", str(tmp_path / "g"), "--plan-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["configurations"] == [[1, 8], [1, 32], [1, 128], [4, 8], [4, 32]]
    assert 0 < out["cases"] < out["gathered"] and out["exit_codes"] == [None] * len(out["sweeps"]) != []
    files = [Path(f) for s in out["sweeps"] for f in s["files"]]
    assert all(f.is_file() for f in files) and {f.stem for f in files} >= {"aten", "attention_prefill"}
    # the HBM budget leaves out the cases whose memory estimate exceeds it, and says how many
    assert main(["grid", str(config), "--device", "h100", "--batches", "1,4", "--prompts", "8,32,128",
                 "--max-tokens", "256", "-o", str(tmp_path / "h"), "--plan-only", "--json", "--max-hbm-gb", "0.0002"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["over_budget"] > 0 and small["cases"] + small["over_budget"] == out["cases"]
    assert main(["grid", str(config), "--device", "h100", "--batches", "x", "--plan-only"]) == 2
    assert "--batches=x: expected" in capsys.readouterr().err


DATA = Path(__file__).parent / "data" / "grid"


def test_an_h200s_grid_prices_a_family_on_this_cpu_the_same_whatever_gpu_is_here(tmp_path, monkeypatch, capsys):
    """Rows an H200 wrote (tests/data/grid) price AFM-4.5B here, read off their kernel families, with the
    interpolation's held-out error; and a GPU on this machine changes nothing (auto attention is the
    rule when the prices come from rows, not the local GPU's choice)."""
    pytest.importorskip("transformers")
    import shutil

    from pytest_opperf.pipeline.predict import trace

    db = tmp_path / "h200.db"
    shutil.copy(DATA / "h200.db", db)
    args = ["predict", str(DATA / "afm_4_5b" / "config.json"), "--layers", "2", "--batch", "8", "--prefill", "512",
            "--decode", "2", "--db", str(db), "--json"]
    assert main([*args, "-o", str(tmp_path / "a")]) == 0
    here = json.loads(capsys.readouterr().out)["configurations"][0]
    rows = here["priced"]["rows"]
    phases = {p["phase"]: p for p in rows["phases"]}
    for phase in ("prefill", "decode"):
        assert phases[phase]["step_us"] > 0 and phases[phase]["share"]["interpolated"] > 0.9
    assert rows["held_out"]["sizes"] > 100 and 0 < rows["held_out"]["median_abs"] < 0.05
    assert "the rule" in here["assumptions"]["attention"]

    asked = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(trace._Attention, "_ask_cuda", lambda self, *a: asked.append(a) or "cudnn")
    assert main([*args, "-o", str(tmp_path / "b")]) == 0
    there = json.loads(capsys.readouterr().out)["configurations"][0]
    assert not asked
    assert [p["step_us"] for p in there["priced"]["rows"]["phases"]] == [p["step_us"] for p in rows["phases"]]


@pytest.mark.parametrize("extra, message", [
    (["--spacing", "0.5"], "--spacing=0.5: expected a factor of 1 or more"),
    (["--max-tokens", "0"], "--max-tokens=0: expected a positive int"),
    (["--max-tokens", "4", "--plan-only"], "--max-tokens=4: no batch x prompt of the grid fits it"),
    (["--layers", "0"], "--layers=0: expected a positive int"),
    (["--prompts", "8:2:3"], "--prompts=8:2:3: expected LO:HI:N"),
    (["--benches", "nowhere"], "--benches nowhere: no such directory of bench tests"),
    (["--db", "results/other.db"], "--db results/other.db: the sweep writes rows to <results>/<device>.db"),
    (["--routing", "uneven", "--plan-only"], "--routing=uneven"),
], ids=["spacing", "max-tokens", "nothing-fits", "layers", "prompts", "benches", "db-name", "routing"])
def test_grid_refuses_bad_options_in_one_line_before_any_sweep(tmp_path, monkeypatch, capsys, extra, message):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benches").mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                  "vocab_size": 256, "dtype": "float32"}))
    assert main(["grid", str(config), "--device", "h100", "--batches", "2", "--prompts", "8", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()


def _priced(out: str) -> list:
    """(batch, prefill, the routing said, each phase's step time) of each configuration of an answer."""
    rows = json.loads(out)["configurations"]
    return [(r["batch"], r["prefill"], r["assumptions"]["experts"],
             [(p["phase"], p["step_us"], p["share"]) for p in r["priced"]["rows"]["phases"]]) for r in rows]


def test_configurations_priced_side_by_side_answer_as_each_does_alone(tmp_path, monkeypatch, capsys):
    """--jobs 2 traces and prices configurations in two forked processes: the same answer as one process,
    and a configuration's answer (its random routing included) the one it gets priced alone."""
    pytest.importorskip("transformers")
    import shutil

    from pytest_opperf.pipeline.predict import answer
    from test_predict_trace import MOE, _config

    db = tmp_path / "h200.db"
    shutil.copy(DATA / "h200.db", db)
    pools = []

    class Spy(answer.ProcessPoolExecutor):
        def __init__(self, workers, **kwargs):
            pools.append(workers)
            super().__init__(workers, **kwargs)

    monkeypatch.setattr(answer, "ProcessPoolExecutor", Spy)
    args = ["predict", str(_config(tmp_path, MOE, "bfloat16")), "--db", str(db), "--decode", "2", "--json"]
    assert main([*args, "--batch", "1,4", "--prefill", "8,32", "--jobs", "2", "-o", str(tmp_path / "a")]) == 0
    side_by_side = _priced(capsys.readouterr().out)
    assert pools == [2]
    assert main([*args, "--batch", "1,4", "--prefill", "8,32", "--jobs", "1", "-o", str(tmp_path / "b")]) == 0
    assert _priced(capsys.readouterr().out) == side_by_side and pools == [2]
    assert main([*args, "--batch", "4", "--prefill", "32", "-o", str(tmp_path / "c")]) == 0
    alone = _priced(capsys.readouterr().out)
    assert alone == [side_by_side[-1]] and "random" in alone[0][2]
    assert main([*args, "--batch", "1", "--prefill", "8", "--jobs", "0", "-o", str(tmp_path / "d")]) == 2
    assert "--jobs=0: expected 1 or more" in capsys.readouterr().err


def test_a_random_router_restarts_at_its_seed_for_each_trace():
    from pytest_opperf.pipeline.predict import trace

    router = trace.Random()
    router.tokens = 64
    first = [router(128, 16), router(128, 16)]
    assert first[0] != first[1] and first[0][-1] == 128
    router.restart()
    assert [router(128, 16), router(128, 16)] == first


def test_a_pricing_process_that_dies_ends_the_command_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import os
    import shutil

    from pytest_opperf.pipeline.predict import answer
    from test_predict_trace import DENSE, _config

    db = tmp_path / "h200.db"
    shutil.copy(DATA / "h200.db", db)
    monkeypatch.setattr(answer, "_traced_and_priced", lambda *args: os._exit(9))  # as the OOM killer would
    assert main(["predict", str(_config(tmp_path, DENSE, "bfloat16")), "--db", str(db), "--batch", "1,2",
                 "--prefill", "8", "--jobs", "2", "-o", str(tmp_path / "a")]) == 2
    assert "a process pricing configurations ended before its answer" in capsys.readouterr().err


def test_priced_from_rows_each_calls_cache_state_is_read_against_the_databases_device():
    """No --device: the L2 of the device the rows were measured on (an H100's 50 MB); measured here,
    this machine's GPU's as before (none on a CPU); --device wins. The H200's spec has no L2 (NVIDIA
    publishes none): its calls stay cold."""
    from pytest_opperf.pipeline.predict import answer

    assert answer.l2_mb(answer.Ask("m", 1, db=Path("h100.db")), "h100") == 50
    assert answer.l2_mb(answer.Ask("m", 1, db=Path("h100.db"), device="a100"), "h100") == 40
    assert answer.l2_mb(answer.Ask("m", 1, db=Path("h200.db")), "h200") is None
    if not __import__("torch").cuda.is_available():
        assert answer.l2_mb(answer.Ask("m", 1, measure=True, db=Path("h100.db")), "h100") is None
