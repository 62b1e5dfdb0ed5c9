"""Arrows point down: the catalogue and the store import only what lies below them."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_opperf.catalog.registry import Op, register_op
from pytest_opperf.columns import KEY, MEASURE, RESERVED

PACKAGE = Path(__file__).parent.parent / "pytest_opperf"


def loaded_after(code: str) -> set:
    """The package's modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return {m for m in out.stdout.split() if m.startswith("pytest_opperf")}


def test_the_catalogue_registers_every_op_without_the_store():
    loaded = loaded_after("from pytest_opperf.catalog import load_builtin\nload_builtin()")
    assert "pytest_opperf.catalog.ops.matmul.gemm" in loaded  # the ops did register
    assert not {m for m in loaded if m.startswith(("pytest_opperf.store", "pytest_opperf.run"))}, loaded


def test_the_store_needs_nothing_of_the_run_layer():
    loaded = loaded_after("import pathlib, pytest_opperf.store.database\nfrom pytest_opperf.store import benchjson\n"
                          "benchjson.commit_info({'git_commit': 'abc'}, pathlib.Path('.'))")
    assert "pytest_opperf.vcs" in loaded and "pytest_opperf.columns" in loaded
    assert not {m for m in loaded if m.startswith(("pytest_opperf.run", "pytest_opperf.view"))}, loaded


@pytest.mark.parametrize("leaf", ["columns.py", "vcs.py", "commands.py", "amounts.py"])
def test_shared_leaves_import_nothing_of_the_package(leaf):
    tree = ast.parse((PACKAGE / leaf).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("pytest_opperf")]


@pytest.mark.parametrize("column", ["time_us", "backend", "throttled", "clock_warmup_s", "rowid"])
def test_an_op_parameter_may_not_take_a_column_of_the_table(column):
    with pytest.raises(ValueError, match=f"parameter '{column}' must be .* not one of the table's own columns"):
        register_op(Op("reserved_probe", (column,), lambda p, dt, d, g: (), lambda: None,
                       lambda p, dt: 0, lambda p, dt: 0))
    assert column in RESERVED and ("rowid" == column or column in {**KEY, **MEASURE})
