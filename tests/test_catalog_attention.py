"""The attention family (prefill, decode, paged decode, MLA decode) and its SDPA and flex backends:
formulas by hand, references against loops written out, wrong backends caught by the check, and a
real session running every op of catalogue part A on a CPU from the shipped configs."""

import math
import shutil
from pathlib import Path

import pytest
import torch

from conftest import FAST, rows
from pytest_opperf import dtypes
from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.ops.attention.attention_prefill import flex
from pytest_opperf.catalog.ops.attention import _common, attention_decode, attention_prefill, mla_decode, paged_decode
from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes
from pytest_opperf.measure.check import compare

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]

load_builtin()


def dt(name):
    return DTypes(dtypes.lookup(name), dtypes.lookup(name))


def make(op, p, dtypes_, device=CPU, seed=0):
    return op.inputs(p, dtypes_, device, torch.Generator(device=device).manual_seed(seed))


def check(op, dtypes_, fn, inputs):
    """The functional check as bench runs it (at the op's default sizes' bound): None when fn passes."""
    return compare(fn(*inputs), op.reference(*inputs), dtypes_.output, op.check_bound(dict(op.defaults), dtypes_))


def backend(op_name, name):
    return BACKENDS[(op_name, name)]


def loops(q, k, v, causal, scale):
    """Attention one query row at a time: each (batch, query head, row) softmax written out."""
    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    out = torch.zeros(b, hq, sq, v.shape[-1], dtype=torch.float64)
    for i in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)  # query head h reads key/value head h // group
            for r in range(sq):
                seen = range(sk - sq + r + 1) if causal else range(sk)
                scores = [scale * float(q[i, h, r].double() @ k[i, kv, j].double()) for j in seen]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                for j, w in zip(seen, weights):
                    out[i, h, r] += w / sum(weights) * v[i, kv, j].double()
    return out


PREFILL = {"batch": 2, "seq": 5, "heads_q": 4, "heads_kv": 2, "head_dim": 8}
DECODE = {"batch": 2, "kv_len": 7, "heads_q": 6, "heads_kv": 2, "head_dim": 8}
PAGED = {**DECODE, "kv_len": 10, "page_size": 4}
MLA = {"batch": 2, "kv_len": 9, "heads": 3, "kv_lora_rank": 16, "rope_dim": 4}


# --- FLOPs and bytes, by hand -----------------------------------------------------------------


def test_attention_flops_and_bytes_by_hand():
    p = {"batch": 1, "seq": 4, "heads_q": 2, "heads_kv": 1, "head_dim": 8}
    # QK^T and PV: 4 * b * h * s^2 * d = 4*1*2*16*8 = 1024, half of it under the causal mask
    assert attention_prefill.flops(p, dt("bf16")) == 512
    assert attention_prefill.nbytes(p, dt("bf16")) == (2 * 2 + 2 * 1) * 4 * 8 * 2  # q, out; k, v
    d = {"batch": 2, "kv_len": 10, "heads_q": 4, "heads_kv": 2, "head_dim": 8}
    assert attention_decode.flops(d, dt("bf16")) == 4 * 2 * 4 * 10 * 8
    assert attention_decode.nbytes(d, dt("bf16")) == (2 * 4 + 2 * 2 * 10) * 2 * 8 * 2
    paged = {**d, "page_size": 4}  # 3 pages per sequence, the last one half used
    assert paged_decode.flops(paged, dt("bf16")) == 2560
    # k and v of the 10 tokens (2*2*10*2*8 elements) + q and out (2*2*4*8), bf16; 2*3 int32 page numbers
    assert paged_decode.nbytes(paged, dt("bf16")) == (640 + 128) * 2 + 4 * 6
    m = {"batch": 2, "kv_len": 10, "heads": 4, "kv_lora_rank": 8, "rope_dim": 2}
    # scores over r + rope = 10 columns: 2*2*4*10*10 = 1600; softmax @ c_kv over r = 8: 2*2*4*10*8 = 1280
    assert mla_decode.flops(m, dt("bf16")) == 2880
    assert mla_decode.nbytes(m, dt("bf16")) == 2 * (4 * 10 + 10 * 10 + 4 * 8) * 2  # q, cache, out
    # DeepSeek-V3, one token against one cached token: 2*128*576 + 2*128*512
    ds = {"batch": 1, "kv_len": 1, "heads": 128, "kv_lora_rank": 512, "rope_dim": 64}
    assert mla_decode.flops(ds, dt("bf16")) == 147456 + 131072
    assert mla_decode.scale(64) == 1 / math.sqrt(192)


