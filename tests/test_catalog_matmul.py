"""The matmul family (gemm's int8 and fp8 paths, gemm_rowwise, bmm, linear, grouped_gemm): formulas
worked by hand, references against independent computations, wrong backends caught by the check."""

import math

import pytest
import torch

from pytest_opperf import dtypes
from pytest_opperf.catalog import load_builtin, precision
from pytest_opperf.catalog.ops.matmul import bmm, gemm, gemm_rowwise, grouped_gemm, linear
from pytest_opperf.catalog.registry import BACKENDS, Backend, DTypes
from pytest_opperf.measure.check import compare

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CPU = torch.device("cpu")

load_builtin()


def dt(i, o=None):
    return DTypes(dtypes.lookup(i), dtypes.lookup(o or i))


def make(op, p, dtypes_, device=CPU, seed=0):
    return op.inputs(p, dtypes_, device, torch.Generator(device=device).manual_seed(seed))


def check(op, p, dtypes_, fn, inputs):
    """The functional check as bench runs it: None when fn's output passes."""
    tol = op.check_bound(p, dtypes_)
    return compare(fn(*inputs), op.reference(*inputs), dtypes_.output, tol)


def runs_here(op_name, backend, dtypes_, p, device_type="cpu", capability=(0, 0)):
    return BACKENDS[(op_name, backend)].unsupported(device_type, dtypes_, capability, p) is None


# --- FLOPs and bytes, by hand -----------------------------------------------------------------


def test_matmul_flops_and_bytes_by_hand():
    p = {"m": 2, "n": 3, "k": 4}
    assert gemm.nbytes(p, dt("int8", "int32")) == (8 + 12) * 1 + 6 * 4  # int8 A, B; int32 C
    assert gemm_rowwise.flops(p, dt("fp8", "bf16")) == 48 + 12  # 2*2*3*4, then two scale multiplies per output
    assert gemm_rowwise.nbytes(p, dt("fp8", "bf16")) == (8 + 12) + 4 * (2 + 3) + 6 * 2  # fp8 A, B; fp32 scales; bf16 C
    q = {"b": 2, "m": 3, "n": 4, "k": 5}
    assert bmm.flops(q, dt("bf16")) == 240  # 2 batches * 3*4 outputs * 5 multiply-adds * 2
    assert bmm.nbytes(q, dt("bf16")) == (2 * (15 + 20) + 2 * 12) * 2
    lin = {"m": 2, "n": 3, "k": 4}
    # 48 for the GEMM, 6 for the bias, then 0 / 1 / 4 / 9 per output element
    assert [linear.flops({**lin, "activation": a}, dt("bf16")) for a in ("none", "relu", "silu", "gelu")] == \
        [54, 60, 78, 108]
    assert linear.nbytes({**lin, "activation": "gelu"}, dt("bf16")) == (8 + 12 + 3) * 2 + 6 * 2  # x, W, bias; y
    g = {"groups": 3, "m": 2, "n": 4, "k": 5}
    assert grouped_gemm.flops(g, dt("bf16")) == 2 * 3 * 2 * 4 * 5
    # x (6 x 5) and W (3 x 5 x 4) in bf16, 3 int32 offsets, out (6 x 4) in bf16
    assert grouped_gemm.nbytes(g, dt("bf16")) == (30 + 60) * 2 + 12 + 24 * 2


def test_reduction_tolerance_formula():
    # 2 u_out + sqrt(k) u_acc: bf16 out (u = 2^-8), fp32 sums; fp8 inputs sum with 14 bits; int8 is exact.
    assert precision.reduction_tolerance(4096, dt("bf16")) == pytest.approx(2 / 256 + 64 * 2**-24)
    assert precision.reduction_tolerance(4096, dt("fp32")) == pytest.approx((2 + 64) * 2**-24)
    assert precision.reduction_tolerance(1024, dt("fp8", "bf16")) == pytest.approx(2 / 256 + 32 * 2**-14)
    assert precision.reduction_tolerance(1024, dt("int8", "int32")) == 0.0
    assert precision.unit_roundoff(dtypes.lookup("fp16")) == 2**-11
    # exp or rsqrt in the op: no fp32 bound under the floor that GPU libraries' approximations need.
    assert precision.reduction_tolerance(64, dt("fp32"), transcendental=True) == precision.LIBRARY_FLOOR
    assert gemm.OP.tolerance({"m": 1, "n": 1, "k": 100}, dt("fp32")) == pytest.approx(12 * 2**-24)


