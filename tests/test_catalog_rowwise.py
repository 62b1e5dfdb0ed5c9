"""Catalogue part B (norms, activations, position, quantization): formulas worked by hand,
references against independent computations, a deliberately wrong backend per op that the
check catches, the configs' case counts, and a real CPU session over every op."""

import math
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import FAST, rows, write_config
from pytest_opperf import dtypes
from pytest_opperf.catalog import BACKENDS, OPS, load_builtin
from pytest_opperf.catalog.ops.activation import gelu_and_mul, silu_and_mul
from pytest_opperf.catalog.ops.norm import add_rmsnorm, layernorm
from pytest_opperf.catalog.ops.position import rope
from pytest_opperf.catalog.ops.quant import quant_fp8, quant_int8
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure.check import compare
from pytest_opperf.config import opconfig as config_mod

REPO = Path(__file__).resolve().parents[1]
OURS = ("layernorm", "add_rmsnorm", "silu_and_mul", "gelu_and_mul", "rope", "quant_fp8", "quant_int8")

load_builtin()


def dt(i, o=None):
    return DTypes(dtypes.lookup(i), dtypes.lookup(o or i))


# --- FLOPs and bytes, by hand -------------------------------------------------------------------


def test_norm_flops_and_bytes_by_hand():
    p = {"m": 2, "n": 3}
    assert layernorm.flops(p, dt("bf16")) == 7 * 6 + 4 * 2  # 6 elements x 7, 2 rows x 4
    assert layernorm.nbytes(p, dt("bf16")) == (6 + 3 + 3) * 2 + 6 * 2  # x, w, b read; y written
    assert add_rmsnorm.flops(p, dt("bf16")) == 5 * 6 + 3 * 2
    assert add_rmsnorm.nbytes(p, dt("bf16")) == (6 + 6 + 3) * 2 + (6 + 6) * 2  # x, r, w; y, s


def test_gated_activation_flops_and_bytes_by_hand():
    p = {"m": 2, "n": 3}  # x is 2 x 6, y is 2 x 3
    assert silu_and_mul.flops(p, dt("bf16")) == 5 * 6
    assert silu_and_mul.nbytes(p, dt("bf16")) == 12 * 2 + 6 * 2
    assert gelu_and_mul.flops(p, dt("bf16")) == 10 * 6
    assert gelu_and_mul.nbytes(p, dt("fp32")) == 12 * 4 + 6 * 4


def test_rope_flops_and_bytes_by_hand():
    p = {"tokens": 2, "heads_q": 4, "heads_kv": 2, "head_dim": 8, "layout": "neox"}
    # 2 tokens x 6 heads x 8 dims = 96 elements of q and k, 3 FLOPs each
    assert rope.flops(p, dt("bf16")) == 288
    # q, k read and written: 96 x (2 + 2); cos and sin: 2 tokens x 4 angles x 2 tensors x 2 bytes
    assert rope.nbytes(p, dt("bf16")) == 96 * 4 + 2 * 4 * 2 * 2
    # the memory estimate adds the reference's ~64 bytes an element (float64 and complex128 copies)
    assert rope.memory(p, dt("bf16")) == 96 * (2 + 2 + 64) + 2 * 8 * (2 + 16)


def test_quant_flops_and_bytes_by_hand():
    token = {"m": 2, "n": 3, "granularity": "token"}
    tensor = {**token, "granularity": "tensor"}
    assert quant_fp8.flops(token, dt("bf16", "fp8")) == 3 * 6 + 2  # a scale per row
    assert quant_fp8.flops(tensor, dt("bf16", "fp8")) == 3 * 6 + 1
    assert quant_fp8.nbytes(token, dt("bf16", "fp8")) == 6 * (2 + 1) + 2 * 4  # x read, q and 2 fp32 scales written
    assert quant_fp8.nbytes(tensor, dt("bf16", "fp8")) == 6 * (2 + 1) + 4
    assert quant_int8.flops({"n": 2, "k": 3}, dt("fp32", "int8")) == 4 * 6 + 2
    assert quant_int8.nbytes({"n": 2, "k": 3}, dt("fp32", "int8")) == 6 * (4 + 1) + 2 * 4


