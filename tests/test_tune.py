"""Tuning: knob sweeps with constraints, the default, the seeded search and its budget, `opperf best`
and its export read back by a kernel, and --opperf-trace. Real pytest sessions on a CPU, with a
backend whose knob really changes its speed (it adds in slices of `chunk` elements)."""

import json
import textwrap

import pytest
import torch

from conftest import FAST, rows, rows_at, write_config
from pytest_opperf import cli
from pytest_opperf.catalog import tuned
from pytest_opperf.catalog.backends.triton import tuned_knobs
from pytest_opperf.catalog.registry import BACKENDS, library_version
from pytest_opperf.config.opconfig import ConfigError, load
from pytest_opperf.config.search import RandomSearch
from pytest_opperf.view import significance
from pytest_opperf.view.best import Sweep
from pytest_opperf.view.text import fmt

CHUNKED = """
import torch
from pytest_opperf import register_backend
from pytest_opperf.catalog import tuned


@register_backend("add", "chunked")
def add_chunked(a, b, chunk=None, pad=0):
    # Python loops over slices: 64-element slices are far slower than one whole add.
    if chunk is None:
        chunk = tuned.knobs("add", "chunked", {"n": a.numel()}, a.dtype).get("chunk", 256)
    out = torch.empty_like(a)
    for start in range(0, a.numel(), chunk):
        torch.add(a[start:start + chunk], b[start:start + chunk], out=out[start:start + chunk])
    return out
"""

BENCH = """
def test_add(backend, inputs, bench):
    bench(backend, *inputs)
"""


@pytest.fixture
def chunked(pytester):
    pytester.makepyfile(conftest=CHUNKED)
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_sweep.py").write_text(BENCH)
    (pytester.path / "configs").mkdir()
    return pytester


@pytest.fixture(autouse=True)
def no_tables():
    """Each test starts and ends without tuned tables (the loader's tables live in the process)."""
    tuned.use([])
    yield
    tuned.use([])


def load_add(tmp_path, text):
    path = tmp_path / "add.yaml"
    path.write_text(textwrap.dedent(text))
    return load(path, ("n",), {}, op_name="add")


# --- knob grids, constraints, the default --------------------------------------------------------


def test_constraints_skip_invalid_combinations_with_the_reason(chunked):
    write_config(chunked, "add", """\
        backends:
          chunked:
            knobs: {chunk: {min: 1024, max: 8192, mul: 2}, pad: [0, 1]}
            constraints: ["chunk * (pad + 1) <= n"]
            default: true
        dtypes: fp32
        params: {N: [2048, 8192]}
        """)
    result = chunked.runpytest("benches", "-rs", *FAST)
    # n=2048: chunk 1024 pad 0/1, 2048 pad 0 -> 3 of 8 hold; n=8192: every chunk with pad 0, 1024-4096 with pad 1 -> 7
    # of 8; plus one default per shape.
    result.assert_outcomes(passed=3 + 7 + 2, skipped=5 + 1)
    result.stdout.fnmatch_lines([
        "SKIPPED*configs/add.yaml: backends.chunked.constraints[[]0[]]: 'chunk * (pad + 1) <= n' does not hold "
        "(chunk=4096, pad=0, n=2048)*"])
    got = {(r["n"], r["knobs"]) for r in rows(chunked, "add")}
    assert (2048, "") in got and (8192, "") in got  # the defaults: no knobs
    assert (2048, '{"chunk": 2048, "pad": 0}') in got and (2048, '{"chunk": 2048, "pad": 1}') not in got
    assert len(got) == 12


def test_an_unknown_knob_is_a_collection_error_naming_file_and_key(chunked):
    write_config(chunked, "add", "backends: {chunked: {knobs: {chunk: [64], unroll: [2]}}}\ndtypes: fp32\n"
                                 "params: {N: 64}\n")
    result = chunked.runpytest("benches", *FAST)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*configs/add.yaml: backends.chunked.knobs.unroll: backend 'chunked' of op 'add' "
                                 "takes no knob 'unroll'; its knobs are ?'chunk', 'pad'?*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    assert not (chunked.path / "results").exists()


