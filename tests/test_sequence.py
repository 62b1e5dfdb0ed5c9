"""The profiled calls in time order (import's calls table) and their replay in that order
(`opperf sequence`): steps and phases from record_function ranges, the data flow a capture saw,
the in-sequence times and context factors, the what-if and its check, on real torch.profiler
traces: hand-written blocks and a small transformers model on the CPU; copies between host and
device on a GPU."""

import json
import sqlite3
from types import SimpleNamespace

import pytest
import torch

from conftest import FAST
from test_predict import cache_of
from pytest_opperf.cli import main
from pytest_opperf.measure import profiler_records
from pytest_opperf.pipeline.mapping import bind, generic, profile
from pytest_opperf.pipeline.reading import calls, capture
from pytest_opperf.pipeline.replay import plan as planning
from pytest_opperf.pipeline.replay import report as replay_report, sequence, summary, whatif
from pytest_opperf.pipeline.reading.signature import ProfileError

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCK = """
import torch
from torch.profiler import record_function
from pytest_opperf.pipeline.reading.capture import capture

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.SiLU(), torch.nn.Linear(128, 64))
x = torch.randn(4, 64)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}", model):
    with record_function("prefill"):
        y = model(x)
    for _ in range(2):
        with record_function("decode"):
            z = torch.softmax(model(y[:1].contiguous()), -1)
    outside = torch.relu(y)
prof.export_chrome_trace(r"{path}")
"""


def imported(tmp_path, script=BLOCK):
    trace = tmp_path / "trace.json"
    exec(script.format(path=trace), {})  # noqa: S102  (our own script: a real trace and its capture)
    rows = profile.import_profile(trace, tmp_path / "profile.db")
    return rows, planning.load_calls(tmp_path / "profile.db")


def test_import_keeps_the_calls_in_order_with_their_steps_phases_and_the_outputs_they_read(tmp_path):
    rows, ordered = imported(tmp_path)
    assert json.loads((tmp_path / "trace.capture.json").read_text())["version"] == capture.VERSION
    by_id = {r["id"]: r for r in rows}
    assert [c["position"] for c in ordered] == list(range(len(ordered)))
    # the capture's own hook, unmapped, is left aside here
    ordered = [c for c in ordered if by_id[c["signature"]]["op_type"] != "PythonDispatchMode"]
    names = [(by_id[c["signature"]]["op_type"], c["step"], c["phase"]) for c in ordered]
    # one step a range: the prefill's two linears and silu, two decode steps, then a call outside every range
    assert names[:3] == [("aten::linear", 0, "prefill"), ("aten::silu", 0, "prefill"), ("aten::linear", 0, "prefill")]
    assert [n for n in names if n[2] == "decode" and n[0] == "aten::softmax"] == \
        [("aten::softmax", 1, "decode"), ("aten::softmax", 2, "decode")]
    assert names[-1] == ("aten::relu", None, "")
    # the whole profile's time is in the calls, call by call
    every = planning.load_calls(tmp_path / "profile.db")
    assert sum(c["profiled_us"] for c in every) == pytest.approx(sum(r["profiled_total_us"] for r in rows))
    assert sum(by_id[c["signature"]]["count"] for c in every) == sum(r["count"] ** 2 for r in rows)
    name_at = {c["position"]: (by_id[c["signature"]]["op_type"], c["step"]) for c in every}

    def read(k):  # what each input slot of the k-th call read: the writer's (op, step), None where none
        links = json.loads(ordered[k]["links"]) if ordered[k]["links"] else []
        return [name_at[p] if p is not None else None for p in links]

    assert read(0) == []  # x was made before the block, the weight is a parameter
    assert read(1) == [("aten::linear", 0)]  # silu reads what the first linear (its addmm inside) wrote
    assert read(2) == [("aten::silu", 0), None, None]  # the second linear: silu's output, then parameters
    # each decode step's first linear reads the prefill's output: the GEMM of the second linear's bias
    firsts = [k for k, n in enumerate(names) if n[0] == "aten::linear" and n[2] == "decode"][::2]
    assert [read(k)[0] for k in firsts] == [("aten::addmm", 0)] * 2


def test_a_capture_without_writers_and_a_trace_without_ranges_still_order_the_calls(tmp_path):
    script = BLOCK.replace('with record_function("prefill")', 'with torch.no_grad()').replace(
        'with record_function("decode")', 'with torch.no_grad()')
    rows, ordered = imported(tmp_path, script)
    assert {(c["step"], c["phase"]) for c in ordered} == {(None, "")}
    saved = json.loads((tmp_path / "trace.capture.json").read_text())
    saved["version"] = 3  # a capture of the last round: sources only, no writers
    saved["inputs"] = [r[:2] for r in saved["inputs"]]
    (tmp_path / "trace.capture.json").write_text(json.dumps(saved))
    profile.import_profile(tmp_path / "trace.json", tmp_path / "old.db")
    assert all(c["links"] is None for c in planning.load_calls(tmp_path / "old.db"))


