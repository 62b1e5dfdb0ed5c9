"""The replay runs the computation the model ran: Python numbers stay numbers, output dtypes are
kept, overloads follow the recorded kinds of the arguments, lists of one tensor replay, and a
case that cannot be built is skipped with the reason (issue 37)."""

import json

import pytest
import torch

from conftest import FAST
from pytest_opperf.catalog import load_builtin, replay
from pytest_opperf.catalog.registry import BACKENDS
from pytest_opperf.cli import main
from pytest_opperf.pipeline.mapping import profile
from test_pipeline_generic import bound, built

load_builtin()


def test_a_python_number_in_arithmetic_replays_as_a_number():
    # x / 30.0 is recorded as div with a 0-dim double and no value (torch 2.13, record_shapes=True)
    b = bound("aten::div", [((8, 16), (16, 1), "c10::BFloat16", ""), (None, None, "double", "")])
    assert (b.call, json.loads(b.args)) == ("aten::div.Scalar", ["T:bf16[8,16]", 2.0])
    assert any("Python number" in a for a in b.assumptions)
    # x + 1 on int64: a 0-dim long int, an int
    b = bound("aten::add", [((8,), (1,), "long int", ""), (None, None, "long int", ""), (None, None, "Scalar", "1")])
    assert (b.call, json.loads(b.args)) == ("aten::add.Scalar", ["T:i64[8]", 2, 1])
    # a real 0-dim float tensor (a device tensor in the model) stays a tensor
    b = bound("aten::mul", [((8, 16), (16, 1), "float", ""), (None, None, "float", "")])
    assert (b.call, json.loads(b.args)) == ("aten::mul.Tensor", ["T:fp32[8,16]", "T:fp32[]"])
    # an op with no Scalar overload takes the number as a 0-dim host tensor: a scalar operand still
    b = bound("aten::atan2", [((8,), (1,), "float", ""), (None, None, "double", "")])
    assert json.loads(b.args) == ["T:fp32[8]", "T:fp64[]@host"]
    call, *args = built(b)
    assert args[1].device.type == "cpu" and args[1].dim() == 0


def test_a_tensor_never_goes_into_a_scalar_slot():
    b = bound("aten::__and__", [((8, 16), (16, 1), "bool", ""), ((8, 16), (16, 1), "bool", "")])
    assert b.call == "aten::__and__.Tensor"
    call, m1, m2 = built(b)
    assert torch.equal(call(m1, m2), m1 & m2)


def test_a_list_of_one_tensor_replays():
    # torch.stack([x]) is recorded as the one tensor's dims, with no '+' between tensors
    b = bound("aten::stack", [((8, 16), (16, 1), "TensorList", ""), (None, None, "Scalar", "0")])
    assert json.loads(b.args) == [["T:fp32[8,16]"], 0]
    call, tensors, dim = built(b)
    assert call(tensors, dim).shape == (1, 8, 16)


def test_item_replays_and_a_case_that_cannot_be_built_is_told_at_set_up():
    call, x = built(bound("aten::item", [(None, None, "float", "")]))
    assert replay.reference(call, x) == pytest.approx(x.item())
    backend = BACKENDS[("aten", "torch")]
    assert backend.unsupported("cpu", None, None, {"call": "aten::item.default", "args": '["T:fp32[]"]'}) is None
    why = backend.unsupported("cpu", None, None, {"call": "aten::no_such_op.default", "args": "[]"})
    assert "has no such overload" in why


MODEL = """
import torch


class Head(torch.nn.Module):
    def forward(self, x, m1, m2):
        logits = x / 30.0
        shifted = logits + 1.0
        probs = torch.softmax(shifted.to(torch.bfloat16), dim=-1, dtype=torch.float32)
        keep = m1 & m2
        return probs, keep, torch.stack([x, logits]), torch.stack([x])


head, x = Head(), torch.randn(16, 64)
m1, m2 = torch.rand(16, 64) > 0.5, torch.rand(16, 64) > 0.5
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof:
    for _ in range(2):
        head(x, m1, m2)
prof.export_chrome_trace(r"{path}")
"""


def profiled_and_imported(directory, script: str) -> dict:
    """Run a profiling script writing directory/trace.json, import it; the signatures by op type."""
    exec(script.format(path=directory / "trace.json"), {})  # noqa: S102  (our own script: a real trace)
    command = ["import", str(directory / "trace.json"), "-o", str(directory / "profile.db")]
    assert main([*command, "--configs", str(directory / "replay")]) == 0
    return {r["op_type"]: r for r in profile.load(directory / "profile.db")}


def test_a_cpu_profile_of_numbers_output_dtypes_and_masks_replays_with_no_failed_case(pytester):
    rows = profiled_and_imported(pytester.path, MODEL)
    args = {name: json.loads(json.loads(r["params"])["args"]) for name, r in rows.items() if r["op"] == "aten"}
    assert args["aten::div"] == ["T:fp32[16,64]", 2.0] and args["aten::add"][1] == 2.0
    assert json.loads(rows["aten::__and__"]["params"])["call"] == "aten::__and__.Tensor"
    # softmax with dtype=float32 is not the catalogue's softmax in the input's dtype
    assert rows["aten::softmax"]["op"] == "aten" and args["aten::softmax"][2] == "D:float32"
    assert rows["aten::softmax"]["dtype"] == "bf16-fp32"
    assert all(r["status"] == "mapped" for r in rows.values()), [r["reason"] for r in rows.values()]
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_replay.py").write_text(
        "def test_aten(backend, inputs, bench):\n    bench(backend, *inputs)\n\n\n"
        "def test_softmax(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    (pytester.path / "configs").mkdir()
    configs = [f"--opperf-config={f}" for f in sorted((pytester.path / "replay").glob("*.yaml"))]
    ops = " or ".join(f.stem for f in sorted((pytester.path / "replay").glob("*.yaml")))
    result = pytester.runpytest("benches/", *FAST, *configs, "-m", ops, "-p", "pytest_opperf.pipeline.mapping.tag",
                                f"--opperf-signatures={pytester.path / 'replay' / 'signatures.json'}")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("failed", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes["passed"] >= 5
    assert main(["backfill", str(pytester.path / "profile.db"), str(pytester.path / "results" / "cpu.db")]) == 0
    assert all(r["replayed_us"] for r in profile.load(pytester.path / "profile.db") if r["status"] == "mapped")