@pytest.mark.parametrize("body, key, message", [
    ("knobs: {b: [1]}\n    constraints: [\"__import__('os').system('x')\"]", "backends.t.constraints[0]",
     "only min, max and abs may be called"),
    ("knobs: {b: [1]}\n    constraints: 'blok < n'", "backends.t.constraints", "unknown name 'blok'"),
    ("knobs: {b: [1]}\n    constraints: ['b <']", "backends.t.constraints[0]", "is not a valid expression"),
    ("knobs: {b: [1]}\n    constraints: ['backend == 1']", "backends.t.constraints[0]", "unknown name 'backend'"),
    ("constraints: ['n > 1']", "backends.t.constraints", "goes with knobs"),
    ("knobs: {b: [1]}\n    default: 'yes'", "backends.t.default", "expected true or false"),
    ("knobs: {b: [1]}\n    search: {samples: 0}", "backends.t.search.samples", "an int >= 1"),
    ("knobs: {b: [1]}\n    search: {samples: 2, method: halving}", "backends.t.search.method", "expected one of ['random']"),
    ("knobs: {b: [1]}\n    search: {samples: 2, budget: -1}", "backends.t.search.budget", "expected seconds > 0"),
    ("knobs: {b: [1]}\n    search: {samples: 2, sed: 1}", "backends.t.search.sed", "unknown key"),
    ("knobs: {b: [1]}\n    search: 5", "backends.t.search", "expected a mapping"),
])
def test_bad_tuning_keys_name_the_file_and_key(tmp_path, body, key, message):
    with pytest.raises(ConfigError) as err:
        load_add(tmp_path, f"backends:\n  t:\n    {body}\ndtypes: fp32\nparams: {{N: 8}}\n")
    assert str(err.value).startswith(f"{tmp_path / 'add.yaml'}: {key}: ") and message in str(err.value)


def test_an_expression_naming_a_knob_is_about_the_cases_that_set_it(tmp_path):
    cfg = load_add(tmp_path, """\
        backends:
          torch: {}
          t: {knobs: {b: [1, 2]}, default: true}
        dtypes: fp32
        params: {N: 8}
        exclude: "b > 1"
        """)
    got = [c.id for c in cfg.expand(("n",), "cpu")]
    # torch and t's default set no b: the exclusion does not touch them (it used to fail on them).
    assert got == ["torch-fp32-n=8", "t-fp32-n=8", "t-fp32-n=8-b=1"]
    assert cfg.count() == 1 + 3  # torch, t's default and its 2 knob values before the exclusion


# --- the search ----------------------------------------------------------------------------------


SEARCHED = """\
    backends:
      t:
        knobs: {{b: {{min: 1, max: 1048576, mul: 2}}, w: [1, 2, 4, 8], s: {{min: 1, max: 1000, step: 1}}}}
        constraints: ["b <= n", "b * w <= 4096"]
        default: true
        search: {{samples: 6, seed: {seed}}}
    dtypes: [fp32, bf16]
    params: {{N: [256, 65536]}}
    """


def test_the_search_draws_the_same_allowed_knob_sets_for_the_same_seed(tmp_path):
    def drawn(seed):
        cfg = load_add(tmp_path, SEARCHED.format(seed=seed))
        return cfg, [c for c in cfg.expand(("n",), "cpu")]

    cfg, first = drawn(7)
    assert [c.id for c in drawn(7)[1]] == [c.id for c in first]
    assert [c.id for c in drawn(8)[1]] != [c.id for c in first]
    # 21 x 4 x 1000 = 84000 combinations: 6 drawn per shape, plus the default, for each dtype.
    assert cfg.count() == 2 * (6 + 1) * 2 == len(first)
    for n in (256, 65536):
        for dtype in ("fp32", "bf16"):
            knobs = [dict(c.knobs) for c in first if c.param_dict["n"] == n and c.dtype_in == dtype]
            assert knobs[0] == {}  # the default first: a budget never cuts it
            assert len({tuple(k.items()) for k in knobs}) == 7
            assert all(k["b"] <= n and k["b"] * k["w"] <= 4096 for k in knobs[1:])
    # Each shape draws on its own: the two shapes' sets differ.
    assert {c.knobs for c in first if c.param_dict["n"] == 256} != {c.knobs for c in first if c.param_dict["n"] == 65536}