# --- references against independent computations -----------------------------------------------


def test_gemm_int8_reference_is_exact_integer_arithmetic():
    p = {"m": 3, "n": 2, "k": 5}
    a, b = make(gemm, p, dt("int8", "int32"))
    assert a.dtype == torch.int8 and a.abs().max() > 0
    by_hand = [[sum(int(a[i, l]) * int(b[l, j]) for l in range(5)) for j in range(2)] for i in range(3)]
    assert gemm.reference(a, b).tolist() == by_hand


def test_gemm_rowwise_reference_and_inputs():
    p = {"m": 4, "n": 3, "k": 8}
    a, b, sa, sb, out_dtype = make(gemm_rowwise, p, dt("fp8", "bf16"))
    assert (sa.shape, sb.shape, out_dtype) == ((4, 1), (1, 3), torch.bfloat16)
    assert sa.dtype == sb.dtype == torch.float32 and b.stride() == (1, 8)  # B column-major, as _scaled_mm wants
    # Each row of A fills e4m3's range (amax 448), and the rows' scales differ (tokens of different size).
    assert a.float().abs().amax(dim=1).tolist() == [448.0] * 4
    assert sa.max() / sa.min() > 1.5
    ref = gemm_rowwise.reference(a, b, sa, sb, out_dtype)
    for i in range(4):
        for j in range(3):
            dot = sum(float(a[i, l]) * float(b[l, j]) for l in range(8))
            assert ref[i, j].item() == pytest.approx(float(sa[i, 0]) * dot * float(sb[0, j]), rel=1e-12)


