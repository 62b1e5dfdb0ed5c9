"""What a timer calls, and the inputs it calls it on for a cache state: cold or hot.

"hot": calls run back to back on the same inputs. "cold": every call finds its inputs out of
the last-level cache. Every timer gets there the same way, by rotating through copies of the
inputs at least twice the cache apart: by the time a copy is read again, the others have
evicted it. One way for all, so a timer and the profiler that checks it time the same cache
state (a flush between calls leaves another one: docs/benchmarks.md). Only inputs that cannot
be copied (a closure, pedantic's setup) are flushed between samples instead (a read of twice
the cache; not possible inside a CUDA graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

CACHES = ("cold", "hot")
MAX_INPUT_COPIES = 20_000
COPY_ALIGN_BYTES = 256  # cudaMalloc's alignment; cuBLASLt wants 16 for matrices and fp8 scales
FLUSH_MIN_BYTES = 64 << 20


def default_cache(device_type: str) -> str:
    # On a CPU an op mostly reads what the op before it just wrote; accelerators run cold.
    return "hot" if device_type == "cpu" else "cold"


@dataclass
class Workload:
    """What is timed: fn(*args, **kwargs), and the size of the inputs it reads.

    With `setup` (pytest-benchmark's pedantic convention), prepare() calls it before each
    timed call, untimed; when it returns (args, kwargs) they replace the arguments.
    """

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    setup: Optional[Callable] = None

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)

    def prepare(self) -> None:
        if self.setup is None:
            return
        fresh = self.setup()
        if fresh is not None:
            self.args, self.kwargs = tuple(fresh[0]), dict(fresh[1] or {})

    @property
    def input_bytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.args if _is_tensor(a))

    def copies(self, n: int) -> list[tuple]:
        """n argument tuples with the tensors copied (n = 1: the original arguments).

        The copies of a tensor are views into one block, made by one copy kernel: cold
        timing of a small input may want thousands of them, and a clone each would cost a
        launch each. A view has the original's shape and strides (a transposed operand stays
        transposed), and starts COPY_ALIGN_BYTES-aligned in the block, as a tensor of its own would.
        """
        columns = [_replicas(a, n - 1) if _is_tensor(a) else [a] * (n - 1) for a in self.args]
        return [self.args, *zip(*columns)] if n > 1 else [self.args]


def _replicas(t, n: int) -> list:
    """n copies of tensor t with its strides, in one allocation and one copy.

    Each copy's slot is rounded up to COPY_ALIGN_BYTES: packed back to back, the copies of a
    4-byte scale would start at 4-byte offsets, which cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED
    for fp8 scales) and vectorised kernels take slow paths on. The padding is under 256 bytes a
    copy and is not counted as input bytes (it is never read).
    """
    if n <= 0:
        return []
    if not _is_dense(t):
        return [_strided_copy(t) for _ in range(n)]  # overlapping or gapped: one copy each
    unit = max(COPY_ALIGN_BYTES // t.element_size(), 1)  # elements in one aligned unit
    slot = -(-t.numel() // unit) * unit
    block = t.new_empty_strided((n, *t.shape), (slot, *t.stride()))
    block.copy_(t.unsqueeze(0).expand(n, *t.shape))
    return list(block.unbind(0))


def _strided_copy(t):
    """A copy of t with t's very strides, gaps and overlaps kept (a clone of a gapped view, a
    column slice, comes out contiguous and runs other kernels): the span of storage t reads,
    copied, and viewed as t is."""
    if t.numel() == 0:
        return t.clone()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    span = t.as_strided((extent,), (1,), t.storage_offset())
    return span.clone().as_strided(t.shape, t.stride())


def _is_dense(t) -> bool:
    """t's elements fill t.numel() consecutive slots, its dimensions in some order (contiguous,
    transposed, permuted): sorted by stride, each stride is the product of the sizes below it."""
    expected = 1
    for stride, size in sorted((st, size) for size, st in zip(t.shape, t.stride()) if size > 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class Flusher:
    """Reads a buffer of twice the cache so the next call finds its inputs in memory, not in cache.

    A read, not a write: a written buffer leaves the cache full of dirty lines, and the timed
    call then pays for writing them back.
    """

    def __init__(self, device, cache_bytes: Optional[int]):
        import torch

        nbytes = max(2 * (cache_bytes or 0), FLUSH_MIN_BYTES)
        self.buffer = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
        self.total = torch.empty((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        import torch

        torch.sum(self.buffer, dim=0, dtype=torch.int64, out=self.total)


def rotation(work: Workload, device, cache: str, cache_bytes: Optional[int]) -> tuple[list[tuple], Optional[Flusher]]:
    """(the argument sets a timer cycles through, the flush it runs before each sample or None).

    Cold: every timer rotates through the same input copies, so all timers (and the profiler
    that checks them) see one cache state. Inputs that cannot be copied (a closure, or
    pedantic's setup making fresh ones) are flushed between samples instead.
    """
    if cache != "cold":
        return [work.args], None
    if work.input_bytes and work.setup is None:
        return work.copies(rotation_copies(work.input_bytes, cache_bytes)), None
    return [work.args], Flusher(device, cache_bytes)


def cold_extra_bytes(cache_bytes: Optional[int]) -> int:
    """The most device memory cold timing adds to a case: the rotated input copies move
    ceil(2 * cache / inputs) sets, under 2 * cache plus one set, and a set is rotated only
    while smaller than 2 * cache: under 4 * cache (plus each copy's alignment padding, under
    256 bytes a tensor, at most 5 MB a tensor at MAX_INPUT_COPIES). A flush buffer is smaller."""
    return max(4 * (cache_bytes or 0), FLUSH_MIN_BYTES)


def rotation_copies(input_bytes: int, cache_bytes: Optional[int]) -> int:
    """Input sets to cycle through so a set's bytes were evicted before it is read again.

    Between two reads of one set, the others move at least twice the cache. An input set
    that alone spans twice the cache evicts itself: one set is enough.

    >>> rotation_copies(8 << 20, 50 << 20), rotation_copies(200 << 20, 50 << 20)
    (14, 1)
    """
    span = 2 * (cache_bytes or 0)
    if input_bytes >= span:
        return 1
    return int(min(MAX_INPUT_COPIES, math.ceil(span / input_bytes) + 1))