def test_random_search_decodes_the_grid_in_product_order():
    # Every one of the 6 combinations, each once, when the sample is as large as the grid.
    search = RandomSearch(samples=6, seed=0)
    got = list(search.sample((("a", (1, 2)), ("b", (10, 20, 30))), "g", lambda k: True))
    assert sorted(got) == sorted((("a", a), ("b", b)) for a in (1, 2) for b in (10, 20, 30))
    assert list(search.sample((("a", (1, 2)), ("b", (10, 20, 30))), "g", lambda k: dict(k)["b"] == 20)) in (
        [(("a", 1), ("b", 20)), (("a", 2), ("b", 20))], [(("a", 2), ("b", 20)), (("a", 1), ("b", 20))])


def test_the_search_budget_skips_the_rest_of_a_shape(chunked):
    write_config(chunked, "add", """\
        backends:
          chunked:
            knobs: {chunk: [64, 128, 256, 512, 1024]}
            default: true
            search: {samples: 5, seed: 1, budget: 0.000001}
        dtypes: fp32
        params: {N: [1024, 2048]}
        """)
    result = chunked.runpytest("benches", "-rs", *FAST)
    # The first case of each shape (its default) spends the budget; the 5 drawn after it skip.
    result.assert_outcomes(passed=2, skipped=10)
    result.stdout.fnmatch_lines(["SKIPPED*search budget of 1e-06 s for fp32-n=1024 spent (* s over 1 cases in this "
                                 "process)*"])
    assert sorted((r["n"], r["knobs"]) for r in rows(chunked, "add")) == [(1024, ""), (2048, "")]


# --- opperf best, the export, the kernels reading it ---------------------------------------------


