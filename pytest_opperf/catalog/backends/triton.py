"""What our Triton kernels share: compiling on first use, and the checks of their launch knobs.

Each kernel lives beside its op, in `ops/<family>/<op>/triton.py`, registered as backend `triton`
of that op. Their launch parameters are tuning knobs a config can sweep
(`backends: {triton: {knobs: {BLOCK_SIZE: [1024, 4096], num_warps: [4, 8]}}}`); a knob value
the kernel cannot run with fails the case with a message saying why.

A kernel module writes its kernels as plain functions under `from __future__ import
annotations` (so `BLOCK_SIZE: tl.constexpr` stays a string Triton reads) and wraps them with
`kernel`, which applies `triton.jit` at the first launch:

    @kernel
    def _scale(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
        ...
    _scale[(blocks,)](x, y, n, BLOCK_SIZE=1024)

So the modules import without triton (its backends are then skipped, naming the package,
and no session pays the second its import costs), and TRITON_INTERPRET=1 set before the
first launch runs the kernel in Triton's interpreter, on CPU tensors (the tests do that).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from pytest_opperf.catalog import tuned

# The largest block a row kernel takes: past it a row's registers spill (liger-kernel and
# Triton's tutorials use the same bound).
MAX_BLOCK = 65536
WARPS = (1, 2, 4, 8, 16, 32)


class _Lazy:
    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: dict[bool, object] = {}

    def __getitem__(self, grid):
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        jitted = self.compiled.get(interpret)
        if jitted is None:
            import triton
            import triton.language

            # The kernel's module names `tl` without importing it; bind it now, before Triton
            # reads the kernel's globals.
            self.fn.__globals__["tl"] = triton.language
            jitted = self.compiled[interpret] = triton.jit(self.fn)
        return jitted[grid]


def kernel(fn: Callable) -> _Lazy:
    """fn as a Triton kernel, compiled at its first launch (`kernel_fn[grid](...)`)."""
    return _Lazy(fn)


def next_power_of_two(n: int) -> int:
    """
    >>> next_power_of_two(4096), next_power_of_two(14336), next_power_of_two(1)
    (4096, 16384, 1)
    """
    return 1 << max(0, int(n) - 1).bit_length()


def power_of_two(op: str, knob: str, value, largest: int = MAX_BLOCK) -> int:
    """A knob that must be a power of two (a block's extent) up to `largest`, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1) or value > largest:
        raise ValueError(f"triton {op}: knob {knob}={value!r}: expected a power of two from 1 to {largest}")
    return value


def row_block(op: str, n: int, block_size: Optional[int]) -> int:
    """BLOCK_SIZE of a kernel that holds a whole row of n elements in one block.

    Default: the next power of two of n. A block smaller than the row cannot work: ValueError.
    """
    need = next_power_of_two(n)
    if need > MAX_BLOCK:
        raise ValueError(f"triton {op}: a row of {n} elements does not fit one block of at most {MAX_BLOCK}")
    if block_size is None:
        return need
    block = power_of_two(op, "BLOCK_SIZE", block_size)
    if block < n:
        raise ValueError(f"triton {op}: knob BLOCK_SIZE={block} is smaller than a row (n={n}); this kernel holds a "
                         f"whole row in one block: give BLOCK_SIZE >= {need}, or exclude the case in the config "
                         f"(\"backend == 'triton' and block_size < n\")")
    return block


def warps(op: str, block: int, num_warps: Optional[int]) -> int:
    """num_warps: the knob if given (1 to 32, a power of two), else more warps for longer rows."""
    if num_warps is None:
        return 4 if block < 2048 else 8 if block < 8192 else 16 if block < 32768 else 32
    if num_warps not in WARPS or isinstance(num_warps, bool):
        raise ValueError(f"triton {op}: knob num_warps={num_warps!r}: expected one of {list(WARPS)}")
    return num_warps


def rows(op: str, *tensors) -> None:
    """The kernels step along a row by 1: each tensor's last dimension must be contiguous."""
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(f"triton {op}: expected tensors whose last dimension is contiguous, got strides "
                             f"{tuple(t.stride())}")


def tuned_knobs(op: str, params: dict, dtype_in, dtype_out=None, **given) -> dict:
    """The knobs given; when the call gave none, those a tuned table holds for this shape
    (`catalog.tuned`: --opperf-tuned or OPPERF_TUNED), each None where it holds none.

    In the order given, so a kernel unpacks them: `block_size, num_warps = tuned_knobs(...).values()`.
    """
    if any(v is not None for v in given.values()):
        return given
    found = tuned.knobs(op, "triton", params, dtype_in, dtype_out)
    return {name: found.get(name) for name in given}
