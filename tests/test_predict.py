"""opperf predict: a model's step, its calls counted as the model runs them, each priced by lookup."""

import json

import pytest
import torch

from pytest_opperf.cli import main
from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.pipeline.predict import models, idealised as predict
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.store import database


def _calls(name: str, phase: str, batch: int = 1, prefill: int = 1024, decode: int = 8, tp: int = 1) -> dict:
    """(op, what) -> (params, count) of one step."""
    model = models.load()[name]
    return {(c.case.op, c.case.comment.split(": ", 1)[1]): (dict(c.case.params), c.count)
            for c in predict.step_calls(model, tp, batch, prefill, decode, phase)}


def test_a_dense_step_counts_each_call_as_the_model_runs_it():
    calls = _calls("llama3.2-1b", "decode", batch=4)
    # 16 layers: qkv, o, two residual norms, rotary, attention, the MLP and the cache write each layer
    assert calls[("gemm", "qkv_proj")] == ({"m": 4, "n": (32 + 2 * 8) * 64, "k": 2048}, 16)
    assert calls[("add_rmsnorm", "input/post-attention norm with the residual")][1] == 32
    assert calls[("gemm", "MLP gate_up_proj")] == ({"m": 4, "n": 2 * 8192, "k": 2048}, 16)
    # decode attends to the cache of the middle decode step: 1024 prompt tokens and 8 // 2 generated
    attention = calls[("attention_decode", "attention over the cache")]
    assert attention[0]["kv_len"] == 1028 and attention[0]["batch"] == 4 and attention[1] == 16
    cache = calls[("kv_cache_write", "the new K and V into the paged cache")]
    assert cache == ({"tokens": 4, "kv_heads": 8, "head_dim": 64, "page_size": 16, "pages": 4 * 1032 // 16}, 16)
    # once a step: the embedding, the final norm, the LM head over the last token, sampling
    for key in (("embedding", "embed_tokens (vocab split over tp)"), ("rmsnorm", "final norm"),
                ("gemm", "lm_head (last token per sequence)"), ("sampling", "next-token sampling")):
        assert calls[key][1] == 1, key
    prefill = _calls("llama3.2-1b", "prefill", batch=2)
    assert prefill[("gemm", "qkv_proj")][0]["m"] == 2 * 1024 and prefill[("gemm", "lm_head (last token per sequence)")][0]["m"] == 2


def test_moe_and_mla_steps_count_their_own_layers():
    mixtral = _calls("mixtral-8x7b", "decode")
    assert mixtral[("grouped_gemm", "MoE experts gate_up (balanced routing)")][1] == 32  # every layer is MoE
    assert not any(what.startswith("MLP") for _, what in mixtral)
    dsv3 = _calls("dsv3", "decode", tp=8)
    assert dsv3[("gemm", "dense MLP gate_up_proj")][1] == 3  # first_k_dense_replace
    assert dsv3[("grouped_gemm", "MoE experts gate_up (balanced routing)")][1] == 61 - 3
    assert dsv3[("mla_decode", "MLA decode, weights absorbed")][1] == 61
    assert not any(op == "kv_cache_write" for op, _ in dsv3)  # MLA's latent cache: not the paged K/V write


def _h100_db(path, rows):
    """A results database of h100 holding these gemm rows ((m, n, k, time_us))."""
    records = [{"op": "gemm", "_params": ["m", "n", "k"], "m": m, "n": n, "k": k, "dtype_in": "bf16",
                "dtype_out": "bf16", "backend": "torch", "backend_version": "1", "knobs": "", "timer": "profiler",
                "cache": "cold", "time_us": t, "run_id": "r0", "created_at": "2026-11-28T00:00:00+00:00"}
               for m, n, k, t in rows]
    database.write(path, {"run_id": "r0", "device": "h100", "started_at": "2026-11-28T00:00:00+00:00"}, records)
    return path


def test_a_prediction_is_the_sum_of_its_priced_calls_and_says_where_each_came_from(tmp_path, capsys):
    # qkv_proj of the decode step measured at 10 us; o_proj bracketed by two rows (interpolated)
    db = _h100_db(tmp_path / "h100.db", [(1, 3072, 2048, 10.0), (1, 2048, 1024, 4.0), (1, 2048, 4096, 16.0)])
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "h100" and out["model"] == "llama3.2-1b"
    decode = out["phases"]["decode"]
    by_what = {c["what"]: c for c in decode["calls"]}
    qkv = by_what["qkv_proj"]
    assert (qkv["kind"], qkv["time_us"], qkv["count"], qkv["total_us"]) == ("measured", 10.0, 16, 160.0)
    o_proj = by_what["o_proj"]  # k=2048, the geometric middle of 1024 and 4096: sqrt(4 * 16) = 8 us
    assert o_proj["kind"] == "interpolated" and o_proj["time_us"] == pytest.approx(8.0)
    # the LM head by the roofline, worked by hand: 2 x 1 x 128256 x 2048 FLOP against reading the
    # bf16 weight (and the tiny activations) at the H100's memory bandwidth
    head = by_what["lm_head (last token per sequence)"]
    spec = load_specs()["h100"]
    nbytes = (2048 + 2048 * 128256 + 128256) * 2
    expected = max(2 * 128256 * 2048 / spec.peak_flops("bf16", "matrix"), nbytes / spec.mem_bw_bytes_per_s) * 1e6
    assert head["kind"] == "roofline" and head["time_us"] == pytest.approx(expected)
    assert decode["step_us"] == pytest.approx(sum(c["total_us"] for c in decode["calls"]))
    assert decode["share"]["measured"] == pytest.approx(160.0 / decode["step_us"])
    assert decode["share"]["interpolated"] == pytest.approx(8.0 * 16 / decode["step_us"])
    assert [c["total_us"] for c in decode["calls"]] == sorted((c["total_us"] for c in decode["calls"]), reverse=True)
    # the text form: each phase's time, its shares and its costliest calls
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(db), "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert f"decode step: {decode['step_us'] / 1e3:.4g} ms (measured {100 * decode['share']['measured']:.1f}%" in text
    assert text.count("[roofline]") >= 2 and text.count(" ms  ") == 4  # two calls a phase


def test_a_config_json_predicts_as_the_built_in_model_it_was_copied_from(tmp_path, capsys):
    # Llama-3.2-1B's config.json fields (the built-in model's source), as transformers writes them
    built_in = models.load()["llama3.2-1b"]
    config = tmp_path / "Llama-3.2-1B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({**built_in.config, "model_type": "llama", "hidden_act": "silu",
                                  "torch_dtype": "bfloat16", "max_position_embeddings": 131072}))
    db = _h100_db(tmp_path / "h100.db", [(1, 3072, 2048, 10.0)])
    answers = []
    for model in ("llama3.2-1b", str(config)):
        assert main(["predict", "--idealised", model, "--db", str(db), "--json", "--batch", "2", "--prefill", "512"]) == 0
        answers.append(json.loads(capsys.readouterr().out)["phases"])
    assert answers[0] == answers[1]
    assert predict.load_model(str(config)).name == "Llama-3.2-1B"


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a JSON config.json"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"hidden_size": 64, "num_attention_heads": 4}), "missing or not an int: ['num_hidden_layers'"),
    (json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                 "vocab_size": 256, "intermediate_size": 128, "hidden_act": "gelu_new"}), "hidden_act 'gelu_new'"),
    (json.dumps({"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                 "vocab_size": 256, "intermediate_size": 128, "num_local_experts": 4}), "without num_experts_per_tok"),
])
def test_a_config_that_cannot_be_read_is_one_line_naming_the_file(tmp_path, capsys, text, message):
    config = tmp_path / "config.json"
    config.write_text(text)
    assert main(["predict", "--idealised", str(config), "--db", str(tmp_path / "none.db"), "--device", "h100"]) == 2
    err = capsys.readouterr().err
    assert str(config) in err and message in err and "Traceback" not in err


def test_bad_options_and_another_devices_database_are_refused(tmp_path, capsys):
    db = _h100_db(tmp_path / "h100.db", [(1, 3072, 2048, 10.0)])
    assert main(["predict", "--idealised", "llama9", "--db", str(db)]) == 2
    assert "MODEL: unknown model 'llama9'" in capsys.readouterr().err
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(db), "--device", "b200"]) == 2
    assert f"--db {db} holds h100's rows, not --device=b200's" in capsys.readouterr().err
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(db), "--batch", "0"]) == 2
    assert "--batch=0: expected a positive int" in capsys.readouterr().err
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(db), "--tp", "3"]) == 2
    assert "--tp=3: 32 attention heads do not split over 3 ranks" in capsys.readouterr().err
    assert main(["predict", "--idealised", "llama3.2-1b", "--db", str(tmp_path / "none.db")]) == 2
    assert "no such results database" in capsys.readouterr().err
    assert main(["predict", "--idealised", "llama3.2-1b"]) == 2  # --db may be left out with --measure only
    assert "--db: a results database (results/<device>.db) to price from, or --measure" in capsys.readouterr().err
    with pytest.raises(ProfileError, match="unknown phase"):
        predict.step_calls(models.load()["llama3.2-1b"], 1, 1, 8, 8, "train")


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}