def test_best_per_shape_export_and_the_kernel_reading_it_back(chunked, capsys):
    write_config(chunked, "add", """\
        backends:
          chunked: {knobs: {chunk: [64, 16384]}, default: true}
        dtypes: fp32
        params: {N: [65536]}
        """)
    chunked.runpytest("benches", *FAST).assert_outcomes(passed=3)
    db = chunked.path / "results" / "cpu.db"
    by_knobs = {r["knobs"]: r["time_us"] for r in rows(chunked, "add")}
    # 4 slices of 16384 against 256 of the default 256 or 1024 of 64 (16384 stays below torch's 32768-element
    # grain for threads, which on a busy machine cost more than they give): the knob decides the speed.
    assert by_knobs['{"chunk": 16384}'] < min(by_knobs[""], by_knobs['{"chunk": 64}'])

    out = chunked.path / "tuned.json"
    assert cli.main(["best", str(db), "--op", "add", "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    best, runner_up = sorted(by_knobs.values())[:2]
    speedup = by_knobs[""] / best
    cells = next(line for line in printed.splitlines() if line.startswith("fp32-n=65536")).split()
    assert cells[:4] == ["fp32-n=65536", "chunked", "chunk=16384", fmt(best)]
    by_row = {r["knobs"]: r for r in rows(chunked, "add")}
    doubt = significance.why_not(by_row['{"chunk": 16384}'], by_row[""])  # "~" where noise could explain it
    assert cells[6] == f"{runner_up / best:.2f}x" and cells[-1] == significance.ratio_text(speedup, doubt)
    table = json.loads(out.read_text())
    entry = table["tables"]["add/chunked"]["shapes"]["fp32-n=65536"]
    assert entry["knobs"] == {"chunk": 16384} and entry["time_us"] == by_knobs['{"chunk": 16384}']
    assert entry["default_time_us"] == by_knobs[""] and entry["speedup_over_default"] == pytest.approx(speedup)
    assert table["device"] == "cpu" and table["opperf_tuned"] == 1

    # The kernel called without knobs takes the table's for its shape; the row says which it ran.
    write_config(chunked, "add", "backends: [chunked]\ndtypes: fp32\nparams: {N: [65536, 4096]}\n")
    result = chunked.runpytest("benches", "--opperf-tuned=tuned.json", "--opperf-results=again", *FAST)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["opperf: tuned knobs from *tuned.json (kernels called without knobs use them)"])
    again = {r["n"]: (r["knobs"], r["tuned_table"]) for r in rows_at(chunked.path / "again" / "cpu.db", "add")}
    assert again == {65536: ('{"chunk": 16384}', "tuned.json"), 4096: ("", None)}  # 4096 was never tuned


def test_sweep_margins_by_hand():
    rows_ = [{"knobs": "", "time_us": 20.0, "ci_rel": 0.01}, {"knobs": '{"b": 2}', "time_us": 12.0, "ci_rel": 0.01},
             {"knobs": '{"b": 1}', "time_us": 10.0, "ci_rel": 0.01}]
    w = Sweep("t", "fp32-n=8", sorted(rows_, key=lambda r: r["time_us"]))
    assert w.best["knobs"] == '{"b": 1}' and w.margin == pytest.approx(1.2) and not w.within_noise
    assert w.speedup_over_default == pytest.approx(2.0)
    close = Sweep("t", "s", [{"knobs": '{"b": 1}', "time_us": 10.0, "ci_rel": 0.01},
                             {"knobs": '{"b": 2}', "time_us": 10.1, "ci_rel": 0.01}])
    assert close.within_noise and close.default is None and close.speedup_over_default is None


def test_best_says_what_is_missing(tmp_path, capsys, chunked):
    write_config(chunked, "add", "backends: [chunked]\ndtypes: fp32\nparams: {N: 64}\n")
    chunked.runpytest("benches", *FAST).assert_outcomes(passed=1)
    db = chunked.path / "results" / "cpu.db"
    assert cli.main(["best", str(db), "--op", "add", "--export", str(tmp_path / "t.json")]) == 2
    assert "no backend ran knobs in add: nothing to export" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
    # Without --op: the message names the tables it searched, not an empty list.
    assert cli.main(["best", str(db), "--export", str(tmp_path / "t.json")]) == 2
    assert "no backend ran knobs in add: nothing to export" in capsys.readouterr().err


def test_a_bad_table_is_refused_naming_the_file(tmp_path, chunked):
    bad = tmp_path / "t.json"
    bad.write_text('{"tables": {}}')
    with pytest.raises(tuned.TunedError, match=r"t.json: not a tuned-knobs table"):
        tuned.use([bad])
    write_config(chunked, "add", "backends: [chunked]\ndtypes: fp32\nparams: {N: 64}\n")
    (chunked.path / "t.json").write_text("{not json")
    result = chunked.runpytest("benches", "--opperf-tuned=t.json", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--opperf-tuned: *t.json: invalid JSON*"])
    result = chunked.runpytest("benches", "--opperf-tuned=none.json", *FAST)
    result.stderr.fnmatch_lines(["*--opperf-tuned=*none.json: no such file*"])


def test_our_triton_kernels_read_the_table_when_called_without_knobs(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"opperf_tuned": 1, "tables": {"rmsnorm/triton": {"shapes": {
        "bf16-m=2-n=100": {"knobs": {"block_size": 64, "num_warps": 2}}}}}}))
    tuned.use([path])
    got = tuned_knobs("rmsnorm", {"m": 2, "n": 100}, torch.bfloat16, block_size=None, num_warps=None)
    assert got == {"block_size": 64, "num_warps": 2}
    assert tuned_knobs("rmsnorm", {"m": 2, "n": 100}, torch.float32, block_size=None, num_warps=None) == \
        {"block_size": None, "num_warps": None}  # fp32 was not tuned
    assert tuned_knobs("rmsnorm", {"m": 2, "n": 100}, torch.bfloat16, block_size=128, num_warps=None) == \
        {"block_size": 128, "num_warps": None}  # knobs given: the table is not asked
    # The kernel's knob check runs before any launch, without triton: it saw the table's block of 64.
    x, w = torch.randn(2, 100, dtype=torch.bfloat16), torch.randn(100, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="knob BLOCK_SIZE=64 is smaller than a row"):
        BACKENDS[("rmsnorm", "triton")].fn(x, w)


# --- traces --------------------------------------------------------------------------------------


