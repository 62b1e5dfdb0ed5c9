"""What a timer calls, and the cache state it calls it in: cold, hot or resident.

"hot": calls run back to back on the same inputs. "cold": before every timed call, a read of a
buffer of at least twice the last-level cache (untimed), so that none of the call's inputs is in
the cache and the cache holds no dirty lines of the harness or of the previous call. "resident":
the cold flush, then a read of the inputs the workload names (`Workload.resident`), so that
exactly those are in the cache, as a model's kernel finds the activation the kernel before it
wrote while its weight comes from device memory (pipeline/mapping/cachestate.py decides which). One
convention for every timer and every op, whatever the size of its inputs (docs/timing.md):
rotating through input copies cannot move an input larger than the cache (an embedding table)
and leaves the previous call's dirty output to be written back inside the timed call; a flush
by writing leaves its own dirty lines behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

CACHES = ("cold", "hot", "resident")
FLUSH_MIN_BYTES = 64 << 20
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
# The row's cache_flush column: how the cache was cleared before the timed calls.
FLUSH_READ = "read"  # before every timed call
FLUSH_READ_PER_SAMPLE = "read-per-sample"  # before the first call of each sample (iterations > 1)
FLUSH_NONE = "none"  # hot
RESIDENT = "+resident"  # appended to the flush: then a read of the resident inputs (cache "resident")


def default_cache(device_type: str) -> str:
    # On a CPU an op mostly reads what the op before it just wrote; accelerators run cold.
    return "hot" if device_type == "cpu" else "cold"


@dataclass
class Workload:
    """What is timed: fn(*args, **kwargs).

    With `setup` (pytest-benchmark's pedantic convention), prepare() calls it before each
    timed call, untimed; when it returns (args, kwargs) they replace the arguments.
    `resident`: positions among the tensors of `args` (in order, tensors inside lists not
    counted) that the cache state "resident" reads into the cache after its flush.
    """

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    setup: Optional[Callable] = None
    resident: tuple = ()

    def resident_tensors(self) -> list:
        """The tensors of `args` that `resident` names, from the live arguments (setup may replace them).

        >>> import torch; a, b = torch.ones(2), torch.zeros(3)
        >>> [t.numel() for t in Workload(print, ("call", a, 7, b), resident=(1,)).resident_tensors()]
        [3]
        """
        import torch

        tensors = [a for a in self.args if isinstance(a, torch.Tensor)]
        return [tensors[i] for i in self.resident if i < len(tensors)]

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)

    def prepare(self) -> None:
        if self.setup is None:
            return
        fresh = self.setup()
        if fresh is not None:
            self.args, self.kwargs = tuple(fresh[0]), dict(fresh[1] or {})


class Flusher:
    """Reads a buffer of at least twice the cache, so the next call finds its inputs in memory and
    the cache free of dirty lines.

    A read, not a write: a written buffer leaves the cache full of dirty lines, and the timed
    call then pays for writing them back. Reading evicts every line, and a dirty one is written
    back here, untimed. The sum lands in a one-element tensor: no output to speak of. int64:
    exact, and vectorised on a CPU (an int32 buffer summed into int64 ran 15x slower there).
    """

    def __init__(self, device, cache_bytes: Optional[int]):
        import torch

        self.nbytes = flush_bytes(device.type, cache_bytes)
        self.buffer = torch.ones(self.nbytes // 8, dtype=torch.int64, device=device)
        self.total = torch.empty((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        import torch

        torch.sum(self.buffer, dim=0, out=self.total)


class ResidentFlush:
    """The cold flush, then a read of each resident input's whole storage: those inputs, and only
    they, are in the cache when the timed call starts (as far as they fit in it)."""

    def __init__(self, flush: Callable[[], None], work: Workload, device):
        import torch

        self.flush = flush
        self.work = work
        self.total = torch.empty((), dtype=torch.int64, device=device)
        # storage address and size -> the flat view read: made once (none inside a graph capture), and
        # only for the current inputs (pedantic's setup may give fresh ones: the old ones are let go)
        self.words: dict = {}

    def __call__(self) -> None:
        self.flush()
        tensors = self.work.resident_tensors()
        keys = {_storage_key(t) for t in tensors}
        if keys != set(self.words):
            self.words = {k: v for k, v in self.words.items() if k in keys}
        for tensor in tensors:
            self.touch(tensor)

    def touch(self, tensor) -> None:
        """Read every byte of the tensor's storage (a view's whole storage: what the model's
        kernel could read), summed into one element, as the Flusher reads its buffer."""
        import torch

        storage = tensor.untyped_storage()
        key = _storage_key(tensor)
        words = self.words.get(key)
        if words is None:
            words = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            for wide in (torch.int64, torch.int32, torch.int16):
                if words.numel() % wide.itemsize == 0 and storage.data_ptr() % wide.itemsize == 0:
                    words = words.view(wide)  # wider words: fewer, vectorised loads
                    break
            self.words[key] = words
        torch.sum(words, dim=0, dtype=torch.int64, out=self.total)


def _storage_key(tensor) -> tuple:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def flusher(device, cache: str, cache_bytes: Optional[int], work: Optional[Workload] = None) -> Optional[Callable]:
    """The flush a timer runs before each timed call: a Flusher when cold, that flush and a read of
    the work's resident inputs when resident, None when hot."""
    if cache == "cold":
        return Flusher(device, cache_bytes)
    if cache == "resident":
        return ResidentFlush(Flusher(device, cache_bytes), work or Workload(lambda: None), device)
    return None


