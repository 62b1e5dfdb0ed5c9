"""all_to_all: rank r sends chunk j of its buffer to rank j and receives chunk r of every rank's.

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = message_bytes (each rank's send buffer, n chunks); algbw = S / time, busbw = algbw * (n-1)/n (nccl-tests)
"""

import torch
import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (DEFAULTS, PARAMS, chunked_factor, divisible, memory,
                                                          no_flops, register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    n = p["num_devices"]
    return torch.cat([x.chunk(n)[rank].clone() for x in sent])  # values moved: exact in their own dtype


def nbytes(p, dt):
    return p["message_bytes"]


def output(x, n):
    return torch.empty_like(x)


OP = register_collective(
    Op("all_to_all", PARAMS, inputs, reference, no_flops, nbytes, peak="link", defaults=DEFAULTS,
       description="rank r gets chunk r of every rank's buffer",
       memory=memory(nbytes, nbytes)),
    output, chunked_factor)


@register_backend("all_to_all", "torch_dist", supports=divisible(by_devices=True))
def all_to_all_torch(x, out, comm):
    dist.all_to_all_single(out, x, group=comm.group)
    return out