def test_trace_writes_a_chrome_trace_per_case_with_a_range_per_sample(chunked):
    write_config(chunked, "add", "backends: {chunked: {knobs: {chunk: [1024, 4096]}}}\ndtypes: fp32\n"
                                 "params: {N: 4096}\n")
    result = chunked.runpytest("benches", "--opperf-trace=traces", *FAST)
    result.assert_outcomes(passed=2)
    files = sorted((chunked.path / "traces").iterdir())
    assert [f.name for f in files] == ["benches_test_sweep.py_test_add[chunked-fp32-n=4096-chunk=1024].json",
                                       "benches_test_sweep.py_test_add[chunked-fp32-n=4096-chunk=4096].json"]
    data = json.loads(files[0].read_text())
    names = [e.get("name") for e in data["traceEvents"]]
    assert names.count("opperf::warmup") == 1
    assert [n for n in names if n.startswith("opperf::sample")] == [f"opperf::sample[{i}]" for i in range(10)]
    assert data["opperf"]["case"] == "chunked-fp32-n=4096-chunk=1024" and data["opperf"]["timer"] == "cpu"
    # Four slices of 1024 per call: the sample ranges hold the adds they timed.
    sample = next(e for e in data["traceEvents"] if e.get("name") == "opperf::sample[3]")
    inside = [e for e in data["traceEvents"] if e.get("name") == "aten::add" and e.get("tid") == sample["tid"]
              and sample["ts"] <= e["ts"] <= sample["ts"] + sample["dur"]]
    assert len(inside) >= 4
    assert len(rows(chunked, "add")) == 2  # the rows are written as without a trace


def test_no_trace_without_the_option(chunked):
    write_config(chunked, "add", "backends: [chunked]\ndtypes: fp32\nparams: {N: 64}\n")
    chunked.runpytest("benches", *FAST).assert_outcomes(passed=1)
    assert not (chunked.path / "traces").exists()


# --- on a GPU: our Triton kernel swept, exported, read back; its kernels in the trace -------------

needs_triton_gpu = pytest.mark.skipif(not torch.cuda.is_available() or library_version("triton") is None,
                                      reason="needs a CUDA GPU and triton")


@needs_triton_gpu
def test_triton_rmsnorm_sweep_export_and_tuned_run_on_the_gpu(pytester, capsys):
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_norms.py").write_text(
        "def test_rmsnorm(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    (pytester.path / "configs").mkdir()
    write_config(pytester, "rmsnorm", """\
        backends:
          triton:
            knobs: {BLOCK_SIZE: [4096, 8192], num_warps: [1, 8]}
            constraints: ["block_size >= n"]
            default: true
        dtypes: bf16
        params: {M: 4096, N: [4096, 8192]}
        """)
    gpu = ("-p", "no:cacheprovider", "-p", "no:randomly", "--opperf-budget=0.1", "-rs")
    result = pytester.runpytest("benches", "--opperf-trace=traces", *gpu)
    result.assert_outcomes(passed=2 * 1 + 4 + 2, skipped=2)  # n=8192: BLOCK_SIZE 4096 breaks the constraint
    db = next((pytester.path / "results").glob("*.db"))
    assert cli.main(["best", str(db), "--op", "rmsnorm", "--export", str(pytester.path / "tuned.json")]) == 0
    table = json.loads((pytester.path / "tuned.json").read_text())["tables"]["rmsnorm/triton"]["shapes"]
    assert set(table) == {"bf16-m=4096-n=4096", "bf16-m=4096-n=8192"}
    trace = json.loads(next((pytester.path / "traces").glob("*n=8192-block_size=8192-num_warps=8*.json")).read_text())
    sample = next(e for e in trace["traceEvents"] if e.get("name") == "opperf::sample[0]")
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "_rmsnorm" in e.get("name", "")]
    assert kernels and any(e["ts"] >= sample["ts"] for e in kernels)

    write_config(pytester, "rmsnorm", "backend: triton\ndtypes: bf16\nparams: {M: 4096, N: [4096, 8192]}\n")
    result = pytester.runpytest("benches", "--opperf-tuned=tuned.json", "--opperf-results=again", *gpu)
    result.assert_outcomes(passed=2)
    again_db = next((pytester.path / "again").glob("*.db"))
    again = {r["n"]: json.loads(r["knobs"] or "{}") for r in rows_at(again_db, "rmsnorm")}
    assert again == {4096: table["bf16-m=4096-n=4096"]["knobs"], 8192: table["bf16-m=4096-n=8192"]["knobs"]}
