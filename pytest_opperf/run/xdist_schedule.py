"""pytest-xdist: the collective cases run last, on one worker, after the other workers ended.

Each worker is pinned to one device (run/xdist.py), but a collective case starts `num_devices`
rank processes on devices 0..n-1 (run/collective.py): it needs every device of the host. So
xdist's scheduler (load, worksteal, loadscope, loadfile, loadgroup) is wrapped: it sees the
kernel cases only and hands them out as it always does, and the collective cases are held back
until it has nothing more to give. The first worker it says goodbye to (shutdown) is kept: its
shutdown is held, and once every other worker has finished and left the scheduler, that worker
gets every collective case in one go, the smallest groups first, then its shutdown. One worker
runs them all, so it starts each group size's rank processes once and keeps them between cases.
(An xdist worker runs a case once it knows the next one or was told to stop, so the kept worker
may still hold its last kernel case until then: that case runs first, with the others gone.)

A worker that has finished is not gone: xdist keeps its process (its interpreter, its CUDA
context and the memory torch's caching allocator holds) until the whole session ends, and a rank
process beside it would find its device short of memory and its timings `contended`. So before
the collective cases are sent, the finished workers' processes are ended and waited for.

A worker that dies is replaced by xdist (--max-worker-restart): the collective cases wait for the
replacement to join and leave too. If the kept worker dies, the case it was running is its crash,
the cases after it are held again, and the next worker the scheduler lets go is kept in its place.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
from typing import Any, Callable, Optional, Sequence

import pytest

from pytest_opperf import testid
from pytest_opperf.catalog.ops.collective import is_collective
from pytest_opperf.run.xdist import HOST_DEVICES_KEY

END_S = 60.0  # how long a finished worker gets to end its process before it is killed
GROUP_SIZE = "num_devices"


def group_size(nodeid: str) -> Optional[float]:
    """The case's `num_devices`, or None without one; 'all' (every device) is the largest.

    >>> group_size("b.py::test_all_reduce[torch_dist-bf16-num_devices=4-message_bytes=8]")
    4
    >>> group_size("b.py::test_broadcast[torch_dist-num_devices=all]"), group_size("b.py::test_gemm[torch]")
    (inf, None)
    """
    params = testid.parse(nodeid).params
    for part in testid.tokens(params) if params else []:
        name, _, value = part.partition("=")
        if name == GROUP_SIZE:
            return int(value) if value.isdigit() else math.inf
    return None


def is_collective_id(nodeid: str) -> bool:
    """A case of a registered collective op (its bench test is test_<op>) with a group size.

    >>> from pytest_opperf.catalog import load_builtin; load_builtin()
    >>> is_collective_id("b.py::test_all_reduce[torch_dist-bf16-num_devices=2-message_bytes=1024-reduce_op=sum]")
    True
    >>> is_collective_id("b.py::test_all_reduce[x]"), is_collective_id("b.py::test_gemm[torch-num_devices=2]")
    (False, False)
    """
    return is_collective(testid.parse(nodeid).test.removeprefix("test_")) and group_size(nodeid) is not None


def end_worker(node: Any, timeout_s: float = END_S) -> None:
    """Wait until a finished worker's process is gone. It reported workerfinished from its
    pytest_sessionfinish: the rest of its pytest (unconfigure) gets `timeout_s`, then execnet's
    exit ends the interpreter (it gives running code 5 s, then interrupts it), and a process
    still there after `timeout_s` more is killed."""
    gateway = node.gateway
    with contextlib.suppress(Exception):  # a channel that ended in an error ended all the same
        node.channel.waitclose(timeout_s)
    gateway.exit()
    popen = getattr(getattr(gateway, "_io", None), "popen", None)  # execnet's popen gateways: what -n starts
    if popen is None:
        gateway.join(timeout_s)
        return
    try:
        popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


class _KernelView:
    """A worker as the wrapped scheduler sees it: its collection holds the kernel cases alone, so
    the indices it sends are mapped to the worker's own; shutdown asks the wrapper first."""

    def __init__(self, node: Any, on_shutdown: Callable[[_KernelView], None]):
        self.node = node
        self.to_full: list[int] = []  # the scheduler's index -> the worker's
        self.done = False  # the scheduler said shutdown and has sent nothing since
        self._on_shutdown = on_shutdown

    def __getattr__(self, name: str) -> Any:
        return getattr(self.node, name)

    def __repr__(self) -> str:
        return repr(self.node)

    def send_runtest_some(self, indices: Sequence[int]) -> None:
        if indices:
            self.done = False
        self.node.send_runtest_some([self.to_full[i] for i in indices])

    def send_runtest_all(self) -> None:
        self.send_runtest_some(range(len(self.to_full)))

    def send_steal(self, indices: Sequence[int]) -> None:
        self.node.send_steal([self.to_full[i] for i in indices])

    def shutdown(self) -> None:
        self.done = True
        self._on_shutdown(self)


