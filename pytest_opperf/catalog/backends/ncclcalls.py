"""NCCL calls bound once and repeated below Python: the nccl backend's `loop` at C speed.

A Python loop around a ctypes call pays on every call the interpreter's loop, ctypes' argument
conversion and the backend's look-ups (communicator, pointers, stream): several microseconds,
about what NCCL's own launch of a small all-reduce costs on the host, so a small message's row
would read the interpreter rather than NCCL.

A BoundCall holds one NCCL function and its arguments, converted once. `repeat(n)` makes the n
calls from a few lines of C (C_SOURCE) compiled on first use with the host's C compiler, the
compiler torch's own extensions build with: no NCCL or CUDA header is needed, NCCL's functions
are reached through their addresses in the library torch loaded. Where no compiler works,
`repeat` is a Python loop over the bound call, and `driver` says so ("python"); the rows record
it (extra_info's `loop_driver`) and the session's summary counts them.

    >>> bound = BoundCall("ncclAllReduce", "coll_arg", fn, (send, recv, count, dtype, op, comm, stream),
    ...                   check, helper())                                                      # doctest: +SKIP
    >>> bound.repeat(500)                                                                   # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Optional

# One function per shape of NCCL call; each makes `n` calls and returns the first error, else 0.
C_SOURCE = r"""
#include <stddef.h>

/* ncclAllReduce, ncclReduceScatter (a reduction), ncclBroadcast (a root): 7 arguments */
typedef int (*coll_arg_t)(const void*, void*, size_t, int, int, void*, void*);
/* ncclAllGather, ncclAlltoAll: 6 arguments */
typedef int (*coll_t)(const void*, void*, size_t, int, void*, void*);
/* ncclSend, ncclRecv: buffer, count, datatype, peer, comm, stream */
typedef int (*p2p_t)(const void*, size_t, int, int, void*, void*);
typedef int (*group_t)(void);

/* Call i reads and writes slot (first + i) % slots of the buffers, `sstep` and `rstep` bytes apart:
   nccl-tests' offset per iteration. */
int opperf_repeat_coll_arg(coll_arg_t fn, long n, long first, long slots, const char* send, size_t sstep,
                           char* recv, size_t rstep, size_t count, int type, int arg, void* comm, void* stream) {
  for (long i = 0; i < n; i++) {
    long s = (first + i) % slots;
    int r = fn(send + s * sstep, recv + s * rstep, count, type, arg, comm, stream);
    if (r) return r;
  }
  return 0;
}

int opperf_repeat_coll(coll_t fn, long n, long first, long slots, const char* send, size_t sstep, char* recv,
                       size_t rstep, size_t count, int type, void* comm, void* stream) {
  for (long i = 0; i < n; i++) {
    long s = (first + i) % slots;
    int r = fn(send + s * sstep, recv + s * rstep, count, type, comm, stream);
    if (r) return r;
  }
  return 0;
}

/* n groups, each of `pairs` sends and receives (send_recv's ring step; all_to_all by peers) */
int opperf_repeat_p2p(group_t start, group_t end, p2p_t send, p2p_t recv, long n, long first, long slots,
                      int pairs, const int* to, const int* from, char* const* sbuf, size_t sstep,
                      char* const* rbuf, size_t rstep, size_t count, int type, void* comm, void* stream) {
  for (long i = 0; i < n; i++) {
    long s = (first + i) % slots;
    int r = start();
    if (r) return r;
    for (int p = 0; p < pairs; p++) {
      r = send(sbuf[p] + s * sstep, count, type, to[p], comm, stream);
      if (r) return r;
      r = recv(rbuf[p] + s * rstep, count, type, from[p], comm, stream);
      if (r) return r;
    }
    r = end();
    if (r) return r;
  }
  return 0;
}
"""

CACHE_VARIABLE = "OPPERF_CACHE_DIR"  # where the compiled helper is kept (default: the user's cache)


def cache_dir() -> Path:
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-opperf"


def compiler() -> Optional[str]:
    """The C compiler torch's extensions would use: $CC, else cc, gcc or clang on the PATH."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named.split()[0]) and named
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


class Helper:
    """The compiled helper's three functions, typed."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        vp, sz, i, lg = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_long
        self.path = path
        self.coll_arg = lib.opperf_repeat_coll_arg
        self.coll_arg.argtypes = [vp, lg, lg, lg, vp, sz, vp, sz, sz, i, i, vp, vp]
        self.coll_arg.restype = i
        self.coll = lib.opperf_repeat_coll
        self.coll.argtypes, self.coll.restype = [vp, lg, lg, lg, vp, sz, vp, sz, sz, i, vp, vp], i
        self.p2p = lib.opperf_repeat_p2p
        self.p2p.argtypes = [vp, vp, vp, vp, lg, lg, lg, i, vp, vp, vp, sz, vp, sz, sz, i, vp, vp]
        self.p2p.restype = i


# Why the helper could not be built (None: it was, or nobody asked yet); said once per process.
UNAVAILABLE: dict = {}


@functools.cache
def helper() -> Optional[Helper]:
    """The compiled helper, built on first use into cache_dir() (kept across sessions, one file per
    version of C_SOURCE and machine); None where it cannot be built, with the reason in UNAVAILABLE."""
    digest = hashlib.sha256(C_SOURCE.encode()).hexdigest()[:16]
    target = cache_dir() / f"ncclcalls-{digest}-{platform.machine()}.so"
    try:
        if not target.exists():
            _build(target)
        return Helper(target)
    except (OSError, subprocess.SubprocessError, _BuildError) as exc:
        UNAVAILABLE["reason"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None


class _BuildError(Exception):
    pass


def _build(target: Path) -> None:
    cc = compiler()
    if cc is None:
        raise _BuildError("no C compiler found ($CC, cc, gcc or clang)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Ranks of one group build at once: each into a file of its own, then one atomic rename wins.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source = Path(tmp) / "ncclcalls.c"
        source.write_text(C_SOURCE)
        built = Path(tmp) / target.name
        run = subprocess.run([*cc.split(), "-O2", "-shared", "-fPIC", "-o", str(built), str(source)],
                             capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            said = (run.stderr or run.stdout).strip().splitlines()
            raise _BuildError(f"{cc} failed: {said[0] if said else run.returncode}")
        os.replace(built, target)


def address(fn) -> int:
    """A ctypes foreign function's address, for the helper to call."""
    return ctypes.cast(fn, ctypes.c_void_p).value


