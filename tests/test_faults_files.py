"""Faults in the files a user hands us, each triggered for real: a file that is not UTF-8, nested
200k levels deep, larger than the limit, or a YAML alias bomb is one line naming the file (a
usage error, exit 4, or a collection error of a sweep; exit 2 of an `opperf` command), never a
traceback, and the results database is left as it was. Every `opperf` output path that cannot be
written is one line naming it and exit 2."""

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ADD, BENCH, FAST, made_once, write_config
from pytest_opperf import cli
from pytest_opperf.config import opconfig as config_mod

NOT_UTF8 = b'{"format": "pytest-opperf-baseline/1", "device": "caf\xe9"}\n'
NESTED = b"[" * 200_000 + b"]" * 200_000
# Billion laughs: nine levels of nine aliases, 9**9 strings once expanded.
LEVELS = "abcdefghi"
BOMB = "[&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], " + ", ".join(
    f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip(LEVELS, LEVELS[1:])) + "]"


def _fake_db(root: Path) -> bytes:
    """results/cpu.db holding a table: a session that wrote anything would change its bytes."""
    (root / "results").mkdir(exist_ok=True)
    con = sqlite3.connect(root / "results" / "cpu.db")
    con.execute("create table earlier (x)")
    con.execute("insert into earlier values (1)")
    con.commit()
    con.close()
    return (root / "results" / "cpu.db").read_bytes()


def _sweep(pytester, *args):
    """A real session (in this process: a usage or collection error needs no other); the results
    database's bytes before and after."""
    before = _fake_db(pytester.path)
    result = pytester.runpytest_inprocess("benches/", *FAST, *args)
    assert (pytester.path / "results" / "cpu.db").read_bytes() == before
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    return result, text


def _one_line(text: str, *parts: str) -> str:
    """The one line of ours that holds every part (and is short: no value printed in full).

    pytest's short test summary repeats a collection error's message after `ERROR <file> - `,
    cut to the terminal's width: on a wide terminal (COLUMNS=300 in some CI) it holds every part
    too, so that section is pytest's, not ours, and is left out."""
    ours = text.split("short test summary info")[0]
    lines = [line for line in ours.splitlines() if all(p in line for p in parts)]
    assert len(lines) == 1, (parts, text)
    assert len(lines[0]) < 600, lines[0]
    return lines[0]


def _refused_deep(line: str) -> None:
    """Our line for a file nested too deep: our own depth check's, or (where the YAML library's
    scanner refuses first, as libyaml's does from PyYAML 6.0.4) our 'invalid YAML' line, whatever
    words the library uses."""
    assert "nested more than" in line or "invalid YAML at line" in line, line


# --- sweeps: usage errors (exit 4) --------------------------------------------------------------


