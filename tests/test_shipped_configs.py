"""Every shipped case through the real `bench` fixture, with every timer and cache state.

For each op x dtype x backend of configs/*.yaml, the smallest shipped shape: the shipped backends
(with their pins) and dtypes go into a small config of those shapes, and the bench files of benches/ run
it in a pytester session per timer x cache. Every case must pass and write its row, except those
its backend refuses on this device (fp8 below sm_89, say), which must be skipped.

On a CPU only the `cpu` timer applies; cold timing flushes the cache there too (a read of twice
the larger of the spec's 2 MB and the host's last-level cache). The GPU variant runs all four timers.
"""

import math
import sqlite3
from pathlib import Path

import pytest
import torch
import yaml

from pytest_opperf import dtypes
from pytest_opperf.catalog.ops.collective import COLLECTIVES
from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes, library_version
from pytest_opperf.config import opconfig as config
from pytest_opperf.measure import inputs

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
QUICK = ("--opperf-budget=0.02", "--opperf-min-samples=3", "--opperf-warmup=0", "-p", "no:cacheprovider",
         "-p", "no:randomly")
CPU_WITH_CACHE = """
devices:
  cpu:
    name: Generic CPU with a 2 MB cache
    backend: cpu
    aliases: [cpu]
    l2_mbytes: 2
    source: "tests: a cache size for cold timing on a CPU"
"""
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def smallest_configs(device: str) -> dict[str, dict]:
    """op -> a config of its smallest shipped shapes: one shape per op x dtype x backend."""
    out = {}
    for path in SHIPPED:
        raw = yaml.safe_load(path.read_text())
        op = raw.get("op", path.stem)
        if op in COLLECTIVES:
            continue  # run on rank groups with their own timers: tests/test_collective_bench.py
        cfg = _load(path, op)
        smallest = {}
        for case in cfg.expand(OPS[op].params, device=device):
            key = (case.backend, case.dtype_in, case.dtype_out, case.knobs)
            size = math.prod(v for _, v in case.params if isinstance(v, (int, float)))
            if key not in smallest or size < smallest[key][0]:
                smallest[key] = (size, case)
        out[op] = {
            "backends": {b.name: {"version": b.version, "knobs": {k: list(v) for k, v in b.knobs}} for b in cfg.backends},
            "dtypes": [{"input": i, "output": o} for i, o in cfg.dtypes],
            "cases": [dict(shape) for shape in {case.params: None for _, case in smallest.values()}],
        }
        if raw.get("exclude"):  # the shipped exclusions hold for the small cases too (no torch_compile on a CPU)
            out[op]["exclude"] = raw["exclude"]
    return out


def _load(path: Path, op: str) -> config.OpConfig:
    spec = OPS[op]
    return config.load(path, spec.params, spec.defaults, op_name=op, op_types=spec.types)


