"""The backends of one shape run side by side on the same inputs, and one reference output serves
them (check.LastReference), without letting a wrong kernel through."""

import dataclasses

import torch

from conftest import FAST, rows, write_config
from pytest_opperf.catalog.registry import OPS
from pytest_opperf.measure.check import LastReference

MATMUL = """

@register_backend("gemm", "matmul")
def gemm_matmul(a, b):
    return torch.matmul(a, b)
"""


def test_a_shapes_backends_run_together_and_share_one_reference(project, monkeypatch):
    op = OPS["gemm"]
    computed = []

    def counted(*args):
        computed.append(tuple(a.shape for a in args))
        return op.reference(*args)

    monkeypatch.setitem(OPS, "gemm", dataclasses.replace(op, reference=counted))
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + MATMUL)
    write_config(project, "gemm", "backends: [torch, matmul, wrong]\ndtypes: [fp32, bf16, fp16]\n"
                                  "params: {M: [8, 16], N: 8, K: 8}\n")
    result = project.runpytest("benches", "-k", "gemm", "-v", *FAST)
    # 1% off still fails at every dtype, checked against the reference the torch backend's case computed.
    result.assert_outcomes(passed=12, failed=6)
    result.stdout.fnmatch_lines(["*functional check failed: gemm/wrong [[]wrong-bf16-m=8-n=8-k=8[]]*"])
    assert len(computed) == 6  # one reference per shape (3 dtypes x 2 sizes), not one per backend
    ran = [line.split("[")[1].split("]")[0] for line in result.stdout.lines if "::test_gemm[" in line
           and (" PASSED" in line or " FAILED" in line)]
    assert ran[:3] == ["torch-fp32-m=8-n=8-k=8", "matmul-fp32-m=8-n=8-k=8", "wrong-fp32-m=8-n=8-k=8"]
    assert sorted(r["backend"] for r in rows(project, "gemm")) == ["matmul"] * 6 + ["torch"] * 6


def test_a_kept_reference_serves_equal_inputs_only():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    kept = LastReference()
    kept.keep("gemm/fp32-fp32/m=4", (a, b), a @ b)
    assert kept.get("gemm/fp32-fp32/m=4", (a.clone(), b.clone())) is kept.ref  # equal values: served
    assert kept.get("gemm/fp32-fp32/m=8", (a, b)) is None  # another shape
    fresh = (a.clone(), b.clone())
    a.add_(1)  # the case before wrote into its inputs while timed: the kept reference is of other values
    assert kept.get("gemm/fp32-fp32/m=4", fresh) is None
    kept.release(unless="gemm/fp32-fp32/m=4")
    assert kept.ref is not None  # kept for the same shape
    kept.release(unless="add/fp32-fp32/n=4")
    assert (kept.key, kept.args, kept.ref) == (None, (), None)  # let go before another shape's inputs


def test_a_reference_too_large_to_keep_is_not_kept(monkeypatch):
    monkeypatch.setattr(LastReference, "MAX_BYTES", 100)
    a = torch.randn(8, 8)  # 256 bytes
    kept = LastReference()
    kept.keep("k", (a,), a)
    assert kept.key is None and kept.get("k", (a,)) is None