def _tree(root) -> dict:
    """Every file under root with its size and modification time, and every folder: to see that
    nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "folder"
            for p in sorted(root.rglob("*"))}


REFUSED = {  # config.json's contents, more options, what the one line names
    "not JSON": (b"garbage\x00\xff{", [], ["config.json: not a JSON config.json"]),
    "a JSON array": (b"[1, 2]", [], ["config.json: expected a JSON object", "got list"]),
    "unknown model_type": ({**TINY, "model_type": "gpt2"}, [], ["config.json: model_type 'gpt2': expected one of",
                                                                "llama"]),
    "no model_type": ({k: v for k, v in TINY.items() if k != "model_type"}, [], ["config.json: no model_type"]),
    "tp over the heads": (TINY, ["--tp", "3"], ["--tp=3: 4 attention heads do not split over 3 ranks"]),
    "tp over the KV heads": ({**TINY, "num_attention_heads": 12, "num_key_value_heads": 3}, ["--tp", "2"],
                             ["--tp=2: 3 KV heads do not split over 2 ranks"]),
    "tp beyond the KV heads": ({**TINY, "num_attention_heads": 12, "num_key_value_heads": 3}, ["--tp", "4"],
                               ["--tp=4: 3 KV heads do not replicate evenly over 4 ranks"]),
    "tp 0": (TINY, ["--tp", "0"], ["--tp=0: expected a positive int"]),
    "tp negative": (TINY, ["--tp=-2"], ["--tp=-2: expected a positive int"]),
}


@pytest.mark.parametrize("mode", ["existing db", "--measure", "--measure, no db yet"])
@pytest.mark.parametrize("what", list(REFUSED))
def test_a_bad_config_or_tp_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capfd, what, mode):
    content, more, said = REFUSED[what]
    config = tmp_path / "config.json"
    config.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    if mode != "--measure, no db yet":
        database.write(tmp_path / "results" / "cpu.db", {"run_id": "r0", "device": "cpu",
                                                         "started_at": "2026-11-28T00:00:00+00:00"}, [])
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    db = [] if mode.startswith("--measure") else ["--db", "results/cpu.db"]
    measure = ["--measure"] if mode.startswith("--measure") else []
    assert main(["predict", "--idealised", str(config), *db, "--device", "cpu", *measure, *more]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("opperf predict: "), err
    assert all(words in err for words in said), err
    assert _tree(tmp_path) == before  # no database, no configs, the database untouched


def test_kv_heads_fewer_than_the_ranks_are_replicated_over_them():
    # vLLM's split: 2 KV heads over 8 ranks, each on 4 of them; every rank holds one
    model = models.Model("m", "llama", "-", {**TINY, "num_attention_heads": 8})
    qkv = [c for c in predict.step_calls(model, 8, 1, 16, 4, "decode") if c.case.comment.endswith("qkv_proj")]
    assert dict(qkv[0].case.params)["n"] == (1 + 2 * 1) * 8


QUICK = "--opperf-budget=0.02 --opperf-min-samples=3 --opperf-warmup=0 --opperf-clock-warmup=off"


def _project(tmp_path, monkeypatch):
    """tmp_path as a project to measure in (the bench tests and their configs, no results yet),
    made the working directory; TINY's config.json in it."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "benches", tmp_path / "benches")
    shutil.copytree(root / "configs", tmp_path / "configs")  # the project's: every bench test has its config
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)
    return config


