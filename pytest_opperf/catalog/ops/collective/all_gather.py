"""all_gather: every rank ends with all ranks' buffers, concatenated in rank order.

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = n * message_bytes (the gathered buffer); algbw = S / time, busbw = algbw * (n-1)/n (nccl-tests)
message_bytes is what each rank sends; nccl-tests' size is the gathered buffer, n times that.
"""

import torch
import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (DEFAULTS, PARAMS, chunked_factor, divisible, memory,
                                                          no_flops, register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend

# all_gather_single replaced all_gather_into_tensor (deprecated in torch 2.13); older torch has only the latter.
_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    # A gather moves values: the reference is exact in the buffers' own dtype.
    out = None
    for r, x in enumerate(sent):
        out = x.new_empty(len(sent) * x.numel()) if out is None else out
        out[r * x.numel():(r + 1) * x.numel()] = x
    return out


def nbytes(p, dt):
    return p["num_devices"] * p["message_bytes"]


def output(x, n):
    return x.new_empty(n * x.numel())


OP = register_collective(
    Op("all_gather", PARAMS, inputs, reference, no_flops, nbytes, peak="link", defaults=DEFAULTS,
       description="every rank gets all ranks' buffers, in rank order",
       memory=memory(nbytes, nbytes)),
    output, chunked_factor)


@register_backend("all_gather", "torch_dist", supports=divisible(by_devices=False))
def all_gather_torch(x, out, comm):
    _GATHER(out, x, group=comm.group)
    return out