def test_profiler_steps_number_the_steps_and_the_range_inside_names_the_phase():
    class T:
        pass

    t = T()
    t.annotations = [(("1", "1"), 0.0, 100.0, "ProfilerStep#7"), (("1", "1"), 10.0, 50.0, "decode"),
                     (("1", "1"), 200.0, 10.0, "prefill")]
    t.starts, t.threads, t.writers = [20.0, 80.0, 205.0, 300.0], [("1", "1")] * 4, {}
    placed = calls.places(t, lambda i: i, [0, 1, 2, 3])
    assert [placed[i][1:3] for i in range(4)] == [(7, "decode"), (7, ""), (1, "prefill"), (None, "")]


def llama_trace(tmp_path, decode=2, dtype=torch.float32):
    """A small Llama's CPU trace (in DTYPE): a prefill of 16 tokens, then DECODE steps, with a capture."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    ids = torch.randint(0, 256, (1, 16))
    trace = tmp_path / "trace.json"
    from torch.profiler import record_function

    with torch.no_grad():
        model(ids)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof, \
                capture.capture(trace, model):
            with record_function("prefill"):
                out = model(ids, use_cache=True)
            for _ in range(decode):
                with record_function("decode"):
                    out = model(out.logits[:, -1:].argmax(-1), **cache_of(model, out), use_cache=True)
    prof.export_chrome_trace(str(trace))
    return trace


def test_the_sequence_replays_a_small_transformers_model_s_cpu_trace_in_order(tmp_path):
    trace = llama_trace(tmp_path)
    assert main(["import", str(trace), "-o", str(tmp_path / "profile.db")]) == 0
    ordered = planning.load_calls(tmp_path / "profile.db")
    assert {c["phase"] for c in ordered} >= {"prefill", "decode"}
    assert sum(1 for c in ordered if c["links"]) > len(ordered) / 2  # most calls read an earlier call's output
    rows = profile.load(tmp_path / "profile.db")
    plan = planning.plan(rows, ordered, torch.device("cpu"))
    replayed = {c.position for c in plan.calls}
    mapped = {c["position"] for c in ordered if {r["id"]: r for r in rows}[c["signature"]]["status"] == "mapped"}
    assert replayed == mapped and len(replayed) > 0.9 * len(ordered)
    assert sum(len(c.links) for c in plan.calls) > len(plan.calls) / 2  # the data flow, linked
    outcome = sequence.run(plan, torch.device("cpu"), repeats=2)
    assert all(len(outcome.times["base"][p]) == 2 for p in replayed)  # every call timed in each repetition
    written = summary.write(tmp_path / "profile.db", outcome, rows)
    assert written == len({c.signature for c in plan.calls})
    # each call's own time in the sequence, beside its profiled one
    timed_calls = {c["position"]: c["sequence_us"] for c in planning.load_calls(tmp_path / "profile.db")}
    assert all((timed_calls[p] or 0) > 0 for p in replayed)
    assert all(us is None for p, us in timed_calls.items() if p not in replayed)
    rows = profile.load(tmp_path / "profile.db")
    timed = [r for r in rows if r["sequence_us"] is not None]
    assert all(r["sequence_us"] > 0 and r["context_factor"] is None for r in timed)  # no isolated replay yet
    table = summary.phases(outcome, ordered)
    prefill = next(t for t in table if t.phase == "prefill")
    decode = next(t for t in table if t.phase == "decode")
    assert (prefill.steps, decode.steps) == (1, 2)
    # CPU time of real calls. The capture's hook runs inside each op's range on the host, so this
    # profile reads slower than the replay (10x on a loaded host); the replay never reads slower
    for t in (prefill, decode):
        assert 0 < t.sequence_us < 3 * t.profiled_us
    c = replay_report.in_context(rows)
    assert c.signatures == len(timed) and c.sequence_us == pytest.approx(sum(r["sequence_us"] * r["count"]
                                                                            for r in timed))


def test_a_kv_cache_cat_reads_the_last_step_s_cache_and_the_new_key_element_by_element(tmp_path):
    # The cache's torch.cat([past, new], dim=-2) takes a tensor list: each element is linked to the
    # call that wrote it, and the replay feeds that call's output to that element.
    profile.import_profile(llama_trace(tmp_path), tmp_path / "profile.db")
    rows, ordered = profile.load(tmp_path / "profile.db"), planning.load_calls(tmp_path / "profile.db")
    by_id = {r["id"]: r for r in rows}
    at = {c["position"]: (by_id[c["signature"]], c) for c in ordered}
    cache_cats = [c for c in ordered if by_id[c["signature"]]["op_type"] == "aten::cat" and c["step"] == 2
                  and by_id[c["signature"]]["input_shapes"].startswith("1,2,17,16+")]
    assert len(cache_cats) == 4  # keys and values of two layers
    for c in cache_cats:
        past, new = json.loads(c["links"])[0]
        sig, producer = at[past]
        # the past: the same layer's cat one step before (16 rows and a new one), whose output is this input
        assert (sig["op_type"], producer["step"], sig["input_shapes"]) == ("aten::cat", 1, "1,2,16,16+1,2,1,16;")
        assert at[new][1]["step"] == 2 and at[new][1]["position"] < c["position"]
    plan = planning.plan(rows, ordered, torch.device("cpu"))
    calls = {c.position: c for c in plan.calls}
    seen = {}

    def spy(position, fn):
        def wrapped(*args):
            out = fn(*args)
            seen[position] = (out.data_ptr(), [t.data_ptr() for t in args[1]] if position in calls_of_cats else [])
            return out
        return wrapped

    calls_of_cats = {c["position"] for c in cache_cats}
    for c in cache_cats:
        past, new = json.loads(c["links"])[0]
        links = [(link.argument, link.element, link.producer) for link in calls[c["position"]].links]
        assert (1, 0, past) in links and (1, 1, new) in links
        for p in (c["position"], past):
            calls[p].fn = spy(p, calls[p].fn)
    outcome = sequence.run(plan, torch.device("cpu"), repeats=1)
    assert outcome.links[0] == sum(len(c.links) for c in plan.calls) and outcome.links[1] == 0  # every link fed
    for c in cache_cats:
        past = json.loads(c["links"])[0][0]
        assert seen[c["position"]][1][0] == seen[past][0]  # the past element is the last step's cat's output


def test_the_command_writes_sequence_us_and_the_report_sets_it_beside_the_isolated_sum(tmp_path, capsys):
    imported(tmp_path)
    db = tmp_path / "profile.db"
    with sqlite3.connect(db) as con:  # an isolated replay's times, as backfill writes them
        con.execute("UPDATE signatures SET replayed_us = profiled_us_mean * 2 WHERE status = 'mapped'")
    con.close()
    assert main(["sequence", str(db), "--repeats", "2"]) == 0
    said = capsys.readouterr().out
    assert "replayed in their order on cpu, 2 repetitions" in said and "prefill" in said and "decode" in said
    rows = profile.load(db)
    timed = [r for r in rows if r["sequence_us"] is not None]
    assert timed and all(r["context_factor"] == pytest.approx(r["sequence_us"] / r["replayed_us"]) for r in timed)
    assert main(["replay-report", str(db), "-o", str(tmp_path / "rep")]) == 0
    assert "in context: in-sequence" in capsys.readouterr().out
    md = (tmp_path / "rep" / "replay_report.md").read_text()
    assert "## In context: the sequence replay" in md and "| isolated (the replay sweep) |" in md
    assert "Context factors furthest from 1" in md
    header = (tmp_path / "rep" / "duration_gap.csv").read_text().splitlines()[0]
    assert "sequence_us" in header and "context_factor" in header
    assert main(["sequence", str(db), "--json", "--repeats", "1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert {p["phase"] for p in figures["phases"]} == {"prefill", "decode", ""} and figures["repeats"] == 1
    # what was not replayed, and why: the capture's own hook is no op of the catalogue
    hook = [e for e in figures["left_out"] if e["op_type"] == "PythonDispatchMode"]
    assert hook and all(e["why"].startswith("unmapped") and e["share"] > 0 for e in hook)


MATMULS = """
import torch
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = torch.randn(32, 64, dtype=dtype), torch.randn(64, 48, dtype=dtype)
        torch.mm(a, b)
