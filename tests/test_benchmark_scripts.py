"""The scripts under benchmarks/ are how docs/benchmarks.md's figures are reproduced: each must still
find what it imports of the package (a refactor that moves a name breaks them without any test
running them, since most need a GPU)."""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
PARTS = ("acceptance", "probes")  # what a GPU session runs for acceptance; probes kept for docs' figures
SCRIPTS = sorted(p for part in PARTS for p in (BENCHMARKS / part).glob("*.py"))


def _missing(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pytest_opperf"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pytest_opperf"):
                    importlib.import_module(alias.name)
    return missing


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_finds_what_it_imports(script):
    assert not _missing(script)


def test_the_check_sees_a_name_that_moved(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("from pytest_opperf.measure.sampler import measure, no_such_name\n")
    assert _missing(stale) == ["pytest_opperf.measure.sampler.no_such_name"]


# --- docs/benchmarks.md's figures come from scripts listed in benchmarks/README.md --------------------

ROOT = Path(__file__).parent.parent
# a script named by its path (README, any docs page), or bare in backticks on the results page
CITED_PATH = re.compile(r"\bbenchmarks/((?:[\w-]+/)?[\w.-]+\.(?:py|sh))\b")
CITED_BARE = re.compile(r"`([\w.-]+\.(?:py|sh))\b")
LISTED = re.compile(r"^\| `([\w.-]+\.(?:py|sh))` \|", re.MULTILINE)


def cited_scripts(pages: dict[str, str]) -> dict[str, str]:
    """script (as cited: `part/name` by path, `name` bare) -> the first page that cites it."""
    out: dict[str, str] = {}
    for page, text in pages.items():
        names = CITED_PATH.findall(text) + (CITED_BARE.findall(text) if page.endswith("benchmarks.md") else [])
        for name in names:
            out.setdefault(name, page)
    return out


def listed_scripts(readme: str) -> dict[str, str]:
    """The scripts of benchmarks/README.md's tables (their first column) -> the part whose section
    lists them (`## acceptance/ ...`, `## probes/ ...`)."""
    out, part = {}, ""
    for line in readme.splitlines():
        if line.startswith("## "):
            part = line[3:].split("/")[0].strip("` ")
        found = LISTED.match(line)
        if found:
            out[found.group(1)] = part
    return out


def test_every_script_the_docs_cite_is_listed_in_benchmarks_readme_in_its_part_and_exists():
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    listed = listed_scripts((BENCHMARKS / "README.md").read_text())
    unlisted = {name: page for name, page in cited_scripts(pages).items() if name.split("/")[-1] not in listed}
    assert not unlisted, f"cited in the docs but not in benchmarks/README.md's tables: {unlisted}"
    elsewhere = {name: page for name, page in cited_scripts(pages).items()
                 if "/" in name and name != f"{listed[name.split('/')[-1]]}/{name.split('/')[-1]}"}
    assert not elsewhere, f"cited under another folder than its own: {elsewhere}"
    absent = sorted(f"{part}/{name}" for name, part in listed.items() if not (BENCHMARKS / part / name).is_file())
    assert not absent, f"benchmarks/README.md lists scripts that are not where it says: {absent}"


def test_benchmarks_holds_its_two_parts_and_every_script_is_listed():
    loose = sorted(p.name for p in BENCHMARKS.iterdir() if p.name not in (*PARTS, "README.md"))
    assert not loose, f"a script belongs in benchmarks/acceptance/ or benchmarks/probes/: {loose}"
    listed = listed_scripts((BENCHMARKS / "README.md").read_text())
    on_disk = {p.name: part for part in PARTS for p in (BENCHMARKS / part).iterdir() if p.suffix in (".py", ".sh")}
    assert on_disk == listed


# a path under benchmarks/ as a command or a sentence names it (not pytest-benchmark's .benchmarks/)
NAMED_PATH = re.compile(r"(?<![\w.])benchmarks/(?:[\w-]+/)*[\w.-]+\.(?:py|sh)\b")


def named_paths(text: str) -> set[str]:
    """Every script path under benchmarks/ that TEXT names, relative to the checkout."""
    return set(NAMED_PATH.findall(text))


def test_every_script_path_the_docs_and_benchmarks_readme_name_exists():
    pages = [ROOT / "README.md", BENCHMARKS / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    absent = sorted(f"{page.relative_to(ROOT)}: {path}" for page in pages for path in named_paths(page.read_text())
                    if not (ROOT / path).is_file())
    assert not absent, f"the docs name scripts that are not there (a removed one: name its commit instead): {absent}"


def test_the_path_check_sees_every_path_and_only_paths():
    text = ("`python3 benchmarks/probes/gone.py --x`, benchmarks/acceptance/load.py, ../benchmarks/a/b/c.sh;\n"
            "not `probes/old.py` (History), .benchmarks/run.py, pytest_benchmarks/x.py, benchmarks/README.md")
    assert named_paths(text) == {"benchmarks/probes/gone.py", "benchmarks/acceptance/load.py", "benchmarks/a/b/c.sh"}


def test_the_citation_check_sees_a_script_missing_from_the_list():
    pages = {"docs/benchmarks.md": "`python3 benchmarks/probes/new_probe.py` (it calls `helper.py`); path/x.py",
             "docs/timing.md": "see `other.py`, and benchmarks/acceptance/load.py"}
    assert cited_scripts(pages) == {"probes/new_probe.py": "docs/benchmarks.md", "helper.py": "docs/benchmarks.md",
                                    "acceptance/load.py": "docs/timing.md"}
    readme = "## acceptance/: run\n| script | what |\n| `load.py` | a load |\nnot `helper.py` |\n## probes/\n| `x.py` | |"
    assert listed_scripts(readme) == {"load.py": "acceptance", "x.py": "probes"}


# --- the package's comments give the reason, not a pointer into the results page -----------------------


def results_page_pointers(source: str, headings: list[str]) -> list[str]:
    """Lines of `source` that cite docs/benchmarks.md or quote one of its section headings."""
    quoted = [f'"{h}"' for h in headings] + [f"'{h}'" for h in headings]
    return [line.strip() for line in source.splitlines()
            if "benchmarks.md" in line or any(q in line for q in quoted)]


def test_no_package_comment_points_at_a_results_page_heading():
    headings = [line[3:].strip() for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
                if line.startswith("## ")]
    found = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / "pytest_opperf").rglob("*.py"))
             if (lines := results_page_pointers(path.read_text(), headings))}
    assert not found, f"say the reason in a few words instead of pointing at the results page: {found}"