def test_memory_estimates_count_the_score_matrix_and_the_reference():
    p = {"batch": 1, "seq": 8192, "heads_q": 32, "heads_kv": 8, "head_dim": 128}
    tensors = attention_prefill.nbytes(p, dt("bf16"))
    scores = 32 * 8192**2  # the eager backend's: bf16 scores, fp32 softmax, bf16 probabilities
    assert attention_prefill.memory(p, dt("bf16")) == tensors + scores * 8 + 3 * 8 * (32 * 8192 * 128)


# --- references against the loops ----------------------------------------------------------------


def test_prefill_and_decode_references_match_the_loops():
    q, k, v = make(attention_prefill, PREFILL, dt("fp32"))
    assert (q.shape, k.shape) == ((2, 4, 5, 8), (2, 2, 5, 8))
    expected = loops(q, k, v, causal=True, scale=1 / math.sqrt(8))
    assert torch.allclose(attention_prefill.reference(q, k, v), expected, rtol=1e-10, atol=1e-12)
    q, k, v = make(attention_decode, DECODE, dt("fp32"))
    expected = loops(q, k, v, causal=False, scale=1 / math.sqrt(8))
    assert torch.allclose(attention_decode.reference(q, k, v), expected, rtol=1e-10, atol=1e-12)


def test_reference_chunks_give_the_same_answer(monkeypatch):
    q, k, v = make(attention_prefill, PREFILL, dt("fp32"))
    whole = attention_prefill.reference(q, k, v)
    monkeypatch.setattr(_common, "REFERENCE_CHUNK", 4 * 5 * 2)  # two query rows per chunk: three chunks
    assert torch.allclose(attention_prefill.reference(q, k, v), whole, rtol=1e-12, atol=1e-14)