prof.export_chrome_trace(r"{path}")
"""

WRONG = """
from pytest_opperf.catalog.registry import register_backend

@register_backend("gemm", "off_by_1pct")
def off(a, b):
    return (a @ b) * 1.01

@register_backend("gemm", "also_right")
def right(a, b):
    return (a.float() @ b.float()).to(a.dtype)
"""


def test_the_what_if_checks_its_backend_and_catches_one_wrong_by_1pct_at_every_dtype(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    exec(MATMULS.format(path=trace), {})  # noqa: S102
    db = tmp_path / "profile.db"
    rows = profile.import_profile(trace, db)
    assert sorted(r["dtype"] for r in rows if r["op"] == "gemm") == ["bf16", "fp16", "fp32"]
    module = tmp_path / "mine.py"
    module.write_text(WRONG)
    code = main(["sequence", str(db), "--register", str(module), "--backend", "gemm=off_by_1pct"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("what-if check failed") == 3, err
    assert all(profile.load(db)[i]["sequence_us"] is None for i in range(len(rows)))  # nothing written
    assert main(["sequence", str(db), "--register", str(module), "--backend", "gemm=also_right"]) == 0
    out = capsys.readouterr().out
    assert "what-if: gemm torch -> also_right (3 signatures)" in out and "predicted step" in out


def test_sequence_says_what_is_wrong_in_one_line(tmp_path, capsys):
    rows, _ = imported(tmp_path)
    db = tmp_path / "profile.db"
    cases = [
        (["--backend", "gemm"], "--backend gemm: expected OP=BACKEND"),
        (["--backend", "nope=torch"], "--backend nope=torch: no catalogue op 'nope'"),
        (["--backend", "gemm=nope"], "--backend gemm=nope: gemm has no backend 'nope' (it has"),
        (["--register", str(tmp_path / "absent.py")], "absent.py: no such file"),
        (["--register", "no_such_module_here"], "--register no_such_module_here: importing it failed"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "nonsense"], "--device="),
        (["--inputs", "both"], "--inputs=both: expected per-call or per-signature"),
        (["--repeats", "0"], "--repeats=0: expected 1 or more"),
        (["--replace", "RMSNorm"], "--replace RMSNorm: expected CLASS=OP:BACKEND"),
        (["--replace", "RMSNorm=gemm:torch"], "--replace RMSNorm=gemm:torch: gemm takes (m, n, k)"),
        (["--replace", "RMSNorm=rmsnorm:nope"], "rmsnorm has no backend 'nope'"),
        (["--replace", "RMSNorm=rmsnorm:torch"], "no module of that class in the profile's capture (its classes: "
                                                 "Linear, SiLU)"),
    ]
    for extra, said in cases:
        assert main(["sequence", str(db), *extra]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, (extra, err)
    before = profile.load(db)
    assert all(r["sequence_us"] is None for r in before)  # no refused command wrote anything
    with sqlite3.connect(db) as con:  # a profile database of an older opperf: no calls table
        con.execute("DROP TABLE calls")
    con.close()
    assert main(["sequence", str(db)]) == 2
    assert "holds no calls in time order" in capsys.readouterr().err
    assert profile.load(db) == before  # its signatures as they were


def test_a_profile_of_device_kernels_is_refused_on_a_cpu_and_a_what_if_backend_that_cannot_run_is_named(
        tmp_path, capsys):
    from pathlib import Path

    gpu = Path(__file__).parent / "data" / "traces" / "h100_gemma2_tf517.json.gz"
    profile.import_profile(gpu, tmp_path / "gpu.db")
    if not torch.cuda.is_available():
        assert main(["sequence", str(tmp_path / "gpu.db")]) == 2
        assert "holds device kernel times and this machine has no CUDA device" in capsys.readouterr().err
    assert main(["sequence", str(tmp_path / "gpu.db"), "--device", "cpu"]) == 2
    assert "the profile holds device kernel times, a CPU has none to compare" in capsys.readouterr().err
    # SDPA on the CPU maps to attention_prefill on sdpa_flash; the memory-efficient kernel is CUDA's only
    trace = tmp_path / "attn.json"
    exec(ATTENTION.format(path=trace), {})  # noqa: S102
    profile.import_profile(trace, tmp_path / "attn.db")
    assert main(["sequence", str(tmp_path / "attn.db"), "--device", "cpu", "--backend",
                 "attention_prefill=sdpa_efficient"]) == 2
    err = capsys.readouterr().err
    assert "--backend attention_prefill=sdpa_efficient: cannot run signature" in err and "Traceback" not in err


def test_a_profile_with_nothing_replayable_says_so(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    exec(RANDOM_ONLY.format(path=trace), {})  # noqa: S102
    profile.import_profile(trace, tmp_path / "p.db")
    assert main(["sequence", str(tmp_path / "p.db")]) == 2
    assert "no call of the profile can be replayed here" in capsys.readouterr().err


ATTENTION = """
import torch
q = k = v = torch.randn(1, 4, 64, 32, dtype=torch.bfloat16)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
prof.export_chrome_trace(r"{path}")
"""

RANDOM_ONLY = """
import torch
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    torch.randn(64, 64)
prof.export_chrome_trace(r"{path}")
"""


def test_a_copy_s_direction_comes_from_its_kernels():
    assert generic._copy_direction("aten::to", ["Memcpy DtoH (Device -> Pageable)"]) == (False, True)
    assert generic._copy_direction("aten::copy_", ["Memcpy HtoD (Pinned -> Device)", "cast"]) == (True, False)
    assert generic._copy_direction("aten::add", ["Memcpy HtoD (Pinned -> Device)", "add"]) == (False, False)
    b = bind.bind("aten::to", [(40,), None, None, None, None, None, None, None],
                  [(1,), None, None, None, None, None, None, None],
                  ["int", "ScalarType", "Layout", "Device", "", "Scalar", "Scalar", ""],
                  ["", "3", "0", "", "", "False", "False", ""], host_output=True)
    assert json.loads(b.args)[3] == "V:cpu" and "device-to-host" in " ".join(b.assumptions)
    b = bind.bind("aten::copy_", [(8,), (8,), None], [(1,), (1,), None], ["float", "float", "Scalar"],
                  ["", "", "False"], host_input=True)
    assert json.loads(b.args)[:2] == ["T:fp32[8]", "T:fp32[8]@host"]


COPIES = """
import torch
counts = torch.randint(0, 9, (40,), dtype=torch.int32, device="cuda")
host = torch.randn(64, 128).pin_memory()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                            record_shapes=True) as prof:
    for _ in range(3):
        on_host = counts.to("cpu")
        on_device = host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
