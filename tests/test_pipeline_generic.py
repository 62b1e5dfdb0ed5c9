"""Recorded aten calls replayed as themselves: binding a trace's slots to an overload, the
contents the replay gives its tensors, and the chain import -> pytest -> backfill on a real
torch.profiler trace of a sampler and an MoE router."""

import json
from pathlib import Path

import pytest
import torch

from conftest import FAST
from pytest_opperf.catalog import load_builtin, replay
from pytest_opperf.catalog.registry import BACKENDS
from pytest_opperf.cli import main
from pytest_opperf.measure import check
from pytest_opperf.dtypes import lookup
from pytest_opperf.pipeline.mapping import bind, profile

load_builtin()


def bound(op_type, slots, **kw):
    """bind() over (dims, strides, type, value) per slot."""
    dims, strides, types, values = (list(x) for x in zip(*slots)) if slots else ([], [], [], [])
    return bind.bind(op_type, dims, strides, types, values, **kw)


def built(b, seed=0):
    return replay.build(b.call, b.args, "cpu", torch.Generator().manual_seed(seed))


def test_strides_and_scalars_are_kept():
    # x @ wte.T: the second operand transposed, as a tied LM head multiplies
    b = bound("aten::mm", [((4, 8), (8, 1), "c10::BFloat16", ""), ((8, 16), (1, 8), "c10::BFloat16", "")])
    assert (b.call, json.loads(b.args)) == ("aten::mm.default", ["T:bf16[4,8]", "T:bf16[8,16]/1,8"])
    call, x, w = built(b)
    assert w.stride() == (1, 8) and w.dtype == torch.bfloat16
    b = bound("aten::topk", [((4, 64), (64, 1), "float", ""), (None, None, "Scalar", "5"),
                             (None, None, "Scalar", "-1"), (None, None, "Scalar", "True"), (None, None, "Scalar", "False")])
    assert json.loads(b.args) == ["T:fp32[4,64]", 5, -1, True, False]
    # a dtype argument is recorded as its ScalarType code (15 = bfloat16)
    b = bound("aten::to", [((4, 8), (8, 1), "float", ""), (None, None, "Scalar", "15"), (None, None, "Scalar", "False"),
                           (None, None, "Scalar", "False"), (None, None, "", "")])
    assert (b.call, json.loads(b.args)[1]) == ("aten::to.dtype", "D:bfloat16")


def test_a_recorded_number_picks_the_overload_that_takes_one():
    b = bound("aten::where", [((4, 8), (8, 1), "bool", ""), ((4, 8), (8, 1), "c10::BFloat16", ""),
                              (None, None, "Scalar", "0.")])
    assert b.call == "aten::where.ScalarOther"


def test_calls_that_cannot_replay_say_why():
    with pytest.raises(bind.Unbindable, match="draws random numbers"):
        bound("aten::randn", [(None, None, "ScalarList", "[4, 8]"), (None, None, "", ""), (None, None, "", ""),
                              (None, None, "", ""), (None, None, "", "")])
    with pytest.raises(bind.Unbindable, match="has no aten::no_such_op"):
        bound("aten::no_such_op", [])
    with pytest.raises(bind.Unbindable, match="no overload of aten::topk takes"):
        bound("aten::topk", [((4, 64), (64, 1), "float", "")])


def test_in_place_ops_replay_in_place_only_when_repeating_them_changes_nothing():
    fill = bound("aten::masked_fill_", [((8, 16), (16, 1), "float", ""), ((8, 16), (16, 1), "bool", ""),
                                        (None, None, "Scalar", "-inf")])
    assert fill.call == "aten::masked_fill_.Scalar" and not fill.proxy
    args = built(fill)
    before = args[1].clone()
    out = args[0](*args[1:])
    ref = replay.reference(*args)  # from the tensor as it was before the call, not as the call left it
    assert check.compare(out, ref, lookup("fp32"), 1e-6) is None
    assert not torch.equal(before, args[1])
    add = bound("aten::add_", [((8, 16), (16, 1), "float", ""), ((8, 16), (16, 1), "float", ""),
                               (None, None, "Scalar", "1")])
    assert add.call == "aten::add.Tensor" and add.proxy and "out of place" in " ".join(add.assumptions)


