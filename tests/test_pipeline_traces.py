"""opperf import on torch.profiler traces nobody here wrote: public traces of several torch versions
(tests/data/PROVENANCE.md), malformed and foreign files refused in one line, linking checked against
the plain quadratic search, and its cost counted."""

import gzip
import importlib.util
import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.reading import events as events_mod
from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.reading import owners, trace
from pytest_opperf.pipeline.reading.signature import ProfileError

TRACES = Path(__file__).parent / "data" / "traces"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def load_events(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def device_us(events) -> float:
    return sum(e["dur"] for e in events if e.get("ph") == "X" and str(e.get("cat")).lower() in DEVICE_CATS)


def linked_share(rows) -> float:
    """The share of the time whose kernels a CPU op launched (not kept under the kernel's own name)."""
    orphan = sum(r["share"] for r in rows if not r["input_shapes"] and r["kernels"]
                 and set(json.loads(r["kernels"])) == {r["op_type"]})
    return 1 - orphan


# file -> (time source, least share of the kernel time linked to a CPU op, an op the mapping takes)
PUBLIC = {
    "kineto_resnet50_v100_torch19.pt.trace.json.gz": ("kernel", 1.0, "aten::add_"),
    "hta_rank0_109k_events.json.gz": ("kernel", 0.79, "aten::mm"),  # the rest: launches outside any recorded op
    "hta_sampled_rank0.json.gz": ("kernel", 0.99, "aten::mm"),
    "hta_mi250_rocm62.json.gz": ("kernel", 1.0, "aten::addmm"),
    "hta_backward_thread.json": ("kernel", 1.0, "aten::mm"),
    "hta_triton_example.json.gz": ("kernel", 1.0, None),  # a Triton kernel's own op: not in the mapping
    "hta_cpu_only_rank_non_gpu.json.gz": ("cpu_op", 1.0, "aten::mm"),
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_public_trace_imports_with_every_microsecond_once(name, tmp_path, capsys):
    path = TRACES / name
    out = tmp_path / "p.db"
    assert main(["import", str(path), "-o", str(out)]) == 0, capsys.readouterr().err
    rows = profile.load(out)
    time_source, least_linked, mapped = PUBLIC[name]
    assert {r["time_source"] for r in rows} == {time_source}
    if time_source == "kernel":
        assert sum(r["profiled_total_us"] for r in rows) == pytest.approx(device_us(load_events(path)), rel=1e-9)
        assert linked_share(rows) >= least_linked
    if mapped:
        assert any(r["status"] == "mapped" and r["op_type"] == mapped for r in rows)


def test_a_pytorch_1_9_trace_reads_its_old_categories(tmp_path):
    # Operator / Kernel / Runtime / Memcpy, kernels' "external id" in lower case, tids as text
    rows = profile.import_profile(TRACES / "kineto_resnet50_v100_torch19.pt.trace.json.gz", tmp_path / "p.db")
    adds = {r["input_shapes"]: r for r in rows if r["op_type"] == "aten::add_"}
    add = adds["32,256,56,56;32,256,56,56;"]
    assert (add["count"], add["input_dtypes"], add["status"], json.loads(add["params"])) == (
        18, "float;float;Int", "mapped", {"n": 32 * 256 * 56 * 56})
    copy = next(r for r in rows if r["op_type"] == "aten::copy_" and r["input_shapes"].startswith("32,3,224,224"))
    assert json.loads(copy["kernels"]) == {"Memcpy HtoD (Pageable -> Device)": 6}


def test_the_import_lists_the_largest_unmapped_op_types(tmp_path, capsys):
    path = TRACES / "hta_sampled_rank0.json.gz"
    assert main(["import", str(path), "-o", str(tmp_path / "p.db")]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = profile.load(tmp_path / "p.db")
    unmapped = profile.unmapped_types(rows)
    header = next(i for i, line in enumerate(out) if line.startswith("  largest unmapped op types"))
    assert out[header] == (f"  largest unmapped op types (10 of {len(unmapped)}): share of the profiled time, "
                           f"calls, signatures")
    listed = out[header + 1:header + 11]
    assert [line.split()[0] for line in listed] == [u.op_type[:60].split()[0] for u in unmapped[:10]]
    top = unmapped[0]
    assert top.op_type == "record_param_comms"
    assert listed[0].split()[-5:] == [f"{100 * top.share:.1f}%", str(top.calls), "calls", str(top.signatures), "sig"]
    assert sum(u.share for u in unmapped) == pytest.approx(sum(r["share"] for r in rows if r["status"] == "unmapped"))


def test_unmapped_types_groups_signatures_by_op_type():
    rows = [{"status": "unmapped", "op_type": "a", "share": 0.1, "count": 2},
            {"status": "unmapped", "op_type": "b", "share": 0.3, "count": 1},
            {"status": "unmapped", "op_type": "a", "share": 0.25, "count": 5},
            {"status": "mapped", "op_type": "c", "share": 0.35, "count": 9}]
    assert [(u.op_type, round(u.share, 9), u.calls, u.signatures) for u in profile.unmapped_types(rows)] == [
        ("a", 0.35, 7, 2), ("b", 0.3, 1, 1)]


# ---- refusals: one line naming the file, and no database written ----

def refused(path, tmp_path, capsys) -> str:
    out = tmp_path / "refused.db"
    assert main(["import", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
    return err.strip()


def test_a_public_trace_without_shapes_is_refused_with_the_fix(tmp_path, capsys):
    path = TRACES / "hta_no_shapes_event_sync.json.gz"
    assert refused(path, tmp_path, capsys) == (
        f"opperf import: {path}: the CPU ops carry no 'Input Dims': record the trace with "
        f"torch.profiler.profile(..., record_shapes=True)")


def test_a_public_trace_without_cpu_ops_is_refused(tmp_path, capsys):
    path = TRACES / "hta_no_cpu_ops_inference_rank_1.json.gz"
    assert refused(path, tmp_path, capsys) == (
        f"opperf import: {path}: no CPU ops (cat 'cpu_op' or 'Operator') in the trace; record it with "
        f"torch.profiler (record_shapes=True)")


def op_event(name="aten::mm", ts=0, dur=10, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": 1, "Input Dims": [[8, 8], [8, 8]], "Input type": ["float", "float"], **args}}


def write_lines(path, events_text: list[str]) -> Path:
    """One event a line after a first line of metadata: event i is on line i + 2."""
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(events_text) + "\n]}\n")
    return path


def test_a_broken_event_is_named_by_index_and_line(tmp_path, capsys):
    good = json.dumps(op_event())
    path = write_lines(tmp_path / "t.json", [good, good, good.replace('"ts": 0,', '"ts": 0'), good])
    assert refused(path, tmp_path, capsys) == (
        f"opperf import: {path}: event 2 (line 4) is not valid JSON (line 4: Expecting ',' delimiter)")


def test_an_event_with_a_wrong_field_is_named_with_the_field(tmp_path, capsys):
    path = write_lines(tmp_path / "t.json", [json.dumps(op_event()), json.dumps(op_event(dur="12"))])
    assert refused(path, tmp_path, capsys) == (
        f"opperf import: {path}: event 1 (line 3): cpu_op event 'aten::mm': 'dur' is '12' "
        f"(expected a number of us, not negative)")
    path = write_lines(tmp_path / "u.json", [json.dumps(op_event(**{"Input Dims": [[8, "8"], [8, 8]]}))])
    assert refused(path, tmp_path, capsys) == (
        f"opperf import: {path}: event 0 (line 2): 'Input Dims' is [[8, '8'], [8, 8]] (expected a list of "
        f"shapes, each a list of integers or a list of such lists)")
    path = write_lines(tmp_path / "v.json", ["[1, 2]"])
    assert refused(path, tmp_path, capsys) == f"opperf import: {path}: event 0 (line 2): a list, not an event object"


def test_a_cut_file_is_refused_not_read_in_part(tmp_path, capsys):
    whole = json.dumps({"traceEvents": [op_event(ts=i * 20) for i in range(50)]})
    cut = tmp_path / "cut.json"
    cut.write_text(whole[: len(whole) // 2])
    err = refused(cut, tmp_path, capsys)
    assert err == f"opperf import: {cut}: event 24 (line 1) is cut off: the file ends inside it"
    packed = gzip.compress(whole.encode())
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(packed[: len(packed) // 2])
    assert refused(cut_gz, tmp_path, capsys) == (
        f"opperf import: {cut_gz}: cannot be read as a Chrome trace JSON file (Compressed file ended before the "
        f"end-of-stream marker was reached)")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert refused(empty, tmp_path, capsys) == (
        f"opperf import: {empty}: not a Chrome trace JSON file (it is empty, expected {{'traceEvents': [...]}} or a "
        f"list of events)")
    csv = tmp_path / "kernels.json"
    csv.write_text("Type,Duration(us)\nMatMulV2,1.0\n")
    assert refused(csv, tmp_path, capsys) == (
        f"opperf import: {csv}: not a Chrome trace JSON file (it starts with 'T', expected "
        f"{{'traceEvents': [...]}} or a list of events)")


def trace_view_events():
    # as torch_npu writes them: "ts" as text, device tasks with their own fields
    return [{"ph": "X", "name": "aten::mm", "pid": 2363241, "tid": 2363241, "ts": "1700000000123456.250",
             "dur": 12.5, "cat": "cpu_op", "args": {"Sequence number": -1, "Fwd thread id": 0}},
            {"ph": "X", "name": "MatMulV2", "pid": 2363250, "tid": 2, "ts": "1700000000123470.000", "dur": 8.1,
             "args": {"Model Id": 4294967295, "Task Type": "AI_CORE", "Stream Id": 2}}]


def test_a_torch_npu_trace_view_points_at_the_kernel_details_beside_it(tmp_path, capsys):
    folder = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True)
    view = folder / "trace_view.json"
    view.write_text(json.dumps(trace_view_events()))
    csv = folder / "kernel_details.csv"
    for beside, target in ((False, "the kernel_details.csv in its ASCEND_PROFILER_OUTPUT folder"), (True, csv)):
        if beside:
            csv.write_text("Type,Duration(us)\n")
        assert refused(view, tmp_path, capsys) == (f"opperf import: {view}: a torch_npu trace_view.json (string "
                                                   f"timestamps, kernels without shapes); import {target} instead")


def test_gzip_is_told_by_its_bytes_not_its_name(tmp_path):
    packed = tmp_path / "trace.json"  # gzip under a plain name, as some tools save it
    packed.write_bytes(gzip.compress((TRACES / "hta_backward_thread.json").read_bytes()))
    (sig,) = trace.read(packed, lambda name, shapes, types, *recorded: name == "aten::mm")
    assert (sig.op_type, sig.input_shapes, sig.total_us) == ("aten::mm", "2048,2048;2048,256", 45.0)


def test_the_chunk_size_changes_nothing(tmp_path, monkeypatch):
    # events cut anywhere by the reader's buffer: the same signatures, the same error lines
    path = TRACES / "hta_mi250_rocm62.json.gz"
    claims = lambda name, shapes, types, *recorded: name in ("aten::mm", "aten::addmm")  # noqa: E731
    whole = trace.read(path, claims)
    for chunk in (1, 7, 500):
        monkeypatch.setattr(events_mod, "CHUNK_CHARS", chunk)
        assert [(s.op_type, s.input_shapes, s.durations_us, s.kernels) for s in trace.read(path, claims)] == [
            (s.op_type, s.input_shapes, s.durations_us, s.kernels) for s in whole]
        good = json.dumps(op_event())
        broken = write_lines(tmp_path / "t.json", [good, good, good.replace('"dur": 10', '"dur" 10')])
        with pytest.raises(ProfileError) as err:
            trace.read(broken, claims)
        assert str(err.value) == f"{broken}: event 2 (line 4) is not valid JSON (line 4: Expecting ':' delimiter)"


# ---- linking: the same answer as the plain quadratic search, at a cost that grows as n log n ----

def random_trace(seed: int, roots: int = 30):
    """Nested CPU ops on two threads, launches anywhere in them, kernels linked three ways, some not at all."""
    rng = random.Random(seed)
    names = ["outer::step", "aten::linear", "aten::mm", "aten::add", "aten::fill_"]
    out, ops = [], []
    ext = corr = 0

    def add_op(tid, ts, dur, depth):
        nonlocal ext
        ext += 1
        shape = [rng.choice([8, 16]), 4]
        op = {"ph": "X", "cat": "cpu_op", "name": names[min(depth, 4)] if depth != 2 else rng.choice(names[2:4]),
              "pid": 1, "tid": tid, "ts": ts, "dur": dur,
              "args": {"External id": ext, "Input Dims": [shape, shape], "Input type": ["float", "float"]}}
        out.append(op)
        ops.append(op)
        t = ts + 1
        while depth < 4 and t < ts + dur - 2 and rng.random() < 0.7:
            child = rng.randint(1, max(1, ts + dur - t - 1))
            add_op(tid, t, child, depth + 1)
            t += child + rng.randint(0, 2)

    for tid in (1, 2):
        t = 0
        for _ in range(roots):
            dur = rng.randint(20, 80)
            add_op(tid, t, dur, 0)
            t += dur + rng.randint(0, 3)
    gpu = 0
    for _ in range(300):
        corr += 1
        tid = rng.choice((1, 2))
        ts = rng.randint(-5, 30 * 85)  # some outside every op: device work no op launched
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts,
                    "dur": 1, "args": {"correlation": corr}})
        gpu += rng.randint(1, 5)
        kernel = {"ph": "X", "cat": "kernel", "name": f"k{corr % 7}", "pid": 0, "tid": 7, "ts": gpu,
                  "dur": rng.randint(1, 9), "args": {}}
        how = rng.choice(("external", "correlation", "flow"))
        if how == "external":
            kernel["args"]["External id"] = rng.choice(ops)["args"]["External id"]
        elif how == "correlation":
            kernel["args"]["correlation"] = corr
        else:
            out.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": gpu, "bp": "e"})
        out.append(kernel)
    rng.shuffle(out)  # nothing may depend on the order of the file
    return out


def claims(name, shapes, types, *recorded):
    return name in ("aten::linear", "aten::fill_") or (name == "aten::add" and shapes.startswith("8,"))


def shapes_of(op):
    return ";".join(",".join(map(str, d)) for d in op["args"]["Input Dims"])


def quadratic(events):
    """The plain search: per kernel, every op of the thread; per op, every op around it."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]

    def contains(o, t):
        return o["ts"] <= t <= o["ts"] + o["dur"]

    def innermost(tid, t):
        best = None
        for o in sorted((o for o in ops if o["tid"] == tid), key=lambda o: (o["ts"], -o["dur"])):
            if o["ts"] <= t and contains(o, t):
                best = o
        return best

    def owner(op):
        middle = op["ts"] + op["dur"] / 2
        around = [o for o in ops if o["tid"] == op["tid"] and (o is op or contains(o, middle) and o["dur"] > op["dur"])]
        for o in sorted(around, key=lambda o: -o["dur"]):  # outermost first
            if claims(o["name"], shapes_of(o), ";".join(o["args"]["Input type"])):
                return o
        return op

    by_ext = {o["args"]["External id"]: o for o in ops}
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    flows = {(e["pid"], e["tid"], e["ts"]): e["id"] for e in events if e.get("ph") == "f"}
    total = defaultdict(float)
    for k in (e for e in events if e.get("cat") == "kernel"):
        launcher = by_ext.get(k["args"].get("External id"))
        if launcher is None:
            call = runtime.get(k["args"].get("correlation", flows.get((k["pid"], k["tid"], k["ts"]))))
            launcher = innermost(call["tid"], call["ts"]) if call else None
        key = (owner(launcher)["name"], shapes_of(owner(launcher))) if launcher else (k["name"], "")
        total[key] += k["dur"]
    return dict(total)


@pytest.mark.parametrize("seed", range(4))
def test_linking_matches_the_quadratic_search(seed, tmp_path):
    events = random_trace(seed)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = defaultdict(float)
    for sig in trace.read(path, claims):
        got[(sig.op_type, sig.input_shapes)] += sig.total_us
    expected = quadratic(events)
    assert dict(got) == pytest.approx(expected)
    assert {k[0] for k in expected} & {"aten::linear", "aten::mm", "aten::add", "aten::fill_", "outer::step"}


def synthetic_module():
    spec = importlib.util.spec_from_file_location(
        "trace_import", Path(__file__).parent.parent / "benchmarks" / "probes" / "trace_import.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_linking_cost_grows_with_the_events_not_their_square(tmp_path, monkeypatch):
    bench = synthetic_module()
    calls = {"n": 0}
    contains = owners.Tree.contains

    def counted(self, i, ts):
        calls["n"] += 1
        return contains(self, i, ts)

    monkeypatch.setattr(owners.Tree, "contains", counted)
    per_event = []
    for n in (5_000, 40_000):
        path = tmp_path / f"s{n}.json"
        count = bench.write_trace(path, n)
        calls["n"] = 0
        sigs = trace.read(path, lambda name, shapes, types, *recorded: name in ("aten::mm", "aten::softmax", "aten::add"))
        per_event.append(calls["n"] / count)
        # every kernel linked: the GEMMs to aten::mm, the softmax kernels (by their flow) to aten::softmax
        assert {s.op_type for s in sigs} == {"aten::mm", "aten::softmax", "aten::add"}
    assert per_event[1] < 3 and per_event[1] < 1.2 * per_event[0]


def test_the_benchmark_trace_is_a_valid_trace_of_the_asked_size(tmp_path):
    bench = synthetic_module()
    path = tmp_path / "s.json.gz"
    count = bench.write_trace(path, 2_000, compress=True)
    events = load_events(path)
    assert len(events) == count and 2_000 <= count < 2_020
    rows = profile.import_profile(path, tmp_path / "p.db")
    assert sum(r["profiled_total_us"] for r in rows) == pytest.approx(device_us(events))
    assert linked_share(rows) == 1.0
