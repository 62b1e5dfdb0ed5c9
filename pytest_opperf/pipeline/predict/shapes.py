"""Shapes from model configs: the catalogue cases one layer of a model runs, per phase and TP size.

The shapes are those an inference engine runs (vLLM's layout): fused qkv and gate_up
projections split over ``tp`` ranks (KV heads replicated when there are fewer than ranks),
residual add + RMSNorm, RoPE, attention (prefill over ``seq`` tokens per sequence, or decode of
one token per sequence against ``seq`` cached ones), SwiGLU, the MoE router, top-k, permute and
the grouped expert GEMMs with balanced routing (``ceil(tokens * top_k / experts)`` rows per
expert), DeepSeek's MLA projections and latent decode, the embedding and the LM head over one
token per sequence, and sampling. Identical cases from several models or layers are written
once, with every origin in the comment.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pytest_opperf.pipeline.mapping.configs import PlannedCase
from pytest_opperf.pipeline.predict.models import Model
from pytest_opperf.pipeline.reading.signature import ProfileError

PHASES = ("prefill", "decode")


@dataclass
class Plan:
    cases: list  # PlannedCase, after the filters
    generated: dict  # op -> distinct cases generated
    over_budget: dict  # op -> cases dropped by --max-hbm-gb
    skipped: list  # (model, tp, why) pairs that cannot be split


# Where a case of layer_calls runs in the model: once a step, once a layer, once a dense or an MoE layer.
STEP, LAYER, DENSE, MOE = "step", "layer", "dense layer", "MoE layer"


def split_problem(model: Model, tp: int) -> str:
    """Why `model` does not run at tensor-parallel size `tp`, as vLLM splits it ("" when it does):
    the attention heads evenly over the ranks; the KV heads evenly too, or, fewer than the ranks,
    each on an equal number of them (MLA's latent cache has no KV heads to split).

    >>> split_problem(Model("m", "m", "-", {"num_attention_heads": 32, "num_key_value_heads": 8}), 16)
    ''
    >>> split_problem(Model("m", "m", "-", {"num_attention_heads": 12, "num_key_value_heads": 3}), 4)
    '3 KV heads do not replicate evenly over 4 ranks'
    """
    if model.heads % tp:
        return f"{model.heads} attention heads do not split over {tp} ranks"
    kv = model.kv_heads
    if model.mla or (kv >= tp and kv % tp == 0) or (0 < kv < tp and tp % kv == 0):
        return ""
    return f"{kv} KV heads do not {'split' if kv >= tp else 'replicate evenly'} over {tp} ranks"


def layer_cases(model: Model, tp: int, batch: int, seq: int, phase: str, dtype: str = "bf16") -> list[PlannedCase]:
    """The cases of one layer of each kind (dense, MoE), the embedding, the LM head and sampling."""
    return [case for case, _, _ in layer_calls(model, tp, batch, seq, phase, dtype)]


def layer_calls(model: Model, tp: int, batch: int, seq: int, phase: str,
                dtype: str = "bf16") -> list[tuple[PlannedCase, str, int]]:
    """layer_cases, each with where it runs (STEP, LAYER, DENSE, MOE) and how many times there."""
    problem = split_problem(model, tp)
    if problem:
        raise ValueError(problem)
    tokens = batch * seq if phase == "prefill" else batch
    h = model.get("hidden_size")
    hq = model.heads // tp
    hkv = max(1, model.kv_heads // tp)
    d = model.head_dim
    where = f"{model.name} tp{tp} {phase} b{batch} s{seq}"
    out: list[tuple[PlannedCase, str, int]] = []

    def add(op: str, what: str, label: str = dtype, part: str = LAYER, per: int = 1, **params) -> None:
        out.append((PlannedCase(op, "torch", label, tuple(params.items()), f"{where}: {what}"), part, per))

    add("embedding", "embed_tokens (vocab split over tp)", part=STEP, tokens=tokens,
        vocab=model.get("vocab_size") // tp, hidden=h)
    add("add_rmsnorm", "input/post-attention norm with the residual", per=2, m=tokens, n=h)
    if model.mla:
        _mla(model, tp, batch, seq, phase, tokens, add)
    else:
        add("gemm", "qkv_proj", m=tokens, n=(hq + 2 * hkv) * d, k=h)
        if model.qk_norm:
            add("rmsnorm", "q_norm per head", m=tokens * hq, n=d)
            add("rmsnorm", "k_norm per head", m=tokens * hkv, n=d)
        add("rope", "rotary on q and k", tokens=tokens, heads_q=hq, heads_kv=hkv, head_dim=d, layout="neox")
        if phase == "prefill":
            add("attention_prefill", "causal attention", batch=batch, seq=seq, heads_q=hq, heads_kv=hkv, head_dim=d)
        else:
            add("attention_decode", "attention over the cache", batch=batch, kv_len=seq, heads_q=hq, heads_kv=hkv,
                head_dim=d)
        add("gemm", "o_proj", m=tokens, n=h, k=hq * d)
    if model.dense_layers:
        inter = model.get("intermediate_size") // tp
        label = "dense MLP" if model.experts else "MLP"
        add("gemm", f"{label} gate_up_proj", part=DENSE, m=tokens, n=2 * inter, k=h)
        add("silu_and_mul", f"{label} SwiGLU", part=DENSE, m=tokens, n=inter)
        add("gemm", f"{label} down_proj", part=DENSE, m=tokens, n=h, k=inter)
    if model.experts:
        _moe(model, tp, tokens, h, functools.partial(add, part=MOE))
    add("rmsnorm", "final norm", part=STEP, m=tokens, n=h)
    add("gemm", "lm_head (last token per sequence)", part=STEP, m=batch, n=model.get("vocab_size") // tp, k=h)
    # engines sample from fp32 logits; the op writes int64 token ids (configs/sampling.yaml)
    add("sampling", "next-token sampling", "fp32-int64", part=STEP, batch=batch, vocab=model.get("vocab_size"),
        top_k=0, top_p=1.0)
    return out


def _mla(model: Model, tp: int, batch: int, seq: int, phase: str, tokens: int, add) -> None:
    h = model.get("hidden_size")
    heads = model.heads // tp
    q_rank, kv_rank = model.get("q_lora_rank"), model.get("kv_lora_rank")
    nope, rope, v = model.get("qk_nope_head_dim"), model.get("qk_rope_head_dim"), model.get("v_head_dim")
    add("gemm", "MLA q_a_proj", m=tokens, n=q_rank, k=h)
    add("rmsnorm", "MLA q_a_layernorm", m=tokens, n=q_rank)
    add("gemm", "MLA q_b_proj", m=tokens, n=heads * (nope + rope), k=q_rank)
    add("gemm", "MLA kv_a_proj_with_mqa", m=tokens, n=kv_rank + rope, k=h)
    add("rmsnorm", "MLA kv_a_layernorm", m=tokens, n=kv_rank)
    add("rope", "MLA rotary part", tokens=tokens, heads_q=heads, heads_kv=1, head_dim=rope, layout="neox")
    if phase == "prefill":
        add("gemm", "MLA kv_b_proj", m=tokens, n=heads * (nope + v), k=kv_rank)
        add("attention_prefill", f"MLA prefill (qk head_dim {nope + rope}; v's {v} replayed as {nope + rope})",
            batch=batch, seq=seq, heads_q=heads, heads_kv=heads, head_dim=nope + rope)
    else:
        add("mla_decode", "MLA decode, weights absorbed", batch=batch, kv_len=seq, heads=heads, kv_lora_rank=kv_rank,
            rope_dim=rope)
    add("gemm", "MLA o_proj", m=tokens, n=h, k=heads * v)


def _moe(model: Model, tp: int, tokens: int, h: int, add) -> None:
    experts, topk = model.experts, model.get("num_experts_per_tok")
    inter = model.expert_intermediate // tp
    rows = max(1, math.ceil(tokens * topk / experts))
    add("gemm", "MoE router", m=tokens, n=experts, k=h)
    add("moe_gating", "MoE softmax + top-k", tokens=tokens, experts=experts, topk=topk, renormalize=1)
    add("moe_permute", "MoE dispatch permute", tokens=tokens, hidden=h, experts=experts, topk=topk)
    add("grouped_gemm", "MoE experts gate_up (balanced routing)", groups=experts, m=rows, n=2 * inter, k=h)
    add("silu_and_mul", "MoE experts SwiGLU", m=tokens * topk, n=inter)
    add("grouped_gemm", "MoE experts down (balanced routing)", groups=experts, m=rows, n=h, k=inter)
    shared = model.get("n_shared_experts") or 0
    if shared:
        add("gemm", "MoE shared experts gate_up", m=tokens, n=2 * inter * shared, k=h)
        add("silu_and_mul", "MoE shared experts SwiGLU", m=tokens, n=inter * shared)
        add("gemm", "MoE shared experts down", m=tokens, n=h, k=inter * shared)


def plan(models: list[Model], tps: list[int], batches: list[int], seqs: list[int], phases: list[str],
         dtype: str = "bf16", rows: int = 0, seed: int = 0, max_hbm_gb: float = 0.0) -> Plan:
    """Every case of every (model, tp, batch, seq, phase), filtered by the HBM budget, then sampled.

    ``rows`` > 0 keeps at most that many cases per op, drawn with ``random.Random(seed)``, in
    their generated order; ``max_hbm_gb`` > 0 first drops cases whose footprint (the op's
    memory estimate, as --opperf-max-mem-gb uses it) exceeds that many GB.
    """
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.dtypes import lookup
    from pytest_opperf.catalog.registry import OPS, DTypes
    from pytest_opperf.measure.budget import GB, case_bytes

    for phase in phases:
        if phase not in PHASES:
            raise ProfileError(f"--phases: unknown phase {phase!r}; expected {' or '.join(PHASES)}")
    load_builtin()
    try:
        dt = DTypes(lookup(dtype), lookup(dtype))
    except KeyError:
        raise ProfileError(f"--dtype: unknown dtype {dtype!r}") from None
    by_op: dict[str, dict[tuple, list]] = {}
    skipped = []
    for model in models:
        for tp in tps:
            problem = split_problem(model, tp)
            if problem:
                skipped.append((model.name, tp, problem))
                continue
            for phase in phases:
                for batch in batches:
                    for seq in seqs:
                        for case in layer_cases(model, tp, batch, seq, phase, dt.input.name):
                            by_op.setdefault(case.op, {}).setdefault(case.params, []).append(case)
    generated = {op: len(cases) for op, cases in by_op.items()}
    over: dict[str, int] = {}
    chosen: list[PlannedCase] = []
    for op, cases in by_op.items():
        keys = list(cases)
        if max_hbm_gb > 0:
            fits = [k for k in keys if case_bytes(OPS[op], _full(OPS[op], k), dt) <= max_hbm_gb * GB]
            over[op] = len(keys) - len(fits)
            keys = fits
        if rows > 0 and len(keys) > rows:
            picked = set(random.Random(f"{seed}:{op}").sample(range(len(keys)), rows))
            keys = [k for i, k in enumerate(keys) if i in picked]
        for key in keys:
            chosen.extend(cases[key])
    return Plan(chosen, generated, over, skipped)


def _full(op, params: tuple) -> dict:
    return {**op.defaults, **dict(params)}


def write(plan_: Plan, directory: Path, header: str) -> list[Path]:
    from pytest_opperf.pipeline.mapping import configs

    return configs.write(plan_.cases, directory, header)
