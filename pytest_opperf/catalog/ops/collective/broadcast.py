"""broadcast: every rank ends with rank 0's buffer.

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = message_bytes; algbw = S / time, busbw = algbw * 1 (nccl-tests)
torch.distributed broadcasts in place: every rank's receive buffer is refilled from its own send
buffer before each call, untimed, so a rank that received nothing fails the check.
"""

import torch
import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (DEFAULTS, PARAMS, divisible, memory, no_flops, one,
                                                          register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend

ROOT = 0


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    return sent[ROOT].clone()  # not the root's own send buffer itself


def nbytes(p, dt):
    return p["message_bytes"]


def output(x, n):
    return torch.empty_like(x)


def prepare(x, out, comm):
    out.copy_(x)


OP = register_collective(
    Op("broadcast", PARAMS, inputs, reference, no_flops, nbytes, peak="link", defaults=DEFAULTS,
       description="every rank gets rank 0's buffer", memory=memory(nbytes, nbytes)),
    output, one, prepare)


@register_backend("broadcast", "torch_dist", supports=divisible(by_devices=False))
def broadcast_torch(x, out, comm):
    dist.broadcast(out, src=ROOT, group=comm.group)
    return out