class CollectivesLast:
    """xdist's scheduler for the kernel cases, wrapped; the collective cases held back for one
    worker that runs them once it is the last. DSession talks to this with the real workers."""

    def __init__(self, inner: Any, is_collective_case: Callable[[str], bool] = is_collective_id,
                 end_s: float = END_S):
        self.inner = inner
        self.is_collective = is_collective_case
        self.end_s = end_s
        self._views: dict[Any, _KernelView] = {}  # worker -> what the scheduler holds for it
        self._collections: dict[Any, list[str]] = {}
        self._to_inner: dict[Any, dict[int, int]] = {}  # worker -> its kernel index -> the scheduler's
        self._order: dict[str, int] = {}  # node id -> its place in the collection
        self._kernel_at: list[int] = []  # the kernel cases' places in the collection (every worker's is the same)
        self._kernels: Optional[int] = None  # how many kernel cases; None before the first collection
        self._held: list[str] = []  # collective cases not sent yet
        self._running: dict[Any, list[str]] = {}  # worker -> collective cases sent and not complete
        self._chosen: Any = None  # the worker that runs the collective cases
        self._ending: list[Any] = []  # finished workers whose processes must be gone first
        self._awaited = 0  # replacements of dead workers not joined yet

    @property
    def nodes(self) -> list:
        return list(self._views)

    @property
    def collection_is_completed(self) -> bool:
        return self.inner.collection_is_completed

    @property
    def tests_finished(self) -> bool:
        return self.inner.tests_finished and not self._held and not any(self._running.values())

    @property
    def has_pending(self) -> bool:
        return self.inner.has_pending or bool(self._held) or any(self._running.values())

    def add_node(self, node: Any) -> None:
        # A worker that joins once the collection is known (a replacement) may be sent cases before
        # its own collection arrives: xdist relies on every worker collecting the same items, and so
        # does the mapping, until the worker's own collection replaces it.
        self._views[node] = _KernelView(node, self._shutdown)
        self._views[node].to_full = list(self._kernel_at)
        self._to_inner[node] = {full: i for i, full in enumerate(self._kernel_at)}
        self._awaited = max(0, self._awaited - 1)
        self.inner.add_node(self._views[node])

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        collection = list(collection)
        kernel = [i for i, nodeid in enumerate(collection) if not self.is_collective(nodeid)]
        self._collections[node] = collection
        self._views[node].to_full = kernel
        self._to_inner[node] = {full: i for i, full in enumerate(kernel)}
        if self._kernels is None:
            self._kernels = len(kernel)
            self._kernel_at = kernel
            self._order = {nodeid: i for i, nodeid in enumerate(collection)}
            self._held = [nodeid for i, nodeid in enumerate(collection) if i not in self._to_inner[node]]
        self.inner.add_node_collection(self._views[node], [collection[i] for i in kernel])

    def schedule(self) -> None:
        self.inner.schedule()
        if self._kernels == 0 and self._held and self._chosen is None:
            self._keep_one()  # the scheduler had nothing to hand out: it may let none go, or all
        self._dispatch()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        inner_index = self._to_inner[node].get(item_index)
        if inner_index is None:
            self._running[node].remove(self._collections[node][item_index])
        else:
            self.inner.mark_test_complete(self._views[node], inner_index, duration)
        self._dispatch()

    def mark_test_pending(self, item: str) -> None:
        if self.is_collective(item):
            self._held.append(item)
            self._dispatch()
        else:
            self.inner.mark_test_pending(item)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        self.inner.remove_pending_tests_from_node(self._views[node], [self._to_inner[node][i] for i in indices])

    def remove_node(self, node: Any) -> Optional[str]:
        """The scheduler's crash item, else the collective case the worker died in; its other
        collective cases are held again. A worker that finished returns None."""
        view = self._views.pop(node)
        finished = getattr(node, "workeroutput", None) is not None
        if node is self._chosen:
            self._chosen = None
        elif finished and self._held:
            self._ending.append(node)
        if not finished:
            self._awaited += 1
        crash = self.inner.remove_node(view) if view in self.inner.nodes else None
        unrun = self._running.pop(node, [])
        if unrun and crash is None and not finished:
            crash = unrun.pop(0)
        self._held.extend(unrun)
        self._collections.pop(node, None)  # a worker that died before its collection has none
        self._to_inner.pop(node, None)
        self._dispatch()
        return crash

    def _shutdown(self, view: _KernelView) -> None:
        """The scheduler has nothing more for this worker: the first one let go while collective
        cases wait is kept for them."""
        node = view.node
        if self._chosen is None and self._held and not node.shutting_down:
            self._chosen = node
        if node is self._chosen and self._held:
            self._dispatch()
        else:
            node.shutdown()

    def _keep_one(self) -> None:
        """Only collective cases: the first worker is kept, the others go."""
        live = [node for node in self._views if not node.shutting_down]
        for node in live[1:]:
            node.shutdown()
        if live:
            self._chosen = live[0]
            self._views[live[0]].done = True

    def _ready(self) -> bool:
        """Collective cases wait, the kept worker is the only one left and no replacement is
        coming, the scheduler is done with it (and has nothing left for anyone), and it was not
        told to shut down yet (a worker ignores what it is sent after that)."""
        view = self._views.get(self._chosen)
        return bool(self._held) and view is not None and len(self._views) == 1 and not self._awaited \
            and view.done and not view.node.shutting_down \
            and (view in self.inner.nodes or not self.inner.has_pending)

    def _dispatch(self) -> None:
        if not self._ready():
            return
        for node in self._ending:
            end_worker(node, self.end_s)
        self._ending.clear()
        node = self._chosen
        ids = sorted(self._held, key=lambda nodeid: (group_size(nodeid) or 0, self._order.get(nodeid, 0)))
        self._held = []
        self._running.setdefault(node, []).extend(ids)
        index = {nodeid: i for i, nodeid in enumerate(self._collections[node])}
        node.send_runtest_some([index[nodeid] for nodeid in ids])
        node.shutdown()


class CollectivesOnOneWorker:
    """Controller hooks: xdist's scheduler wrapped in CollectivesLast, and each worker told every
    device of the host (`devices`: what run/xdist.py's host_devices reads; None: nothing told)."""

    def __init__(self, devices: Optional[Any] = None):
        self.devices = devices

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if self.devices:
            node.workerinput[HOST_DEVICES_KEY] = self.devices

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        inner = yield
        return inner if inner is None or config.getvalue("dist") == "each" else CollectivesLast(inner)
