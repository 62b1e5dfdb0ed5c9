"""The scripts under benchmarks/ are how docs/benchmarks.md's figures are reproduced: each must still
find what it imports of the package (a refactor that moves a name breaks them without any test
running them, since most need a GPU)."""

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))


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
