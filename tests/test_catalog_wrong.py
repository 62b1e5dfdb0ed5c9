"""Every built-in op: its torch backend passes the functional check on tiny CPU inputs, and
deliberately wrong variants of that output do not.

The wrong variants of each output: values off by ten times the op's tolerance (a relative
error in the norm), the elements permuted (where that moves them past the tolerance), and for
integer outputs (ids, offsets) one element changed by one. A new op must add its tiny case to
TINY below: the test fails for an op it does not know.
"""

import pytest
import torch

from pytest_opperf.catalog import OPS, load_builtin
from pytest_opperf.dtypes import lookup
from pytest_opperf.catalog.registry import BACKENDS, DTypes
from pytest_opperf.catalog.table import rows as builtin_rows
from pytest_opperf.measure import check

load_builtin()

# op -> (parameters, dtype_in, dtype_out): the smallest case that exercises the op.
TINY = {
    "gemm": ({"m": 8, "n": 12, "k": 16}, "fp32", "fp32"),
    "add": ({"n": 64}, "fp32", "fp32"),
    "gelu": ({"n": 64}, "fp32", "fp32"),
    "softmax": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "rmsnorm": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "moe_gating": ({"tokens": 16, "experts": 8, "topk": 2}, "fp32", "fp32"),
    "moe_permute": ({"tokens": 16, "hidden": 8, "experts": 4, "topk": 2}, "fp32", "fp32"),
    "sampling": ({"batch": 8, "vocab": 400, "top_k": 20, "top_p": 0.8}, "fp32", "int64"),
    "cross_entropy": ({"tokens": 8, "vocab": 100}, "fp32", "fp32"),
    "kv_cache_write": ({"tokens": 4, "kv_heads": 2, "head_dim": 8, "pages": 2}, "fp32", "fp32"),
    "embedding": ({"tokens": 8, "vocab": 20, "hidden": 8}, "fp32", "fp32"),
    "transpose": ({"m": 6, "n": 10}, "fp32", "fp32"),
    "bmm": ({"b": 2, "m": 8, "n": 12, "k": 16}, "fp32", "fp32"),
    "gemm_rowwise": ({"m": 16, "n": 16, "k": 32}, "fp8", "bf16"),
    "linear": ({"m": 8, "n": 12, "k": 16, "activation": "gelu"}, "fp32", "fp32"),
    "grouped_gemm": ({"groups": 2, "m": 8, "n": 12, "k": 16}, "fp32", "fp32"),
    # A recorded topk: two outputs, the values (float) and the ids (compared exactly).
    "aten": ({"call": "aten::topk.default", "args": '["T:fp32[4,64]",5,-1,true,true]'}, "fp32", "fp32"),
    "attention_prefill": ({"batch": 1, "seq": 16, "heads_q": 4, "heads_kv": 2, "head_dim": 16}, "fp32", "fp32"),
    "attention_decode": ({"batch": 2, "kv_len": 16, "heads_q": 4, "heads_kv": 2, "head_dim": 16}, "fp32", "fp32"),
    "paged_decode": ({"batch": 2, "kv_len": 32, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "page_size": 8},
                     "fp32", "fp32"),
    "mla_decode": ({"batch": 2, "kv_len": 16, "heads": 4, "kv_lora_rank": 32, "rope_dim": 8}, "fp32", "fp32"),
    "layernorm": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "add_rmsnorm": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "silu_and_mul": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "gelu_and_mul": ({"m": 4, "n": 16}, "fp32", "fp32"),
    "rope": ({"tokens": 4, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "layout": "gptj"}, "fp32", "fp32"),
    "quant_fp8": ({"m": 4, "n": 32, "granularity": "token"}, "fp32", "fp8"),
    "quant_int8": ({"n": 4, "k": 32}, "fp32", "int8"),
    "sort": ({"m": 4, "n": 64}, "fp32", "fp32"),
}

# Collectives check on their ranks, against every rank's inputs: tests/test_collective_bench.py.
BUILTIN = [r["op"] for r in builtin_rows() if r["family"] != "collective"]