# --- references against independent computations ---------------------------------------------


def test_layernorm_reference_by_hand_and_against_torch():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    w = torch.tensor([1.0, 1.0, 2.0, 2.0])
    b = torch.tensor([0.0, 1.0, 0.0, 1.0])
    # mean 2.5, biased variance 1.25
    s = 1 / math.sqrt(1.25 + 1e-5)
    assert layernorm.reference(x, w, b)[0].tolist() == pytest.approx([-1.5 * s, -0.5 * s + 1, 1.0 * s, 3.0 * s + 1])
    f64 = torch.float64
    x, w, b = torch.randn(5, 33, dtype=f64), torch.rand(33, dtype=f64), torch.randn(33, dtype=f64)
    expect = torch.nn.functional.layer_norm(x, (33,), w, b, 1e-5)
    assert torch.allclose(layernorm.reference(x, w, b), expect, rtol=1e-12, atol=1e-12)


def test_add_rmsnorm_reference_by_hand():
    y, s = add_rmsnorm.reference(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 2.0]]), torch.tensor([1.0, 0.5]))
    assert s[0].tolist() == [3.0, 4.0]
    rms = math.sqrt((9 + 16) / 2 + 1e-6)
    assert y[0].tolist() == pytest.approx([3 / rms, 2 / rms])


def test_gated_activation_references():
    x = torch.tensor([[0.0, 1.0, 5.0, 7.0]], dtype=torch.float64)  # gate [0, 1], up [5, 7]
    assert silu_and_mul.reference(x)[0].tolist() == pytest.approx([0.0, 7 / (1 + math.exp(-1))])
    x = torch.randn(3, 16, dtype=torch.float64)
    gate, up = x[:, :8], x[:, 8:]
    assert torch.allclose(silu_and_mul.reference(x), gate * torch.sigmoid(gate) * up, rtol=1e-12)
    tanh_gelu = torch.nn.functional.gelu(gate, approximate="tanh") * up
    assert torch.allclose(gelu_and_mul.reference(x), tanh_gelu, rtol=1e-12)
    # the tanh approximation, not erf's: they part by 4.7e-4 at -2.7
    g = torch.tensor([[-2.7, 1.0]], dtype=torch.float64)
    erf = torch.nn.functional.gelu(g[:, :1]) * 1.0
    assert abs(gelu_and_mul.reference(g).item() - erf.item()) > 4e-4


def test_rope_reference_turns_the_pairs_each_layout_names():
    q = torch.arange(1.0, 9.0).reshape(1, 2, 4)  # 1 token, 2 heads of 4 dims
    k = -q[:, :1]
    quarter = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])  # pair 0 turns 90 degrees, pair 1 not
    rq, rk = rope.reference(q, k, *quarter, "neox")  # pairs (0, 2) and (1, 3)
    assert rq[0, 0].tolist() == [-3.0, 2.0, 1.0, 4.0]  # (a, b) = (1, 3) -> (-3, 1); (2, 4) stays
    assert rk[0, 0].tolist() == [3.0, -2.0, -1.0, -4.0]
    rq, _ = rope.reference(q, k, *quarter, "gptj")  # pairs (0, 1) and (2, 3)
    assert rq[0, 0].tolist() == [-2.0, 1.0, 3.0, 4.0]