prof.export_chrome_trace(r"{path}")
"""


@cuda
def test_copies_between_host_and_device_replay_as_what_they_were(pytester):
    trace = pytester.path / "trace.json"
    exec(COPIES.format(path=trace), {})  # noqa: S102
    assert main(["import", str(trace), "-o", str(pytester.path / "profile.db"), "--configs",
                 str(pytester.path / "replay")]) == 0
    rows = [r for r in profile.load(pytester.path / "profile.db") if r["op_type"] == "aten::to"]
    args = sorted(json.loads(r["params"])["args"] for r in rows)
    assert any('"V:cpu"' in a for a in args) and any("@host" in a for a in args), args
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_replay.py").write_text("def test_aten(backend, inputs, bench):\n"
                                                               "    bench(backend, *inputs)\n")
    (pytester.path / "configs").mkdir()
    configs = [f"--opperf-config={f}" for f in sorted((pytester.path / "replay").rglob("aten.yaml"))]
    for config in configs:
        result = pytester.runpytest("benches/", *FAST, config, "-m", "aten", "-p", "pytest_opperf.pipeline.mapping.tag",
                                    f"--opperf-signatures={pytester.path / 'replay' / 'signatures.json'}")
        outcomes = result.parseoutcomes()
        assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 1, result.stdout.str()[-3000:]
    assert main(["sequence", str(pytester.path / "profile.db"), "--repeats", "2"]) == 0
    timed = [r for r in profile.load(pytester.path / "profile.db") if r["op_type"] == "aten::to"]
    assert all(r["sequence_us"] and r["sequence_us"] > 0 for r in timed)


@cuda
def test_a_cuda_trace_replays_in_sequence_within_its_profile_s_kernel_time(tmp_path):
    trace = tmp_path / "trace.json"
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    from torch.profiler import record_function
    for _ in range(3):
        torch.relu(x @ w)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                record_shapes=True) as prof:
        for _ in range(5):
            with record_function("step"):
                y = torch.relu(x @ w) + x
    torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    assert y.isfinite().all()
    profile.import_profile(trace, tmp_path / "profile.db")
    assert main(["sequence", str(tmp_path / "profile.db")]) == 0
    rows = profile.load(tmp_path / "profile.db")
    c = replay_report.in_context(rows)
    assert 0.8 < c.sequence_us / c.profiled_us < 1.25
    # the kernels each signature ran in sequence, beside those it ran in the profile: the same GEMM
    gemm = next(r for r in rows if r["op_type"] == "aten::mm")
    assert set(json.loads(gemm["sequence_kernels"])) == set(json.loads(gemm["kernels"]))
    with pytest.raises(ProfileError, match="a CPU has none to compare"):
        planning.device_of("cpu", "kernel")


def test_an_op_and_the_capture_s_hook_event_on_the_same_clock_tick_still_match(tmp_path):
    # A coarse clock makes an op and the hook event inside it start and end on the same tick: which
    # calls the hook saw is told by nesting, so the capture's records still match.
    _, ordered = imported(tmp_path)
    data = json.loads((tmp_path / "trace.json").read_text())
    ops = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    tied = 0
    for hook in [e for e in ops if e["name"] == "PythonDispatchMode"]:
        around = [e for e in ops if e is not hook and e["tid"] == hook["tid"] and e["ts"] <= hook["ts"]
                  and e["ts"] + e["dur"] >= hook["ts"] + hook["dur"]]
        if around:
            op = min(around, key=lambda e: e["dur"])
            op["ts"], op["dur"] = hook["ts"], hook["dur"]
            tied += 1
    assert tied > 5
    (tmp_path / "tied.json").write_text(json.dumps(data))
    (tmp_path / "tied.capture.json").write_text((tmp_path / "trace.capture.json").read_text())
    profile.import_profile(tmp_path / "tied.json", tmp_path / "tied.db")
    again = planning.load_calls(tmp_path / "tied.db")
    assert sum(1 for c in again if c["links"]) == sum(1 for c in ordered if c["links"]) > 5


def test_a_call_s_device_time_is_its_kernels_not_the_span_of_its_range():
    class K:
        def __init__(self, name, duration):
            self.name, self.duration = name, duration

    class E:
        def __init__(self, name, kernels=(), children=(), legacy=False):
            self.name, self.kernels, self.cpu_children, self.is_legacy = name, list(kernels), list(children), legacy

    # a range around an op of two kernels (3 and 4 us) launched 10 us apart: its span is 17 us
    op = E("aten::sort", [K("radix", 3.0), K("copy", 4.0)])
    ranged = E("opperf.sequence#0.5", [K("opperf.sequence#0.5", 17.0)], [op], legacy=True)
    assert sequence.device_us(ranged) == 7.0
    # a kernel launched under the range with no op around it (a Triton launch) counts
    ranged.kernels.append(K("triton_rmsnorm", 2.0))
    assert sequence.device_us(ranged) == 9.0


def test_a_kernel_tied_to_no_op_of_its_range_counts_from_the_range_s_device_side_copy():
    """A Triton launch the profiler tied to nothing: the host's range holds no kernel, its device-side
    copy spans it. The kernels that start inside each device-side copy are that call's, in time order."""
    def ev(name, start, end, device="DeviceType.CUDA"):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device)

    events = [ev("opperf.sequence#0.7", 0, 10, "DeviceType.CPU"),
              ev("opperf.sequence#0.7", 100, 103.5), ev("_rmsnorm", 100, 103.5),     # repetition 1
              ev("opperf.sequence#0.7", 200, 206), ev("_rmsnorm", 200, 202), ev("copy", 204, 206),
              ev("add", 103.5, 150)]                                                 # the next call's
    assert profiler_records.range_device_times(events, sequence.RANGE) == {"opperf.sequence#0.7": [3.5, 4.0]}


