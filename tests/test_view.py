"""Looking at results: `opperf report`, `plot`, `html`, `export`, `datasette-metadata` and
--opperf-html, all checked against the databases of real CPU sessions.

The sessions (two, a second device's database and a gate report) are shared by the module:
each costs seconds on two cores, and every view here only reads them.
"""

import csv
import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import BENCH, CONFTEST, FAST, GEMM_SEED, made_once, rows_at
from pytest_opperf import cli
from pytest_opperf.columns import MEASURE
from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.measure.stats import is_unstable
from pytest_opperf.view import best, datasette, html, plots, significance, summary
from pytest_opperf.view.source import OpTable, Results, ViewError, case_id
from pytest_opperf.view.text import Section, fmt, render_markdown, render_text

VIEW_BENCH = BENCH + """

def test_gelu(backend, inputs, bench):
    bench(backend, *inputs)
"""
GELU = """
backends: [torch, torch_unfused]
dtypes: [fp32]
params:
  N: [4096, 65536]
"""
ADD = """
backend: torch
dtypes: [fp32, bf16]
params:
  N: [1024, 4096]
"""

needs_matplotlib = pytest.mark.skipif(
    __import__("importlib").util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed: the plot tests need pytest-opperf[plot]")


def _session(root: Path, *args: str) -> subprocess.CompletedProcess:
    # Keep what PYTHONPATH brings (on the GPU image, sqlite_utils comes only through it) but not
    # this checkout, whose benches/ and conftest.py must not shadow the project under test.
    here = Path(__file__).resolve().parents[1]
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != here]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(kept)}
    return subprocess.run([sys.executable, "-m", "pytest", "benches", *FAST, "-q", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


def _view_project(root: Path) -> None:
    """Two real CPU sessions of one project: results/cpu.db (gemm, add, gelu with two backends),
    then the gemm cases again into second/cpu.db, gated against the first run's baseline, with
    its JSON report and its HTML report written at session end (its output in second.out)."""
    import torch

    (root / "conftest.py").write_text(CONFTEST)
    (root / "benches").mkdir()
    (root / "benches" / "test_ops.py").write_text(VIEW_BENCH)
    (root / "configs").mkdir()
    (root / "configs" / "gemm.yaml").write_text(GEMM_SEED.format(version=torch.__version__.split("+")[0]))
    (root / "configs" / "add.yaml").write_text(ADD)
    (root / "configs" / "gelu.yaml").write_text(GELU)
    first = _session(root, "--opperf-save-baseline=base.json")
    assert first.returncode == 0, first.stdout + first.stderr
    second = _session(root, "-k", "gemm", "--opperf-results=second", "--opperf-baseline=base.json",
                      "--opperf-max-regression=500%", "--opperf-report-json=gate.json", "--opperf-html=run.html")
    assert second.returncode == 0, second.stdout + second.stderr
    (root / "second.out").write_text(second.stdout)


@pytest.fixture(scope="session")  # not module: under --dist worksteal a worker's tests of this module are
def dbs(tmp_path_factory, worker_id):  # interleaved with others', and a module fixture was made again
    """The view project's databases and reports (_view_project), made once for the whole run."""
    root = made_once(tmp_path_factory, worker_id, "viewproject", _view_project)
    return {"root": root, "a": root / "results" / "cpu.db", "b": root / "second" / "cpu.db",
            "gate": root / "gate.json", "html": root / "run.html", "second_out": (root / "second.out").read_text()}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- report -------------------------------------------------------------------------------------


def test_report_summarises_each_op_from_the_database(dbs, capsys):
    db = dbs["a"]
    before = _digest(db)
    assert cli.main(["report", str(db)]) == 0
    out = capsys.readouterr().out
    # A summary first: a line per op, before the first op's own section.
    total = sum(len(rows_at(db, op)) for op in ("add", "gelu", "gemm"))
    assert out.startswith(f"summary: {total} cases of 3 ops in cpu.db\n"), out[:300]
    head = out.split("\n\n")[0].splitlines()
    assert [line.split()[:2] for line in head[3:6]] == [[op, str(len(rows_at(db, op)))] for op in ("add", "gelu", "gemm")]
    for op in ("add", "gelu", "gemm"):
        table = rows_at(db, op)
        assert f"{op}: {len(table)} cases on cpu" in out
        params = {"add": ["n"], "gelu": ["n"], "gemm": ["m", "n", "k"]}[op]
        best, worst = max(table, key=lambda r: r["gflops"]), min(table, key=lambda r: r["gflops"])
        assert re.search(rf"\nGFLOP/s +{re.escape(fmt(best['gflops']))}  {re.escape(case_id(best, params))} +"
                         rf"{re.escape(fmt(worst['gflops']))}  {re.escape(case_id(worst, params))}\n", out)
    # the CPU spec has no peaks: MFU/MBU are said to be missing, once for every op, not shown as numbers
    assert out.count("not computed") == 1
    assert "MFU, MBU: not computed for any row of add, gelu, gemm (the hardware spec of cpu" in out
    # gelu: the fastest backend per shape, counted by hand from the rows; a win only where significant
    gelu = rows_at(db, "gelu")
    gelu_wins = out.split("gelu: fastest backend per shape\n")[1].split("\n\n")[0]
    wins = {}
    for n in (4096, 65536):
        fastest, second = sorted((r for r in gelu if r["n"] == n), key=lambda r: r["time_us"])[:2]
        if significance.why_not(fastest, second):
            said = re.escape(significance.verdict_text(significance.why_not(fastest, second)))
            assert re.search(rf"\nfp32-n={n} +{said} ", out)
            continue
        wins[fastest["backend"]] = wins.get(fastest["backend"], 0) + 1
        assert re.search(rf"\nfp32-n={n} +{fastest['backend']} ", gelu_wins)
    assert f"torch {wins.get('torch', 0)}" in out and f"torch_unfused {wins.get('torch_unfused', 0)}" in out
    assert "one backend ran for add, gemm: no fastest backend to name" in out  # said once
    assert "add: fastest backend per shape" not in out
    # The flags section is there only where a row is flagged: a quiet run has none (before: IndexError).
    add = rows_at(db, "add")
    unstable = sorted(case_id(r, ["n"]) for r in add if r["unstable"])
    assert all(r["check_floor"] < 0.01 for r in add)  # fp32 adds: their check sees far under 1%
    if any(r["unstable"] or r["throttled"] or r["contended"] for r in add):
        flags = out.split("add: unstable, throttled, contended and check-floor rows\n")[1].split("\n\n")[0]
        assert sorted(line.split()[0] for line in flags.splitlines()[2:] if "unstable" in line) == unstable
    else:
        assert "add: unstable, throttled, contended and check-floor rows" not in out
        assert re.search(r"no unstable \(a median that moved between the halves of its samples\), throttled, "
                         r"contended or check-floor \(above 1%\) rows in [a-z, ]*\badd\b", out)
    run = rows_at(db, "runs")[0]
    assert run["run_id"] in out and run["torch"] in out
    assert _digest(db) == before  # read-only


def test_html_wraps_long_text_and_plots_read_plain_ticks():
    from pytest_opperf.view.html import CSS, _cell

    contention = "cpu: others took 1.73 of 2 cores while the case ran, our threads waited 41% of the time"
    assert "class=long" in _cell(contention) and "class=long" not in _cell("torch")
    assert "td.long{white-space:normal" in CSS  # before: every cell nowrap, the column ran off the page
    assert [plots.tick_label(v) for v in (1048576, 1e6, 4096)] == ["1Mi", "1M", "4096"]  # before: 1.04858e+06


def test_report_markdown_and_the_rows_view(dbs, capsys):
    db = dbs["a"]
    assert cli.main(["report", str(db), "--op", "gemm", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## gemm: 2 cases on cpu")
    assert "| metric | best | case | worst | case |" in out and "| --- | ---: | --- | ---: | --- |" in out
    assert "## runs in cpu.db" in out and "add:" not in out
    assert cli.main(["report", str(db), "--op", "add", "--rows", "--limit", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "add: 4 rows in cpu.db"
    header = out[1].split()
    assert header[:4] == ["n", "dtype_in", "dtype_out", "backend"] and "sm_clock_mhz_before" not in header
    stored = rows_at(db, "add")
    for line, row in zip(out[3:6], stored):
        cells = line.split()
        assert cells[0] == str(row["n"]) and cells[header.index("time_us")] == fmt(row["time_us"])
    assert out[6] == "  ... 1 more rows (--limit N shows more)"


def test_report_bad_input_is_one_line_and_exit_2(dbs, tmp_path, capsys):
    assert cli.main(["report", str(dbs["a"]), "--op", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"opperf report: {dbs['a']}: no table 'nope' (tables: add, gelu, gemm)"
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    assert cli.main(["report", str(junk)]) == 2
    assert "not a readable SQLite database" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "none.db"), "--op", "gemm"]) == 2
    assert "none.db: no such database" in capsys.readouterr().err


def test_text_tables_align_and_markdown_escapes():
    section = Section("t", ["case", "time_us"], [["a|b", "1.5"], ["c", "12,345"]], notes=["n"])
    assert render_text([section]).splitlines() == ["t", "case  time_us", "----  -------", "a|b       1.5",
                                                   "c      12,345", "  n"]
    assert "| a\\|b | 1.5 |" in render_markdown([section]) and "| --- | ---: |" in render_markdown([section])


def test_rich_renders_the_same_sections():
    rich = pytest.importorskip("rich.console", reason="rich is optional: plain text is tested above")
    console = rich.Console(file=io.StringIO(), width=120)
    from pytest_opperf.view.text import render_rich

    render_rich([Section("gemm: best", ["case", "time_us"], [["torch-m=8", "1.5"]], notes=["a note"])], console)
    text = console.file.getvalue()
    assert "gemm: best" in text and "torch-m=8" in text and "a note" in text


# --- export and datasette ---------------------------------------------------------------------


def test_export_csv_and_json_hold_the_rows(dbs, tmp_path, capsys):
    db = dbs["a"]
    stored = rows_at(db, "gelu")
    assert cli.main(["export", str(db), "--op", "gelu", "--format", "json", "-o", str(tmp_path / "g.json")]) == 0
    assert json.loads((tmp_path / "g.json").read_text()) == stored
    assert cli.main(["export", str(db), "--op", "gelu"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(parsed[0]) == list(stored[0])
    for got, row in zip(parsed, stored):
        assert float(got["time_us"]) == row["time_us"] and got["backend"] == row["backend"]
        assert int(got["n"]) == row["n"] and (got["mfu"] == "") == (row["mfu"] is None)
    assert cli.main(["export", str(db), "--op", "gelu", "--format", "xml"]) == 2
    assert "--format=xml: expected one of csv, json" in capsys.readouterr().err


def test_datasette_metadata_describes_every_column(dbs, tmp_path):
    out = tmp_path / "metadata.json"
    assert cli.main(["datasette-metadata", str(dbs["a"]), "-o", str(out)]) == 0
    meta = json.loads(out.read_text())
    tables = meta["databases"]["cpu"]["tables"]
    assert sorted(tables) == ["add", "gelu", "gemm", "runs"]
    gemm = tables["gemm"]
    columns = [r[1] for r in sqlite3.connect(dbs["a"]).execute("pragma table_info(gemm)")]
    assert sorted(gemm["columns"]) == sorted(columns)
    assert gemm["columns"]["m"] == "parameter m of gemm (from its config)"
    assert gemm["units"]["time_us"] == "us" and gemm["facets"] == ["backend", "dtype_in", "timer"]
    assert gemm["columns"]["mbu"] == MEASURE["mbu"].description and "mbu" not in gemm["units"]
    assert gemm["columns"]["dtype_in"] == "input dtype" and gemm["units"]["sm_clock_mhz_before"] == "MHz"
    # Every column sortable: no sort_desc (it broke ?_col=... over more than a page); ratios and GFLOP/s rounded.
    assert not any("sort_desc" in t or "sortable_columns" in t for t in tables.values())
    assert gemm["opperf_digits"]["gflops"] == 1 and gemm["opperf_digits"]["mfu"] == 4
    assert gemm["description_html"].startswith("<p>one row per measured case of gemm")
    assert f"<summary>what the {len(columns)} columns mean</summary>" in gemm["description_html"]


def _datasette_command() -> list:
    """How to start Datasette here: this Python's module, else a `datasette` on PATH; skip without."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("datasette") is not None:
        return [sys.executable, "-m", "datasette"]
    found = shutil.which("datasette")
    if found is None:
        pytest.skip("datasette is not installed (pip install datasette)")
    return [found]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, deadline_s: float = 0.0):
    """(status, body) of a GET; with a deadline, retried until the server answers."""
    import time
    import urllib.error
    import urllib.request

    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_datasette_serves_the_results_sorted_by_any_column(dbs, tmp_path):
    command = _datasette_command()
    meta = tmp_path / "metadata.json"
    assert cli.main(["datasette-metadata", str(dbs["a"]), "-o", str(meta)]) == 0
    plugins = tmp_path / "plugins"  # the rounding plugin, as `--plugins-dir` loads it without an install
    plugins.mkdir()
    plugin = Path(datasette.__file__).with_name("datasette_plugin.py")
    (plugins / plugin.name).write_text(plugin.read_text())
    port = _free_port()
    server = subprocess.Popen([*command, "serve", str(dbs["a"]), "-m", str(meta), "--plugins-dir", str(plugins),
                               "-h", "127.0.0.1", "-p", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/cpu/gemm"
    try:
        status, body = _get(base + ".json?_sort=time_us&_shape=array", deadline_s=60)
        assert status == 200, body
        times = [r["time_us"] for r in json.loads(body)]
        assert times == sorted(r["time_us"] for r in rows_at(dbs["a"], "gemm")) and len(times) >= 2
        # One column shown, sorted, over more than a page: HTTP 400 "Invalid SQL" under sort_desc.
        for query in ("?_sort=time_us", "?_col=time_us&_size=1", "?_sort_desc=gflops&_col=gflops&_size=1"):
            status, page = _get(base + query)
            assert status == 200, (query, page[-500:])
        status, page = _get(base + "?_sort=time_us")
        assert page.index("<details><summary>what the") < page.index("<table")  # the rows right after a line
        cells = re.findall(r'class="col-gflops type-float">([^<]*)<', page)
        assert cells and all(re.fullmatch(r"[\d,]+\.\d", c) for c in cells), cells  # rounded to 0.1
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_datasette_loads_the_metadata(dbs, tmp_path):
    app = pytest.importorskip("datasette.app", reason="datasette is optional")
    import asyncio

    meta = datasette.metadata([Results.open(dbs["a"])])
    ds = app.Datasette([str(dbs["a"])], metadata=meta)

    async def fetch():
        page = await ds.client.get("/cpu/gemm")
        data = await ds.client.get("/cpu/gemm.json?_shape=array")
        return page, data

    page, data = asyncio.run(fetch())
    assert page.status_code == 200 and data.status_code == 200
    assert "median time of one call" in page.text and 'data-column="backend"' in page.text
    assert len(data.json()) == len(rows_at(dbs["a"], "gemm"))


# --- plots --------------------------------------------------------------------------------------


@needs_matplotlib
def test_roofline_without_peaks_draws_points_and_says_so(dbs, tmp_path):
    from pytest_opperf.view import plots

    table = Results.open(dbs["a"]).table("gemm")
    fig = plots.roofline(table, load_specs()["cpu"], "cpu")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)" and ax.get_ylabel() == "achieved FLOP/s"
    assert "the cpu spec has no peaks: points only" in ax.get_title()
    assert not ax.lines  # no roof
    points = sorted(float(v) for c in ax.collections for p in c.get_offsets() for v in p)
    assert points == pytest.approx(sorted(v for r in table.rows
                                          for v in (r["flops"] / r["bytes"], r["flops"] / (r["time_us"] * 1e-6))))
    paths = plots.save(fig, tmp_path, "gemm-roofline", ["png", "svg"])
    assert [p.name for p in paths] == ["gemm-roofline.png", "gemm-roofline.svg"]
    assert all(p.stat().st_size > 5000 for p in paths)
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in paths[1].read_bytes()


@needs_matplotlib
def test_roofline_with_peaks_draws_each_roof(dbs):
    from pytest_opperf.view import plots

    table = Results.open(dbs["a"]).table("add")  # fp32 and bf16 rows: two vector roofs
    h100 = load_specs()["h100"]
    fig = plots.roofline(table, h100, "cpu")
    ax = fig.axes[0]
    roofs = {line.get_label(): max(line.get_ydata()) for line in ax.lines}
    assert len(roofs) == 2
    for dtype in ("bf16", "fp32"):
        label = next(k for k in roofs if k.startswith(f"{dtype} vector peak"))
        assert roofs[label] == pytest.approx(h100.peak_flops(dtype, "vector"))
        assert "3350 GB/s" in label
    assert "no peaks" not in ax.get_title()


@needs_matplotlib
def test_roofline_of_a_device_without_a_spec_and_capped_panels(dbs):
    from pytest_opperf.view import plots

    results = Results.open(dbs["a"])
    fig = plots.roofline(results.table("gemm"), None, "cpu")
    assert "no hardware spec for this device: points only" in fig.axes[0].get_title() and not fig.axes[0].lines
    fig = plots.lines(results.table("add"), max_panels=1)  # fp32 and bf16: two panels, one shown
    assert [ax.get_visible() for ax in fig.axes] == [True]
    assert "(first 1 of 2 panels: --max-panels N)" in fig.get_suptitle()
    assert fig.axes[0].get_title() == "bf16"


@needs_matplotlib
def test_lines_over_the_swept_parameter(dbs):
    from pytest_opperf.view import plots

    table = Results.open(dbs["a"]).table("gelu")
    fig = plots.lines(table)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "n" and ax.get_ylabel() == "time per call (us, median)"
    assert sorted(line.get_label() for line in ax.lines) == ["torch", "torch_unfused"]
    for line in ax.lines:
        mine = sorted((r["n"], r["time_us"]) for r in table.rows if r["backend"] == line.get_label())
        assert list(line.get_xdata()) == [n for n, _ in mine] and list(line.get_ydata()) == [t for _, t in mine]
    assert "timer=cpu, cache=hot" in fig.get_suptitle()
    # gemm's M is the swept parameter (N and K are fixed); one panel per dtype combination
    gemm = plots.lines(Results.open(dbs["a"]).table("gemm"), y="gflops")
    assert gemm.axes[0].get_xlabel() == "m" and gemm.axes[0].get_ylabel() == "GFLOP/s"
    assert "n=16, k=8" in gemm.get_suptitle()
    with pytest.raises(ViewError, match=r"--x=q: op 'gelu' has no parameter 'q' \(parameters: n\)"):
        plots.lines(table, x="q")


@needs_matplotlib
def test_speedup_of_one_backend_over_another(dbs):
    from pytest_opperf.view import plots

    table = Results.open(dbs["a"]).table("gelu")
    fig = plots.speedup(table)  # defaults: A torch_unfused, B torch
    ax = fig.axes[0]
    assert ax.get_xlabel() == "speedup of torch_unfused over torch\n(torch time / torch_unfused time)"
    time = {(r["backend"], r["n"]): r["time_us"] for r in table.rows}
    bars = sorted(ax.patches, key=lambda p: -p.get_y())  # top to bottom: the shapes in order
    assert [1 + b.get_width() for b in bars] == pytest.approx(
        [time["torch", n] / time["torch_unfused", n] for n in (4096, 65536)])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fp32-n=4096", "fp32-n=65536"]  # top first
    assert any(line.get_xdata()[0] == 1.0 for line in ax.lines)  # the 1.0 line
    flipped = plots.speedup(table, a="torch", b="torch_unfused").axes[0]
    assert flipped.get_xlabel().startswith("speedup of torch over torch_unfused")
    with pytest.raises(ViewError, match="op 'gemm' has one backend"):
        plots.speedup(Results.open(dbs["a"]).table("gemm"))
    with pytest.raises(ViewError, match="--a=nope: op 'gelu' has no backend 'nope'"):
        plots.speedup(table, a="nope")


@needs_matplotlib
def test_devices_matches_rows_of_the_same_key(dbs):
    from pytest_opperf.view import plots

    a, b = Results.open(dbs["a"]).table("gemm"), Results.open(dbs["b"]).table("gemm")
    fig = plots.devices(a, b)
    ax = fig.axes[0]
    assert ax.get_xlabel() == ("speedup of cpu (second/cpu.db) over cpu (results/cpu.db)\n"
                               "(cpu (results/cpu.db) time / cpu (second/cpu.db) time)")
    assert "2 cases in both" in ax.get_title()
    time_b = {r["m"]: r["time_us"] for r in b.rows}
    bars = sorted(ax.patches, key=lambda p: -p.get_y())
    assert [1 + p.get_width() for p in bars] == pytest.approx(
        [r["time_us"] / time_b[r["m"]] for r in sorted(a.rows, key=lambda r: r["m"])])
    with pytest.raises(ViewError, match="op 'add': no case is in both"):
        plots.devices(Results.open(dbs["a"]).table("add"), OpTable("add", ["n"], [], [], dbs["b"]))


@needs_matplotlib
def test_cli_plot_writes_every_kind(dbs, tmp_path, capsys):
    out = tmp_path / "plots"
    before = _digest(dbs["a"])
    for kind in ("roofline", "lines", "speedup"):
        assert cli.main(["plot", str(dbs["a"]), "--kind", kind, "-o", str(out), "--format", "png,svg"]) == 0
    assert cli.main(["plot", str(dbs["a"]), str(dbs["b"]), "--kind", "devices", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    expected = [f"{op}-roofline-cpu.{f}" for op in ("add", "gelu", "gemm") for f in ("png", "svg")]
    expected += [f"{op}-lines-cpu.{f}" for op in ("add", "gelu", "gemm") for f in ("png", "svg")]
    expected += ["gelu-speedup-cpu.png", "gelu-speedup-cpu.svg", "gemm-devices-cpu-vs-cpu.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    assert all((out / name).stat().st_size > 5000 for name in expected)
    assert "skipped add-speedup-cpu: " in printed and "one backend (torch): a speedup needs two" in printed
    assert _digest(dbs["a"]) == before
    # asked by name, an op that cannot be drawn is an error
    assert cli.main(["plot", str(dbs["a"]), "--kind", "speedup", "--op", "gemm", "-o", str(out)]) == 2
    assert cli.main(["plot", str(dbs["a"]), "--kind", "devices", "-o", str(out)]) == 2
    assert "--kind=devices compares two databases; got 1" in capsys.readouterr().err
    assert cli.main(["plot", str(dbs["a"]), "--kind", "pie"]) == 2
    assert cli.main(["plot", str(dbs["a"]), "--format", "gif"]) == 2
    err = capsys.readouterr().err
    assert "--kind=pie: expected one of roofline, lines, speedup, devices" in err
    assert "--format=gif: expected a comma-separated list of png, svg" in err


def test_plot_without_matplotlib_names_the_extra(dbs, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert cli.main(["plot", str(dbs["a"]), "--kind", "lines"]) == 2
    assert "plots need matplotlib: pip install 'pytest-opperf[plot]'" in capsys.readouterr().err


# --- HTML ---------------------------------------------------------------------------------------


class _Tables(HTMLParser):
    """Every <table id=...>: its header and its rows' cells as (data-v, text); and what a page loads."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.cell = {}, None, None
        self.loads, self.svgs, self.scripts = [], 0, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self.current = self.tables.setdefault(attrs["id"], {"head": [], "rows": []})
        elif tag == "tr" and self.current is not None:
            self.current["rows"].append([])
        elif tag in ("td", "th") and self.current is not None:
            self.cell = [attrs.get("data-v"), ""]
        if tag == "svg":
            self.svgs += 1
        if tag == "script":
            self.scripts += 1
        for name in ("src", "href"):
            if attrs.get(name) and not attrs[name].startswith("#"):
                self.loads.append(attrs[name])

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            row = self.current["rows"][-1]
            row.append(tuple(self.cell))
            self.cell = None
        elif tag == "table":
            if self.current is not None and self.current["rows"]:
                self.current["head"] = [text for _, text in self.current["rows"].pop(0)]
            self.current = None


def _parse(path: Path) -> _Tables:
    parser = _Tables()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@needs_matplotlib
def test_html_report_holds_every_row_plots_and_the_gate(dbs, tmp_path, capsys):
    out = tmp_path / "report.html"
    before = _digest(dbs["a"]), _digest(dbs["b"])
    assert cli.main(["html", str(dbs["a"]), str(dbs["b"]), "--gate", str(dbs["gate"]), "-o", str(out)]) == 0
    assert f"opperf html: {out}" in capsys.readouterr().out
    assert (_digest(dbs["a"]), _digest(dbs["b"])) == before
    page = _parse(out)
    assert page.loads == [] and page.scripts == 1  # nothing fetched: no src=, no external href
    for op in ("add", "gelu", "gemm"):
        table = Results.open(dbs["a"]).table(op)
        shown = page.tables[f"rows-cpu-{op}"]
        assert shown["head"][:1 + len(table.params)] == ["case", *table.params]
        at = shown["head"].index("time_us")
        got = sorted((cells[0][0], float(cells[at][0])) for cells in shown["rows"])
        assert got == sorted((case_id(r, table.params), r["time_us"]) for r in table.rows)
    # roofline + lines per op, speedup for gelu, devices for gemm (the op in both); the second file's ops too
    assert page.svgs == 3 * 2 + 1 + 2 + 1
    gate = json.loads(dbs["gate"].read_text())
    verdicts = sorted((c["case"], c["verdict"]) for c in gate["cases"])
    gate_table = page.tables["gate-cases"]
    assert gate_table["head"][:2] == ["case", "verdict"]
    assert sorted((cells[0][1], cells[1][1]) for cells in gate_table["rows"]) == verdicts
    assert len(verdicts) == 2


def test_html_without_matplotlib_still_has_the_tables(dbs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = html.write(tmp_path / "r.html", [dbs["a"]], ops=["gelu"])
    page = _parse(out)
    assert page.svgs == 0 and "pytest-opperf[plot]" in out.read_text()
    assert len(page.tables["rows-cpu-gelu"]["rows"]) == 4 and "rows-cpu-gemm" not in page.tables


def test_bad_gate_report_is_named(dbs, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    assert cli.main(["html", str(dbs["a"]), "--gate", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    assert f"--gate={bad}: not a report of --opperf-report-json" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_opperf_html_option_writes_the_runs_database_at_session_end(dbs):
    assert f"opperf: HTML report of {dbs['b']} written to {dbs['html']}" in dbs["second_out"]
    page = _parse(dbs["html"])
    assert sorted(t for t in page.tables if t.startswith("rows-")) == ["rows-cpu-gemm"]
    assert len(page.tables["rows-cpu-gemm"]["rows"]) == len(rows_at(dbs["b"], "gemm"))
    assert len(page.tables["gate-cases"]["rows"]) == 2  # the gate's verdicts of the run


def test_opperf_html_with_sample_only_writes_nothing(project):
    result = project.runpytest("benches", *FAST, "-k", "gemm", "--opperf-sample-only", "--opperf-html=r.html")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["opperf: HTML report not written to *r.html: this run stored no database"])
    assert not (project.path / "r.html").exists()


# --- honest comparisons: noise is never drawn or printed as a speedup ------------------------------


def _gelu_row(backend: str, time_us: float, cv: float, ci_rel, drift: float = 0.0, **extra) -> dict:
    return {"n": 65536, "dtype_in": "fp32", "dtype_out": "fp32", "backend": backend, "backend_version": "2.13.0",
            "knobs": "", "timer": "cpu", "cache": "hot", "device": "cpu", "time_us": time_us, "cv": cv,
            "ci_rel": ci_rel, "median_drift": drift, "unstable": int(is_unstable(drift)), "samples": 40, "throttled": 0,
            "target_met": 0, **extra}


def _gelu(*rows) -> OpTable:
    return OpTable("gelu", ["n"], list(rows[0]), list(rows), Path("gelu.db"))


# The case: a loaded 2-core VM, torch 250 us (CV 0.94) against torch_unfused 5022 us (CV 1.89),
# each median moving within its case as the load came and went (their halves 35% and 80% apart).
NOISY_GELU = (_gelu_row("torch", 250.0, 0.94, 0.6, drift=0.35), _gelu_row("torch_unfused", 5022.5, 1.89, 0.9, drift=0.8))
QUIET_GELU = (_gelu_row("torch", 250.0, 0.02, 0.01), _gelu_row("torch_unfused", 5022.5, 0.02, 0.01))


def test_the_gelu_style_20x_from_noise_is_printed_as_not_significant():
    noisy = render_text(summary.OpSummary.of(_gelu(*NOISY_GELU)).sections())
    # An unstable row forbids a verdict: "cannot judge" and why, never "no significant difference".
    assert "cannot judge: unstable (median drift +35.0%)" in noisy and "~20.09x" in noisy
    assert "no significant difference" not in noisy and "1 that cannot be judged" in noisy
    assert not re.search(r"(?<!~)20\.09x", noisy) and "wins: torch 0, torch_unfused 0" in noisy
    assert significance.NOTE in noisy
    quiet = render_text(summary.OpSummary.of(_gelu(*QUIET_GELU)).sections())  # the same ratio, measured well
    assert re.search(r"(?<!~)20\.09x", quiet) and "wins: torch 1" in quiet and "no significant" not in quiet


@pytest.mark.parametrize("change, reason", [
    ({"contended": 1}, "contended"),  # a busy machine: no claim, however tight the CIs
    ({"median_drift": 0.08, "unstable": 1}, "unstable (median drift +8.0%)"),  # a median that moved: no claim either
    ({"unstable": 1, "median_drift": None}, "unstable"),  # a row written before the drift column: its flag alone
    ({"ci_rel": None}, "no confidence interval"),
    ({"time_us": 255.0, "ci_rel": 0.02}, "the confidence intervals overlap"),  # 2% apart, CIs of 1% and 2%
])
def test_a_difference_needs_stable_uncontended_rows_with_disjoint_intervals(change, reason):
    fast, slow = QUIET_GELU
    assert significance.why_not(fast, slow) is None
    assert significance.why_not(fast, {**slow, **change}) == reason
    assert significance.why_not({**slow, **change}, fast) == reason  # in either order


def test_a_wide_row_whose_median_holds_is_judged_by_its_interval():
    # cv 1.89 (seed 002's "unstable") but the halves' medians agree: the CI, which that spread widens,
    # decides; before, the cv alone refused any verdict.
    fast, slow = QUIET_GELU
    assert significance.why_not(fast, {**slow, "cv": 1.89}) is None
    assert significance.why_not(fast, {**slow, "cv": 1.89, "ci_rel": 0.96}) == significance.OVERLAP


@needs_matplotlib
def test_the_gelu_style_20x_from_noise_is_a_grey_bar():
    ax = plots.speedup(_gelu(*NOISY_GELU), a="torch", b="torch_unfused").axes[0]
    (bar,) = ax.patches
    assert bar.get_facecolor()[:3] == pytest.approx((0.65, 0.65, 0.65))
    assert [t.get_text() for t in ax.texts] == ["~20.09x"] and "not significant" in ax.get_title()
    ax = plots.speedup(_gelu(*QUIET_GELU), a="torch", b="torch_unfused").axes[0]
    assert ax.patches[0].get_facecolor()[:3] != pytest.approx((0.65, 0.65, 0.65))
    assert [t.get_text() for t in ax.texts] == ["20.09x"] and "not significant" not in ax.get_title()


def test_the_fastest_knobs_are_no_pick_when_the_rows_are_noise():
    rows = [_gelu_row("triton", 100.0, 0.9, 0.5, drift=0.2, knobs='{"block": 1024}'),
            _gelu_row("triton", 120.0, 0.9, 0.5, drift=0.2)]
    (sweep,) = best.best_per_shape(_gelu(*rows))
    assert sweep.within_noise and sweep.default_not_significant == "unstable (median drift +20.0%)"
    quiet = [{**r, "cv": 0.01, "median_drift": 0.0, "unstable": 0, "ci_rel": 0.01} for r in rows]
    (sweep,) = best.best_per_shape(_gelu(*quiet))
    assert not sweep.within_noise and sweep.default_not_significant is None


@needs_matplotlib
def test_lines_carry_the_confidence_interval_as_a_band():
    rows = [_gelu_row("torch", 100.0, 0.02, 0.05), {**_gelu_row("torch", 400.0, 0.02, 0.10), "n": 262144}]
    fig = plots.lines(_gelu(*rows), x="n")
    (band,) = fig.axes[0].collections
    ys = sorted({round(float(v[1]), 6) for path in band.get_paths() for v in path.vertices})
    assert ys[0] == pytest.approx(95.0) and ys[-1] == pytest.approx(440.0)  # 100 +- 5%, 400 +- 10%
    assert "confidence interval" in fig._suptitle.get_text()


def test_an_attainable_ratio_above_100_percent_is_clamped_and_explained():
    rows = [_gelu_row("torch", 250.0, 0.02, 0.01, mbu_attainable=9.31, mfu_attainable=0.5)]
    text = render_text(summary.OpSummary.of(_gelu(*rows)).sections())
    assert "100%*" in text and "931" not in text and "measured low" in text
