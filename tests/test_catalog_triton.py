"""Our Triton kernels and the liger-kernel backends.

On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors, tiny
shapes), when triton (and numpy, which the interpreter needs) is installed; on a GPU the
`cuda` tests run them compiled, at model shapes, with liger-kernel's backends beside them.
The knob checks need neither.
"""

import importlib
import importlib.util
import sys
import textwrap

import pytest
import torch

from conftest import FAST, rows, write_config
from pytest_opperf import dtypes
from pytest_opperf.catalog import BACKENDS, OPS, load_builtin
from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.backends import triton as _common
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure.check import compare

load_builtin()

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None,
    reason="Triton's interpreter needs triton and numpy installed")


def _numpy_refuses_array_to_int():
    """numpy 2.4 refuses int() of a 1-element array, which Triton 3.6's interpreter does for a
    loop over a runtime bound (`for start in range(0, n, BLOCK_SIZE)`)."""
    import numpy

    return not numpy.lib.NumpyVersion(numpy.__version__) < "2.4.0"


def dt(i, o=None):
    return DTypes(dtypes.lookup(i), dtypes.lookup(o or i))


def run(op, backend, p, dtypes_, device="cpu", **knobs):
    """(problem or None, output, reference, inputs) of one call of a backend on the op's inputs."""
    args = OPS[op].inputs(p, dtypes_, device, torch.Generator(device=device).manual_seed(0))
    out = BACKENDS[(op, backend)].fn(*args, **knobs)
    ref = OPS[op].reference(*args)
    tol = OPS[op].check_bound(p, dtypes_)
    return compare(out, ref, dtypes_.output, tol), out, ref, args