def test_a_call_the_hook_did_not_see_costs_only_itself_its_record(tmp_path):
    # One more aten::silu in the trace than the capture recorded (the trace and the hook saw a call
    # differently): the calls are aligned with the records, and the others keep what was captured.
    rows, ordered = imported(tmp_path)
    data = json.loads((tmp_path / "trace.json").read_text())
    ops = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    silu = next(e for e in ops if e["name"] == "aten::silu")
    after = max(e["ts"] + e["dur"] for e in ops) + 5.0  # after every call, outside the hook's events
    data["traceEvents"].append({**silu, "ts": after, "dur": 1.0, "args": dict(silu["args"], **{"External id": 999999})})
    (tmp_path / "extra.json").write_text(json.dumps(data))
    (tmp_path / "extra.capture.json").write_text((tmp_path / "trace.capture.json").read_text())
    again = profile.import_profile(tmp_path / "extra.json", tmp_path / "extra.db")
    captured = [r for r in again if r["op_type"] == "aten::silu" and r["input_sources"]]
    assert sum(r["count"] for r in captured) == 3  # the three the hook saw
    linked = sum(1 for c in planning.load_calls(tmp_path / "extra.db") if c["links"])
    assert linked == sum(1 for c in ordered if c["links"])


def test_a_catalogue_case_s_arguments_are_told_from_the_slots_by_size_then_order():
    q, k, v = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16)
    sig = {"op": "attention_prefill", "input_shapes": "1,8,4,16;1,8,4,16;1,8,4,16;;;;;;"}
    assert planning.slot_arguments(sig, [q, k, v], torch)[:3] == [0, 1, 2]
    # a size two slots share and one argument has: not told apart
    sig = {"op": "gemm", "input_shapes": "4,8;4,8"}
    assert planning.slot_arguments(sig, [torch.randn(4, 8), torch.randn(2, 3)], torch) == [None, None]
    # an aten case's arguments follow its overload, in the recorded order
    sig = {"op": "aten", "input_shapes": "4,8;;"}
    assert planning.slot_arguments(sig, ["call", torch.randn(4, 8), 1, True], torch) == [1, None, None]