def test_rope_reference_against_meta_llamas_complex_rotation():
    # Meta's reference Llama turns interleaved pairs as complex numbers by e^(i * pos * freq): gptj.
    p = {"tokens": 5, "heads_q": 3, "heads_kv": 1, "head_dim": 8, "layout": "gptj"}
    q, k, cos, sin, layout = rope.inputs(p, dt("fp64"), "cpu", torch.Generator().manual_seed(1))
    angles = torch.atan2(sin, cos)
    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
    expect = torch.view_as_real(torch.view_as_complex(q.reshape(5, 3, 4, 2).contiguous()) * turn).flatten(-2)
    assert torch.allclose(rope.reference(q, k, cos, sin, layout)[0], expect, atol=1e-12)
    # neox pairs dims i and i + 4: the same turn, after gathering each pair's halves side by side
    neox = torch.stack(q.chunk(2, dim=-1), dim=-1).flatten(-2)
    rq = rope.reference(q, k, cos, sin, "neox")[0]
    assert torch.allclose(torch.stack(rq.chunk(2, dim=-1), dim=-1).flatten(-2),
                          torch.view_as_real(torch.view_as_complex(neox.reshape(5, 3, 4, 2)) * turn).flatten(-2),
                          atol=1e-12)


def test_rope_inputs_turn_by_whole_positions_times_base_500000_frequencies():
    p = {"tokens": 6, "heads_q": 1, "heads_kv": 1, "head_dim": 128, "layout": "neox"}
    *_, cos, sin, _ = rope.inputs(p, dt("fp64"), "cpu", torch.Generator().manual_seed(2))
    freqs = 500000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    # The slowest pair turns by under 0.32 rad at any position below 131072: its angle gives the position.
    pos = torch.atan2(sin[:, -1], cos[:, -1]) / freqs[-1]
    assert torch.allclose(pos, pos.round(), atol=1e-3) and 0 <= pos.min() and pos.max() < 131072
    angles = pos.round()[:, None] * freqs[None, :]
    assert torch.allclose(cos, angles.cos(), atol=1e-9) and torch.allclose(sin, angles.sin(), atol=1e-9)


def test_quant_fp8_reference_by_hand():
    x = torch.tensor([[4.0, -1.0, 0.5], [0.25, 0.5, -0.125]])
    q, scale = quant_fp8.reference(x, "token")
    assert scale.dtype == torch.float32 and scale.flatten().tolist() == pytest.approx([4 / 448, 0.5 / 448], rel=1e-7)
    assert q.tolist() == [[448.0, -112.0, 56.0], [224.0, 448.0, -112.0]]
    q, scale = quant_fp8.reference(x, "tensor")
    assert scale.shape == (1,) and scale.item() == pytest.approx(4 / 448)
    assert q[1].tolist() == [28.0, 56.0, -14.0]


def test_torch_rounds_to_e4m3_nearest_ties_to_even():
    # 92 sits between 88 (mantissa 011) and 96 (100), 100 between 96 and 104 (101): even wins both
    assert torch.tensor([92.0, 100.0, 91.9, 100.1]).to(torch.float8_e4m3fn).float().tolist() == [96, 96, 88, 104]


def test_quant_int8_reference_rounds_half_to_even():
    w = torch.tensor([[127.0, -63.5, 0.5, 1.5, 2.5, 3.2]])  # amax 127: scale 1, w / scale exact
    q, scale = quant_int8.reference(w)
    assert scale.tolist() == [[1.0]] and scale.dtype == torch.float32
    assert q[0].tolist() == [127.0, -64.0, 0.0, 2.0, 2.0, 3.0]


# --- the check catches a deliberately wrong backend; the torch backend passes ------------------


def _check(op, p, dtypes_, backend):
    gen = torch.Generator().manual_seed(0)
    args = OPS[op].inputs(p, dtypes_, "cpu", gen)
    tol = OPS[op].check_bound(p, dtypes_)
    return compare(backend(*args), OPS[op].reference(*args), dtypes_.output, tol)


def _no_bias(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, None, 1e-5)


def _old_residual(x, r, w):  # normalizes the sum but hands back the residual it was given
    return add_rmsnorm.add_rmsnorm_torch(x, r, w)[0], r


def _swapped(x):  # silu of up times gate
    n = x.shape[-1] // 2
    return torch.nn.functional.silu(x[:, n:]) * x[:, :n]


def _erf_gelu(x):
    n = x.shape[-1] // 2
    return torch.nn.functional.gelu(x[:, :n]) * x[:, n:]


