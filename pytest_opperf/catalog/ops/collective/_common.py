"""What the collectives share: their parameters, the per-rank call convention, the bandwidths.

A collective op is an `Op` like any other (parameters, dtypes, config, bench test), with a
different call convention, because its work runs in `num_devices` rank processes (see
run/collective.py), not in the test's process:

    inputs(params, dtypes, device, gen) -> (x,)     one rank's send buffer, random from its own seed
    reference(sent, rank, params) -> tensor         what `rank` must hold afterwards, computed from
                                                    every rank's send buffer (`sent[r]`, regenerated
                                                    on each access: measure/collective.py's
                                                    SendBuffers), exactly
    backend(x, out, comm) -> out                    the collective; `comm` (measure.collective.Comm)
                                                    holds the group, the rank and the case's params

and three more functions given to `register_collective`: `output(x, n)` (the receive buffer,
allocated once), `prepare(x, out, comm)` (untimed, before every call: in-place collectives start
from the send buffer each time) and `bus_factor(n)` (nccl-tests' busbw / algbw).

Bandwidths follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t, where S is the `bytes()` of
the op (the per-rank buffer nccl-tests calls `size`), and busbw = algbw x bus_factor(n), the
rate each link must carry, comparable with the link's peak whatever n is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pytest_opperf.catalog.registry import Op, choice, register_op
from pytest_opperf.dtypes import check_chunk

REDUCE_OPS = ("sum", "max", "min")
ReduceOp = choice(*REDUCE_OPS)
# num_devices first: the grid varies it slowest, so a sweep starts each process group once.
PARAMS = ("num_devices", "message_bytes")
REDUCING_PARAMS = (*PARAMS, "reduce_op")
DEFAULTS = {"num_devices": 2}
ALL_SIZES = "all"
# The functional check's own memory: two float64 chunks of measure/check.py's CHUNK elements.
CHECK_CHUNKS_BYTES = 2 * 8 * (1 << 24)  # num_devices: every group size the run has ranks for (run/collective.py: group_sizes)


class _GroupSize(type):
    def __instancecheck__(cls, value) -> bool:
        return value == ALL_SIZES or (isinstance(value, int) and not isinstance(value, bool))


# num_devices' type: a number of ranks, or "all".
GroupSize = _GroupSize(f"an integer or {ALL_SIZES!r}", (object,), {})
REDUCING_DEFAULTS = {**DEFAULTS, "reduce_op": "sum"}


@dataclass(frozen=True)
class Collective:
    """The parts of a collective op that the rank processes need beyond its `Op`."""

    op: str
    output: Callable  # (x, n) -> the receive buffer
    prepare: Optional[Callable]  # (x, out, comm) -> None, untimed before every call
    bus_factor: Callable[[int], float]


COLLECTIVES: dict[str, Collective] = {}


def register_collective(op: Op, output: Callable, bus_factor: Callable[[int], float],
                        prepare: Optional[Callable] = None) -> Op:
    """Register a collective: its Op (for configs and rows) and the parts its ranks need."""
    op = dataclasses.replace(op, types={"num_devices": GroupSize, **op.types})
    register_op(op)
    COLLECTIVES[op.name] = Collective(op.name, output, prepare, bus_factor)
    return op


def is_collective(op: str) -> bool:
    return op in COLLECTIVES


def elements(p: dict, dt) -> int:
    return p["message_bytes"] // dt.input.itemsize


def send_buffer(p: dict, dt, device, gen):
    """A rank's random send buffer of message_bytes: normal floats, or small integers (no overflow
    when n of them are summed)."""
    import torch

    n = elements(p, dt)
    if dt.input.is_float:
        return torch.randn(n, device=device, generator=gen, dtype=torch.float32).to(dt.input.torch)
    return torch.randint(-1000, 1000, (n,), device=device, generator=gen, dtype=dt.input.torch)


def exact_dtype(dtype):
    """The dtype a reduction of buffers of `dtype` is exact enough in: float32 for 1- and 2-byte
    floats (a sum of up to hundreds of bf16 values rounds 2^16 times finer than bf16 itself), else
    float64. Half the bytes of a float64 reference: on 8 ranks of 1 GiB that is what fits."""
    import torch

    return torch.float32 if dtype.is_floating_point and dtype.itemsize <= 2 else torch.float64


def reduce(sent: Sequence, reduce_op: str, part: Optional[Callable] = None):
    """The reduction of every rank's buffer (or of `part(buffer)` of each), accumulated one rank at a
    time in exact_dtype: one buffer and the accumulator at a time, not n float64 copies."""
    import torch

    acc = None
    for x in sent:
        x = x if part is None else part(x)
        if acc is None:
            acc = x.to(exact_dtype(x.dtype), copy=True)
        elif reduce_op == "sum":
            acc.add_(x)
        else:
            (torch.maximum if reduce_op == "max" else torch.minimum)(acc, x, out=acc)
        del x
    return acc


def no_flops(p: dict, dt) -> float:
    return 0.0


def memory(out_bytes: Callable[[dict, Any], float], reference_bytes: Callable[[dict, Any], float]
           ) -> Callable[[dict, Any], float]:
    """An op's memory estimate for one rank (each rank holds these on its own device): its send
    buffer and receive buffer, the check's reference, one regenerated send buffer of another rank
    with the float32 draw it is rounded from, and the check's two float64 chunks of the output."""

    def estimate(p: dict, dt) -> float:
        size = p["message_bytes"]
        draw = size + 4 * size // dt.input.itemsize if dt.input.is_float else size
        chunks = 2 * 8 * min(check_chunk(), out_bytes(p, dt) // dt.output.itemsize)
        return size + out_bytes(p, dt) + reference_bytes(p, dt) + draw + chunks

    return estimate


def exact_bytes(elements_of: Callable[[dict, Any], float]) -> Callable[[dict, Any], float]:
    """A reduction's reference: `elements_of(p, dt)` elements in exact_dtype."""

    def nbytes(p: dict, dt) -> float:
        return elements_of(p, dt) * (4 if dt.input.is_float and dt.input.itemsize <= 2 else 8)

    return nbytes


def divisible(by_devices: bool) -> Callable:
    """A backend `supports` that refuses a message size the dtype (and, for ops that split the buffer
    into one chunk per rank, the rank count) does not divide."""

    def supports(device_type, dt, capability, p):
        size, n, item = p["message_bytes"], p["num_devices"], dt.input.itemsize
        if size <= 0 or size % item:
            return f"message_bytes={size} is not a positive multiple of {dt.input.name}'s {item} bytes"
        if by_devices and (size // item) % n:
            return f"message_bytes={size} does not split into {n} equal chunks of {dt.input.name}"
        return None

    return supports


def algbw_gbps(size_bytes: float, time_us: float) -> Optional[float]:
    """nccl-tests' algorithm bandwidth in GB/s (1e9 bytes/s): the buffer size S over the time.

    >>> algbw_gbps(1e9, 10_000.0)      # 1 GB in 10 ms
    100.0
    """
    return size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else None


def all_reduce_factor(n: int) -> float:
    """2(n-1)/n: a ring all-reduce sends and receives each byte 2(n-1)/n times per rank."""
    return 2 * (n - 1) / n


def chunked_factor(n: int) -> float:
    """(n-1)/n: all-gather, reduce-scatter and all-to-all move all but the rank's own chunk."""
    return (n - 1) / n


def one(n: int) -> float:
    """1: broadcast and send/recv carry each byte once over each link."""
    return 1.0