def test_bmm_and_linear_references():
    x, y = make(bmm, {"b": 3, "m": 2, "n": 4, "k": 5}, dt("fp32"))
    ref = bmm.reference(x, y)
    for i in range(3):
        assert torch.equal(ref[i], x[i].double() @ y[i].double())
    p = {"m": 2, "n": 3, "k": 4, "activation": "gelu"}
    x, w, bias, act = make(linear, p, dt("fp32"))
    assert act == "gelu" and w.shape == (3, 4)
    ref = linear.reference(x, w, bias, act)
    for i in range(2):
        for j in range(3):
            y = sum(float(x[i, l]) * float(w[j, l]) for l in range(4)) + float(bias[j])
            gelu = 0.5 * y * (1 + math.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
            assert ref[i, j].item() == pytest.approx(gelu, rel=1e-9)
    silu = linear.reference(x, w, bias, "silu")
    pre = x.double() @ w.double().t() + bias.double()
    assert torch.allclose(silu, pre / (1 + torch.exp(-pre)))


def test_linear_refuses_an_unknown_activation_by_name():
    with pytest.raises(ValueError, match=r"activation='swish': expected one of none, relu, silu, gelu"):
        make(linear, {"m": 2, "n": 3, "k": 4, "activation": "swish"}, dt("fp32"))


def test_grouped_gemm_reference_matches_a_one_hot_contraction():
    p = {"groups": 3, "m": 2, "n": 4, "k": 5}
    x, w, offs, sizes = make(grouped_gemm, p, dt("fp32"))
    assert offs.tolist() == [2, 4, 6] and offs.dtype == torch.int32 and sizes == (2, 2, 2)
    # Independent: token t belongs to group t // m; sum over groups with a one-hot mask.
    onehot = torch.nn.functional.one_hot(torch.arange(6) // 2, 3).double()
    expected = torch.einsum("tk,gkn,tg->tn", x.double(), w.double(), onehot)
    assert torch.allclose(grouped_gemm.reference(x, w, offs, sizes), expected)


# --- the check: torch backends pass, wrong ones fail ----------------------------------------------


def test_gemm_int8_and_fp8_run_on_cpu_and_wrong_kernels_fail():
    p = {"m": 32, "n": 48, "k": 64}
    for pair in (dt("int8", "int32"), dt("fp8", "bf16"), dt("fp32")):
        assert runs_here("gemm", "torch", pair, p)
        assert check(gemm.OP, p, pair, gemm.gemm_torch, make(gemm, p, pair)) is None
    a, b = make(gemm, p, dt("int8", "int32"))
    # An integer kernel that drops the last k-tile: int8 GEMMs must be exact, so even this is caught.
    problem = check(gemm.OP, p, dt("int8", "int32"), lambda a, b: torch._int_mm(a[:, :-8], b[:-8]), (a, b))
    assert "normwise relative error" in problem and "exceeds 0" in problem


def test_gemm_rowwise_backends_pass_and_misindexed_scales_fail():
    p = {"m": 32, "n": 48, "k": 64}
    pair = dt("fp8", "bf16")
    inputs = make(gemm_rowwise, p, pair)
    for name in ("torch", "torch_dequant"):
        refused = BACKENDS[("gemm_rowwise", name)].unsupported("cpu", pair, (0, 0), p)
        if name == "torch" and refused and "need torch" in refused:
            continue  # an older torch (the GPU image's) has no row-wise fp8 CPU kernel
        assert refused is None, refused
        assert check(gemm_rowwise.OP, p, pair, BACKENDS[("gemm_rowwise", name)].fn, inputs) is None

    def reversed_rows(a, b, sa, sb, out_dtype):  # the row scales applied to the wrong rows
        # through the dequantizing backend: torch 2.11's CPU _scaled_mm takes per-tensor scales only
        return BACKENDS[("gemm_rowwise", "torch_dequant")].fn(a, b, sa.flip(0).contiguous(), sb, out_dtype)

    assert "exceeds" in check(gemm_rowwise.OP, p, pair, reversed_rows, inputs)
    assert "row-wise" in BACKENDS[("gemm_rowwise", "torch")].unsupported("cuda", pair, (8, 9), p)
    # bf16 output only on a CPU; an older torch (2.11, the GPU image's) is refused before that
    refused = BACKENDS[("gemm_rowwise", "torch")].unsupported("cpu", dt("fp8", "fp16"), (0, 0), p)
    assert "bf16 only" in refused or "need torch 2.13" in refused


def test_bmm_linear_grouped_torch_pass_and_wrong_kernels_fail():
    p = {"b": 3, "m": 8, "n": 16, "k": 32}
    inputs = make(bmm, p, dt("bf16"))
    assert check(bmm.OP, p, dt("bf16"), bmm.bmm_torch, inputs) is None
    assert "exceeds" in check(bmm.OP, p, dt("bf16"), lambda x, y: x @ y[0], inputs)  # batch 0's B for all

    for act in ("none", "relu", "silu", "gelu"):
        q = {"m": 8, "n": 16, "k": 32, "activation": act}
        for pair in (dt("fp32"), dt("bf16")):
            assert check(linear.OP, q, pair, linear.linear_torch, make(linear, q, pair)) is None
    q = {"m": 8, "n": 16, "k": 32, "activation": "silu"}

    def act_before_bias(x, w, bias, activation):
        return linear._apply(x @ w.t(), activation) + bias

    assert "exceeds" in check(linear.OP, q, dt("bf16"), act_before_bias, make(linear, q, dt("bf16")))

    g = {"groups": 4, "m": 8, "n": 16, "k": 32}
    inputs = make(grouped_gemm, g, dt("bf16"))
    assert check(grouped_gemm.OP, g, dt("bf16"), grouped_gemm.grouped_gemm_torch, inputs) is None
    rotated = lambda x, w, offs, sizes: grouped_gemm.grouped_gemm_torch(x, w.roll(1, 0), offs, sizes)  # noqa: E731
    assert "exceeds" in check(grouped_gemm.OP, g, dt("bf16"), rotated, inputs)


def test_grouped_mm_backend_computes_the_op_where_torch_has_it():
    g = {"groups": 4, "m": 8, "n": 16, "k": 32}
    inputs = make(grouped_gemm, g, dt("bf16"))
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    # On a CPU torch._grouped_mm is its loop fallback: the backend's call and layout are still checked.
    assert check(grouped_gemm.OP, g, dt("bf16"), grouped_gemm.grouped_gemm_grouped_mm, inputs) is None
    supports = BACKENDS[("grouped_gemm", "torch_grouped_mm")]
    assert "sm_90" in supports.unsupported("cpu", dt("bf16"), (0, 0), g)
    assert supports.unsupported("cuda", dt("bf16"), (9, 0), g) is None
    assert "bf16" in supports.unsupported("cuda", dt("fp16"), (9, 0), g)
    assert "multiples of 8" in supports.unsupported("cuda", dt("bf16"), (9, 0), {**g, "n": 20})


def test_shape_limits_reach_supports_through_the_params():
    p = {"m": 16, "n": 48, "k": 64}
    torch_gemm = BACKENDS[("gemm", "torch")]
    # torch._int_mm on CUDA (cuBLASLt) needs m > 16 and k, n multiples of 8; a CPU has no such limit.
    assert "m > 16" in torch_gemm.unsupported("cuda", dt("int8", "int32"), (9, 0), p)
    assert torch_gemm.unsupported("cpu", dt("int8", "int32"), (0, 0), p) is None
    assert torch_gemm.unsupported("cuda", dt("int8", "int32"), (9, 0), {**p, "m": 17}) is None
    assert "divisible by 16" in torch_gemm.unsupported("cuda", dt("fp8", "bf16"), (9, 0), {**p, "n": 40})
    fused = BACKENDS[("linear", "torch_addmm_act")]
    assert "relu and gelu" in fused.unsupported("cuda", dt("bf16"), (9, 0), {**p, "activation": "silu"})
    # The three-argument form of supports still works; a four-argument one gets the case's params.
    three = Backend("x", "y", len, "torch", supports=lambda device_type, dtypes_, capability: device_type)
    four = Backend("x", "y", len, "torch", supports=lambda device_type, dtypes_, capability, params: params["m"])
    assert three.unsupported("cpu", dt("fp32"), (0, 0), p) == "cpu"
    assert four.unsupported("cpu", dt("fp32"), (0, 0), p) == 16


# --- on a GPU (the lead's run) ---------------------------------------------------------------------


@cuda
def test_gpu_matmul_backends_pass_their_check():
    device = torch.device("cuda")
    capability = torch.cuda.get_device_capability()
    cases = [
        (gemm.OP, "gemm", {"m": 256, "n": 256, "k": 512}, dt("int8", "int32"), "torch"),
        (gemm.OP, "gemm", {"m": 256, "n": 256, "k": 512}, dt("fp8", "bf16"), "torch"),
        (gemm.OP, "gemm", {"m": 512, "n": 512, "k": 4096}, dt("fp32"), "torch"),
        (gemm_rowwise.OP, "gemm_rowwise", {"m": 256, "n": 256, "k": 512}, dt("fp8", "bf16"), "torch"),
        (gemm_rowwise.OP, "gemm_rowwise", {"m": 256, "n": 256, "k": 512}, dt("fp8", "bf16"), "torch_dequant"),
        (linear.OP, "linear", {"m": 256, "n": 512, "k": 1024, "activation": "gelu"}, dt("bf16"), "torch_addmm_act"),
        (linear.OP, "linear", {"m": 256, "n": 512, "k": 1024, "activation": "relu"}, dt("bf16"), "torch_addmm_act"),
        (grouped_gemm.OP, "grouped_gemm", {"groups": 8, "m": 64, "n": 256, "k": 512}, dt("bf16"), "torch_grouped_mm"),
    ]
    ran = 0
    for op, name, p, pair, backend in cases:
        if not runs_here(name, backend, pair, p, "cuda", capability):
            continue
        inputs = make(op, p, pair, device)
        assert check(op, p, pair, BACKENDS[(name, backend)].fn, inputs) is None, (name, backend, pair.label)
        ran += 1
    assert ran >= 4  # int8, fp32, the dequantized fp8 and the fused linear run on any CUDA GPU
