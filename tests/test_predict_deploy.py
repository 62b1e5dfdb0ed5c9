"""opperf predict as a deployment runs the model: generate's prefill, a router's experts, the whole
depth from one trace of each distinct layer, the serving figures, and the refusals before any work."""

import json
import math
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.predict import answer, depth, model, price, trace
from pytest_opperf.pipeline.reading.signature import ProfileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DENSE = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=256, max_position_embeddings=512)
# layer 0 dense, the rest with 8 experts, top 2
MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
           decoder_sparse_step=1, mlp_only_layers=[0], num_hidden_layers=5, vocab_size=256,
           max_position_embeddings=512)
# sliding and full attention alternating
GEMMA2 = dict(model_type="gemma2", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, num_hidden_layers=5, vocab_size=256, sliding_window=8, max_position_embeddings=512)
# three dense layers, then experts, and multi-head latent attention
DSV3 = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=6, first_k_dense_replace=3,
            n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, vocab_size=256, q_lora_rank=32,
            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=512)


def _config(tmp_path: Path, fields: dict, dtype: str = "bfloat16") -> Path:
    path = tmp_path / f"{fields['model_type']}-{fields['num_hidden_layers']}.json"
    path.write_text(json.dumps({**fields, "dtype": dtype}))
    return path


def _traced(built, out: Path, batch=2, prefill=8, decode=2, **kwargs) -> tuple[Path, trace.Traced]:
    traced = trace.record(built, batch, prefill, decode, out, "math", **kwargs)
    answer._import(traced.trace, out / "profile.db", None)
    return out / "profile.db", traced


