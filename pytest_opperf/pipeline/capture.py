"""What the profiler does not record, saved beside the trace for the replay: ``capture``.

torch.profiler's record_shapes trace holds a call's dims, strides and scalars, not the contents
of its tensors. Two contents change a kernel's time: the offsets of ``torch._grouped_mm`` (how
many tokens each expert of a mixture of experts got: routing is rarely even) and the length of
``aten::index``'s index list. ``capture`` records them during the profiled run::

    from pytest_opperf.pipeline.capture import capture

    with torch.profiler.profile(activities=[...], record_shapes=True) as prof, capture("trace.json"):
        model(batch)
    prof.export_chrome_trace("trace.json")

and writes ``trace.capture.json`` beside the trace when the block ends. ``opperf import
trace.json`` reads it: the k-th ``aten::_grouped_mm`` of the trace (in time order) replays with the
k-th offsets captured (its signature keeps them, so calls routed differently are different
signatures), and the k-th ``aten::index`` with the k-th index count; "k-th" counts the calls the
hook saw, those outside its ``PythonDispatchMode`` events in the trace. Only ``aten::index`` is
counted: ``index_put_`` (``x[ids] = v``) takes its count from its values, which the trace holds.
Files of version 1 counted ``index_put_`` calls into the same list; import reads them against the
trace's ``aten::index`` and ``aten::index_put_`` calls in time order. The capture keeps
references to the offset tensors and reads them once the block ends, so the profiled kernels are
not synchronised or copied; its dispatch hook adds host time to every op (the kernels' own times are what import
reads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

VERSION = 2
READABLE = (1, 2)  # version 1: index_counts also counted index_put calls (see the module doc)


def sidecar(trace: Path) -> Path:
    """The capture file of a trace: trace.json(.gz) -> trace.capture.json."""
    name = trace.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".capture.json")


class capture:  # noqa: N801  (a context manager used as a function, like torch.no_grad)
    """Record grouped-GEMM offsets and index counts while a model runs; write them beside TRACE."""

    def __init__(self, trace: str | Path):
        self.path = sidecar(Path(trace))
        self.grouped: list = []   # offset tensors, read when the block ends
        self.indexed: list = []   # index counts of aten::index
        self._mode = None

    def __enter__(self) -> "capture":
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                owner._see(func, args, kwargs or {})
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        offsets = [t.tolist() if t is not None else None for t in self.grouped]
        self.path.write_text(json.dumps({"version": VERSION, "grouped_mm_offsets": offsets,
                                         "index_counts": self.indexed}) + "\n")

    def _see(self, func, args: tuple, kwargs: dict) -> None:
        name = getattr(func, "__name__", "")
        if name.startswith("_grouped_mm"):
            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            self.grouped.append(offs)
        elif name == "index.Tensor":
            indices = args[1] if len(args) > 1 else kwargs.get("indices") or []
            counts = [int(t.numel()) for t in indices if t is not None and t.dtype != _bool()]
            self.indexed.append(counts[0] if counts else None)


def _bool():
    import torch

    return torch.bool


def load(trace: Path) -> Optional[dict]:
    """The capture file beside TRACE, read; None when there is none. ValueError when it is not one."""
    path = sidecar(trace)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a capture file of pytest_opperf.pipeline.capture ({exc})") from None
    if not isinstance(data, dict) or data.get("version") not in READABLE:
        raise ValueError(f"{path}: not a capture file of pytest_opperf.pipeline.capture (version "
                         f"{' or '.join(map(str, READABLE))})")
    return data