class BoundCall:
    """One NCCL call with its arguments converted once: `()` makes it, `repeat(n)` makes it n times.

    kind: "coll_arg" (7 arguments: a reduction or a root), "coll" (6) or "p2p" (a group of sends
    and receives; `args` is then (group start, group end, send, recv, peers to, peers from, send
    buffers, receive buffers, count, datatype, comm, stream)). The first two arguments of a
    collective are its send and receive buffers. check(result, what) raises on an NCCL error.

    rotating(slots, send_step, recv_step): the same call over `slots` buffer pairs that many bytes
    apart, call i on pair i % slots, as nccl-tests moves its buffers by one message an iteration
    (so a message under the L2's size is not read from the L2 by every call).
    """

    def __init__(self, name: str, kind: str, fn, args: tuple, check: Callable[[int, str], None],
                 helper_: Optional[Helper] = None):
        self.name, self.kind, self.fn, self.check = name, kind, fn, check
        self.helper = helper_
        self.slots, self.steps = 1, (0, 0)
        self.next = 0  # the slot of the next call
        if kind == "p2p":
            start, end, send, recv, to, frm, sbufs, rbufs, count, dtype, comm, stream = args
            self.pairs = len(to)
            self._to, self._from = (ctypes.c_int * self.pairs)(*to), (ctypes.c_int * self.pairs)(*frm)
            self._sbufs, self._rbufs = list(sbufs), list(rbufs)
            self._group = (start, end, send, recv)
            self._rest = (count, dtype, comm, stream)
        else:
            self.args = tuple(args)
        self._by_slot = self._convert_slots()

    def rotating(self, slots: int, send_step: int, recv_step: int) -> "BoundCall":
        self.slots, self.steps = max(1, int(slots)), (int(send_step), int(recv_step))
        self._by_slot = self._convert_slots()
        return self

    @property
    def driver(self) -> str:
        """Who makes repeat()'s calls: "c" (the compiled helper) or "python"."""
        return "c" if self.helper is not None else "python"

    def __call__(self) -> None:
        self._python(1)

    def repeat(self, n: int) -> None:
        """n calls back to back (slot after slot); the first NCCL error raises."""
        h = self.helper
        if h is None:
            self._python(n)
            return
        first, slots, (sstep, rstep) = self.next, self.slots, self.steps
        if self.kind == "p2p":
            start, end, send, recv = (address(f) for f in self._group)
            count, dtype, comm, stream = self._rest
            sb, rb = (ctypes.c_void_p * self.pairs)(*self._sbufs), (ctypes.c_void_p * self.pairs)(*self._rbufs)
            result = h.p2p(start, end, send, recv, n, first, slots, self.pairs, self._to, self._from, sb, sstep, rb,
                           rstep, count, dtype, comm, stream)
        else:
            repeat = h.coll_arg if self.kind == "coll_arg" else h.coll
            send, recv, *rest = self.args
            result = repeat(address(self.fn), n, first, slots, send, sstep, recv, rstep, *rest)
        self.next = (first + n) % slots
        self.check(result, self.name)

    def _python(self, n: int) -> None:
        by_slot, slots, check = self._by_slot, self.slots, self.check
        first = self.next
        if self.kind == "p2p":
            start, end, send, recv = self._group
            count, dtype, comm, stream = self._rest
            for i in range(n):
                sends, recvs = by_slot[(first + i) % slots]
                check(start(), "ncclGroupStart")
                for p in range(self.pairs):
                    check(send(sends[p], count, dtype, self._to[p], comm, stream), "ncclSend")
                    check(recv(recvs[p], count, dtype, self._from[p], comm, stream), "ncclRecv")
                check(end(), "ncclGroupEnd")
        else:
            fn, name = self.fn, self.name
            for i in range(n):
                result = fn(*by_slot[(first + i) % slots])
                if result:
                    check(result, name)
        self.next = (first + n) % slots

    def _convert_slots(self) -> list:
        """Each slot's arguments, converted once (a call from Python then converts nothing)."""
        sstep, rstep = self.steps
        out = []
        for s in range(self.slots):
            if self.kind == "p2p":
                out.append(([b + s * sstep for b in self._sbufs], [b + s * rstep for b in self._rbufs]))
            else:
                send, recv, *rest = self.args
                out.append(tuple(_convert(self.fn.argtypes, (send + s * sstep, recv + s * rstep, *rest))))
        return out


def _convert(argtypes, args):
    """Each argument as its ctypes type, made once (a call then converts nothing)."""
    for kind, value in zip(argtypes, args):
        if isinstance(value, ctypes._SimpleCData) or kind is None:
            yield value
        elif kind is ctypes.c_void_p:
            yield ctypes.c_void_p(value)
        else:
            yield kind(value)