def _calls(db: Path) -> list:
    """(position, phase, op, shapes) of each call in order."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT c.position, c.phase, s.op_type, s.input_shapes FROM calls c "
                           "JOIN signatures s ON s.id = c.signature ORDER BY c.position").fetchall()
    con.close()
    return rows


# generate's prefill

def test_the_prefill_runs_its_lm_head_on_the_last_position_as_generate_does(tmp_path):
    built = model.build(str(_config(tmp_path, DENSE, "float32")))
    heads = {}
    for logits in ("last", "all"):
        db, traced = _traced(built, tmp_path / logits, batch=2, prefill=8, logits=logits)
        heads[logits] = [s for _, phase, op, s in _calls(db) if phase == "prefill" and op == "aten::linear"
                         and s.endswith(";256,64;")]
        said = traced.logits
    assert heads["last"] == ["2,1,64;256,64;"] and heads["all"] == ["2,8,64;256,64;"]
    assert said.startswith("all: the prefill's LM head on every prompt position (--logits all")
    assert trace.logits_said("last", 1).startswith("last: the prefill's LM head on the last position only")


def test_a_forward_without_logits_to_keep_is_said_to_compute_every_position(tmp_path, monkeypatch):
    (tmp_path / "plainlm.py").write_text(
        "import torch\n"
        "class LM(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(16, 8)\n"
        "        self.head = torch.nn.Linear(8, 16)\n"
        "    def forward(self, input_ids, use_cache=True, past_key_values=None):\n"
        "        return {'logits': self.head(self.emb(input_ids)), 'past_key_values': 1}\n"
        "def build():\n"
        "    return LM()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    built = model.build("plainlm:build")
    assert trace.logits_kept(built.module, "last") is None
    db, traced = _traced(built, tmp_path / "t", batch=1, prefill=4, decode=0)
    assert "takes no logits_to_keep, so its prefill computes every position's logits" in traced.logits
    assert "16;4,8;8,16;;" in {s for *_, s in _calls(db)}  # the head's addmm over all 4 positions


# a router's experts

@pytest.mark.parametrize("tokens,experts,k", [(1, 64, 8), (8, 64, 8), (8, 128, 8), (32, 8, 2), (4096, 40, 8)])
def test_random_routing_matches_a_uniform_top_k_router(tokens, experts, k):
    """Each token picks k distinct experts: rows sum to tokens x k, an expert gets at most one row a
    token; over many draws the experts touched average E (1 - (1 - k/E)^T) and each expert's rows
    average T k / E (the formulas of a uniform router)."""
    gen = torch.Generator().manual_seed(1)
    draws = [trace.counts(tokens, experts, k, gen) for _ in range(400)]
    for c in draws:
        assert sum(c) == tokens * k and max(c) <= tokens and len(c) == experts
    touched = sum(sum(1 for n in c if n) for c in draws) / len(draws)
    expected = experts * (1 - (1 - k / experts) ** tokens)
    assert touched == pytest.approx(expected, rel=0.02, abs=0.05)
    per_expert = [sum(c[e] for c in draws) / len(draws) for e in range(experts)]
    assert max(per_expert) == pytest.approx(tokens * k / experts, rel=0.35 if tokens < 32 else 0.05)
    assert sum(per_expert) / experts == pytest.approx(tokens * k / experts)


def test_the_default_routing_draws_per_layer_and_step_and_shares_a_layers_draw(tmp_path):
    fields = {**MOE, "mlp_only_layers": [], "num_hidden_layers": 2}
    built = model.build(str(_config(tmp_path, fields)))
    _, traced = _traced(built, tmp_path / "t", batch=4, prefill=16, decode=3)
    offsets = json.loads((tmp_path / "t" / "trace.capture.json").read_text())["grouped_mm_offsets"]
    # 2 layers x (gate_up, down) a step: prefill, 3 decode steps
    assert len(offsets) == 2 * 2 * 4
    for step in range(4):
        layer0, layer0_down, layer1, layer1_down = offsets[4 * step: 4 * step + 4]
        assert layer0 == layer0_down and layer1 == layer1_down  # one routing a layer
        tokens = 4 * 16 if step == 0 else 4
        assert layer0[-1] == layer1[-1] == tokens * 2
    assert offsets[4] != offsets[8] or offsets[6] != offsets[10]  # a new draw each step
    decode = offsets[4]
    touched = sum(1 for a, b in zip([0, *decode[:-1]], decode) if b > a)
    assert 2 <= touched <= 8 and traced.experts.startswith("random: each token picks its top-k experts uniformly")
    # seeded: the same trace again draws the same
    _traced(model.build(str(_config(tmp_path, fields))), tmp_path / "again", batch=4, prefill=16, decode=3)
    assert json.loads((tmp_path / "again" / "trace.capture.json").read_text())["grouped_mm_offsets"] == offsets
    # --routing even: every decode call spreads its 8 rows over all 8 experts
    _, even = _traced(model.build(str(_config(tmp_path, fields))), tmp_path / "even", batch=4, prefill=16,
                      decode=1, experts=trace.Even())
    assert json.loads((tmp_path / "even" / "trace.capture.json").read_text())["grouped_mm_offsets"][-1] == \
        [1, 2, 3, 4, 5, 6, 7, 8]


# the whole depth from each distinct layer

@pytest.mark.parametrize("fields,layers,traced,stand_in", [
    (DENSE | {"num_hidden_layers": 7}, 7, 2, {0: 1}),
    (MOE, 5, 2, {0: 0, 1: 1}),
    (GEMMA2, 5, 2, {0: 0, 1: 1}),
    (DSV3, 6, 4, {0: 2, 1: 3}),
], ids=["llama", "qwen3_moe", "gemma2", "deepseek_v3"])
def test_the_cut_trace_counted_per_layer_has_the_full_traces_calls(tmp_path, fields, layers, traced, stand_in):
    """Every (phase, op, shapes) of the full-depth trace, as many times, in the trace of the distinct
    layers with each stand-in's calls counted once per layer of its pattern."""
    config = _config(tmp_path, fields)
    cut, found = answer.at_depth(answer.Ask(str(config), 2, measure=True), lambda text: None)
    assert (found.layers, found.traced, found.stand_in) == (layers, traced, stand_in)
    db, _ = _traced(cut, tmp_path / "cut", experts=trace.Even())
    weights = depth.weights(db, found)
    full_db, _ = _traced(model.build(str(config)), tmp_path / "full", experts=trace.Even())
    weighted, full = Counter(), Counter()
    for position, *key in _calls(db):
        weighted[tuple(key)] += weights[position]
    for _, *key in _calls(full_db):
        full[tuple(key)] += 1
    assert +weighted == full


def test_the_whole_depth_priced_from_rows_equals_the_full_traces_price(tmp_path):
    """Priced from the same results database (rows and rooflines), the cut trace counted per layer and
    the full trace give the same step times."""
    from pytest_opperf.store import database

    config = _config(tmp_path, MOE)
    cut, found = answer.at_depth(answer.Ask(str(config), 2, measure=True), lambda text: None)
    db, _ = _traced(cut, tmp_path / "cut", experts=trace.Even())
    full_db, _ = _traced(model.build(str(config)), tmp_path / "full", experts=trace.Even())
    results = tmp_path / "h100.db"
    database.write(results, {"run_id": "r0", "device": "h100", "started_at": "2026-11-29T00:00:00+00:00"},
                   [{"op": "gemm", "_params": ["m", "n", "k"], "m": 8, "n": 8, "k": 8, "dtype_in": "bf16",
                     "dtype_out": "bf16", "backend": "torch", "backend_version": "1", "knobs": "", "timer": "profiler",
                     "cache": "cold", "time_us": 3.0, "run_id": "r0", "created_at": "2026-11-29T00:00:00+00:00"}])
    got = {p.phase: p for p in price.rows(db, results, "h100", weights=depth.weights(db, found))[0]}
    want = {p.phase: p for p in price.rows(full_db, results, "h100")[0]}
    for phase in ("prefill", "decode"):
        assert want[phase].step_us > 0
        assert got[phase].step_us == pytest.approx(want[phase].step_us, rel=1e-9)
        assert got[phase].calls == want[phase].calls


