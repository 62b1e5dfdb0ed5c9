"""Shared set-up for plugin tests: a small project in pytester's directory, and row readers."""

import fcntl
import shutil
import sqlite3
import textwrap
from pathlib import Path
from typing import Callable

import pytest
import torch


def _keep_compiler_stacks_between_sessions() -> None:
    """In-process pytester sessions drop every module they imported when they end. torch's
    compiler stack (torch._dynamo, torch._inductor: the profiler imports it too) registers torch
    libraries once per process, and Triton is a C extension: imported again by the next session,
    both fail ("Only a single TORCH_LIBRARY...", "'triton._C.libtriton' is not a package"), as
    seen on the GPU image. Like pytester's own zope/readline exception, keep them loaded."""
    take = getattr(pytest.Pytester, "_Pytester__take_sys_modules_snapshot", None)
    if take is None:  # a pytest without this hook: nothing to widen
        return
    from _pytest.pytester import SysModulesSnapshot

    kept = ("zope", "readline", "torch", "triton", "liger_kernel", "sympy", "functorch")

    def snapshot(self):
        return SysModulesSnapshot(preserve=lambda name: name.split(".")[0] in kept or name.startswith(kept[:2]))

    pytest.Pytester._Pytester__take_sys_modules_snapshot = snapshot


_keep_compiler_stacks_between_sessions()

# Keep real sessions quick on two shared cores: tiny budgets; the numbers are not under test here.
# Contention off: on shared cores every row would be contended and the gate would judge none; the
# tests of contention (test_contention.py) turn it on.
FAST = ("--device=cpu", "--opperf-budget=0.02", "--opperf-min-samples=3", "--opperf-warmup=0",
        "--opperf-contention=off", "-p", "no:cacheprovider", "-p", "no:randomly")

BENCH = """
def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)


def test_add(backend, inputs, bench):
    bench(backend, *inputs)
"""

# A backend that computes the wrong thing (off by 1%), and one that returns the wrong shape.
CONFTEST = """
import torch
from pytest_opperf import register_backend


@register_backend("gemm", "wrong")
def gemm_wrong(a, b):
    return (a @ b) * 1.01


@register_backend("add", "transposed")
def add_transposed(a, b):
    return (a + b).flip(0)
"""

GEMM_SEED = """
backend: torch
backend_version: "{version}"
dtypes: {{'input': 'fp32', 'output': 'fp32'}}
params:
  M: {{min: 2, max: 4, step: 2}}
  N: [16]
  K: [8]
"""

ADD = """
backend: torch
dtypes: [fp32, bf16]
params:
  N: [1024, 4096]
"""


@pytest.fixture
def project(pytester: pytest.Pytester):
    """A bench project: benches/test_ops.py, configs/gemm.yaml (seed form), configs/add.yaml."""
    pytester.makepyfile(conftest=CONFTEST)
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_ops.py").write_text(BENCH)
    (pytester.path / "configs").mkdir()
    write_config(pytester, "gemm", GEMM_SEED.format(version=torch.__version__.split("+")[0]))
    write_config(pytester, "add", ADD)
    return pytester


def write_config(pytester, op: str, text: str):
    path = pytester.path / "configs" / f"{op}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def rows(pytester, table: str, device: str = "cpu") -> list[dict]:
    return rows_at(pytester.path / "results" / f"{device}.db", table)


def rows_at(path, table: str) -> list[dict]:
    """The rows of a table of a real SQLite file, in insertion order ([] if file or table is missing)."""
    if not path.exists():
        return []
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    try:
        if not con.execute("select 1 from sqlite_master where name = ?", (table,)).fetchone():
            return []
        return [dict(r) for r in con.execute(f"select * from [{table}] order by rowid")]
    finally:
        con.close()


def db_bytes(pytester, device: str = "cpu") -> bytes:
    path = pytester.path / "results" / f"{device}.db"
    return path.read_bytes() if path.exists() else b""


def made_once(tmp_path_factory, worker_id: str, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` that make(folder) fills once in the whole run, for a session fixture whose
    tests only read it: under xdist the workers share it (the first makes it, the others wait on a
    lock), where a fixture of each worker's session made it again on each."""
    base = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        base = base.parent  # this run's folder, above each worker's own
    folder = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder
