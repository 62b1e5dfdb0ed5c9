"""reduce_scatter: rank r ends with chunk r of the reduction (sum, max or min) of all ranks' buffers.

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = message_bytes (each rank's whole send buffer); algbw = S / time, busbw = algbw * (n-1)/n (nccl-tests)
"""

import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (REDUCING_DEFAULTS, REDUCING_PARAMS, ReduceOp, chunked_factor,
                                                          divisible, exact_bytes, memory, no_flops, reduce,
                                                          register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend

# reduce_scatter_single replaced reduce_scatter_tensor (deprecated in torch 2.13); older torch has only the latter.
_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    n = p["num_devices"]
    return reduce(sent, p["reduce_op"], part=lambda x: x.chunk(n)[rank])


def nbytes(p, dt):
    return p["message_bytes"]


def output(x, n):
    return x.new_empty(x.numel() // n)


OP = register_collective(
    Op("reduce_scatter", REDUCING_PARAMS, inputs, reference, no_flops, nbytes, peak="link",
       defaults=REDUCING_DEFAULTS, types={"reduce_op": ReduceOp},
       description="rank r gets chunk r of the reduction of all ranks' buffers",
       memory=memory(lambda p, dt: p["message_bytes"] // p["num_devices"],
                     exact_bytes(lambda p, dt: p["message_bytes"] // p["num_devices"] // dt.input.itemsize))),
    output, chunked_factor)


@register_backend("reduce_scatter", "torch_dist", supports=divisible(by_devices=True))
def reduce_scatter_torch(x, out, comm):
    _SCATTER(out, x, op=comm.reduce_op, group=comm.group)
    return out