@pytest.mark.parametrize("content", [NOT_UTF8, NESTED], ids=["not-utf8", "nested"])
def test_a_broken_baseline_is_a_usage_error_naming_it(project, content):
    (project.path / "base.json").write_bytes(content)
    result, text = _sweep(project, "--opperf-baseline=base.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = _one_line(text, "base.json")
    assert ("not UTF-8" in line) if content is NOT_UTF8 else ("nested" in line)


@pytest.mark.parametrize("content", [b'{"opperf_tuned": 1, "tables": {"\xff": 1}}', NESTED], ids=["not-utf8", "nested"])
def test_a_broken_tuned_table_is_a_usage_error_naming_it(project, content):
    (project.path / "t.json").write_bytes(content)
    result, text = _sweep(project, "--opperf-tuned=t.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _one_line(text, "--opperf-tuned", "t.json")


@pytest.mark.parametrize("content", [b"devices:\n  caf\xe9: {}\n", NESTED], ids=["not-utf8", "nested"])
def test_a_broken_hardware_spec_is_a_usage_error_naming_it(project, content):
    (project.path / "hw.yaml").write_bytes(content)
    result, text = _sweep(project, "--opperf-hardware=hw.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # before: the YAML composer crashed the process
    _one_line(text, "hw.yaml", "cannot read hardware specs")


def test_a_config_for_an_op_no_selected_test_benchmarks_is_a_usage_error(project):
    (project.path / "mine.yaml").write_text("op: add\n" + ADD)
    result, text = _sweep(project, "-k", "gemm", "--opperf-config=mine.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _one_line(text, "--opperf-config=", "mine.yaml", "for op 'add'", "benchmark gemm")


def test_a_bad_file_size_limit_is_a_usage_error(project):
    result, text = _sweep(project, "--opperf-max-file-mb=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _one_line(text, "--opperf-max-file-mb=lots")


# --- sweeps: config files (collection errors: the message alone) --------------------------------


def _config_error(pytester, *args) -> str:
    result, text = _sweep(pytester, *args)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest's exit for a collection error
    assert "1 error" in text
    return text


def test_a_config_over_the_size_limit_names_the_limit(project):
    path = write_config(project, "add", ADD + "#" * 2000 + "\n")  # about 2 KiB; the limit 1 KiB
    text = _config_error(project, "--opperf-max-file-mb=0.001")
    _one_line(text, str(path), "MiB, more than the limit", "--opperf-max-file-mb")


def test_a_config_over_the_limit_loads_once_the_limit_is_raised(project):
    write_config(project, "add", ADD + "#" * 2000 + "\n")
    result = project.runpytest_inprocess("benches/", "-k", "add", *FAST, "--opperf-max-file-mb=0.01",
                                          "--opperf-sample-only")
    assert result.ret == 0, result.stdout.str()


@pytest.mark.parametrize("content", [b"backend: torch\ndtypes: fp32\nparams: {N: [4]}\n# caf\xe9\n",
                                     b"backend: torch\ndtypes: fp32\nparams: " + NESTED + b"\n"],
                         ids=["not-utf8", "nested"])
def test_a_broken_config_is_one_line_naming_it(project, content):
    path = project.path / "configs" / "add.yaml"
    path.write_bytes(content)
    text = _config_error(project)
    if b"\xe9" in content:
        _one_line(text, str(path), "not UTF-8")
    else:
        _refused_deep(_one_line(text, str(path)))


@pytest.mark.parametrize("key", ["max_regression", "op"])
def test_an_alias_bomb_is_refused_fast_with_a_short_message(project, key):
    path = write_config(project, "add", f"{ADD}\n{key}: {BOMB}\n")
    start = time.perf_counter()
    with pytest.raises(config_mod.ConfigError) as info:
        config_mod.load(path, ("n",), {}, op_name="add")
    assert time.perf_counter() - start < 2.0  # before: repr of the expanded value, 1 GB and a minute
    assert "aliases" in str(info.value) and len(str(info.value)) < 300
    text = _config_error(project)
    _one_line(text, str(path), "aliases")


def test_a_huge_value_is_quoted_short_in_a_message(tmp_path):
    path = tmp_path / "add.yaml"
    path.write_text(f"{ADD}\nexclude: 'n > 0 and {'x' * 100_000}'\n")
    with pytest.raises(config_mod.ConfigError) as info:
        config_mod.load(path, ("n",), {}, op_name="add")
    assert len(str(info.value)) < 400, str(info.value)[:400]


def test_a_description_that_is_not_a_string_is_a_config_error(project):
    path = write_config(project, "add", ADD + "description: [a, b]\n")
    text = _config_error(project)
    _one_line(text, str(path), "description: expected a string, got list")


def test_a_broken_config_on_the_command_line_is_reported_once(project):
    # Three bench files look for their op's config among the --opperf-config files (before: once each).
    for name in ("test_second.py", "test_third.py"):
        (project.path / "benches" / name).write_text(BENCH.split("\n\n\ndef test_add")[0])
    (project.path / "mine.yaml").write_text("backend: torch\ndtypes: [fp32\n")
    result = project.runpytest_inprocess("benches/", *FAST, "--opperf-config=mine.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    text = result.stdout.str() + result.stderr.str()
    assert len([line for line in text.splitlines() if "mine.yaml: invalid YAML" in line]) == 1, text


def test_only_the_selected_tests_configs_stop_a_run(project):
    gemm = write_config(project, "gemm", "backend: torch\ndtypes: [fp32\n")
    result = project.runpytest_inprocess("benches/", *FAST, "-k", "add")
    result.assert_outcomes(passed=4, warnings=1)  # before: gemm's collection error stopped the add run
    text = result.stdout.str()
    assert len([line for line in text.splitlines() if f"{gemm}: invalid YAML" in line]) == 1, text
    assert "no selected test uses this config" in text
    result = project.runpytest_inprocess("benches/", *FAST, "-k", "gemm")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error, as a broken config always was
    _one_line(result.stdout.str(), f"{gemm}: invalid YAML at line")
    assert "Traceback" not in result.stdout.str()


# --- opperf commands: input files (exit 2) ------------------------------------------------------


def _opperf(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_opperf.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _exit_2_one_line(done: subprocess.CompletedProcess, *parts: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return _one_line(done.stderr, *parts)


@pytest.mark.parametrize("name,content", [("trace.json", NOT_UTF8), ("trace.json", NESTED),
                                          ("kernel_details.csv", b"Type,Duration(us)\nMatMul\xff,1\n")],
                         ids=["trace-not-utf8", "trace-nested", "csv-not-utf8"])
def test_a_broken_profile_is_one_line_and_exit_2(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    _exit_2_one_line(_opperf("import", name, "-o", "p.db", cwd=tmp_path), name)
    assert not (tmp_path / "p.db").exists()


@pytest.mark.parametrize("content", [NOT_UTF8, NESTED], ids=["not-utf8", "nested"])
def test_a_broken_baseline_is_one_line_for_compare(tmp_path, content):
    (tmp_path / "a.json").write_bytes(content)
    _exit_2_one_line(_opperf("compare", "a.json", "a.json", cwd=tmp_path), "a.json")


def test_a_hardware_spec_nested_deep_is_one_line_for_devices(tmp_path):
    (tmp_path / "hw.yaml").write_bytes(NESTED)
    _refused_deep(_exit_2_one_line(_opperf("devices", "--hardware", "hw.yaml", cwd=tmp_path), "hw.yaml"))


def test_the_file_size_limit_of_opperf_commands(tmp_path):
    (tmp_path / "a.json").write_text('{"format": "x"}' + " " * 3000)
    over = _opperf("compare", "a.json", "a.json", "--max-file-mb", "0.001", cwd=tmp_path)
    _exit_2_one_line(over, "a.json", "more than the limit")
    env_over = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "compare", "a.json", "a.json"], cwd=tmp_path,
                              capture_output=True, text=True, env={**__import__("os").environ, "OPPERF_MAX_FILE_MB": "0.001"})
    _exit_2_one_line(env_over, "a.json", "more than the limit")
    within = _opperf("compare", "a.json", "a.json", "--max-file-mb", "1", cwd=tmp_path)
    _exit_2_one_line(within, "a.json", "format")  # read, then refused for what it holds


# --- opperf commands: output paths (exit 2) -----------------------------------------------------


def _swept(root: Path) -> None:
    """A real results database of one small CPU sweep, and a regular file beside it."""
    (root / "benches").mkdir()
    (root / "benches" / "test_ops.py").write_text(BENCH.split("\n\n\ndef test_add")[0].replace("gemm", "add"))
    (root / "configs").mkdir()
    (root / "configs" / "add.yaml").write_text("backend: torch\ndtypes: fp32\nparams:\n  N: [64, 128]\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "benches/", *FAST, "-q"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (root / "somefile").write_text("a file, not a folder\n")


@pytest.fixture(scope="session")  # made once in the run: worksteal interleaves modules, and the tests only read it
def db(tmp_path_factory, worker_id):
    return made_once(tmp_path_factory, worker_id, "outputs", _swept) / "results" / "cpu.db"


# Every command that writes, with its output under a regular file (no user, root neither, can
# create it) and, where the run gets as far as writing, a path /proc will not take.
COMMANDS = {
    "html": ["html", "{db}", "-o", "{out}"],
    "plot": ["plot", "{db}", "-o", "{out}"],
    "export": ["export", "{db}", "--op", "add", "-o", "{out}"],
    "datasette-metadata": ["datasette-metadata", "{db}", "-o", "{out}"],
    "timeline": ["timeline", "{db}", "-o", "{out}.html"],
    "best": ["best", "{db}", "--export", "{out}"],
    "baseline": ["baseline", "{db}", "-o", "{out}"],
    "merge": ["merge", "{out}", "{db}"],
    "import": ["import", "trace.json", "-o", "{out}"],
    "shapes": ["shapes", "--target-models", "qwen3-32b", "-o", "{out}"],
    "replay-report": ["replay-report", "p.db", "-o", "{out}"],
    "calibrate": ["calibrate", "--device", "cpu", "--db", "{out}"],
    "catalog": ["catalog", "--readme", "{out}"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_output_under_a_file_is_one_line_and_exit_2(db, name):
    before = db.read_bytes()
    out = db.parent.parent / "somefile" / "out"
    args = [a.format(db=db, out=out) for a in COMMANDS[name]]
    line = _exit_2_one_line(_opperf(*args, cwd=db.parent.parent), str(out))
    assert "somefile is not a directory" in line
    assert db.read_bytes() == before


@pytest.mark.parametrize("name", ["html", "export", "datasette-metadata", "baseline", "timeline"])
def test_an_output_that_fails_while_written_is_one_line_and_exit_2(db, name):
    before = db.read_bytes()
    out = "/proc/opperf-no-such-dir/out"  # the check passes (root may write /proc), the write fails
    args = [a.format(db=db, out=out) for a in COMMANDS[name]]
    done = _opperf(*args, cwd=db.parent.parent)
    _exit_2_one_line(done, "/proc/opperf-no-such-dir")
    assert db.read_bytes() == before


def test_cli_main_says_an_unwritable_output_in_one_line(db, capsys):
    assert cli.main(["export", str(db), "--op", "add", "-o", str(db.parent.parent / "somefile" / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "somefile/x.csv: cannot write" in err