# --- knobs: checked before any launch, with or without triton ------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: BACKENDS[("rmsnorm", "triton")].fn(torch.ones(2, 100), torch.ones(100), block_size=64),
     "triton rmsnorm: knob BLOCK_SIZE=64 is smaller than a row (n=100); this kernel holds a whole row in one "
     "block: give BLOCK_SIZE >= 128"),
    (lambda: BACKENDS[("softmax", "triton")].fn(torch.ones(2, 100), block_size=96),
     "triton softmax: knob BLOCK_SIZE=96: expected a power of two from 1 to 65536"),
    (lambda: BACKENDS[("softmax", "triton")].fn(torch.ones(1, 70000)),
     "triton softmax: a row of 70000 elements does not fit one block of at most 65536"),
    (lambda: BACKENDS[("add_rmsnorm", "triton")].fn(torch.ones(2, 8), torch.ones(2, 8), torch.ones(8), num_warps=3),
     "triton add_rmsnorm: knob num_warps=3: expected one of [1, 2, 4, 8, 16, 32]"),
    (lambda: BACKENDS[("rope", "triton")].fn(torch.ones(1, 4, 8), torch.ones(1, 2, 8), torch.ones(1, 4),
                                             torch.ones(1, 4), "neox", block_h=8),
     "triton rope: knob BLOCK_H=8: expected a power of two from 1 to 4"),
    (lambda: BACKENDS[("silu_and_mul", "triton")].fn(torch.ones(2, 16).t(), block_size=4),
     "triton silu_and_mul: expected tensors whose last dimension is contiguous"),
    (lambda: BACKENDS[("quant_fp8", "triton")].fn(torch.ones(2, 16), "token", block_size="big"),
     "triton quant_fp8: knob BLOCK_SIZE='big': expected a power of two"),
])
def test_a_knob_the_kernel_cannot_run_with_is_refused_with_the_reason(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(message)


def test_knob_defaults():
    assert _common.row_block("rmsnorm", 4096, None) == 4096
    assert _common.row_block("rmsnorm", 14336, None) == 16384
    assert [_common.warps("x", b, None) for b in (1024, 4096, 16384, 65536)] == [4, 8, 16, 32]
    assert _common.warps("x", 65536, 8) == 8


TRITON_OPS = {"rmsnorm": "norm", "add_rmsnorm": "norm", "softmax": "activation", "silu_and_mul": "activation",
              "rope": "position", "quant_fp8": "quant"}  # op -> family: the kernel is ops/<family>/<op>/triton.py
LIGER_OPS = {"rmsnorm": "norm.rmsnorm", "add_rmsnorm": "norm.add_rmsnorm", "layernorm": "norm.layernorm",
             "softmax": "activation.softmax", "silu_and_mul": "activation.silu_and_mul",
             "gelu_and_mul": "activation.gelu_and_mul", "rope": "position.rope"}  # op -> its module under ops/


def test_the_modules_import_and_register_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    for name, family in TRITON_OPS.items():
        importlib.reload(importlib.import_module(f"pytest_opperf.catalog.ops.{family}.{name}.triton"))
        backend = BACKENDS[(name, "triton")]
        assert backend.library == "triton" and backend.devices == {"cuda"}
    for name, module in LIGER_OPS.items():
        importlib.reload(importlib.import_module(f"pytest_opperf.catalog.ops.{module}"))
        backend = BACKENDS[(name, "liger")]
        # registered by the op's own module, not by a module of liger's that serves every op
        assert backend.fn.__module__ == f"pytest_opperf.catalog.ops.{module}", name
        assert backend.library == "liger-kernel" and backend.devices == {"cuda"}
    assert sorted(op for (op, name) in BACKENDS if name == "liger") == sorted(LIGER_OPS)


# --- the kernels in Triton's interpreter, on the CPU --------------------------------------------------
#
# In a pytest subprocess: TRITON_INTERPRET must be set before triton is first imported (Triton's
# own library functions, tl.sum among them, are made interpreted or compiled at that import), and
# this process may have imported it compiled already (the GPU tests below).

INTERPRETER_CONFTEST = """
import os

os.environ["TRITON_INTERPRET"] = "1"

from pytest_opperf import register_backend
from pytest_opperf.catalog.ops.activation.silu_and_mul import triton as silu_and_mul
from pytest_opperf.catalog.ops.activation.softmax import triton as softmax
from pytest_opperf.catalog.ops.norm.add_rmsnorm import triton as add_rmsnorm
from pytest_opperf.catalog.ops.norm.rmsnorm import triton as rmsnorm
from pytest_opperf.catalog.ops.position.rope import triton as rope

# Our Triton kernels under a backend name that runs on the CPU: the interpreter stands in for the GPU.
for module in (rmsnorm, add_rmsnorm, softmax, silu_and_mul, rope):
    op = module.__name__.rsplit(".", 2)[-2]  # pytest_opperf.catalog.ops.<family>.<op>.triton
    register_backend(op, "interpreted", library="triton")(getattr(module, op + "_triton"))
"""

INTERPRETER_BENCH = """
import numpy
import pytest
import torch

from pytest_opperf.catalog import BACKENDS, OPS


def test_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)


def test_add_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)


def test_softmax(backend, inputs, bench):
    bench(backend, *inputs)


def test_silu_and_mul(backend, inputs, bench):
    bench(backend, *inputs)


def test_rope(backend, inputs, bench):
    bench(backend, *inputs)


@pytest.mark.parametrize("granularity, block_size", [("token", None), ("token", 16), ("tensor", None), ("tensor", 32)])
def test_quant_fp8_scales(granularity, block_size):
    # Only the scales: Triton's interpreter does not round to e4m3 as the GPU does (3.6 rounds ties
    # up and loses the carry into the next binade: 127.9 -> 64); q is checked on a GPU.
    if (block_size or granularity == "tensor") and not numpy.lib.NumpyVersion(numpy.__version__) < "2.4.0":
        pytest.skip("Triton's interpreter runs no loop over a runtime bound with numpy >= 2.4")
    x = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    q, scale = BACKENDS[("quant_fp8", "triton")].fn(x, granularity, block_size=block_size)
    _, expect = OPS["quant_fp8"].reference(x, granularity)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (4, 100)
    assert scale.shape == expect.shape and torch.allclose(scale, expect, rtol=1e-6, atol=0)
"""

INTERPRETER_CONFIGS = {
    "rmsnorm": """
        backends:
          interpreted:
            knobs: {BLOCK_SIZE: [64, 128], num_warps: [4, 8]}
        dtypes: [fp32, bf16]
        params: {M: 3, N: 100}
        """,
    "add_rmsnorm": "backend: interpreted\ndtypes: [fp32, fp16]\nparams: {M: 3, N: 100}\n",
    "softmax": "backends: {interpreted: {knobs: {num_warps: [2]}}}\ndtypes: [fp32, bf16]\nparams: {M: 3, N: 1000}\n",
    "silu_and_mul": "backends: {interpreted: {knobs: {BLOCK_SIZE: [16, 128]}}}\ndtypes: [fp32, bf16]\n"
                    "params: {M: 2, N: 100}\n",
    # heads that are not powers of two, and one or several heads a program
    "rope": "backends: {interpreted: {knobs: {BLOCK_H: [1, 4]}}}\ndtypes: [fp32, bf16]\n"
            "params: {tokens: 2, heads_q: 6, heads_kv: 3, head_dim: 24, layout: [neox, gptj]}\n",
}


@needs_triton
def test_the_kernels_pass_their_checks_in_the_interpreter_with_the_knobs_of_the_config(pytester):
    pytester.makepyfile(conftest=INTERPRETER_CONFTEST)
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_kernels.py").write_text(INTERPRETER_BENCH)
    (pytester.path / "configs").mkdir()
    for op, text in INTERPRETER_CONFIGS.items():
        write_config(pytester, op, textwrap.dedent(text))
    result = pytester.runpytest_subprocess("benches", "-v", "-rs", *FAST)
    loops = 0 if _numpy_refuses_array_to_int() else 3
    # rmsnorm 8 (4 fail: BLOCK_SIZE=64 < n), add_rmsnorm 2, softmax 2, silu_and_mul 4, rope 8; 4 quant scales
    result.assert_outcomes(passed=20 + 1 + loops, failed=4, skipped=3 - loops)
    result.stdout.fnmatch_lines(["*ValueError: triton rmsnorm: knob BLOCK_SIZE=64 is smaller than a row (n=100)*"])
    assert sorted(r["knobs"] for r in rows(pytester, "rmsnorm")) == [
        '{"block_size": 128, "num_warps": 4}', '{"block_size": 128, "num_warps": 4}',
        '{"block_size": 128, "num_warps": 8}', '{"block_size": 128, "num_warps": 8}']
    assert {(r["layout"], r["knobs"]) for r in rows(pytester, "rope")} == {
        (layout, f'{{"block_h": {b}}}') for layout in ("neox", "gptj") for b in (1, 4)}
    for op, count in {"add_rmsnorm": 2, "softmax": 2, "silu_and_mul": 4, "rope": 8}.items():
        assert len(rows(pytester, op)) == count, op


# --- on a GPU: compiled, at model shapes ---------------------------------------------------------------

GPU_CASES = [
    ("rmsnorm", {"m": 256, "n": 8192}, {}),
    ("rmsnorm", {"m": 7, "n": 3584}, {"block_size": 8192, "num_warps": 16}),
    ("add_rmsnorm", {"m": 256, "n": 4096}, {}),
    ("softmax", {"m": 64, "n": 32000}, {}),
    ("softmax", {"m": 1024, "n": 4096}, {"num_warps": 4}),
    ("silu_and_mul", {"m": 33, "n": 14336}, {}),
    ("silu_and_mul", {"m": 1, "n": 18944}, {"block_size": 256}),
    ("rope", {"tokens": 257, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "layout": "neox"}, {}),
    ("rope", {"tokens": 257, "heads_q": 28, "heads_kv": 4, "head_dim": 128, "layout": "gptj"}, {"block_h": 4}),
    ("quant_fp8", {"m": 256, "n": 4096, "granularity": "token"}, {}),
    ("quant_fp8", {"m": 256, "n": 14336, "granularity": "token"}, {"block_size": 1024}),
    ("quant_fp8", {"m": 256, "n": 8192, "granularity": "tensor"}, {}),
    ("quant_fp8", {"m": 3, "n": 4096, "granularity": "tensor"}, {"block_size": 512}),
]


@cuda
@pytest.mark.parametrize("op, p, knobs", GPU_CASES, ids=[f"{c[0]}-{'-'.join(map(str, c[1].values()))}-{c[2]}"
                                                         for c in GPU_CASES])
@pytest.mark.parametrize("din", ["bf16", "fp32"])
def test_triton_kernel_on_the_gpu(op, p, knobs, din):
    pytest.importorskip("triton")
    if op == "quant_fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 e4m3 needs sm_89 or newer")
    dtypes_ = dt(din, "fp8") if op == "quant_fp8" else dt(din)
    problem, *_ = run(op, "triton", p, dtypes_, device="cuda", **knobs)
    assert problem is None


LIGER_CASES = [
    ("rmsnorm", {"m": 256, "n": 4096}),
    ("add_rmsnorm", {"m": 256, "n": 4096}),
    ("layernorm", {"m": 256, "n": 6144}),
    ("softmax", {"m": 64, "n": 32768}),  # a Llama-3 vocabulary row (128256) is refused: test below
    ("silu_and_mul", {"m": 33, "n": 14336}),
    ("gelu_and_mul", {"m": 33, "n": 14336}),
    ("rope", {"tokens": 257, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "layout": "neox"}),
]


@cuda
@pytest.mark.parametrize("op, p", LIGER_CASES, ids=[c[0] for c in LIGER_CASES])
@pytest.mark.parametrize("din", ["bf16", "fp32"])
def test_liger_backend_on_the_gpu(op, p, din):
    pytest.importorskip("liger_kernel")
    args = OPS[op].inputs(p, dt(din), "cuda", torch.Generator(device="cuda").manual_seed(0))
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    problem = compare(BACKENDS[(op, "liger")].fn(*args), OPS[op].reference(*args), dt(din).output,
                      OPS[op].check_bound(p, dt(din)))
    assert problem is None
    # the check computes the reference after the call: a backend must leave its inputs as they were
    assert all(not isinstance(a, torch.Tensor) or torch.equal(a, b) for a, b in zip(args, before))


