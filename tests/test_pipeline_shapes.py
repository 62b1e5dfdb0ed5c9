"""opperf shapes: model configs -> cases: configs, with --max-hbm-gb and --rows/--seed."""

import math

import yaml

from pytest_opperf.catalog import load_builtin
from pytest_opperf.dtypes import lookup
from pytest_opperf.catalog.registry import OPS, DTypes
from pytest_opperf.cli import main
from pytest_opperf.measure.budget import case_bytes
from pytest_opperf.pipeline.predict import models, shapes
from pytest_opperf.config import opconfig as config

KNOWN = models.load()


def cases_of(cases, op):
    return [(dict(c.params), c.comment.split(": ", 1)[1]) for c in cases if c.op == op]


def test_llama_8b_layer_at_tp8_is_the_hand_worked_one():
    # Llama-3.1-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336, vocab 128256.
    # At tp=8: 4 query heads and 1 KV head per rank, MLP 1792 per rank, vocab 16032 per rank.
    cases = shapes.layer_cases(KNOWN["llama3.1-8b"], tp=8, batch=1, seq=2048, phase="prefill")
    gemms = {what: p for p, what in cases_of(cases, "gemm")}
    assert gemms["qkv_proj"] == {"m": 2048, "n": (4 + 2 * 1) * 128, "k": 4096}
    assert gemms["o_proj"] == {"m": 2048, "n": 4096, "k": 512}
    assert gemms["MLP gate_up_proj"] == {"m": 2048, "n": 3584, "k": 4096}
    assert gemms["MLP down_proj"] == {"m": 2048, "n": 4096, "k": 1792}
    assert gemms["lm_head (last token per sequence)"] == {"m": 1, "n": 16032, "k": 4096}
    assert cases_of(cases, "attention_prefill") == [
        ({"batch": 1, "seq": 2048, "heads_q": 4, "heads_kv": 1, "head_dim": 128}, "causal attention")]
    assert cases_of(cases, "silu_and_mul")[0][0] == {"m": 2048, "n": 1792}
    assert cases_of(cases, "rope")[0][0] == {"tokens": 2048, "heads_q": 4, "heads_kv": 1, "head_dim": 128,
                                             "layout": "neox"}
    decode = shapes.layer_cases(KNOWN["llama3.1-8b"], tp=8, batch=16, seq=4096, phase="decode")
    assert cases_of(decode, "attention_decode")[0][0] == {"batch": 16, "kv_len": 4096, "heads_q": 4, "heads_kv": 1,
                                                          "head_dim": 128}
    assert {what: p for p, what in cases_of(decode, "gemm")}["qkv_proj"] == {"m": 16, "n": 768, "k": 4096}


