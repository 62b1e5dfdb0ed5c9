"""Which recorded calls would launch a device kernel: the device events a meta trace lacks.

A profile taken on a GPU ties each kernel to the call that launched it. A run on meta tensors
launches none, so the trace gets one device event (PLACEHOLDER_US long) per call that would: an op
with a device kernel of its own (a CPU or CUDA kernel registered for it), outside every other
launching op, since what runs under it on meta is its decomposition (``aten::gelu``'s muls and adds
in float32); else the innermost op that computes (``aten::copy_`` under ``aten::_to_copy``). Views,
factories of empty memory and composites that only delegate compute nothing. On two H100 traces of
transformers models (tests/data/traces), every top-level call that launched a kernel is found so
(tests/test_predict_trace.py).
"""

from __future__ import annotations

import gc
import gzip
import json
from contextlib import contextmanager
from pathlib import Path

PLACEHOLDER_US = 1.0  # a traced call's time in the trace: never read as a measurement
# Calls that launch no kernel on a GPU although the profiler records them as ops of their own.
NO_KERNEL = {"aten::_fused_sdp_choice", "aten::empty", "aten::empty_strided", "aten::empty_like",
             "aten::empty_permuted", "aten::new_empty", "aten::new_empty_strided", "aten::resize_", "aten::detach_", "aten::_unsafe_view", "aten::result_type", "aten::set_", "aten::lift_fresh",
             "aten::_local_scalar_dense", "aten::is_nonzero", "aten::sym_size", "aten::sym_stride",
             "aten::sym_numel", "aten::size", "aten::stride", "aten::numel", "aten::dim"}


def with_launches(raw: Path, path: Path) -> int:
    """RAW's events, with a device event after each call that would launch a kernel, written to PATH
    (gzip). Returns how many were added."""
    with collector_paused():  # ~10^5 new dicts: each collection would rescan the ones parsed before
        return _with_launches(raw, path)


def _with_launches(raw: Path, path: Path) -> int:
    data = json.loads(raw.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"),
                 key=lambda e: (e.get("pid"), e.get("tid"), e["ts"], -e["dur"]))
    launching = launchers(ops)
    for i in launching:
        e = ops[i]
        ext = e.get("args", {}).get("External id")
        events.append({"ph": "X", "cat": "kernel", "name": f"meta {e['name']}", "pid": "device", "tid": "stream",
                       "ts": e["ts"], "dur": PLACEHOLDER_US, "args": {"External id": ext}})
    if isinstance(data, dict):
        data["opperf"] = {"traced_on": "meta", "placeholder_us": PLACEHOLDER_US}
    # one encoded write, lightly compressed: json.dump's many small writes into gzip cost seconds a trace
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(json.dumps(data).encode("utf-8"))
    return len(launching)


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block: a trace's parse makes ~10^5 containers,
    and each collection the allocations trigger would walk every one made before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def launchers(ops: list) -> list:
    """The indexes of OPS (cpu_op events sorted by thread, start, longest first) that would launch a
    device kernel: an op with a kernel of its own, outside every other launching op (what runs under
    it on meta is its decomposition: aten::gelu's muls and adds), else the innermost computing op
    (aten::copy_ under aten::_to_copy)."""
    computes = _Computes()
    parents = _parents(ops)
    inner_compute = [False] * len(ops)  # has a descendant that computes
    for i in reversed(range(len(ops))):  # children before their parents
        if computes(ops[i]["name"]) or inner_compute[i]:
            p = parents[i]
            while p is not None and not inner_compute[p]:
                inner_compute[p] = True
                p = parents[p]
    covered = [False] * len(ops)  # inside a launching op (parents come before their children)
    launches = [False] * len(ops)
    for i in range(len(ops)):
        p = parents[i]
        covered[i] = p is not None and (covered[p] or launches[p])
        name = ops[i]["name"]
        launches[i] = not covered[i] and computes(name) and (computes.has_kernel(name) or not inner_compute[i])
    return [i for i, launched in enumerate(launches) if launched]


def _parents(ops: list) -> list:
    """Each op's enclosing op on its thread (ops sorted by thread, start, longest first)."""
    parents: list = [None] * len(ops)
    stack: list = []
    for i, e in enumerate(ops):
        while stack and ((ops[stack[-1]]["pid"], ops[stack[-1]]["tid"]) != (e["pid"], e["tid"])
                         or ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] < e["ts"] + e["dur"] - 1e-3):
            stack.pop()
        parents[i] = stack[-1] if stack else None
        stack.append(i)
    return parents


class _Computes:
    """Whether an op name is one that computes on a device: an aten op that is neither a view (every
    overload returns an alias of an input), nor a composite that only delegates (every overload
    CompositeImplicitAutograd), nor in NO_KERNEL."""

    def __init__(self):
        self.known: dict = {}
        self.kernels: dict = {}

    def __call__(self, name: str) -> bool:
        if name not in self.known:
            self.known[name] = self._decide(name)
        return self.known[name]

    def has_kernel(self, name: str) -> bool:
        """A device kernel of its own (a CPU or CUDA kernel registered for some overload), not a
        composite that calls other ops."""
        if name not in self.kernels:
            import torch

            try:
                schemas = torch._C._jit_get_schemas_for_operator(name)
            except RuntimeError:
                schemas = []
            found = False
            for s in schemas:
                full = f"{name}.{s.overload_name}" if s.overload_name else name
                for key in ("CPU", "CUDA"):
                    try:
                        found = found or torch._C._dispatch_has_kernel_for_dispatch_key(full, key)
                    except RuntimeError:
                        pass
            self.kernels[name] = found
        return self.kernels[name]

    @staticmethod
    def _decide(name: str) -> bool:
        import torch

        if "::" not in name or name in NO_KERNEL or name.startswith("prims::"):
            return False  # prims: the meta device's decompositions of an aten op, which computes itself
        try:
            schemas = torch._C._jit_get_schemas_for_operator(name)
        except RuntimeError:
            schemas = []
        if not schemas:
            return not name.startswith("aten::")  # a custom op (a library's kernel) computes
        tensors = [r for s in schemas for r in s.returns if "Tensor" in str(r.type)]
        if tensors and all(r.alias_info is not None and not r.alias_info.is_write for r in tensors):
            return False
        composite = []
        for s in schemas:
            full = f"{name}.{s.overload_name}" if s.overload_name else name
            try:
                composite.append(torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"))
            except RuntimeError:
                composite.append(False)
        return not all(composite)