def _case(op):
    if op not in TINY:
        pytest.fail(f"op {op!r} has no tiny case: add it to TINY in {__file__} as "
                    f"{op!r}: ({{param: value, ...}}, dtype_in, dtype_out)", pytrace=False)
    params, dtype_in, dtype_out = TINY[op]
    spec = OPS[op]
    params = {**spec.defaults, **params}
    dt = DTypes(lookup(dtype_in), lookup(dtype_out))
    tolerance = spec.check_bound(params, dt)
    return spec, params, dt, tolerance


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _wrong_variants(out, tolerance, gen):
    """(description, the output with exactly one of its tensors made wrong)."""
    outs = _outputs(out)
    for i, o in enumerate(outs):
        variants = []
        if o.dtype.is_floating_point:
            rel = 10 * tolerance if tolerance > 0 else 1e-3  # an exact op: any visible error
            noise = torch.randn(o.shape, generator=gen, dtype=torch.float64)
            scale = rel * torch.linalg.vector_norm(o.double()) / torch.linalg.vector_norm(noise)
            variants.append(("perturbed", (o.double() + scale * noise).float().to(o.dtype)))
            if o.numel() > 1:
                # Through float32: not every dtype has a flip kernel (fp8 on a CPU).
                flipped = o.float().flatten().flip(0).reshape(o.shape).to(o.dtype)
                moved = torch.linalg.vector_norm(flipped.double() - o.double()) / torch.linalg.vector_norm(o.double())
                if moved > 10 * tolerance:
                    variants.append(("permuted", flipped))
        else:
            changed = o.clone()
            changed.view(-1)[changed.numel() // 2] += 1
            variants.append(("one id changed", changed))
        for name, bad in variants:
            yield f"output {i} {name}", tuple(bad if j == i else x for j, x in enumerate(outs))


@pytest.mark.parametrize("op", BUILTIN)
def test_torch_backend_passes_and_wrong_outputs_fail(op):
    spec, params, dt, tolerance = _case(op)
    backend = BACKENDS[(op, "torch")]
    refused = backend.unsupported("cpu", dt, (), params)
    if refused and "need torch" in refused:
        pytest.skip(refused)  # an older torch (the GPU image's) lacks the CPU kernel
    assert refused is None, f"{op}: pick a tiny dtype pair it runs"
    with torch.inference_mode():
        inputs = spec.inputs(params, dt, torch.device("cpu"), torch.Generator().manual_seed(0))
        out = backend.fn(*inputs)
        ref = spec.reference(*spec.inputs(params, dt, torch.device("cpu"), torch.Generator().manual_seed(0)))
    assert check.compare(out, ref, dt.output, tolerance) is None
    variants = list(_wrong_variants(out, tolerance, torch.Generator().manual_seed(1)))
    assert variants
    single = not isinstance(out, (tuple, list))
    for name, bad in variants:
        problem = check.compare(bad[0] if single else bad, ref, dt.output, tolerance)
        assert problem is not None, f"{op}: the check let a wrong output through ({name})"


def test_every_tiny_case_is_a_registered_op():
    assert sorted(set(TINY) - set(OPS)) == []


# --- a kernel 1% off fails at every dtype the op runs (issue 38) ------------------------------

HALF_AND_SINGLE = ("bf16", "fp16", "fp32")


def _dtype_pairs(op):
    """(params, dtypes) of `op` at each dtype pair its torch backend runs here, the tiny case's
    in/out roles kept: (d, d) where the op writes what it reads, else each of bf16/fp16/fp32 on
    the side that varies. A recorded aten call names its tensors' dtype in its arguments."""
    spec, params, dt, _ = _case(op)
    pairs = {(d, d) for d in HALF_AND_SINGLE} | {(d, dt.output.name) for d in HALF_AND_SINGLE} \
        | {(dt.input.name, d) for d in HALF_AND_SINGLE}
    runs = []
    for i, o in sorted(pairs):
        at = DTypes(lookup(i), lookup(o))
        p = {**params, "args": params["args"].replace("T:fp32", f"T:{o}")} if op == "aten" else params
        if BACKENDS[(op, "torch")].unsupported("cpu", at, (), p) is None:
            runs.append((p, at))
    return runs


def run_torch(op, params, dt):
    """(the torch backend's output, the reference, the check's bound) of a case on the CPU, seed 0."""
    spec = OPS[op]
    with torch.inference_mode():
        inputs = spec.inputs(params, dt, torch.device("cpu"), torch.Generator().manual_seed(0))
        out = BACKENDS[(op, "torch")].fn(*inputs)
        ref = spec.reference(*spec.inputs(params, dt, torch.device("cpu"), torch.Generator().manual_seed(0)))
    return out, ref, spec.check_bound(params, dt)


def _one_percent_off(out):
    """(index, the outputs with that float output scaled by 1.01 in its own dtype) for each float
    output a 1% error shows in (fp8's steps are 6-12%: scaled q rounds back to itself)."""
    outs = _outputs(out)
    for i, o in enumerate(outs):
        if not o.dtype.is_floating_point:
            continue
        scaled = (o.double() * 1.01).to(o.dtype)
        if torch.equal(scaled.reshape(-1).view(torch.uint8), o.reshape(-1).view(torch.uint8)):
            continue
        yield i, tuple(scaled if j == i else x for j, x in enumerate(outs))


@pytest.mark.parametrize("op", BUILTIN)
def test_a_backend_one_percent_off_fails_at_every_dtype(op):
    spec = OPS[op]
    pairs = _dtype_pairs(op)
    if not pairs:
        _, params, dt, _ = _case(op)
        refused = BACKENDS[(op, "torch")].unsupported("cpu", dt, (), params) or ""
        if "need torch" in refused:
            pytest.skip(refused)  # an older torch (the GPU image's 2.11) lacks the CPU kernel
    assert pairs, f"{op}: its torch backend runs no bf16/fp16/fp32 pair on the CPU"
    floats = set()
    for params, dt in pairs:
        out, ref, bound = run_torch(op, params, dt)
        assert check.compare(out, ref, dt.output, bound) is None, f"{op} at {dt.label}: the correct backend fails"
        single = not isinstance(out, (tuple, list))
        for i, bad in _one_percent_off(out):
            floats.add(dt.label)
            problem = check.compare(bad[0] if single else bad, ref, dt.output, bound)
            assert problem is not None, f"{op} at {dt.label}: output {i} 1% off passes the check (bound {bound:g})"
    # Ops that write only ids (sampling) are compared exactly: the test above changes one id.
    if any(o.dtype.is_floating_point for o in _outputs(out)):
        assert floats, f"{op}: no output where a 1% error shows"
    # Every op reads or writes each of them, but the fp8 GEMM (fp8 in, bf16 out only).
    if op != "gemm_rowwise":
        covered = {dt.input.name for _, dt in pairs} | {dt.output.name for _, dt in pairs}
        assert set(HALF_AND_SINGLE) <= covered, f"{op}: runs only {sorted(covered)}"


def test_default_bound_catches_one_percent_at_bf16_where_the_old_table_did_not():
    # The old per-dtype figure (bf16: 2e-2 normwise) let a 1% error in every element through.
    bf16 = DTypes(lookup("bf16"), lookup("bf16"))
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    relu = OPS["add"].check_bound({"n": 4096}, bf16)
    assert relu < 0.01 < 2e-2
    assert check.compare((x.double() * 1.01).to(torch.bfloat16), x.double(), bf16.output, relu) is not None
    assert check.compare(x, x.double(), bf16.output, relu) is None


def test_a_scale_error_fails_as_systematic_even_under_a_loose_normwise_bound():
    # mla_decode's bound must let an eager backend's bf16 scores through (5.5 u_bf16 at its sizes):
    # 1% off passes that normwise, and the systematic share fails it.
    bf16 = DTypes(lookup("bf16"), lookup("bf16"))
    loose = OPS["mla_decode"].check_bound({"kv_lora_rank": 512, "rope_dim": 64}, bf16)
    assert loose > 0.0102
    ref = torch.randn(2, 128, 512, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rounded = ref.to(torch.bfloat16)
    noisy = (ref * (1 + 0.01 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1),
                                           dtype=torch.float64))).to(torch.bfloat16)  # random 1%: no bias
    assert check.compare(rounded, ref, bf16.output, loose) is None
    assert check.compare(noisy, ref, bf16.output, loose) is None
    problem = check.compare((ref * 1.01).to(torch.bfloat16), ref, bf16.output, loose)
    assert problem is not None and problem.startswith("systematic error: the output is 1.01")


