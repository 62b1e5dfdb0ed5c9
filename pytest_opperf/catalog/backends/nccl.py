"""The `nccl` backend of every collective: the NCCL library itself, called through ctypes.

`torch_dist` times what PyTorch pays for a collective (torch.distributed's work queue, its
watchdog's events, its checks: about 20 us a call on an H100 host, more than a small message
takes on NVLink). This backend calls the same library torch loaded (libnccl, or RCCL on ROCm)
directly, on torch's current stream, as vLLM's and SGLang's pynccl wrappers do, so a row at any
size can be set beside nccl-tests, and its calls can be captured in a CUDA graph (the `graph`
convention) like any kernel. No new dependency: the library is the one in torch's process.

Each process group gets one communicator of its own, made on the group's first call (every rank
of the group makes that call together, in the functional check): rank 0 of the group asks NCCL
for a unique id and the ranks agree on it over the group's host (gloo) group. Calls are
out-of-place (all_reduce reads `x` and writes `out`, as nccl-tests' out-of-place columns do);
all_to_all is NCCL's ncclAlltoAll where the library has it (2.28 and later), else a group of a
send and a receive per peer, as nccl-tests does.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
from typing import Callable

from pytest_opperf import dtypes
from pytest_opperf.catalog.backends import ncclcalls
from pytest_opperf.catalog.ops.collective import divisible
from pytest_opperf.catalog.registry import register_backend

LIBRARY_VARIABLE = "OPPERF_NCCL_LIBRARY"  # a path to the library, to call another than torch's


def _distribution() -> str:
    """The distribution whose version the rows record: the NCCL wheel torch depends on, else torch."""
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return "torch"


DISTRIBUTION = _distribution()

# ncclRedOp_t (nccl.h); its ncclDataType_t is the dtype table's `nccl` (pytest_opperf/dtypes.py)
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
SUCCESS = 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]  # NCCL_UNIQUE_ID_BYTES


class NcclError(RuntimeError):
    pass


class Nccl:
    """The library's functions this backend calls, with their C signatures."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        self.path = path
        vp, sz, i, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
        signatures = {
            "ncclGetVersion": [ctypes.POINTER(ctypes.c_int)],
            "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(ctypes.c_void_p), i, UniqueId, i],
            "ncclAllReduce": [vp, vp, sz, i, i, comm, vp],
            "ncclAllGather": [vp, vp, sz, i, comm, vp],
            "ncclReduceScatter": [vp, vp, sz, i, i, comm, vp],
            "ncclBroadcast": [vp, vp, sz, i, i, comm, vp],
            "ncclSend": [vp, sz, i, i, comm, vp],
            "ncclRecv": [vp, sz, i, i, comm, vp],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
        }
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, name, fn)
        self.ncclGetErrorString = lib.ncclGetErrorString
        self.ncclGetErrorString.argtypes, self.ncclGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        self.ncclAlltoAll = getattr(lib, "ncclAlltoAll", None)  # NCCL 2.28 and later
        if self.ncclAlltoAll is not None:
            self.ncclAlltoAll.argtypes, self.ncclAlltoAll.restype = [vp, vp, sz, i, comm, vp], ctypes.c_int
        version = ctypes.c_int()
        self.check(self.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
        self.version = version.value

    def check(self, result: int, what: str) -> None:
        if result != SUCCESS:
            text = self.ncclGetErrorString(result).decode(errors="replace")
            raise NcclError(f"{what} returned {result} ({text}) in {self.path}")


def library_path() -> str:
    """The NCCL (or RCCL) this process already loaded with torch, else the one its name finds.

    OPPERF_NCCL_LIBRARY names another. torch's CUDA build links libnccl.so.2 (from the wheel
    nvidia-nccl-*), so once torch is imported the library is in this process's memory map."""
    chosen = os.environ.get(LIBRARY_VARIABLE)
    if chosen:
        return chosen
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                name = os.path.basename(path)
                if name.startswith(("libnccl.so", "librccl.so")):
                    return path
    except OSError:
        pass
    import torch

    return "librccl.so.1" if getattr(torch.version, "hip", None) else "libnccl.so.2"


@functools.cache
def nccl() -> Nccl:
    path = library_path()
    try:
        return Nccl(path)
    except (OSError, AttributeError) as exc:
        raise NcclError(f"cannot load NCCL from {path} ({exc}); {LIBRARY_VARIABLE}=PATH names the library to "
                        f"call") from None


class Communicator:
    """One NCCL communicator for the ranks of a torch.distributed group."""

    def __init__(self, comm):
        import torch.distributed as dist

        lib = nccl()
        unique = UniqueId()
        if comm.rank == 0:
            lib.check(lib.ncclGetUniqueId(ctypes.byref(unique)), "ncclGetUniqueId")
        box = [bytes(unique.internal) if comm.rank == 0 else None]
        host = comm.host_group
        source = 0 if host is None else dist.get_global_rank(host, 0)
        dist.broadcast_object_list(box, src=source, group=host)
        ctypes.memmove(unique.internal, box[0], len(unique.internal))
        handle = ctypes.c_void_p()
        lib.check(lib.ncclCommInitRank(ctypes.byref(handle), comm.size, unique, comm.rank), "ncclCommInitRank")
        self.lib, self.handle, self.size, self.rank = lib, handle, comm.size, comm.rank


_COMMUNICATORS: dict = {}  # process group (None: the default group) -> Communicator


def communicator(comm) -> Communicator:
    """The communicator of `comm`'s group, made on first use by every rank of the group together."""
    key = comm.group
    made = _COMMUNICATORS.get(key)
    if made is None or made.size != comm.size:
        made = _COMMUNICATORS[key] = Communicator(comm)
    return made


def _stream(t) -> int:
    """The current stream of `t`'s device, as cudaStream_t: the capture stream while a graph is
    captured. torch's raw getter (well under a microsecond); torch.cuda.current_stream() makes a
    Stream object each call, several microseconds of a call that NCCL launches in about ten."""
    return _raw_stream()(t.device.index)


@functools.cache
def _raw_stream():
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


@functools.cache
def _code(dtype) -> int:
    found = dtypes.of_torch(dtype)
    if found is None or found.nccl is None:
        raise NcclError(f"NCCL has no datatype for {dtype}")
    return found.nccl


def _datatype(t) -> int:
    return _code(t.dtype)


def _reduction(comm) -> int:
    return REDUCE_OPS[comm.params.get("reduce_op", "sum")]


def supports(by_devices: bool, min_ranks: int = 1):
    """A message size the dtype (and, by_devices, the rank count) divides; a dtype NCCL carries."""

    def check(device_type, dt, capability, p):
        if p["num_devices"] < min_ranks:
            return f"needs num_devices >= {min_ranks}, got {p['num_devices']}"
        import torch

        if getattr(torch.version, "hip", None) is None and getattr(torch.version, "cuda", None) is None:
            return "this torch has no CUDA: no NCCL"
        if dt.input.nccl is None:
            return f"NCCL has no datatype for {dt.input.name}"
        if p.get("reduce_op", "sum") not in REDUCE_OPS:
            return f"NCCL has no reduction {p['reduce_op']!r}"
        return divisible(by_devices)(device_type, dt, capability, p)

    return check


def buffers(group=None):
    """Where a rank makes this backend's send and receive buffers: NCCL's own memory (ncclMemAlloc,
    through torch.distributed's NCCL allocator in a torch.cuda.MemPool), as nccl-tests allocates
    them. A CUDA graph that captures NCCL calls on such buffers registers them with NCCL
    (NCCL_GRAPH_REGISTER), and its calls then run without NCCL's staging copies: on 2 H200s
    nccl-tests' -G all_gather of 2 GiB read 3313 us against 3857 us in its loop, where buffers from
    torch's caching allocator read the loop's time in a graph too. Where torch has no such
    allocator (older torch, a group of another backend), the buffers are torch's as usual."""
    import contextlib

    import torch

    try:
        return torch.cuda.use_mem_pool(_pool(group))
    except Exception:  # noqa: BLE001 (no NCCL allocator here: the buffers come from torch's)
        return contextlib.nullcontext()


_POOLS: dict = {}


def _pool(group):
    import torch
    import torch.distributed as dist

    if group not in _POOLS:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        allocator = pg._get_backend(torch.device("cuda")).mem_allocator
        _POOLS[group] = torch.cuda.MemPool(allocator)
    return _POOLS[group]


def backend(op: str, bind: Callable, by_devices: bool = False, min_ranks: int = 1):
    """Register the op's nccl backend; `bind(x, out, comm)` is its call bound once (a BoundCall: the
    `loop` convention repeats it below Python, measure/collective.py)."""
    register = register_backend(op, "nccl", library=DISTRIBUTION, devices={"cuda"},
                                supports=supports(by_devices, min_ranks))

    def wrap(fn):
        fn.buffers = buffers  # measure/collective.py makes the case's buffers inside it
        fn.bind = bind
        return register(fn)

    return wrap


def _bound(name: str, kind: str, args: tuple) -> ncclcalls.BoundCall:
    lib = nccl()
    return ncclcalls.BoundCall(name, kind, getattr(lib, name), args, lib.check, ncclcalls.helper())


def bind_all_reduce(x, out, comm) -> ncclcalls.BoundCall:
    c = communicator(comm)
    return _bound("ncclAllReduce", "coll_arg", (x.data_ptr(), out.data_ptr(), x.numel(), _datatype(x),
                                                _reduction(comm), c.handle, _stream(x)))


def bind_all_gather(x, out, comm) -> ncclcalls.BoundCall:
    c = communicator(comm)
    return _bound("ncclAllGather", "coll", (x.data_ptr(), out.data_ptr(), x.numel(), _datatype(x), c.handle,
                                            _stream(x)))


def bind_reduce_scatter(x, out, comm) -> ncclcalls.BoundCall:
    c = communicator(comm)
    return _bound("ncclReduceScatter", "coll_arg", (x.data_ptr(), out.data_ptr(), out.numel(), _datatype(x),
                                                    _reduction(comm), c.handle, _stream(x)))


def bind_all_to_all(x, out, comm) -> ncclcalls.BoundCall:
    c, lib = communicator(comm), nccl()
    count, kind, stream = x.numel() // comm.size, _datatype(x), _stream(x)
    if lib.ncclAlltoAll is not None:
        return _bound("ncclAlltoAll", "coll", (x.data_ptr(), out.data_ptr(), count, kind, c.handle, stream))
    # Before NCCL 2.28: a group of one send and one receive per peer, as nccl-tests does.
    step, peers = count * x.element_size(), range(comm.size)
    return _bound_p2p(list(peers), list(peers), [x.data_ptr() + p * step for p in peers],
                      [out.data_ptr() + p * step for p in peers], count, kind, c.handle, stream)


def bind_broadcast(x, out, comm) -> ncclcalls.BoundCall:
    c = communicator(comm)
    return _bound("ncclBroadcast", "coll_arg", (x.data_ptr(), out.data_ptr(), x.numel(), _datatype(x), 0, c.handle,
                                                _stream(x)))


def bind_send_recv(x, out, comm) -> ncclcalls.BoundCall:
    c = communicator(comm)
    return _bound_p2p([(comm.rank + 1) % comm.size], [(comm.rank - 1) % comm.size], [x.data_ptr()],
                      [out.data_ptr()], x.numel(), _datatype(x), c.handle, _stream(x))


def _bound_p2p(to: list, frm: list, sends: list, recvs: list, count: int, kind: int, handle, stream):
    lib = nccl()
    return ncclcalls.BoundCall("ncclSend/ncclRecv", "p2p", None,
                               (lib.ncclGroupStart, lib.ncclGroupEnd, lib.ncclSend, lib.ncclRecv, to, frm, sends,
                                recvs, count, kind, handle, stream), lib.check, ncclcalls.helper())


# A backend is its bound call made once: one path for a single call, a loop and a graph's capture.
@backend("all_reduce", bind_all_reduce)
def all_reduce_nccl(x, out, comm):
    bind_all_reduce(x, out, comm)()
    return out


@backend("all_gather", bind_all_gather)
def all_gather_nccl(x, out, comm):
    bind_all_gather(x, out, comm)()
    return out


@backend("reduce_scatter", bind_reduce_scatter, by_devices=True)
def reduce_scatter_nccl(x, out, comm):
    bind_reduce_scatter(x, out, comm)()
    return out


@backend("all_to_all", bind_all_to_all, by_devices=True)
def all_to_all_nccl(x, out, comm):
    bind_all_to_all(x, out, comm)()
    return out


@backend("broadcast", bind_broadcast)
def broadcast_nccl(x, out, comm):
    bind_broadcast(x, out, comm)()
    return out


@backend("send_recv", bind_send_recv, min_ranks=2)  # a rank does not send to itself
def send_recv_nccl(x, out, comm):
    bind_send_recv(x, out, comm)()
    return out