def test_paged_reference_is_the_attention_of_the_unpaged_cache():
    q, k_cache, v_cache, table, kv_len = make(paged_decode, PAGED, dt("fp32"))
    assert k_cache.shape == (6, 4, 2, 8) and table.shape == (2, 3) and kv_len == 10
    assert sorted(table.flatten().tolist()) == list(range(6)) and table.flatten().tolist() != list(range(6))
    # Independent: walk the table page by page, token by token.
    k = torch.stack([torch.stack([k_cache[table[i, t // 4], t % 4] for t in range(10)]) for i in range(2)])
    v = torch.stack([torch.stack([v_cache[table[i, t // 4], t % 4] for t in range(10)]) for i in range(2)])
    expected = loops(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), causal=False, scale=1 / math.sqrt(8))
    assert torch.allclose(paged_decode.reference(q, k_cache, v_cache, table, kv_len), expected.squeeze(2))


def test_mla_reference_is_nope_plus_rope_scores_over_the_latent():
    q, kv, rank = make(mla_decode, MLA, dt("fp32"))
    assert q.shape == (2, 3, 20) and kv.shape == (2, 9, 20) and rank == 16
    out = mla_decode.reference(q, kv, rank)
    for i in range(2):
        for h in range(3):
            q_nope, q_pe = q[i, h, :16].double(), q[i, h, 16:].double()
            c_kv, k_pe = kv[i, :, :16].double(), kv[i, :, 16:].double()
            scores = (c_kv @ q_nope + k_pe @ q_pe) / math.sqrt(128 + 4)
            assert torch.allclose(out[i, h], torch.softmax(scores, 0) @ c_kv)


def test_grouped_heads_must_divide():
    with pytest.raises(ValueError, match="heads_q=6 must be a multiple of heads_kv=4"):
        make(attention_decode, {**DECODE, "heads_kv": 4}, dt("fp32"))


# --- the check: backends that run on a CPU pass, wrong ones fail ----------------------------------


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_prefill_backends_pass_and_a_forgotten_causal_mask_fails():
    for name in ("fp32", "bf16"):
        inputs = make(attention_prefill, {**PREFILL, "seq": 64}, dt(name))
        for b in ("torch", "sdpa_math", "sdpa_flash"):
            assert backend("attention_prefill", b).unsupported("cpu", dt(name), (0, 0), PREFILL) is None
            assert check(attention_prefill.OP, dt(name), backend("attention_prefill", b).fn, inputs) is None, b
        assert check(attention_prefill.OP, dt(name), lambda q, k, v: flex.flex_prefill(q, k, v, compiled=False),
                     inputs) is None

        def no_mask(q, k, v):
            return _common.eager(q, k, v, causal=False, scale=1 / math.sqrt(q.shape[-1]))

        assert "exceeds" in check(attention_prefill.OP, dt(name), no_mask, inputs)


def test_decode_backends_pass_and_a_wrong_head_mapping_fails():
    inputs = make(attention_decode, {**DECODE, "kv_len": 300}, dt("bf16"))
    for b in ("torch", "sdpa_math", "sdpa_flash"):
        assert check(attention_decode.OP, dt("bf16"), backend("attention_decode", b).fn, inputs) is None, b

    def tiled_heads(q, k, v):  # repeat (0,1,2,0,1,2) where grouped-query attention means repeat_interleave
        g = q.shape[1] // k.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1))

    assert "exceeds" in check(attention_decode.OP, dt("bf16"), tiled_heads, inputs)


def test_paged_backends_pass_and_ignoring_the_block_table_fails():
    inputs = make(paged_decode, {**PAGED, "kv_len": 100, "page_size": 16}, dt("bf16"))
    for b in ("torch", "torch_gather_sdpa"):
        assert check(paged_decode.OP, dt("bf16"), backend("paged_decode", b).fn, inputs) is None, b

    def pages_in_order(q, k_cache, v_cache, block_table, kv_len):
        ordered = torch.arange(block_table.numel(), dtype=torch.int32).view_as(block_table)
        return paged_decode.paged_decode_torch(q, k_cache, v_cache, ordered, kv_len)

    assert "exceeds" in check(paged_decode.OP, dt("bf16"), pages_in_order, inputs)


def test_mla_backends_pass_and_the_wrong_softmax_scale_fails():
    inputs = make(mla_decode, {"batch": 2, "kv_len": 200, "heads": 16, "kv_lora_rank": 512, "rope_dim": 64},
                  dt("bf16"))
    for b in ("torch", "sdpa_math"):
        assert check(mla_decode.OP, dt("bf16"), backend("mla_decode", b).fn, inputs) is None, b

    def scaled_by_the_cache_width(q, kv, rank):  # 1/sqrt(576) instead of DeepSeek's 1/sqrt(128 + 64)
        scores = torch.einsum("bhc,btc->bht", q.float(), kv.float()) / math.sqrt(q.shape[-1])
        return (torch.softmax(scores, -1) @ kv[..., :rank].float()).to(q.dtype)

    assert "exceeds" in check(mla_decode.OP, dt("bf16"), scaled_by_the_cache_width, inputs)


def test_kernels_that_cannot_run_say_why():
    p = {"batch": 1, "seq": 128, "heads_q": 8, "heads_kv": 2, "head_dim": 64}
    for b in ("sdpa_efficient", "sdpa_cudnn"):
        assert "CUDA only" in backend("attention_prefill", b).unsupported("cpu", dt("fp32"), (0, 0), p)
    assert "compiling it for cpu takes minutes" in backend("attention_prefill", "flex_attention").unsupported(
        "cpu", dt("bf16"), (0, 0), p)
    mixed = DTypes(dtypes.lookup("bf16"), dtypes.lookup("fp32"))
    assert "input dtype" in backend("attention_prefill", "sdpa_math").unsupported("cpu", mixed, (0, 0), p)
    # Flash and cuDNN cannot take MLA's 576-wide keys with 512-wide values: not registered for it.
    assert ("mla_decode", "sdpa_flash") not in BACKENDS and ("mla_decode", "sdpa_efficient") in BACKENDS


# --- a real session: every op of part A from the shipped configs -------------------------------

PART_A = ("gemm_rowwise", "bmm", "linear", "grouped_gemm",
          "attention_prefill", "attention_decode", "paged_decode", "mla_decode")

NO_MASK = """
import math
from pytest_opperf import register_backend
from pytest_opperf.catalog.ops.attention import _common


@register_backend("attention_prefill", "no_mask")
def prefill_without_its_mask(q, k, v):
    return _common.eager(q, k, v, causal=False, scale=1 / math.sqrt(q.shape[-1]))
"""


def _bench_project(pytester):
    (pytester.path / "configs").mkdir()
    (pytester.path / "benches").mkdir()
    for op in PART_A:
        shutil.copy(REPO / "configs" / f"{op}.yaml", pytester.path / "configs")
    for bench in ("test_matmul.py", "test_attention.py"):  # test_matmul.py holds test_gemm too
        shutil.copy(REPO / "benches" / bench, pytester.path / "benches")
    (pytester.path / "configs" / "gemm.yaml").write_text(
        "backend: torch\ndtypes: [{input: int8, output: int32}, {input: fp8, output: bf16}]\n"
        "params: {M: 32, N: 48, K: 64}\n")


def test_every_op_runs_on_a_cpu_from_the_shipped_configs(pytester):
    _bench_project(pytester)
    result = pytester.runpytest("benches", "-rs", *FAST)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines_random([
        "SKIPPED*SDPA's cuDNN kernel runs on CUDA only, not on cpu",
        "SKIPPED*flex_attention is compiled to Triton for CUDA here*",
        "SKIPPED*torch._grouped_mm has its fused kernel on CUDA sm_90 and sm_100 only",
    ])
    for op in PART_A + ("gemm",):
        got = rows(pytester, op)
        assert got, f"no rows for {op}"
        spec = OPS[op]
        for row in got:
            p = {c: row[c] for c in spec.params}
            pair = DTypes(dtypes.lookup(row["dtype_in"]), dtypes.lookup(row["dtype_out"]))
            assert row["flops"] == spec.flops(p, pair) and row["bytes"] == spec.bytes(p, pair)
            assert row["time_us"] > 0
        # Every op's baseline ran in fp32 (or its only dtype pair), and in bf16 where it computes in bf16.
        refused = BACKENDS[(op, "torch")].unsupported("cpu", pair, (), p)
        assert "torch" in {r["backend"] for r in got} or "need torch" in (refused or ""), op
    assert {r["dtype_in"] for r in rows(pytester, "gemm")} == {"int8", "fp8"}
    ran = {(r["backend"], r["dtype_in"]) for r in rows(pytester, "attention_prefill")}
    assert {("torch", "fp32"), ("torch", "bf16"), ("sdpa_math", "fp32"), ("sdpa_math", "bf16")} <= ran
    assert {r["activation"] for r in rows(pytester, "linear")} == {"none"}


def test_a_prefill_that_forgets_its_causal_mask_fails_in_a_session(pytester):
    _bench_project(pytester)
    pytester.makepyfile(conftest=NO_MASK)
    (pytester.path / "configs" / "attention_prefill.yaml").write_text(
        "backends: [torch, no_mask]\ndtypes: fp32\n"
        "params: {BATCH: 1, SEQ: 64, HEADS_Q: 4, HEADS_KV: 2, HEAD_DIM: 16}\n")
    result = pytester.runpytest("benches", "-k", "attention_prefill", *FAST)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*functional check failed: attention_prefill/no_mask*normwise relative error*"])
    assert [r["backend"] for r in rows(pytester, "attention_prefill")] == ["torch"]


# --- on a GPU (the lead's run) ---------------------------------------------------------------------


@cuda
def test_gpu_sdpa_flex_backends_pass_or_say_why():
    device = torch.device("cuda")
    capability = torch.cuda.get_device_capability()
    cases = [(attention_prefill.OP, {"batch": 2, "seq": 1024, "heads_q": 32, "heads_kv": 8, "head_dim": 128}),
             (attention_decode.OP, {"batch": 8, "kv_len": 4096, "heads_q": 28, "heads_kv": 4, "head_dim": 128}),
             (mla_decode.OP, {"batch": 4, "kv_len": 2048, "heads": 128, "kv_lora_rank": 512, "rope_dim": 64})]
    ran = set()
    for op, p in cases:
        inputs = make(op, p, dt("bf16"), device)
        for (name, b), entry in BACKENDS.items():
            if name != op.name or entry.unsupported("cuda", dt("bf16"), capability, p):
                continue
            if not entry.fn.__module__.startswith("pytest_opperf."):
                continue  # a deliberately wrong backend another test module registered in this worker
            assert check(op, dt("bf16"), entry.fn, inputs) is None, (name, b)
            ran.add((name, b))
    # On an sm_80+ GPU flash takes both GQA cases, and the efficient kernel takes MLA's 576/512 head dims.
    assert {("attention_prefill", "sdpa_flash"), ("attention_decode", "sdpa_flash"),
            ("mla_decode", "sdpa_efficient"), ("attention_prefill", "flex_attention")} <= ran


@cuda
def test_gpu_sdpa_supports_gives_torchs_reason():
    capability = torch.cuda.get_device_capability()
    huge = {"batch": 1, "seq": 256, "heads_q": 8, "heads_kv": 8, "head_dim": 512}
    reason = backend("attention_prefill", "sdpa_flash").unsupported("cuda", dt("bf16"), capability, huge)
    assert reason and "flash" in reason and "256" in reason
    fp32 = backend("attention_prefill", "sdpa_flash").unsupported("cuda", dt("fp32"), capability, huge)
    assert fp32 and "flash" in fp32


def test_sdpa_refusal_reasons_come_from_python_warnings_and_from_cs_stderr():
    # torch 2.11 on an H100 printed SDPA's refusal from C++ to fd 2, not as a Python warning.
    import os
    import warnings

    from pytest_opperf.catalog.backends import sdpa

    def refuse():
        warnings.warn("Memory efficient kernel not used because: dtype")
        os.write(2, b"[W1123 11:54:37.390611155 sdp_utils.cpp:180] Warning: Flash attention requires "
                    b"head_dim <= 256. Got 512 instead. (function check_head_dim_size_flash)\nunrelated\n")
        return False

    ok, said = sdpa._with_torch_warnings(refuse)
    assert ok is False
    assert said == ("Memory efficient kernel not used because: dtype; "
                    "Flash attention requires head_dim <= 256. Got 512 instead.")