def cache_flush(cache: str, calls_per_sample: int) -> str:
    """The row's cache_flush value for a measurement in this cache state.

    >>> cache_flush("cold", 1), cache_flush("cold", 10), cache_flush("hot", 1), cache_flush("resident", 1)
    ('read', 'read-per-sample', 'none', 'read+resident')
    """
    if cache not in ("cold", "resident"):
        return FLUSH_NONE
    flush = FLUSH_READ if calls_per_sample == 1 else FLUSH_READ_PER_SAMPLE
    return flush + RESIDENT if cache == "resident" else flush


def flush_bytes(device_type: str, cache_bytes: Optional[int]) -> int:
    """Bytes a flush reads: twice the last-level cache, at least FLUSH_MIN_BYTES. On a CPU the
    cache is the larger of the given figure and the one the kernel reports (host_llc_bytes).

    >>> flush_bytes("cuda", 50 << 20) == 100 << 20, flush_bytes("cuda", None) == FLUSH_MIN_BYTES
    (True, True)
    """
    cache = cache_bytes or 0
    if device_type == "cpu":
        cache = max(cache, host_llc_bytes() or 0)
    return max(2 * cache, FLUSH_MIN_BYTES)


def host_llc_bytes(root: Path = CPU_CACHES) -> Optional[int]:
    """The host's last-level data cache in bytes, from sysfs (the highest level's size), or None.

    On Linux, /sys/devices/system/cpu/cpu0/cache/index*/ holds one folder a cache, with its
    `level`, `type` (Data, Instruction, Unified) and `size` ("32768K").
    """
    best: tuple[int, int] = (0, 0)
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            size = _size_bytes((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and (level, size) > best:
            best = (level, size)
    return best[1] or None


def _size_bytes(text: str) -> int:
    """sysfs's cache size spelling in bytes: '32768K' -> 33554432; '1M'; a bare number is bytes.

    >>> _size_bytes("32768K"), _size_bytes("1M"), _size_bytes("512")
    (33554432, 1048576, 512)
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def cold_extra_bytes(cache_bytes: Optional[int]) -> int:
    """The most device memory cold timing adds to a case: the flush buffer (twice the cache,
    at least FLUSH_MIN_BYTES)."""
    return max(2 * (cache_bytes or 0), FLUSH_MIN_BYTES)
