"""all_reduce: every rank ends with the reduction (sum, max or min) of all ranks' buffers.

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = message_bytes per rank; algbw = S / time, busbw = algbw * 2(n-1)/n (nccl-tests)
torch.distributed reduces in place: the receive buffer is refilled from the send buffer before
each call, untimed, so every call reduces the same data.
"""

import torch
import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (REDUCING_DEFAULTS, REDUCING_PARAMS, ReduceOp, all_reduce_factor,
                                                          divisible, exact_bytes, memory, no_flops, reduce,
                                                          register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    return reduce(sent, p["reduce_op"])


def nbytes(p, dt):
    return p["message_bytes"]


def output(x, n):
    return torch.empty_like(x)


def prepare(x, out, comm):
    out.copy_(x)


OP = register_collective(
    Op("all_reduce", REDUCING_PARAMS, inputs, reference, no_flops, nbytes, peak="link", defaults=REDUCING_DEFAULTS,
       types={"reduce_op": ReduceOp}, description="every rank gets the reduction of all ranks' buffers",
       memory=memory(nbytes, exact_bytes(lambda p, dt: p["message_bytes"] // dt.input.itemsize))),
    output, all_reduce_factor, prepare)


@register_backend("all_reduce", "torch_dist", supports=divisible(by_devices=False))
def all_reduce_torch(x, out, comm):
    dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
    return out