def test_the_answer_says_the_depth_and_layers_keeps_the_cut(tmp_path, capsys):
    config = _config(tmp_path, DENSE | {"num_hidden_layers": 6}, "float32")
    assert main(["predict", str(config), "--prefill", "8", "--decode", "1", "--measure", "--measure-device", "cpu",
                 "--attention", "math", "--repeats", "1", "-o", str(tmp_path / "p"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["depth"] == "6 layers priced from a trace of the first 2 (1 distinct layer pattern: layer 1 for 6)"
    row = got["configurations"][0]
    assert row["assumptions"]["depth"] == got["depth"]
    decode = {p["phase"]: p for p in row["priced"]["sequence"]["phases"]}["decode"]
    # the whole model's calls a step: each layer's as many as the traced layer 1's
    cut_calls = _calls(Path(row["profile"]))
    assert decode["calls_per_step"] > sum(1 for _, phase, *_ in cut_calls if phase == "decode")
    assert main(["predict", str(config), "--layers", "2", "--prefill", "8", "--decode", "1", "--measure",
                 "--measure-device", "cpu", "--attention", "math", "--repeats", "1", "-o", str(tmp_path / "q"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] is None


# what a serving engineer reads

def test_serving_figures_worked_by_hand():
    row = {"batch": 8, "tp": 2, "priced": {"sequence": {"how": "", "phases": [
        {"phase": "prefill", "step_us": 100_000.0}, {"phase": "decode", "step_us": 10_000.0}]}}}
    got = answer.serving(row, 9, {"ttft": 120.0, "tpot": 12.0})
    # 9 tokens: 100 ms + 8 x 10 ms = 180 ms; 8 x 9 tokens / 0.18 s = 400 tokens/s; 200 a GPU
    assert got["time_ms"] == pytest.approx(180.0) and got["tokens_per_s"] == pytest.approx(400.0)
    assert got["tokens_per_s_per_gpu"] == pytest.approx(200.0) and got["meets_slo"] is True
    assert answer.serving(row, 9, {"tpot": 9.0})["meets_slo"] is False
    assert answer.parse_slo("ttft=200,tpot=25") == {"ttft": 200.0, "tpot": 25.0}
    for bad in ("ttft=0", "latency=3", "ttft=x", "ttft=1,ttft=2"):
        with pytest.raises(ProfileError, match="--slo="):
            answer.parse_slo(bad)


def test_the_table_is_ranked_by_tokens_per_second_per_gpu(tmp_path, capsys):
    config = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(config), "--batch", "1,4", "--prefill", "8", "--decode", "2", "--measure",
                 "--measure-device", "cpu", "--attention", "math", "--repeats", "1", "-o", str(tmp_path / "p"),
                 "--slo", "ttft=100000,tpot=0.000001", "--output-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "device time (kernels back to back, as under CUDA graphs), not an eager loop's host overhead" in out
    assert "D = 5 output tokens" in out and "SLO: ttft <= 100000 ms, tpot <= 1e-06 ms" in out
    table = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].isdigit()][:2]
    rates = [float(cells[7]) for cells in table]
    assert rates == sorted(rates, reverse=True) and len(rates) == 2
    assert all(cells[8] == "-" for cells in table)  # no configuration meets a TPOT of a picosecond


# refused before any work

@pytest.mark.parametrize("args,said", [
    (["--measure", "--db", "{tmp}/none.db"], "--db={tmp}/none.db: no such results database"),
    (["--db", "{tmp}/none.db"], "--db={tmp}/none.db: no such results database"),
    (["--measure", "--measure-device", "cpu", "--from", "{tmp}/p.db"], "--from={tmp}/p.db: no such profile database"),
    (["--measure", "--measure-device", "cpu", "--routing", "zipf"], "--routing=zipf: expected one of random, even"),
    (["--measure", "--measure-device", "cpu", "--logits", "first"], "--logits=first: expected one of last, all"),
    (["--measure", "--measure-device", "cpu", "--slo", "ttft"], "--slo=ttft: expected ttft=MS,tpot=MS"),
    (["--measure", "--measure-device", "cpu", "--output-tokens", "0"], "--output-tokens=0: expected 1 or more"),
    (["--measure", "--measure-device", "cpu", "--repeats", "0"], "--repeats=0: expected 1 or more"),
    (["--measure", "--measure-device", "tpu9"], "--measure-device=tpu9: not a torch device"),
])
def test_bad_options_are_refused_in_one_line_before_any_trace(tmp_path, capsys, args, said):
    config = _config(tmp_path, DENSE, "float32")
    out = tmp_path / "out"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["predict", str(config), "-o", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said.replace("{tmp}", str(tmp_path)) in err[0], err
    assert not out.exists()  # nothing traced


def test_a_bad_memory_budget_is_refused_before_any_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPPERF_MEMORY_BUDGET", "lots")
    config = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(config), "--measure", "--measure-device", "cpu", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OPPERF_MEMORY_BUDGET" in err[0] and not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_measure_without_a_gpu_names_the_option_the_user_has(tmp_path, capsys):
    config = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(config), "--measure", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--measure-device=cuda: no such device on this machine" in err and "--device=" not in err
    assert not (tmp_path / "out").exists()


def test_uniform_router_formula_sanity():
    """The expected experts touched, worked by hand: batch 8, top 8 of 64: 64 (1 - (56/64)^8) = 42.0."""
    assert 64 * (1 - (56 / 64) ** 8) == pytest.approx(42.0, abs=0.05)
    assert math.isclose(8 * (1 - (1 - 2 / 8) ** 1), 2.0)


def test_the_lm_head_on_the_last_position_replays_as_one_mm_as_the_models_parameter_does(tmp_path):
    """A batch's last positions are a strided [B, 1, H] view; torch folds it into one mm where the
    weight is a Parameter (as the model's) and runs a bmm over the broadcast weight where it is a plain
    tensor, reading the weight B times. The replay makes the model's weights Parameters."""
    from pytest_opperf.pipeline.mapping import profile
    from pytest_opperf.pipeline.replay import plan as planning

    db, _ = _traced(model.build(str(_config(tmp_path, DENSE, "float32"))), tmp_path / "t", batch=4, prefill=16,
                    decode=0)
    rows, calls = profile.load(db), planning.load_calls(db)
    head = next(r for r in rows if r["op_type"] == "aten::linear" and r["input_shapes"] == "4,1,64;256,64;")
    planned = planning.plan(rows, calls, torch.device("cpu"), "per-call")
    call = next(c for c in planned.calls if c.signature == head["id"])

    def kernels(args):
        with torch.inference_mode(), torch.profiler.profile() as prof:
            call.fn(*args)
        return [e.name for e in prof.events() if e.name in ("aten::mm", "aten::bmm")]

    assert isinstance(call.args[2], torch.nn.Parameter) and kernels(call.args) == ["aten::mm"]
    plain = [*call.args[:2], call.args[2].detach(), *call.args[3:]]
    assert kernels(plain) == ["aten::bmm"]  # what the replay ran before: the weight read once a row


def test_a_cut_whose_layers_are_not_the_models_traces_the_whole_depth_and_says_so(tmp_path, monkeypatch):
    config = _config(tmp_path, MOE)
    real = depth.patterns
    seen = []

    def patterns(module, config=None):  # the cut model's layers read as another pattern than the full model's
        found = real(module, config)
        seen.append(found)
        if len(seen) == 2:
            return depth.Depth(found.layers, found.traced, found.prefix, tuple(p + 1 for p in found.pattern),
                               found.stand_in)
        return found

    monkeypatch.setattr(depth, "patterns", patterns)
    said = []
    built, found = answer.at_depth(answer.Ask(str(config), 2, measure=True), said.append)
    assert found is None and said == ["opperf predict: the first 2 layers cut from the config are not the model's: "
                                      "traced at its full depth (5 layers)"]
    assert len(depth.layer_list(built.module)[1]) == 5


def test_a_trace_without_module_calls_cannot_be_counted_per_layer(tmp_path):
    config = _config(tmp_path, DENSE | {"num_hidden_layers": 4}, "float32")
    cut, found = answer.at_depth(answer.Ask(str(config), 1, measure=True), lambda text: None)
    db, _ = _traced(cut, tmp_path / "t", decode=1)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM modules")
    con.close()
    with pytest.raises(ProfileError, match=r"holds no module calls, so its layers cannot be counted: trace the whole "
                                           r"model with --layers 4"):
        answer.depth_weights(db, found)
