"""The CUDA runtime, called through ctypes: a CUDA graph captured and launched as nccl-tests does.

A graph of NCCL calls holds an event-record node beside each kernel (NCCL's support for mixing
graphs with eager calls). Replayed on torch's current stream, the legacy default stream, those
nodes cost microseconds a call; replayed on a non-blocking stream they cost what nccl-tests' -G
pays. So the nccl backend's graph is captured here in thread-local mode on a non-blocking stream
of the rank's own, instantiated without flags and launched on that stream, as nccl-tests does
(docs/collectives.md). The library is the one torch loaded (found in this process's memory map).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable, Optional

STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking
CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL = 0, 1  # cudaStreamCaptureMode
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 8: "sem_signal", 9: "sem_wait", 10: "mem_alloc", 11: "mem_free", 13: "conditional"}


class CudaError(RuntimeError):
    pass


def mapped(prefix) -> Optional[str]:
    """The path of a library this process has loaded whose file name starts with `prefix` (a
    string, or a tuple of them), from its memory map; None where none is (or no map: not Linux).
    catalog/backends/nccl.py reads the map the same way: the catalogue may not import this layer."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith(prefix):
                    return path
    except OSError:
        pass
    return None


class Runtime:
    """The CUDA runtime functions a captured graph needs, with their C signatures."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        vp, i, sz, ull = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_ulonglong
        pvp = ctypes.POINTER(ctypes.c_void_p)
        self.path = path
        for name, args in {
            "cudaStreamCreateWithFlags": [pvp, ctypes.c_uint],
            "cudaStreamBeginCapture": [vp, i],
            "cudaStreamEndCapture": [vp, pvp],
            "cudaGraphInstantiateWithFlags": [pvp, vp, ull],
            "cudaGraphLaunch": [vp, vp],
            "cudaStreamSynchronize": [vp],
            "cudaGraphGetNodes": [vp, vp, ctypes.POINTER(sz)],
            "cudaGraphNodeGetType": [vp, ctypes.POINTER(i)],
            "cudaGraphExecDestroy": [vp],
            "cudaGraphDestroy": [vp],
            "cudaGetErrorString": [i],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_char_p if name == "cudaGetErrorString" else i
            setattr(self, name, fn)

    def check(self, result: int, what: str) -> None:
        if result:
            raise CudaError(f"{what} returned {result} ({self.cudaGetErrorString(result).decode()})")

    def stream(self) -> int:
        """A new non-blocking stream of the current device (cudaStream_t as an int)."""
        s = ctypes.c_void_p()
        self.check(self.cudaStreamCreateWithFlags(ctypes.byref(s), STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags")
        return s.value

    def nodes(self, graph) -> dict:
        """A captured graph's nodes counted by type ({"kernel": 20, "event_record": 20, ...})."""
        count = ctypes.c_size_t(0)
        self.check(self.cudaGraphGetNodes(graph, None, ctypes.byref(count)), "cudaGraphGetNodes")
        nodes = (ctypes.c_void_p * count.value)()
        self.check(self.cudaGraphGetNodes(graph, nodes, ctypes.byref(count)), "cudaGraphGetNodes")
        kinds: dict = {}
        for node in nodes:
            t = ctypes.c_int()
            self.check(self.cudaGraphNodeGetType(node, ctypes.byref(t)), "cudaGraphNodeGetType")
            name = NODE_TYPES.get(t.value, str(t.value))
            kinds[name] = kinds.get(name, 0) + 1
        return kinds


class Graph:
    """Work captured on `stream` in thread-local mode, instantiated, launched on the same stream."""

    def __init__(self, rt: Runtime, stream: int, work: Callable[[], None]):
        self.rt, self.stream = rt, stream
        self.graph = self.exe = None
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        rt.check(rt.cudaStreamBeginCapture(stream, CAPTURE_THREAD_LOCAL), "cudaStreamBeginCapture")
        try:
            work()
        except BaseException:
            # End the capture (the stream is unusable until then) and free what it held.
            if rt.cudaStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value:
                rt.cudaGraphDestroy(graph)
            raise
        rt.check(rt.cudaStreamEndCapture(stream, ctypes.byref(graph)), "cudaStreamEndCapture")
        try:
            rt.check(rt.cudaGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0), "cudaGraphInstantiate")
        except CudaError:
            rt.cudaGraphDestroy(graph)
            raise
        self.graph, self.exe = graph, exe

    def launch(self, times: int = 1) -> None:
        rt, exe, stream = self.rt, self.exe, self.stream
        for _ in range(times):
            rt.check(rt.cudaGraphLaunch(exe, stream), "cudaGraphLaunch")

    def nodes(self) -> dict:
        return self.rt.nodes(self.graph)

    def close(self) -> None:
        if self.exe is not None:
            self.rt.cudaGraphExecDestroy(self.exe)
            self.rt.cudaGraphDestroy(self.graph)
            self.exe = self.graph = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (at interpreter exit the library may be gone)
            pass


@functools.cache
def runtime() -> Runtime:
    """The CUDA runtime torch loaded (its CUDA must be initialised first)."""
    return Runtime(mapped("libcudart.so") or "libcudart.so")