ONE_MATMUL = """
import torch
a, b = torch.randn(32, 64), torch.randn(64, 48)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    torch.mm(a, b)
prof.export_chrome_trace(r"{path}")
"""


def test_backfill_after_the_sequence_sets_the_context_factor(tmp_path):
    from pytest_opperf.pipeline.replay import backfill
    from test_pipeline_replay import results_with

    trace = tmp_path / "trace.json"
    exec(ONE_MATMUL.format(path=trace), {})  # noqa: S102
    db = tmp_path / "profile.db"
    rows = profile.import_profile(trace, db)
    outcome = sequence.run(planning.plan(rows, planning.load_calls(db), torch.device("cpu")), torch.device("cpu"), 1)
    summary.write(db, outcome, rows)
    (gemm,) = [r for r in profile.load(db) if r["op"] == "gemm"]
    assert gemm["sequence_us"] > 0 and gemm["context_factor"] is None  # not replayed alone yet
    results = results_with(tmp_path / "cpu.db", [(32, 48, 64, "torch", 2.0, "2026-11-28T01:00:00+00:00")], db)
    assert backfill.backfill(db, results).filled == 1
    (gemm,) = [r for r in profile.load(db) if r["op"] == "gemm"]
    assert gemm["context_factor"] == pytest.approx(gemm["sequence_us"] / 2.0)


def test_a_public_training_trace_s_profiler_steps_and_their_ranges_number_its_calls(tmp_path):
    # HTA's sampled rank-0 trace (repository, path and commit in tests/data/PROVENANCE.md): two
    # ProfilerStep# ranges, each holding forward, backward and optimizer ranges.
    from pathlib import Path

    trace = Path(__file__).parent / "data" / "traces" / "hta_sampled_rank0.json.gz"
    rows = profile.import_profile(trace, tmp_path / "p.db")
    ordered = planning.load_calls(tmp_path / "p.db")
    by_step: dict = {}
    for c in ordered:
        by_step.setdefault(c["step"], set()).add(c["phase"])
    for step in (551, 552):
        assert {"## forward ##", "## backward ##", "## optimizer ##", "## data_load ##"} <= by_step[step]
    starts = [c["position"] for c in ordered]
    assert starts == sorted(starts) == list(range(len(ordered)))
    # every unit of time is a call's, except the kernels no CPU op launched (kept under their name)
    orphans = sum(r["profiled_total_us"] for r in rows if not r["input_shapes"] and r["kernels"]
                  and r["op_type"] in json.loads(r["kernels"]))
    assert sum(c["profiled_us"] for c in ordered) + orphans == pytest.approx(sum(r["profiled_total_us"] for r in rows))