def _other_layout(q, k, cos, sin, layout):
    return rope.rope_torch(q, k, cos, sin, "gptj" if layout == "neox" else "neox")


def _scale_one_percent_off(x, granularity):  # dequantizes right (q * scale ~ x), off the reference grid
    q, scale = quant_fp8.quant_fp8_torch(x, granularity)
    scale = scale * 1.01
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def _truncates(w):
    scale = w.float().abs().amax(dim=-1, keepdim=True) / 127
    return torch.trunc(w.float() / scale).to(torch.int8), scale


WRONG = [
    ("layernorm", {"m": 4, "n": 64}, dt("fp32"), _no_bias),
    ("add_rmsnorm", {"m": 4, "n": 64}, dt("bf16"), _old_residual),
    ("silu_and_mul", {"m": 4, "n": 64}, dt("bf16"), _swapped),
    ("gelu_and_mul", {"m": 64, "n": 256}, dt("fp32"), _erf_gelu),
    ("rope", {"tokens": 3, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "layout": "neox"}, dt("bf16"), _other_layout),
    ("quant_fp8", {"m": 4, "n": 256, "granularity": "token"}, dt("bf16", "fp8"), _scale_one_percent_off),
    ("quant_fp8", {"m": 4, "n": 256, "granularity": "tensor"}, dt("fp32", "fp8"), _scale_one_percent_off),
    ("quant_int8", {"n": 8, "k": 256}, dt("bf16", "int8"), _truncates),
]


@pytest.mark.parametrize("op, p, dtypes_, wrong", WRONG, ids=[f"{w[0]}-{w[3].__name__}" for w in WRONG])
def test_the_check_catches_a_wrong_backend_and_passes_torch(op, p, dtypes_, wrong):
    assert _check(op, p, dtypes_, BACKENDS[(op, "torch")].fn) is None
    assert _check(op, p, dtypes_, wrong) is not None


def test_a_wrong_scale_fails_the_quant_check_by_its_scales_too():
    problem = _check("quant_fp8", {"m": 2, "n": 64, "granularity": "token"}, dt("fp32", "fp8"),
                     lambda x, g: (quant_fp8.quant_fp8_torch(x, g)[0], quant_fp8.quant_fp8_torch(x, g)[1] * 1.01))
    assert problem.startswith("output 1: normwise relative error 0.01")


def test_scales_must_come_in_fp32():
    problem = _check("quant_int8", {"n": 2, "k": 8}, dt("fp32", "int8"),
                     lambda w: (quant_int8.quant_int8_torch(w)[0], quant_int8.quant_int8_torch(w)[1].double()))
    assert problem == "output 1: dtype torch.float64, expected torch.float32 (the reference's dtype for this output)"


# --- configs: real-model shapes, small sweeps ------------------------------------------------------


@pytest.mark.parametrize("op", OURS + ("rmsnorm", "softmax"))
def test_config_sweeps_stay_small(op):
    spec = OPS[op]
    cfg = config_mod.load(REPO / "configs" / f"{op}.yaml", spec.params, spec.defaults, op_name=op,
                          op_types=spec.types)
    gpu = list(cfg.expand(spec.params, device="h100"))
    cpu = [c for c in cfg.expand(spec.params, device="cpu") if BACKENDS[(op, c.backend)].devices is None]
    assert 0 < len(gpu) <= 12, [c.id for c in gpu]
    assert cpu and {c.dtype_in for c in cpu} >= {"fp32", "bf16"}
    # every CPU case moves under 64 MB (the CPU sweep of all ops should take about a minute)
    for case in cpu:
        assert OPS[op].bytes(case.param_dict, dt(case.dtype_in, case.dtype_out)) < 64e6