@pytest.mark.parametrize("device", [["--device", "cpu"], []], ids=["--device cpu", "detected"])
def test_measure_without_a_database_makes_this_machines(tmp_path, monkeypatch, capfd, device):
    from pytest_opperf.hardware.specs import resolve_device

    config = _project(tmp_path, monkeypatch)
    name = "cpu" if device else resolve_device(None)[0].name  # as `pytest benches/` names it: cpu on a CPU
    assert main(["predict", "--idealised", str(config), "--prefill", "8", "--decode", "2", "--dtype", "fp32", "--measure",
                 *device, "--pytest-args", QUICK]) == 0
    out, err = capfd.readouterr()
    assert [p.name for p in (tmp_path / "results").glob("*.db")] == [f"{name}.db"], err[-2000:]
    assert out.startswith(f"opperf predict tiny: batch 1, prefill 8, decode 2, tp 1, fp32, on {name} "
                          f"(results/{name}.db)\n"), out
    assert "prefill step: " in out and "decode step: " in out and "(measured 100.0%," in out
    # without --measure there is still nothing to price from
    assert main(["predict", "--idealised", str(config), "--db", "results/h100.db"]) == 2
    assert "--db results/h100.db: no such results database" in capfd.readouterr().err


def test_measure_refuses_a_database_of_another_device_before_running_anything(tmp_path, monkeypatch, capfd):
    config = _project(tmp_path, monkeypatch)
    _h100_db(tmp_path / "results" / "h100.db", [(1, 3072, 2048, 10.0)])
    before = _tree(tmp_path)
    assert main(["predict", "--idealised", str(config), "--db", "results/h100.db", "--measure", "--device", "cpu"]) == 2
    assert ("--db results/h100.db holds h100's rows; --measure measures on cpu: pass results/cpu.db"
            in capfd.readouterr().err)
    if torch.accelerator.current_accelerator() is None:  # no GPU: an H100's cases cannot be measured here
        assert main(["predict", "--idealised", str(config), "--measure", "--device", "h100"]) == 2
        assert "--device=h100: h100 runs on cuda, but this machine has no accelerator" in capfd.readouterr().err
    # reading the database (read-only) leaves SQLite's -wal and -shm beside it, as every reader does
    assert {k: v for k, v in _tree(tmp_path).items() if not k.endswith(("-wal", "-shm"))} == before