TYPED = """
import torch
from torch.profiler import record_function
from pytest_opperf.pipeline.reading.capture import capture

torch.manual_seed(0)
w = torch.randn(64, 64, dtype=torch.bfloat16)
past = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             record_shapes=True) as prof, capture(r"{path}"):
    new = (torch.randn(2, 64, dtype=torch.bfloat16) @ w).view(1, 2, 1, 64)
    cache = torch.cat([past, new], dim=-2)
    q = torch.randn(1, 64, 2, 8, dtype=torch.bfloat16).transpose(1, 2)   # a strided view, as a head split makes
    r = q + q.contiguous()
prof.export_chrome_trace(r"{path}")
"""


def test_a_tensor_list_replays_in_the_dtype_it_held_and_a_strided_add_as_itself(tmp_path):
    # The trace types a tensor list only as TensorList: the capture writes its dtype beside it, and
    # without a capture the list takes the dtype of the profile's matrix products. A strided add
    # replays as itself (the catalogue's add makes dense inputs: another kernel).
    rows, _ = imported(tmp_path, TYPED)
    cat = next(r for r in rows if r["op_type"] == "aten::cat")
    assert cat["input_dtypes"].split(";")[0] == "TensorList(bfloat16)"
    assert cat["op"] == "aten" and json.loads(json.loads(cat["params"])["args"])[0][0].startswith("T:bf16[")
    add = next(r for r in rows if r["op_type"] == "aten::add")
    assert add["op"] == "aten" and "/" in json.loads(json.loads(add["params"])["args"])[0]  # its strides kept
    (tmp_path / "trace.capture.json").unlink()
    bare = profile.import_profile(tmp_path / "trace.json", tmp_path / "bare.db")
    cat = next(r for r in bare if r["op_type"] == "aten::cat")
    assert cat["input_dtypes"].split(";")[0] == "TensorList"
    assert json.loads(json.loads(cat["params"])["args"])[0][0].startswith("T:bf16[")
    assert "tensor lists hold bfloat16" in cat["note"]