def test_the_pointer_check_sees_a_quoted_heading_and_the_page():
    source = ('x = 1  # compiled again (see "Once-a-process costs")\n'
              "# costs seconds (docs/benchmarks.md)\n"
              "# once-a-process costs are paid before the first case\n")
    assert results_page_pointers(source, ["Once-a-process costs", "Collection"]) == [
        'x = 1  # compiled again (see "Once-a-process costs")', "# costs seconds (docs/benchmarks.md)"]


def _load_script(name: str):
    (path,) = [BENCHMARKS / part / f"{name}.py" for part in PARTS if (BENCHMARKS / part / f"{name}.py").is_file()]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_floors_counts_each_op_and_names_rows_above_one_percent(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "cpu.db"
    con = sqlite3.connect(db)
    con.execute("create table quant_fp8 (test_id text, run_id text, created_at text, check_floor real)")
    con.execute("create table sampling (test_id text, run_id text, created_at text, check_floor real)")
    con.executemany("insert into quant_fp8 values (?, ?, ?, ?)",
                    [("b.py::test_quant_fp8[a]", "old", "1", 0.5), ("b.py::test_quant_fp8[a]", "new", "2", 0.0711),
                     ("b.py::test_quant_fp8[b]", "new", "2", 0.004)])
    con.executemany("insert into sampling values (?, 'new', '2', ?)",
                    [("b.py::test_sampling[aten::x]", 0.0), ("b.py::test_sampling[old]", None)])
    con.commit()
    con.close()
    floors = _load_script("check_floors")
    assert floors.main([str(db)]) == 0
    out = capsys.readouterr().out
    assert f"{db}, run new" in out  # the latest run, not the older one's 50%
    assert "4 rows; 1 with a floor above 1%:" in out and "7.11%  test_quant_fp8[a]" in out
    assert "1 exact (every output compared exactly: floor 0):\n  test_sampling[aten::x]" in out
    assert "1 without a floor (NULL: written before exact comparisons recorded 0):\n  test_sampling[old]" in out
    assert floors.main([str(tmp_path / "missing.db")]) == 2
    assert "missing.db: no such database" in capsys.readouterr().err


def test_the_sweeps_bound_on_n_gpus_is_worked_by_hand():
    """A serial run of 4 s start-up and 1 s end: kernel cases of 2 + 6 s, a 2-rank group's case of 1 s
    and a 4-rank group's case of 3 s. On 4 GPUs the 4-rank case holds every GPU (3 s, serial); the rest
    is 2 + 6 + 1 x 2 GPU-seconds = 10, spread over 4: 2.5 s. Bound: 4 + 1 + 3 + 2.5 = 10.5 s."""
    speed = _load_script("speed")
    cases = [(0.0, 2.0, False, None, "gw0", 300.0), (2.0, 8.0, False, None, "gw0", 5.0),
             (8.0, 9.0, True, "0,1", "gw1", 40.0), (9.0, 12.0, True, "0,1,2,3", "gw1", 0.0)]
    rows = {f"t{i}": {"started": 100 + a, "ended": 100 + b, "collective": c, "gpus": g, "worker": w,
                      "first_call_ms": f, "target_met": 1}
            for i, (a, b, c, g, w, f) in enumerate(cases)}
    run = {"rows": rows, "began": 96.0, "wall_s": 17.0}
    assert speed.bound(run, 4) == {"startup_s": 4.0, "end_s": 1.0, "all_gpu_groups_s": 3.0, "spread_s": 2.5,
                                   "bound_s": 10.5}
    assert speed.bound(run, 1)["bound_s"] == 4 + 1 + 2 + 6 + 1 * 2 + 3 * 4  # one GPU: every GPU-second in turn
    assert speed.first_calls(run) == {"gw0": {"s": 0.305, "largest_ms": 300.0}, "gw1": {"s": 0.04, "largest_ms": 40.0}}