def test_an_out_call_replays_as_the_out_overload_and_is_checked_on_its_out_tensor(tmp_path):
    # aten::where(condition, a Python float, tensor, out=...) as a torch 2.13 record_shapes trace writes it:
    # the float is a 0-dim double without a value, the out tensor sits in the slot of its keyword.
    where = {"ph": "X", "cat": "cpu_op", "name": "aten::where", "pid": 1, "tid": 1, "ts": 0, "dur": 7,
             "args": {"External id": 1, "Input Dims": [[8, 32], [], [8, 32], [8, 32]],
                      "Input type": ["bool", "double", "float", "float"],
                      "Input Strides": [[32, 1], [], [32, 1], [32, 1]], "Concrete Inputs": ["", "", "", ""]}}
    trace = tmp_path / "where.json"
    trace.write_text(json.dumps({"traceEvents": [where]}))
    (row,) = profile.import_profile(trace, tmp_path / "p.db")
    assert (row["status"], row["op"]) == ("mapped", "aten"), row["reason"]
    params = json.loads(row["params"])
    assert params["call"] == "aten::where.self_out"
    assert json.loads(params["args"]) == ["T:b1[8,32]", "T:fp64[]@host", "T:fp32[8,32]", "T:fp32[8,32]"]
    args = built(bind.Bound(params["call"], params["args"], ()))
    out = BACKENDS[("aten", "torch")].fn(*args)
    assert out.data_ptr() == args[4].data_ptr()  # the call wrote into its out tensor, as the model's did
    assert check.compare(out, replay.reference(*args), lookup("fp32"), 1e-6) is None
    assert check.compare(out.neg(), replay.reference(*args), lookup("fp32"), 1e-6) is not None
    # bytes: the three inputs read, the out tensor written once (not also read)
    assert replay.nbytes(params["call"], params["args"]) == 8 * 32 * 1 + 8 + 8 * 32 * 4 + 8 * 32 * 4
    # other out= calls bind to their out overloads, keyword arguments in schema order
    add = bound("aten::add", [((8, 32), (32, 1), "float", ""), ((8, 32), (32, 1), "float", ""),
                              (None, None, "Scalar", "2"), ((8, 32), (32, 1), "float", "")])
    assert (add.call, json.loads(add.args)) == ("aten::add.out", ["T:fp32[8,32]", "T:fp32[8,32]", 2, "T:fp32[8,32]"])
    mm = bound("aten::mm", [((8, 64), (64, 1), "float", ""), ((64, 8), (1, 64), "float", ""), ((8, 8), (8, 1), "float", "")])
    assert (mm.call, json.loads(mm.args)) == ("aten::mm.out", ["T:fp32[8,64]", "T:fp32[64,8]/1,64", "T:fp32[8,8]"])
    for b in (add, mm):
        args = built(b)
        assert check.compare(BACKENDS[("aten", "torch")].fn(*args), replay.reference(*args), lookup("fp32"), 1e-5) is None


def test_contents_are_valid_for_what_the_op_does():
    index = built(bound("aten::index_select", [((50, 8), (8, 1), "float", ""), (None, None, "Scalar", "0"),
                                               ((200,), (1,), "long int", "")]))
    assert 0 <= int(index[3].min()) and int(index[3].max()) < 50
    gm = built(bound("aten::_grouped_mm", [((64, 32), (32, 1), "c10::BFloat16", ""),
                                           ((4, 32, 16), (512, 1, 32), "c10::BFloat16", ""),
                                           ((4,), (1,), "int", ""), (None, None, "", ""), (None, None, "", "")]))
    assert gm[3].tolist() == [16, 32, 48, 64] and gm[2].stride() == (512, 1, 32)
    top = built(bound("aten::topk", [((16, 32000), (32000, 1), "c10::BFloat16", ""), (None, None, "Scalar", "8"),
                                     (None, None, "Scalar", "-1"), (None, None, "Scalar", "True"),
                                     (None, None, "Scalar", "True")]))
    assert all(row.unique().numel() == 32000 for row in top[1])  # distinct in each row: every kernel picks alike
    (mask,) = [a for a in built(bound("aten::masked_fill", [((8, 16), (16, 1), "float", ""), ((8, 16), (16, 1), "bool", ""),
                                                            (None, None, "Scalar", "0")]))[1:] if
               isinstance(a, torch.Tensor) and a.dtype == torch.bool]
    assert 0 < int(mask.sum()) < mask.numel()
    # an index the profiler leaves out: index_put's count comes from its values, index's is assumed
    put = bound("aten::index_put_", [((100,), (1,), "float", ""), (None, None, "", ""), ((30,), (1,), "float", ""),
                                     (None, None, "Scalar", "False")])
    assert json.loads(put.args)[1] == ["T:i64[30]"] and not put.proxy
    idx = bound("aten::index", [((100, 8), (8, 1), "float", ""), (None, None, "", "")])
    assert idx.proxy and "assumed" in " ".join(idx.assumptions)


def test_the_reference_catches_a_wrong_result():
    b = bound("aten::cumsum", [((4, 64), (64, 1), "float", ""), (None, None, "Scalar", "-1"), (None, None, "", "")])
    args = built(b)
    good = BACKENDS[("aten", "torch")].fn(*args)
    ref = replay.reference(*args)
    assert check.compare(good, ref, lookup("fp32"), 1e-4) is None
    wrong = args[1].cumsum(0)  # the wrong dimension
    assert "normwise relative error" in check.compare(wrong, ref, lookup("fp32"), 1e-4)


