"""Each input as hot as it was in the model (issue 44): the per-input decision on hand-made traces,
its replay configs, and the timer that flushes the L2 and then reads exactly the resident inputs."""

import json
import sqlite3
from pathlib import Path

import pytest
import torch

from conftest import FAST
from pytest_opperf import config
from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.registry import OPS
from pytest_opperf.cli import main
from pytest_opperf.measure import inputs
from pytest_opperf.measure.timers import CpuTimer
from pytest_opperf.pipeline.mapping import cachestate, profile
from pytest_opperf.pipeline.reading import capture

load_builtin()
BF16 = "c10::BFloat16"


def op_event(name, ts, ext, dims, types, strides=None, values=None):
    args = {"External id": ext, "Input Dims": dims, "Input type": types}
    if strides is not None:
        args.update({"Input Strides": strides, "Concrete Inputs": values or [""] * len(dims)})
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 10, "args": args}


def gemm_after_its_producer(path):
    """A decode step's MLP in miniature: silu writes the activation, then two GEMMs read it with a
    weight each: aten::linear (replayed as itself) and GPT-2's Conv1D, addmm(bias, x, weight)
    (replayed as the catalogue's linear)."""
    events = [
        op_event("aten::silu", 0, 1, [[4, 256]], [BF16], [[256, 1]]),
        op_event("aten::linear", 20, 2, [[4, 256], [1024, 256], []], [BF16, BF16, ""], [[256, 1], [256, 1], []]),
        op_event("aten::addmm", 40, 3, [[768], [4, 256], [256, 768], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"],
                 [[1], [256, 1], [1, 256], [], []], ["", "", "", "1", "1"]),
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_gemm_reading_the_previous_op_s_output_and_a_weight_gets_each_its_own_state(tmp_path):
    trace = gemm_after_its_producer(tmp_path / "t.json")
    rows = {r["op_type"]: r for r in profile.import_profile(trace, tmp_path / "p.db", l2_mb=50, cache_rule="inputs")}
    linear = rows["aten::linear"]
    assert (linear["op"], linear["residency"], linear["cache"]) == ("aten", "resident;cold;", "resident")
    why = json.loads(linear["residency_reason"])
    assert why[0].startswith("producer not in the trace (no tensor ids): the default, resident")
    assert why[1].startswith("a parameter slot of aten::linear") and why[2] == ""
    assert json.loads(linear["resident_inputs"]) == [0]  # x among the replay's input tensors (x, weight)
    # the catalogue's linear takes (x, weight, bias): the profile's slot 1 is its input 0
    conv1d = rows["aten::addmm"]
    assert (conv1d["op"], conv1d["residency"], conv1d["cache"]) == ("linear", "cold;resident;cold;;", "resident")
    assert json.loads(conv1d["resident_inputs"]) == [0]
    # a bias with as many elements as the activation (n = m x k): which input is which is not known,
    # so the signature keeps one state, and says why
    assert cachestate.tensor_positions("linear", {"m": 4, "n": 1024, "k": 256}, "bf16", "1024;4,256;256,1024;;",
                                       (1,)) is None
    # a resident tensor list (aten::cat's) is not one the timer reads: not told apart either
    assert cachestate.tensor_positions("aten", {"call": "aten::cat.default", "args": '[["T:fp32[2,4]","T:fp32[2,4]"],0]'},
                                       "fp32", "2,4+2,4;", (0,)) is None
    # the silu reads only an activation: every input resident is the hot state (no positions needed)
    assert (rows["aten::silu"]["residency"], rows["aten::silu"]["cache"]) == ("resident", "hot")
    # the default rule keeps one state per signature and still records the per-input decision
    rows = {r["op_type"]: r for r in profile.import_profile(trace, tmp_path / "s.db", l2_mb=50)}
    assert (rows["aten::linear"]["cache"], rows["aten::linear"]["residency"]) == ("cold", "resident;cold;")


def test_inputs_past_half_the_l2_an_unknown_l2_and_out_tensors_are_not_resident():
    # 48 MiB of activations do not fit half a 50 MiB L2
    big = cachestate.residency("aten::mm", "2048,4096;4096,2048", f"{BF16};{BF16}", 50 * 2**20)
    assert big.slots == ("cold", "cold") and big.cache == "cold" and "exceed half the 50 MiB L2" in big.reasons[0]
    unknown = cachestate.residency("aten::linear", "4,256;1024,256;", f"{BF16};{BF16};", None)
    assert unknown.slots == ("cold", "cold", "") and "L2 size is unknown" in unknown.reasons[0]
    # aten::where.self_out: the out tensor is written, not an input to keep in the cache
    where = cachestate.residency("aten::where", "8,32;;8,32;8,32", "bool;double;float;float", 50 * 2**20,
                                 frozenset({3}))
    assert where.slots == ("resident", "", "resident", "") and where.reasons[3].startswith("an out= tensor")


def test_the_resident_inputs_reach_the_replay_config_and_load_back(tmp_path, capsys):
    trace = gemm_after_its_producer(tmp_path / "t.json")
    assert main(["import", str(trace), "-o", str(tmp_path / "p.db"), "--l2-mb", "50", "--cache-rule", "inputs",
                 "--configs", str(tmp_path / "replay")]) == 0
    assert "replay configs (resident cache)" in capsys.readouterr().out
    path = tmp_path / "replay" / "resident" / "aten.yaml"
    text = path.read_text()
    assert "cache: resident" in text and "resident: [0]" in text
    cfg = config.load(path, OPS["aten"].params, OPS["aten"].defaults, op_name="aten", op_types=OPS["aten"].types,
                      caches=inputs.CACHES)
    (case,) = list(cfg.expand(OPS["aten"].params, device="any"))
    assert cfg.cache == "resident" and case.resident == (0,)
    (linear,) = config.load(tmp_path / "replay" / "resident" / "linear.yaml", OPS["linear"].params,
                            OPS["linear"].defaults, op_name="linear", op_types=OPS["linear"].types).expand(
        OPS["linear"].params, device="any")
    assert linear.resident == (0,)


def test_a_resident_list_that_is_not_positions_names_the_row(tmp_path):
    path = tmp_path / "gemm.yaml"
    path.write_text("op: gemm\nbackend: torch\ndtypes: [fp32]\ncases:\n  - {m: 8, n: 8, k: 8, resident: [x]}\n")
    with pytest.raises(config.ConfigError, match=r"cases\[0\]\.resident: expected a list of input tensor positions"):
        config.load(path, OPS["gemm"].params, OPS["gemm"].defaults, op_name="gemm")


def test_the_resident_state_flushes_then_reads_only_the_resident_inputs(monkeypatch):
    log = []
    monkeypatch.setattr(inputs.Flusher, "__call__", lambda self: log.append("flush"))
    touch = inputs.ResidentFlush.touch
    monkeypatch.setattr(inputs.ResidentFlush, "touch", lambda self, t: (log.append(("touch", t)), touch(self, t)))
    x, w, bias = torch.randn(4, 16), torch.randn(16, 16), torch.randn(16)
    work = inputs.Workload(lambda *a: log.append("call"), ("aten::addmm", bias, x, w, 1), resident=(1,))
    timer = CpuTimer(work, torch.device("cpu"), "resident", 1 << 20)
    assert len(timer.sample(2)) == 2
    assert log == ["flush", ("touch", x), "call", "flush", ("touch", x), "call"]
    assert timer.cache_flush == "read+resident"
    assert int(timer.flush.total) == int(x.view(torch.int64).sum())  # every byte of x was read
    # fresh inputs (pedantic's setup): the new x is read, the old one's view let go
    fresh = torch.randn(4, 16)
    work.args = ("aten::addmm", bias, fresh, w, 1)
    timer.flush()
    assert int(timer.flush.total) == int(fresh.view(torch.int64).sum()) and len(timer.flush.words) == 1
    # hot and cold are as they were: no flush, and the flush alone
    assert CpuTimer(work, torch.device("cpu"), "hot", 1 << 20).flush is None
    assert type(CpuTimer(work, torch.device("cpu"), "cold", 1 << 20).flush) is inputs.Flusher


def test_a_resident_replay_runs_through_pytest_and_its_rows_say_so(pytester):
    trace = gemm_after_its_producer(pytester.path / "t.json")
    assert main(["import", str(trace), "-o", str(pytester.path / "p.db"), "--l2-mb", "50", "--cache-rule", "inputs",
                 "--configs", str(pytester.path / "replay")]) == 0
    configs = sorted((pytester.path / "replay" / "resident").glob("*.yaml"))
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_replay.py").write_text("".join(
        f"def test_{c.stem}(backend, inputs, bench):\n    bench(backend, *inputs)\n\n\n" for c in configs))
    result = pytester.runpytest("benches/", *FAST, *[f"--opperf-config={c}" for c in configs])
    assert result.parseoutcomes().get("passed") == len(configs) == 2, result.stdout.str()[-3000:]
    with sqlite3.connect(pytester.path / "results" / "cpu.db") as db:
        states = {r for op in ("aten", "linear") for r in db.execute(f"select cache, cache_flush from [{op}]")}
    db.close()
    assert states == {("resident", "read+resident")}