def test_liger_softmax_refuses_rows_past_its_block():
    # liger raises at launch past one 65536-wide block; supports says so before the case runs.
    entry = BACKENDS[("softmax", "liger")]
    assert "65536" in entry.unsupported("cuda", dt("bf16"), (9, 0), {"m": 1, "n": 128256})
    assert entry.unsupported("cuda", dt("bf16"), (9, 0), {"m": 1, "n": 32768}) is None


@cuda
def test_liger_rope_refuses_the_gptj_layout():
    pytest.importorskip("liger_kernel")
    p = {"tokens": 2, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "layout": "gptj"}
    with pytest.raises(ValueError, match="rotates halves .layout neox. only"):
        run("rope", "liger", p, dt("bf16"), device="cuda")


def test_liger_is_imported_without_peft_and_transformers_then_both_import_again(tmp_path, monkeypatch):
    # A stand-in liger_kernel whose ops module imports peft and transformers as liger's does
    # (utils, and the NPU probe at import); real peft/transformers stand-ins sit beside it.
    (tmp_path / "liger_kernel").mkdir()
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (tmp_path / "liger_kernel" / "ops.py").write_text(textwrap.dedent("""
        found = []
        for name in ("peft", "transformers"):
            try:
                __import__(name)
                found.append(name)
            except ImportError:
                pass
        LigerSoftmaxFunction = None
    """))
    for name in ("peft", "transformers"):
        (tmp_path / f"{name}.py").write_text("LOADED = True\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("liger_kernel", "liger_kernel.ops"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    liger.ops.cache_clear()
    try:
        ops = liger.ops()
        assert ops.found == [] and ops.__file__.startswith(str(tmp_path))
        assert "peft" not in sys.modules and "transformers" not in sys.modules  # no None left behind
        assert importlib.import_module("peft").LOADED and importlib.import_module("transformers").LOADED
    finally:
        liger.ops.cache_clear()
        for name in ("liger_kernel", "liger_kernel.ops", "peft", "transformers"):
            sys.modules.pop(name, None)


def test_liger_keeps_peft_and_transformers_that_were_imported_before(tmp_path, monkeypatch):
    (tmp_path / "liger_kernel").mkdir()
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (tmp_path / "liger_kernel" / "ops.py").write_text("import peft\nimport transformers\nfound = ['peft', 'transformers']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("peft", "transformers"):
        monkeypatch.setitem(sys.modules, name, type(sys)(name))
    for name in ("liger_kernel", "liger_kernel.ops"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    liger.ops.cache_clear()
    try:
        assert liger.ops().found == ["peft", "transformers"]
        assert sys.modules["peft"] is not None and sys.modules["transformers"] is not None
    finally:
        liger.ops.cache_clear()
        for name in ("liger_kernel", "liger_kernel.ops"):
            sys.modules.pop(name, None)
