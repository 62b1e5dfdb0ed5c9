"""The scripts under benchmarks/ are how docs/benchmarks.md's figures are reproduced: each must still
find what it imports of the package (a refactor that moves a name breaks them without any test
running them, since most need a GPU)."""

import ast
import importlib
import importlib.util
import json
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


def test_trace_kernels_reads_launches_in_order_with_their_configuration(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("trace_kernels", SCRIPTS[0].parent / "trace_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    launch = {"cat": "kernel", "name": "nvjet_sm90_gemm", "args": {"grid": [1, 132, 1], "block": [384, 1, 1],
                                                                   "registers per thread": 168, "stream": 7}}
    events = [{**launch, "ts": 30, "dur": 169.0}, {**launch, "ts": 10, "dur": 154.0},
              {"cat": "kernel", "name": "flush_reduce", "ts": 20, "dur": 40.0}, {"cat": "cpu_op", "name": "x", "ts": 5}]
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert module.main([str(path), "--name", "nvjet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "case.json: 2 launches, median 161.5 us, min 154.0, max 169.0"
    assert out[1] == "  launch configurations (grid, block, registers, stream): ('[1, 132, 1]', '[384, 1, 1]', 168, 7) x2"
    assert out[2] == "  in order: 154 169"
    assert module.main([str(path), "--name", "missing"]) == 0
    assert "no kernel named like 'missing'" in capsys.readouterr().out