def _write(text: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    return path


def _refusal(case, device_type: str, capability: tuple):
    backend = BACKENDS[(case.op, case.backend)]
    if backend.devices is not None and device_type not in backend.devices:
        return "device"
    if library_version(backend.library) is None:
        return "library"  # an optional library (liger-kernel, ...) not installed here: the case is skipped
    dt = DTypes(dtypes.lookup(case.dtype_in), dtypes.lookup(case.dtype_out))
    return backend.unsupported(device_type, dt, capability, case.param_dict)


def _rows(results: Path) -> list[dict]:
    found = []
    for db in results.glob("*.db"):
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        try:
            for (table,) in con.execute("select name from sqlite_master where type = 'table' and name != 'runs'"):
                found += [dict(r) for r in con.execute(f"select * from [{table}]")]
        finally:
            con.close()
    return found


# On a CPU the sweep runs in two sessions that the suite's workers can share: the memory ops'
# smallest shipped shapes (a 4096 x 4096 transpose, a 32000-row embedding table) take about half
# of its time.
PARTS = {"memory": lambda name: name == "test_memory.py", "others": lambda name: name != "test_memory.py",
         "all": lambda name: True}


def run_every_shipped_case(pytester, timer_name: str, cache: str, device_type: str, capability: tuple, *args,
                           part: str = "all"):
    """Every shipped case of the bench files of `part` (see PARTS) in one session; the rows it wrote."""
    (pytester.path / "benches").mkdir(exist_ok=True)
    bench_file = {}  # op -> the bench file that holds its test
    for source in (ROOT / "benches").glob("test_*.py"):
        if source.name == "test_collectives.py":
            continue  # see smallest_configs
        text = source.read_text()
        if PARTS[part](source.name):
            (pytester.path / "benches" / source.name).write_text(text)
        bench_file.update({op: source.name for op in OPS if f"def test_{op}(" in text})
    (pytester.path / "configs").mkdir(exist_ok=True)
    expected, refused = set(), set()
    configs = smallest_configs(device_type)
    assert set(configs) <= set(bench_file), set(configs) - set(bench_file)  # every shipped config has its bench test
    ops = {op for op in configs if PARTS[part](bench_file[op])}
    for op, small in configs.items():
        if op not in ops:
            continue
        written = _write(small, pytester.path / "configs" / f"{op}.yaml")
        for case in _load(written, op).expand(OPS[op].params, device=device_type):
            node = f"benches/{bench_file[op]}::test_{op}[{case.id}]"
            (refused if _refusal(case, device_type, capability) else expected).add(node)
    assert {node.split("::test_")[1].split("[")[0] for node in expected} == ops, expected  # every op runs a case here
    reprec = pytester.inline_run("benches", f"--opperf-timer={timer_name}", f"--opperf-cache={cache}", *QUICK, *args)
    passed, skipped, failed = reprec.listoutcomes()
    assert not failed, [f"{r.nodeid}: {r.longreprtext[-600:]}" for r in failed]
    assert {r.nodeid for r in passed} == expected
    assert {r.nodeid for r in skipped} == refused
    rows = _rows(pytester.path / "results")
    assert sorted(r["test_id"] for r in rows) == sorted(expected)  # one row per case that ran
    for row in rows:
        assert (row["timer"], row["cache"]) == (timer_name, cache) and row["time_us"] > 0, row["test_id"]
        assert row["samples"] >= 3
        assert row["cache_flush"] == ("read" if cache == "cold" else "none"), row["test_id"]
        # every row says what its check can catch: an exact comparison's floor is 0, not unknown
        assert row["check_floor"] is not None and row["check_floor"] >= 0, row["test_id"]
    return rows


@pytest.mark.parametrize("part", ["memory", "others"])
@pytest.mark.parametrize("cache", ["cold", "hot"])
def test_every_shipped_case_runs_on_cpu(pytester, monkeypatch, cache, part):
    # A cold sample reads twice the larger of the spec's cache and the host's last level (sysfs):
    # 520 MB, 0.1 s, a sample on a server CPU's 260 MB L3, two thirds of this test's time. The
    # session runs in this process: its flush reads twice the spec's 2 MB (64 MB at least) here;
    # the host's figure is tested in test_timing.py.
    monkeypatch.setattr(inputs, "host_llc_bytes", lambda *args: None)
    hardware = pytester.path / "cpu_with_cache.yaml"
    hardware.write_text(CPU_WITH_CACHE)
    rows = run_every_shipped_case(pytester, "cpu", cache, "cpu", (0, 0), "--device=cpu",
                                  f"--opperf-hardware={hardware}", part=part)
    if part == "others":  # torch._scaled_mm runs fp8 GEMMs on a CPU too (torch >= 2.13): the fp8 case is a row
        assert any(r["dtype_in"] == "fp8" for r in rows)


@cuda
@pytest.mark.parametrize("cache", ["cold", "hot"])
@pytest.mark.parametrize("timer_name", ["cpu", "event", "cuda_graph", "profiler"])
def test_every_shipped_case_runs_on_the_gpu(pytester, timer_name, cache):
    capability = torch.cuda.get_device_capability()
    rows = run_every_shipped_case(pytester, timer_name, cache, "cuda", capability)
    assert any(r["dtype_in"] == "fp8" for r in rows) == (capability >= (8, 9))
    assert all(r["kernels"] for r in rows)  # names recorded: the timed call's kernels were compared with them


def test_every_op_sweeps_two_gpu_backends_and_the_cpu_compiles_nothing():
    # An H100's default sweep compares at least two backends of every op; a CPU's
    # (README's main command on a laptop) stays quick, so torch_compile is left out there.
    for path in SHIPPED:
        op = yaml.safe_load(path.read_text()).get("op", path.stem)
        if OPS[op].peak == "link":
            continue  # collectives: one torch.distributed backend, tested in test_collective_bench.py
        if op == "aten":
            continue  # a recorded call replayed as itself: the op is its one backend (test_pipeline_generic.py)
        cfg = _load(path, op)
        on_gpu = {c.backend for c in cfg.expand(OPS[op].params, device="h100")}
        gpu_capable = {b for b in on_gpu if BACKENDS[(op, b)].devices is None or "cuda" in BACKENDS[(op, b)].devices}
        assert len(gpu_capable) >= 2, f"{path.name}: an H100 sweeps only {sorted(gpu_capable)}"
        on_cpu = {c.backend for c in cfg.expand(OPS[op].params, device="cpu")}
        assert "torch_compile" not in on_cpu, f"{path.name}: torch_compile in the CPU sweep"


def test_the_cpu_sweep_holds_no_half_precision_gemm_of_seconds_and_the_gpu_keeps_them():
    # fp16 and bf16 GEMMs run on a CPU's vector units: 1024^3 took 2 to 4 s a call, half a minute a case.
    cfg = _load(ROOT / "configs" / "gemm.yaml", "gemm")
    half = [c for c in cfg.expand(OPS["gemm"].params, device="cpu") if c.dtype_in in ("fp16", "bf16")]
    sizes = sorted({math.prod(v for _, v in c.params) for c in half})
    assert sizes and max(sizes) <= 512**3, sizes
    on_gpu = {math.prod(v for _, v in c.params) for c in cfg.expand(OPS["gemm"].params, device="h100")
              if c.dtype_in == "fp16"}
    assert max(on_gpu) == 8192**3