def test_rope_layout_outside_its_choices_is_a_collection_error(pytester):
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_position.py").write_text((REPO / "benches" / "test_position.py").read_text())
    (pytester.path / "configs").mkdir()
    write_config(pytester, "rope", "backend: torch\ndtypes: fp32\nparams: {tokens: 1, layout: [neox, llama]}\n")
    result = pytester.runpytest("benches", *FAST)
    result.stdout.fnmatch_lines(["*rope.yaml: params.layout[[]1[]]: expected 'neox' or 'gptj' values for this "
                                 "parameter, got str 'llama'*"])
    assert result.ret != 0 and not (pytester.path / "results").exists()


# --- a real session: every op of this part on the CPU, rows written ---------------------------------

CONFIGS = {  # every op of benches/test_{norm,activation,position,quant}.py
    "rmsnorm": "backend: torch\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "softmax": "backend: torch\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "gelu": "backend: torch\ndtypes: [fp32, bf16]\nparams: {N: 256}\n",
    "layernorm": "backends: [torch, torch_unfused]\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "add_rmsnorm": "backend: torch\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "silu_and_mul": "backend: torch\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "gelu_and_mul": "backend: torch\ndtypes: [fp32, bf16]\nparams: {M: 4, N: 64}\n",
    "rope": "backend: torch\ndtypes: [fp32, bf16]\nparams: {tokens: 3, heads_q: 4, heads_kv: 2, head_dim: 16, "
            "layout: [neox, gptj]}\n",
    "quant_fp8": "backends: [torch, off_scale]\ndtypes: [{input: bf16, output: fp8}, {input: fp32, output: fp8}]\n"
                 "params: {M: 4, N: 64, granularity: [token, tensor]}\n",
    "quant_int8": "backend: torch\ndtypes: [{input: bf16, output: int8}, {input: fp32, output: int8}]\n"
                  "params: {N: 8, K: 64}\n",
}

WRONG_QUANT = """
import torch
from pytest_opperf import register_backend


@register_backend("quant_fp8", "off_scale")
def off_scale(x, granularity):
    amax = x.float().abs().amax(dim=-1, keepdim=True) if granularity == "token" else x.float().abs().amax().reshape(1)
    scale = amax / 440  # not 448: q * scale still gives x back
    return (x.float() / scale).to(torch.float8_e4m3fn), scale
"""


def test_every_op_runs_on_cpu_and_writes_rows(pytester):
    pytester.makepyfile(conftest=WRONG_QUANT)
    (pytester.path / "benches").mkdir()
    for family in ("norm", "activation", "position", "quant"):
        name = f"test_{family}.py"
        (pytester.path / "benches" / name).write_text((REPO / "benches" / name).read_text())
    (pytester.path / "configs").mkdir()
    for op, text in CONFIGS.items():
        write_config(pytester, op, textwrap.dedent(text))
    result = pytester.runpytest("benches", *FAST)
    # 2 rmsnorm + 2 softmax + 2 gelu + 4 layernorm + 2 + 2 + 2 + 4 rope + 4 quant_fp8 torch
    # (+ 4 off_scale, failed) + 2 quant_int8
    result.assert_outcomes(passed=26, failed=4)
    result.stdout.fnmatch_lines(["*functional check failed: quant_fp8/off_scale*output 0: normwise relative error*"])
    for op, count in {"rmsnorm": 2, "softmax": 2, "gelu": 2, "layernorm": 4, "add_rmsnorm": 2, "silu_and_mul": 2, "gelu_and_mul": 2, "rope": 4,
                      "quant_fp8": 4, "quant_int8": 2}.items():
        stored = rows(pytester, op)
        assert len(stored) == count, op
        assert all(r["time_us"] > 0 and r["flops"] > 0 and r["bytes"] > 0 for r in stored)
        assert {r["backend"] for r in stored} <= {"torch", "torch_unfused"}
    assert {(r["layout"], r["dtype_in"]) for r in rows(pytester, "rope")} == {
        ("neox", "fp32"), ("gptj", "fp32"), ("neox", "bf16"), ("gptj", "bf16")}
    assert {(r["granularity"], r["dtype_out"]) for r in rows(pytester, "quant_fp8")} == {
        ("token", "fp8"), ("tensor", "fp8")}
