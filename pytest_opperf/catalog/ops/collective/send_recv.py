"""send_recv: each rank sends its buffer to the next rank and receives the previous rank's (a ring).

FLOPs: 0 (a collective: read its algbw_gbps and busbw_gbps)
Bytes: S = message_bytes; algbw = S / time, busbw = algbw * 1 (nccl-tests' sendrecv)
Needs two ranks at least: a rank does not send to itself.
"""

import torch
import torch.distributed as dist

from pytest_opperf.catalog.ops.collective._common import (DEFAULTS, PARAMS, divisible, memory, no_flops, one,
                                                          register_collective, send_buffer)
from pytest_opperf.catalog.registry import Op, register_backend


def inputs(p, dt, device, gen):
    return (send_buffer(p, dt, device, gen),)


def reference(sent, rank, p):
    return sent[(rank - 1) % p["num_devices"]]


def nbytes(p, dt):
    return p["message_bytes"]


def output(x, n):
    return torch.empty_like(x)


OP = register_collective(
    Op("send_recv", PARAMS, inputs, reference, no_flops, nbytes, peak="link", defaults=DEFAULTS,
       description="each rank sends its buffer to the next rank in a ring",
       memory=memory(nbytes, nbytes)),
    output, one)


def _supports(device_type, dt, capability, p):
    if p["num_devices"] < 2:
        return f"send_recv needs num_devices >= 2, got {p['num_devices']}"
    return divisible(by_devices=False)(device_type, dt, capability, p)


@register_backend("send_recv", "torch_dist", supports=_supports)
def send_recv_torch(x, out, comm):
    peers = [comm.rank + 1, comm.rank - 1]
    ops = [dist.P2POp(dist.isend, x, peers[0] % comm.size, comm.group),
           dist.P2POp(dist.irecv, out, peers[1] % comm.size, comm.group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return out