CAPTURED = """
import torch
from pytest_opperf.pipeline.reading.capture import capture

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.SiLU(), torch.nn.Linear(128, 64))
x = torch.randn(4, 64)
cache = torch.randn(32, 64)  # a KV cache: made before the block; one row block is written in it
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}", model):
    y = model(x)
    cache[:4].copy_(y)
    scores = cache @ y.t()
prof.export_chrome_trace(r"{path}")
"""


def test_a_capture_tells_each_input_s_producer_and_the_weights_of_the_model(tmp_path):
    trace = tmp_path / "trace.json"
    exec(CAPTURED.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    assert json.loads((tmp_path / "trace.capture.json").read_text())["version"] == capture.VERSION
    rows = profile.import_profile(trace, tmp_path / "p.db", l2_mb=50, cache_rule="inputs")
    by = {(r["op_type"], r["input_shapes"]): r for r in rows}
    # silu reads what the first GEMM just wrote
    silu = by[("aten::silu", "4,128")]
    assert (silu["input_sources"], silu["residency"], silu["cache"]) == ("r", "resident", "hot")
    # the second linear (a composite: its sources come from the aten::t and aten::addmm inside it):
    # the activation just written, the weight and bias the model's parameters
    second = by[("aten::linear", "4,128;64,128;64")]
    assert (second["input_sources"], second["residency"], second["cache"]) == ("r;p;p", "resident;cold;cold",
                                                                              "resident")
    assert "a parameter or buffer of the model (capture)" in json.loads(second["residency_reason"])[1]
    # the KV cache was made before the block (a write of 4 of its rows does not make it resident)
    scores = by[("aten::matmul", "32,64;64,4")]
    assert (scores["input_sources"], scores["residency"]) == ("o;r", "cold;resident")
    # an L2 too small for what was written since: the same output is no longer resident
    rows = profile.import_profile(trace, tmp_path / "small.db", l2_mb=0.0001, cache_rule="inputs")
    silu = {(r["op_type"], r["input_shapes"]): r for r in rows}[("aten::silu", "4,128")]
    assert (silu["input_sources"], silu["residency"]) == ("e", "cold")
    # a capture whose calls of an op are not the trace's (one silu record lost): that op keeps no sources
    saved = json.loads((tmp_path / "trace.capture.json").read_text())
    saved["inputs"] = [r for r in saved["inputs"] if r[0] != "aten::silu"] + [["aten::silu", ["r"]]] * 2
    (tmp_path / "trace.capture.json").write_text(json.dumps(saved))
    rows = profile.import_profile(trace, tmp_path / "other.db", l2_mb=50, cache_rule="inputs")
    silu = {(r["op_type"], r["input_shapes"]): r for r in rows}[("aten::silu", "4,128")]
    assert silu["input_sources"] is None and silu["residency"] == "resident"  # the default's, said so
    assert json.loads(silu["residency_reason"])[0].startswith("producer not in the trace")
    # without the capture the default decides: the first linear's input is taken for an activation
    (tmp_path / "trace.capture.json").unlink()
    rows = profile.import_profile(trace, tmp_path / "plain.db", l2_mb=50, cache_rule="inputs")
    first = {(r["op_type"], r["input_shapes"]): r for r in rows}[("aten::linear", "4,64;128,64;")]
    assert (first["input_sources"], first["residency"]) == (None, "resident;cold;")


def test_a_3d_matmul_s_write_is_its_mm_s_once_not_the_unsafe_view_s_it_ends_with(tmp_path):
    """x @ w of a 3-D x dispatches as view, mm, _unsafe_view: the _unsafe_view returns the mm's output
    over the same memory without the schema marking it a view. The reader's writer is the mm, and its
    bytes count once in what was written since."""
    weight = torch.nn.Parameter(torch.randn(64, 32))
    owner = torch.nn.Module()
    owner.weight = weight
    x = torch.randn(1, 8, 64)
    with torch.no_grad(), capture.capture(tmp_path / "t.json", owner) as seen:
        y = x @ weight
        y.relu()
    records = json.loads((tmp_path / "t.capture.json").read_text())["inputs"]
    names = [r[0] for r in records]
    assert names == ["aten::view", "aten::mm", "aten::_unsafe_view", "aten::relu"]
    assert records[1][1] == ["o", "p"]  # x made before the block, the weight a parameter
    assert records[3][2] == [names.index("aten::mm")]  # relu reads what the mm wrote
    assert records[3][1] == ["w0"]  # nothing written after the mm (its own bytes aside)
    assert seen.sources.total == 2 * 8 * 32 * 4  # the mm's output and the relu's, each once


ONE_TOKEN = """
import torch
from pytest_opperf.pipeline.reading.capture import capture


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.q, self.k, self.v = (torch.nn.Linear(64, 64) for _ in range(3))

    def forward(self, x):
        h = self.norm(x + 1)
        q, k, v = (m(h).view(1, -1, 4, 16).transpose(1, 2) for m in (self.q, self.k, self.v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


torch.manual_seed(0)
model = Block().eval()
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}", model):
    model(torch.randn(1, 8, 64))  # a prefill of 8 tokens
    model(torch.randn(1, 1, 64))  # one token: its input has as many elements as the norm's weight
prof.export_chrome_trace(r"{path}")
"""


def test_a_composite_s_weight_of_one_token_s_element_count_is_still_the_weight(tmp_path):
    """One token's layer_norm reads an input [1, 1, 64] and a weight and bias [64]: each slot takes the
    source and writer of the input of its own shape inside (by element count alone all three took the
    input's, and the sequence replay fed the weight and bias the add's output, read from the L2)."""
    trace = tmp_path / "trace.json"
    exec(ONE_TOKEN.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    rows = profile.import_profile(trace, tmp_path / "p.db", l2_mb=50, cache_rule="inputs")
    by = {(r["op_type"], r["input_shapes"]): r for r in rows}
    for tokens in (8, 1):
        assert by[("aten::layer_norm", f"1,{tokens},64;;64;64;;")]["input_sources"] == "r;;p;p;;"
        assert by[("aten::linear", f"1,{tokens},64;64,64;64")]["input_sources"] == "r;p;p"
        assert by[("aten::layer_norm", f"1,{tokens},64;;64;64;;")]["residency"] == "resident;;cold;cold;;"
    with sqlite3.connect(tmp_path / "p.db") as db:
        ids = {r["id"]: r["op_type"] for r in rows}
        calls = [(ids[s], json.loads(links) if links else []) for s, links in
                 db.execute("select signature, links from calls order by position")]
    db.close()
    position = {op: [k for k, (o, _) in enumerate(calls) if o == op] for op in {o for o, _ in calls}}
    norms, linears = position["aten::layer_norm"], position["aten::linear"]
    adds = position["aten::add"]
    for n, add in zip(norms, adds):
        assert calls[n][1][:4] == [add, None, None, None]  # the weight and bias: the model's, not the add's
    for k, attention in enumerate(position["aten::scaled_dot_product_attention"]):
        q, kk, v = linears[3 * k: 3 * k + 3]
        assert calls[attention][1][:3] != [None] * 3
        # query, key and value each their own projection's (by element count alone, all three the query's)
        writers = calls[attention][1][:3]
        assert all(w is not None for w in writers) and len(set(writers)) == 3
        for w, lin in zip(writers, (q, kk, v)):
            assert w > lin  # written after its projection (the view and transpose after it)
        assert all(calls[lin][1][1:] in ([None, None], []) for lin in (q, kk, v))


def test_on_an_h100_deepseek_v3_trace_decode_gemms_read_their_activation_from_the_l2_and_their_weight_cold(tmp_path):
    trace = Path(__file__).parent / "data" / "traces" / "h100_deepseek_v3_tf517.json.gz"
    rows = [r for r in profile.import_profile(trace, tmp_path / "p.db", cache_rule="inputs") if r["status"] == "mapped"]
    decode = [r for r in rows if r["op_type"] == "aten::linear" and r["input_shapes"].startswith("1,1,")]
    assert decode and {(r["residency"].split(";")[0], r["residency"].split(";")[1], r["cache"], r["resident_inputs"])
                       for r in decode} == {("resident", "cold", "resident", "[0]")}
    # tensor lists (the timer reads no list), all resident: hot, no positions needed; past half the L2: cold
    cats = {r["residency"]: r["cache"] for r in rows if r["op_type"] == "aten::cat"}
    assert cats == {"resident;": "hot", "cold;": "cold"}
    assert not [r for r in rows if "is not known" in r["cache_reason"]]