def test_measure_runs_the_calls_the_database_lacks_through_pytest_then_prices_them_as_measured(
        tmp_path, monkeypatch, capfd):
    config = _project(tmp_path, monkeypatch)
    db = tmp_path / "results" / "cpu.db"
    args = ["predict", "--idealised", str(config), "--batch", "2", "--prefill", "16", "--decode", "4", "--dtype", "fp32",
            "--db", str(db), "--device", "cpu", "--json", "--measure", "--pytest-args", QUICK]
    assert main(args) == 0
    captured = capfd.readouterr()
    out = json.loads(captured.out)  # pytest's own lines went to stderr
    assert out["measured"]["exit"] == 0 and out["measured"]["cases"] >= 20, captured.err[-2000:]
    assert " passed" in captured.err
    for phase in ("prefill", "decode"):
        kinds = {c["kind"] for c in out["phases"][phase]["calls"]}
        assert kinds == {"measured"}, out["phases"][phase]["calls"]
        assert out["phases"][phase]["share"]["measured"] == pytest.approx(1.0)
    written = sorted(p.name for p in (tmp_path / "predict-cases").glob("*.yaml"))
    assert {"gemm.yaml", "attention_prefill.yaml", "attention_decode.yaml", "kv_cache_write.yaml"} <= set(written)
    # a second --measure finds every call measured: nothing to run
    assert main(args) == 0
    again = json.loads(capfd.readouterr().out)
    assert again["measured"] == {"cases": 0, "command": [], "exit": 0}
    # --measure into a file not named for the device would put the rows elsewhere: refused
    assert main([*args[:-4], "--db", str(tmp_path / "results" / "mine.db"), "--measure"]) == 2
    assert "name it cpu.db" in capfd.readouterr().err
    # a pytest run that fails stops the command before it predicts; so does a missing benches folder
    bigger = [*args[:3], "--batch", "3", *args[5:-2], "--pytest-args=--no-such-option"]
    assert main(bigger) == 2
    assert "--measure: pytest exited 4 on " in capfd.readouterr().err
    assert main([*bigger[:-1], "--benches", "nowhere"]) == 2
    assert "--benches nowhere: no such directory of bench tests" in capfd.readouterr().err