OFF_NORM = """
import torch
from pytest_opperf.catalog.registry import register_backend

@register_backend("rmsnorm", "off_by_1pct")
def off(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6) * 1.01
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_a_module_replaced_by_one_kernel_stands_in_for_its_calls_fed_and_feeding_as_the_module(tmp_path, capsys,
                                                                                             dtype):
    # --replace LlamaRMSNorm=rmsnorm:torch: each call of the model's eager norm (six ops) gives way in
    # the what-if to one call of the catalogue's rmsnorm, fed what wrote the norm's input, its output
    # read by what read the norm's; a stand-in wrong by 1% fails the command and writes nothing.
    profile.import_profile(llama_trace(tmp_path, dtype=dtype), tmp_path / "profile.db")
    db = tmp_path / "profile.db"
    rows, ordered = profile.load(db), planning.load_calls(db)
    modules = [m for m in whatif.load_modules(db) if m["class"] == "LlamaRMSNorm"]
    assert len(modules) == 15 and all(len(json.loads(m["positions"])) >= 5 for m in modules)  # 5 a step, 3 steps
    plan = planning.plan(rows, ordered, torch.device("cpu"))
    whatif.stand_ins(plan, {"*RMSNorm": ("rmsnorm", "torch")}, whatif.load_modules(db), torch.device("cpu"))
    assert len(plan.replacements) == 15 and plan.replaced == {"*RMSNorm": ("rmsnorm", "torch", 15)}
    assert all(p in plan.skipped for m in modules for p in json.loads(m["positions"]))
    reads = {}
    first = modules[1]  # the first layer's input norm: the embedding wrote its input, q_proj reads its output
    stand_in = plan.replacements[first["output_position"]]
    assert [(link.argument, link.producer) for link in stand_in.links] == [(0, first["input_position"])]
    consumer = next(c for c in plan.calls if any(link.producer == first["output_position"] for link in c.links))

    def spy(name, fn):
        def wrapped(*args):
            out = fn(*args)
            reads[name] = out.data_ptr() if name == "stand-in" else [a.data_ptr() for a in args[1:]
                                                                       if isinstance(a, torch.Tensor)]
            return out
        return wrapped

    stand_in.fn = spy("stand-in", stand_in.fn)
    consumer.fn = spy("consumer", consumer.fn)
    outcome = sequence.run(plan, torch.device("cpu"), repeats=1, what_if=True)
    assert reads["stand-in"] in reads["consumer"]  # the consumer read the stand-in's output
    alt = outcome.times["what-if"]
    assert all(p not in alt for m in modules for p in json.loads(m["positions"]) if p != m["output_position"])
    assert all(m["output_position"] in alt for m in modules)
    table = summary.phases(outcome, ordered)
    assert all(t.what_if_us is not None and t.what_if_us != t.sequence_us for t in table if t.phase)
    # the command: a stand-in wrong by 1% is caught at this dtype, a right one is reported
    (tmp_path / "mine.py").write_text(OFF_NORM)
    code = main(["sequence", str(db), "--register", str(tmp_path / "mine.py"), "--replace",
                 "LlamaRMSNorm=rmsnorm:off_by_1pct"])
    err = capsys.readouterr().err
    assert code == 1 and "what-if check failed: --replace model.layers.0.input_layernorm by rmsnorm" in err, err
    assert all(r["sequence_us"] is None for r in profile.load(db))
    assert main(["sequence", str(db), "--replace", "LlamaRMSNorm=rmsnorm:torch", "--json", "--repeats", "1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["replaced"] == {"LlamaRMSNorm": {"op": "rmsnorm", "backend": "torch", "module_calls": 15}}
    assert all(p["what_if_us"] is not None for p in figures["phases"])


def test_calls_of_one_op_and_shapes_in_different_steps_share_their_weights_whatever_else_was_recorded(tmp_path):
    # An MoE layer routes each decode step differently: its grouped GEMMs are other signatures
    # (other offsets) of the same shapes. The k-th such call of a step reads the weights the k-th of
    # every other step reads, as the model's layer does (and one copy of them fits in memory).
    profile.import_profile(llama_trace(tmp_path), tmp_path / "profile.db")
    rows, ordered = profile.load(tmp_path / "profile.db"), planning.load_calls(tmp_path / "profile.db")
    linear = next(r for r in rows if r["op_type"] == "aten::linear" and r["input_shapes"].startswith("1,1,64;128,64"))
    twin = dict(linear, id=max(r["id"] for r in rows) + 1, input_values=None)  # the same shapes, another record
    rows.append(twin)
    for c in ordered:
        if c["signature"] == linear["id"] and c["step"] == 2:
            c["signature"] = twin["id"]
    plan = planning.plan(rows, ordered, torch.device("cpu"))
    first = [c for c in plan.calls if c.signature == linear["id"] and c.step == 1]
    second = [c for c in plan.calls if c.signature == twin["id"]]
    assert len(first) == len(second) == 4  # gate and up, two layers
    for a, b in zip(first, second):  # the k-th of each step: one weight tensor
        assert a.args[2] is b.args[2]
    assert len({id(c.args[2]) for c in first}) == 4  # four projections, four weights


def test_a_list_s_dtype_is_read_from_its_type_else_the_matrix_products_by_time():
    assert bind.dtype_of_list("TensorList(bfloat16)") == "bfloat16"
    assert bind.dtype_of_list("TensorList") is None and bind.dtype_of_list("c10::BFloat16") is None
    assert bind.is_list("TensorList") and bind.is_list("TensorList(float16)") and not bind.is_list("float")

    class S:
        def __init__(self, op_type, dtypes, total_us):
            self.op_type, self.input_dtypes, self.total_us = op_type, dtypes, total_us

    # an fp32 router GEMM of many calls, bf16 projections of more time: the model computes in bf16
    sigs = [S("aten::mm", "float;float", 30.0), S("aten::linear", "c10::BFloat16;c10::BFloat16;", 70.0),
            S("aten::add", "float;float", 500.0)]
    assert profile.compute_dtype(sigs) == "bfloat16"
    assert profile.compute_dtype([S("aten::add", "float;float", 1.0)]) is None


def test_a_replacement_that_cannot_be_made_says_why_in_one_line_and_writes_nothing(tmp_path, capsys):
    profile.import_profile(llama_trace(tmp_path), tmp_path / "profile.db")
    db = tmp_path / "profile.db"
    cases = [
        (["--replace", "LlamaRMSNorm=nope:torch"], "--replace LlamaRMSNorm=nope:torch: no catalogue op 'nope'"),
        # the catalogue's Triton rmsnorm runs on CUDA only; this profile is of a CPU
        (["--replace", "LlamaRMSNorm=rmsnorm:triton", "--device", "cpu"],
         "--replace LlamaRMSNorm=rmsnorm:triton: cannot run model.layers.0.input_layernorm [1, 16, 64] here"),
    ]
    for extra, said in cases:
        assert main(["sequence", str(db), *extra]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, (extra, err)
    # a profile taken inside capture(trace) without the model: no module calls to replace
    (tmp_path / "bare").mkdir()
    imported(tmp_path / "bare", TYPED)
    assert main(["sequence", str(tmp_path / "bare" / "profile.db"), "--replace", "X=rmsnorm:torch"]) == 2
    assert "the profile has no module calls: profile inside capture(trace, model)" in capsys.readouterr().err
    assert all(r["sequence_us"] is None for r in profile.load(db))