def test_deepseek_v3_decode_has_mla_and_moe_shapes():
    # DeepSeek-V3 at tp=8, decode of 64 sequences: 16 heads per rank, 256 experts of 2048 (256 per rank),
    # top-8: 64 * 8 / 256 = 2 rows per expert with balanced routing.
    cases = shapes.layer_cases(KNOWN["dsv3"], tp=8, batch=64, seq=2048, phase="decode")
    assert cases_of(cases, "mla_decode")[0][0] == {"batch": 64, "kv_len": 2048, "heads": 16, "kv_lora_rank": 512,
                                                   "rope_dim": 64}
    grouped = {what: p for p, what in cases_of(cases, "grouped_gemm")}
    assert grouped["MoE experts gate_up (balanced routing)"] == {"groups": 256, "m": 2, "n": 512, "k": 7168}
    assert grouped["MoE experts down (balanced routing)"] == {"groups": 256, "m": 2, "n": 7168, "k": 256}
    gemms = {what: p for p, what in cases_of(cases, "gemm")}
    assert gemms["MLA q_b_proj"] == {"m": 64, "n": 16 * (128 + 64), "k": 1536}
    assert gemms["MLA kv_a_proj_with_mqa"] == {"m": 64, "n": 512 + 64, "k": 7168}
    assert gemms["MoE router"] == {"m": 64, "n": 256, "k": 7168}
    assert gemms["dense MLP down_proj"] == {"m": 64, "n": 7168, "k": 18432 // 8}
    assert cases_of(cases, "moe_gating")[0][0] == {"tokens": 64, "experts": 256, "topk": 8, "renormalize": 1}


def test_every_shipped_model_cites_its_source_and_writes_loadable_configs(tmp_path):
    load_builtin()
    names = sorted({m.name for m in KNOWN.values()})
    assert {"llama3.1-8b", "llama3.1-70b", "qwen2.5-7b", "qwen3-32b", "mixtral-8x7b", "dsv3"} <= set(names)
    for name in names:
        assert KNOWN[name].source.startswith("https://huggingface.co/") and KNOWN[name].source.endswith("config.json")
    plan = shapes.plan(models.select(names, KNOWN), [1, 8], [1, 8], [512], ["prefill", "decode"])
    files = shapes.write(plan, tmp_path, "test")
    assert ("qwen2.5-7b", 8, "28 attention heads do not split over 8 ranks") in plan.skipped
    for path in files:
        raw = yaml.safe_load(path.read_text())
        op = OPS[raw["op"]]
        cfg = config.load(path, op.params, op.defaults, op_name=raw["op"], op_types=op.types)
        assert len(list(cfg.expand(op.params, device="h100"))) == len(raw["cases"]) > 0


def footprints(plan, op):
    dt = DTypes(lookup("bf16"), lookup("bf16"))
    return {c.params: case_bytes(OPS[op], {**OPS[op].defaults, **dict(c.params)}, dt) for c in plan.cases if c.op == op}


def test_max_hbm_gb_drops_exactly_the_cases_over_the_budget():
    chosen = models.select(["llama3.1-8b"], KNOWN)
    full = shapes.plan(chosen, [1], [1, 64], [2048, 32768], ["prefill"])
    sizes = footprints(full, "attention_prefill")
    assert len(sizes) == 4
    limit_gb = sorted(sizes.values())[1] / 1e9 * 1.0001  # the two smallest fit
    cut = shapes.plan(chosen, [1], [1, 64], [2048, 32768], ["prefill"], max_hbm_gb=limit_gb)
    kept = footprints(cut, "attention_prefill")
    assert set(kept) == {k for k, v in sizes.items() if v <= limit_gb * 1e9} and len(kept) == 2
    assert cut.over_budget["attention_prefill"] == 2
    assert all(v <= limit_gb * 1e9 for op in {c.op for c in cut.cases} for v in footprints(cut, op).values())


def test_rows_and_seed_sample_reproducibly():
    chosen = models.select(["llama3.1-8b", "qwen3-32b", "mixtral-8x7b"], KNOWN)
    args = ([1, 8], [1, 16, 64], [1024, 8192], ["prefill", "decode"])
    full = {c.params for c in shapes.plan(chosen, *args).cases if c.op == "gemm"}
    a = [c.params for c in shapes.plan(chosen, *args, rows=10, seed=1).cases if c.op == "gemm"]
    again = [c.params for c in shapes.plan(chosen, *args, rows=10, seed=1).cases if c.op == "gemm"]
    other = [c.params for c in shapes.plan(chosen, *args, rows=10, seed=2).cases if c.op == "gemm"]
    assert len(full) > 10 and len(set(a)) == 10 and set(a) <= full
    assert a == again and set(a) != set(other)
    rope = {c.params for c in shapes.plan(chosen, *args, rows=10, seed=1).cases if c.op == "rope"}
    assert len(rope) == min(10, len({c.params for c in shapes.plan(chosen, *args).cases if c.op == "rope"}))


def test_opperf_shapes_writes_configs_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert main(["shapes", "--target-models", "llama3.1-8b,dsv3", "--tp", "8", "--batch", "4", "--seq", "1024",
                 "--rows", "3", "--seed", "7", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    gemm = yaml.safe_load((out / "gemm.yaml").read_text())
    assert len(gemm["cases"]) == 3 and gemm["dtypes"] == ["bf16"]
    assert "--opperf-config=" in printed and f"{out / 'gemm.yaml'}" in printed
    assert "https://huggingface.co/deepseek-ai/DeepSeek-V3" in (out / "gemm.yaml").read_text()
    assert main(["shapes", "--target-models", "gpt-5", "-o", str(out)]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err
    assert main(["shapes", "--target-models", "dsv3", "--tp", "0", "-o", str(out)]) == 2
    assert "--tp=0" in capsys.readouterr().err


def test_balanced_routing_rounds_up():
    cases = shapes.layer_cases(KNOWN["mixtral-8x7b"], tp=1, batch=3, seq=1, phase="decode")
    grouped = cases_of(cases, "grouped_gemm")
    assert grouped[0][0]["m"] == math.ceil(3 * 2 / 8) == 1