@pytest.mark.parametrize("family, extra", [("llama", {}), ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2})])
def test_a_transformers_models_matmul_flops_are_the_predicted_steps_gemm_flops(tmp_path, family, extra):
    # A real model, built from transformers' own classes (random weights), profiled on the CPU with
    # FLOPs counted: its matmuls (separate q, k, v, gate and up; the experts' rows as routed) do
    # the FLOPs of the predicted step's GEMMs (fused, balanced routing) exactly, prefill and decode.
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile

    from pytest_opperf.catalog.registry import OPS, DTypes
    from pytest_opperf.dtypes import lookup as dtype

    config = transformers.AutoConfig.for_model(family, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                               num_key_value_heads=2, num_hidden_layers=2, vocab_size=1024,
                                               hidden_act="silu", **extra)
    config.save_pretrained(tmp_path)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    batch, prefill = 2, 32

    def matmul_flops(*args, **kwargs) -> int:
        # The rotary embedding's product of its frequencies by the positions is a bmm in some
        # transformers releases (5.17: an outer product, [1, 16, 1] @ [1, 1, 32], 1024 FLOPs here)
        # and a mul in others (5.24): no layer's GEMM, and the predicted step prices it apart. A
        # product over an inner size of 1 is left out.
        with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
            out = model(*args, use_cache=True, logits_to_keep=1, **kwargs)
        return out, sum(e.flops for e in prof.events() if e.flops and e.name in ("aten::mm", "aten::addmm", "aten::bmm")
                        and not (e.name == "aten::bmm" and e.input_shapes and e.input_shapes[0][-1] == 1))

    with torch.inference_mode():
        out, seen = {}, {}
        out["prefill"], seen["prefill"] = matmul_flops(torch.randint(0, 1024, (batch, prefill)))
        token = out["prefill"].logits[:, -1:].argmax(-1)
        _, seen["decode"] = matmul_flops(token, **cache_of(model, out["prefill"]))
    fp32 = DTypes(dtype("fp32"), dtype("fp32"))
    loaded = predict.load_model(str(tmp_path / "config.json"))
    for phase in ("prefill", "decode"):
        calls = predict.step_calls(loaded, 1, batch, prefill, 2, phase, "fp32")
        predicted = sum(OPS[c.case.op].flops({**OPS[c.case.op].defaults, **dict(c.case.params)}, fp32) * c.count
                        for c in calls if c.case.op in ("gemm", "grouped_gemm"))
        assert predicted == seen[phase] > 0, phase


def cache_of(model, out) -> dict:
    """The keyword that hands a step's KV cache to the next: `cache` in transformers 5 (which
    deprecates `past_key_values`), `past_key_values` before it."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: out.get("cache") if out.get("cache") is not None else out.get("past_key_values")}