SCAN = {"call": "aten::cumsum.default", "args": '["T:bf16[4,32000]",-1,null]'}


def _carried_in_bf16(x):
    """x's cumsum as a scan that adds in bf16 across blocks: each block of 1000 summed exactly, then
    added to the running sum as stored in the bf16 output (a carry rounded 32 times)."""
    out = torch.zeros_like(x, dtype=torch.bfloat16)
    acc = torch.zeros(x.shape[0], dtype=torch.bfloat16)
    for j in range(0, x.shape[-1], 1000):
        out[:, j:j + 1000] = (acc.double().unsqueeze(1) + x[:, j:j + 1000].cumsum(-1)).to(torch.bfloat16)
        acc = out[:, j + 999]
    return out


def test_a_bf16_scan_gets_its_length_in_the_bound_and_a_scale_error_still_fails():
    # torch's CUDA cumsum adds in the output dtype: on an H100 a bf16 cumsum of 32000 values read
    # 0.0179 normwise (2026-11-26), over the elementwise 2 u. The aten op's bound grows with the
    # scanned length; a kernel 1% off still fails, as a systematic error. The correct scan here sums
    # exactly and rounds once (a CPU scan accumulating in float); one that carries in bf16: below.
    bf16 = DTypes(lookup("bf16"), lookup("bf16"))
    bound = OPS["aten"].check_bound(SCAN, bf16)
    assert bound > 0.0179 > OPS["aten"].check_bound({"call": "aten::neg.default", "args": '["T:bf16[4,32000]"]'},
                                                     bf16)
    x = torch.randn(4, 32000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = x.cumsum(-1)
    assert check.compare(ref.to(torch.bfloat16), ref, bf16.output, bound) is None  # summed exactly, then rounded
    assert check.compare((ref * 1.01).to(torch.bfloat16), ref, bf16.output, bound) is not None


@pytest.mark.xfail(strict=True, reason="known defect: a scan whose carries are rounded to bf16 carries their "
                   "error into every later output; over 300 random inputs its systematic share reached 0.88% "
                   "(p95 0.56%), past the check's allowance of u = 0.39% in 47 of them (2026-11-26). A kernel "
                   "1% off is 1.0%: no allowance tells the two apart for every input. Needs the CUDA kernel's "
                   "own error, measured on a GPU, before the rule changes.")
def test_a_bf16_scan_that_carries_in_bf16_passes_for_every_input():
    bf16 = DTypes(lookup("bf16"), lookup("bf16"))
    bound = OPS["aten"].check_bound(SCAN, bf16)
    gen = torch.Generator().manual_seed(0)
    failed = []
    for _ in range(40):
        x = torch.randn(4, 32000, dtype=torch.float64, generator=gen)
        problem = check.compare(_carried_in_bf16(x), x.cumsum(-1), bf16.output, bound)
        failed += [problem] if problem else []
    assert not failed, failed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", HALF_AND_SINGLE)
def test_a_large_replays_reference_runs_in_float64_on_the_device_and_catches_1_percent(dtype):
    """Inputs over DEVICE_REFERENCE_BYTES on a GPU: the float64 reference runs there (an 8192-token
    linear of 4096 x 4096: seconds on a CPU), equals the CPU's, and a kernel 1% off still fails."""
    from pytest_opperf.catalog import replay

    params = {"call": "aten::linear.default", "args": f'["T:{dtype}[8192,4096]","T:{dtype}[4096,4096]",null]'}
    spec, dt = OPS["aten"], DTypes(lookup(dtype), lookup(dtype))
    with torch.inference_mode():
        inputs = spec.inputs(params, dt, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
        assert replay._large(list(inputs[1:]), torch)
        ref = spec.reference(*inputs)
        out = BACKENDS[("aten", "torch")].fn(*inputs)
        on_cpu = spec.reference(inputs[0], *[a.cpu() if isinstance(a, torch.Tensor) else a for a in inputs[1:]])
    assert ref.device.type == "cuda" and on_cpu.device.type == "cpu"
    assert torch.allclose(ref.cpu().double(), on_cpu.double(), rtol=1e-3, atol=1e-3)
    bound = spec.check_bound(params, dt)
    assert check.compare(out, ref, dt.output, bound) is None
    assert check.compare((out.double() * 1.01).to(out.dtype), ref, dt.output, bound) is not None