ROUTER = """
import torch
torch.manual_seed(0)
logits = torch.randn(16, 512, dtype=torch.bfloat16)
x = torch.randn(64, 32, dtype=torch.bfloat16)
w = torch.randn(48, 32, dtype=torch.bfloat16)
ids = torch.randint(0, 64, (20,))
masked = torch.empty(16, 512, dtype=torch.bfloat16)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    probs = logits.float().softmax(-1)
    top = torch.topk(probs, 8, dim=-1)
    order = torch.sort(logits, dim=-1, descending=True)
    greedy = logits.argmax(-1)
    masked = logits.masked_fill(logits < 0, float("-inf"))
    csum = torch.cumsum(probs, dim=-1)
    rows = x.index_select(0, ids)
    head = x @ w.T
    # out=: a 0-dim double stands for the Python float a model's code passes (recorded alike)
    torch.ops.aten.where.self_out(logits < 0, torch.tensor(-1e4, dtype=torch.float64), logits, out=masked)
prof.export_chrome_trace(r"{path}")
"""


def test_a_sampler_trace_replays_as_itself_through_pytest_and_backfills(pytester):
    trace = pytester.path / "trace.json"
    exec(ROUTER.format(path=trace), {})  # noqa: S102  (our own script: a real torch.profiler trace)
    assert main(["import", str(trace), "-o", str(pytester.path / "profile.db"), "--configs",
                 str(pytester.path / "replay")]) == 0
    rows = profile.load(pytester.path / "profile.db")
    wanted = {"aten::topk", "aten::sort", "aten::argmax", "aten::masked_fill", "aten::cumsum", "aten::index_select",
              "aten::where"}
    same = {r["op_type"] for r in rows if r["op"] == "aten" and r["status"] == "mapped" and not r["proxy"]}
    assert wanted <= same
    (where,) = [json.loads(r["params"])["call"] for r in rows if r["op_type"] == "aten::where"]
    assert where == "aten::where.self_out"
    (head,) = [r for r in rows if r["op_type"] == "aten::matmul"]  # the outermost op replays, mm inside it
    assert json.loads(head["params"])["args"] == '["T:bf16[64,32]","T:bf16[32,48]/1,32"]'  # x @ w.T as it was
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_replay.py").write_text("def test_aten(backend, inputs, bench):\n"
                                                               "    bench(backend, *inputs)\n")
    (pytester.path / "configs").mkdir()
    result = pytester.runpytest("benches/", *FAST, f"--opperf-config={pytester.path / 'replay' / 'aten.yaml'}",
                                "-m", "aten", "-p", "pytest_opperf.pipeline.mapping.tag",
                                f"--opperf-signatures={pytester.path / 'replay' / 'signatures.json'}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= len(wanted), result.stdout.str()[-3000:]
    assert main(["backfill", str(pytester.path / "profile.db"), str(pytester.path / "results" / "cpu.db")]) == 0
    filled = {r["op_type"] for r in profile.load(pytester.path / "profile.db") if r["replayed_us"] is not None}
    assert wanted <= filled


def test_a_deepseek_v3_trace_from_an_h100_maps_whole_and_replays_as_it_ran(tmp_path):
    trace = Path(__file__).parent / "data" / "traces" / "h100_deepseek_v3_tf517.json.gz"
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    total = sum(r["profiled_total_us"] for r in rows)
    mapped = sum(r["profiled_total_us"] for r in rows if r["status"] == "mapped")
    same = sum(r["profiled_total_us"] for r in rows if r["status"] == "mapped" and not r["proxy"])
    assert mapped / total >= 0.97 and same / total >= 0.90
    # the experts: torch._grouped_mm with each expert's weight passed transposed, replayed so
    experts = [json.loads(r["params"]) for r in rows if r["op_type"] == "aten::_grouped_mm"]
    assert experts and all(p["call"] == "aten::_grouped_mm.default" and "/" in json.loads(p["args"])[1]
                           for p in experts)
    # MLA: value heads of 128 against 192 for queries and keys - not the catalogue's one-head-dim attention
    mla = [r for r in rows if "attention" in r["op_type"] and r["input_shapes"].startswith("1,64,1,192")]
    assert mla and all(r["op"] == "aten" for r in mla)
    # the one assumed count (aten::index's index list is not recorded) is a stand-in, and says so
    (index,) = {r["proxy"] for r in rows if r["op_type"] == "aten::index"}
    assert index == 1


def test_a_hand_written_aten_case_that_names_no_overload_says_which_key():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"aten: call='topk': expected aten::<name>.<overload>"):
        replay.build("topk", "[]", "cpu", gen)
    with pytest.raises(ValueError, match=r"aten: call='aten::topk.nope': this torch .* has no such overload"):
        replay.build("aten::topk.nope", "[]", "cpu", gen)
    with pytest.raises(ValueError, match=r"aten: args=.* is not JSON"):
        replay.build("aten::topk.default", "[T:fp32[4]", "cpu", gen)
    with pytest.raises(ValueError, match=r"aten: args must be a list of 5 values for aten::topk.default"):
        replay.build("aten::topk.default", '["T:fp32[4]"]', "cpu", gen)
    # A tensor's text that does not read as one (here a stride list in brackets): named, before any tensor is made.
    with pytest.raises(ValueError, match=r"aten: 'T:fp32\[4\]/\[1\]' is not a tensor's text \(T:<dtype>\[dims\]"):
        replay.build("aten::topk.default", '["T:fp32[4]/[1]", 2, -1, true, true]', "cpu", gen)
