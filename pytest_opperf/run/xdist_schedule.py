"""pytest-xdist: each case holds the devices it needs, and only those.

A kernel case needs one device, its worker's (run/xdist.py pins each worker to one). A collective
case of `num_devices` k needs k: its worker, the *leader*, starts k rank processes
(run/collective.py), one on each device of a *lease* that this scheduler grants: k devices that
nothing else uses while the lease lasts. The other workers of those devices, the *lenders*, are
sent nothing meanwhile: each finishes the case it runs and waits. Leases of disjoint devices run
side by side (two 2-rank groups on a 4-GPU host), kernel cases run on the devices no lease holds,
and a group of every device waits until every device is free.

Order: the collective cases first, the largest groups first, then the kernel cases. At the start
every device is free, so the largest groups take every device at once, and no kernel case waits
in the middle of the sweep for a group to assemble; the kernel cases, short and many, fill the
end, where a collective case (a group to start, 0.1-0.3 s a case) would leave devices idle. A
lease whose size has no cases left passes its leader on to the next size, on its own devices
(every smaller group fits them), and the devices it does not need go to further leases of that
size or to kernel cases.

xdist's scheduler (load, worksteal, loadscope, loadfile, loadgroup) still deals the kernel cases,
as it always does, through a view of each worker (_KernelView): while a worker leads or lends,
its view says it is shutting down, so the scheduler sends it nothing (what its first deal sends
regardless is held back and sent once the worker is free again).

The wire. An xdist worker runs a case once it knows the next one (or was told to stop): a worker
holding one case that is not complete is idle. So a leader is always sent its next case before
the last one ends, and a lease's last case is followed by the leader's next work (the next
lease's first case, a kernel case, or the stop). Which devices a case's group uses, and when they
are free, the controller writes into the workers' directory (LeaseBoard): the leader reads its
case's devices there and, before it starts the group, waits until the lease is marked ready (its
lenders idle, the lease before it on those devices ended).

A worker that dies is replaced by xdist (--max-worker-restart) with the same device: the case it
was running is its crash, the collective cases it held go back to be dealt again, its lease ends,
and its replacement joins as a lender if its device is leased.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest

from pytest_opperf import testid
from pytest_opperf.catalog.ops.collective import is_collective
from pytest_opperf.run.xdist import CRASH_DIR_KEY, HOST_DEVICES_KEY

END_S = 60.0  # how long a finished worker gets to end its process before it is killed
GROUP_SIZE = "num_devices"
LEASES_FILE = "leases.json"  # in the workers' directory: node id -> (lease, devices)
READY_POLL_S = 0.002  # how often a leader looks whether its lease is ready


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
    """Wait until a finished worker's process is gone (its context and cached memory with it). It
    reported workerfinished from its pytest_sessionfinish: the rest of its pytest gets `timeout_s`,
    then execnet's exit ends the interpreter, and a process still there `timeout_s` later is killed."""
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


def spec_device(variable: Optional[str]) -> Callable[[Any], Optional[str]]:
    """The device a worker was pinned to: its execnet spec's `env:<variable>=<entry>` (run/xdist.py)."""

    def device_of(node: Any) -> Optional[str]:
        env = getattr(getattr(node.gateway, "spec", None), "env", None) or {}
        return env.get(variable) if variable else None

    return device_of


class LeaseBoard:
    """Controller: what the leaders read in the workers' directory. One JSON file, replaced whole:
    each collective case sent, its lease and devices; and a file `ready-<lease>` once the lease's
    devices are free."""

    def __init__(self, directory: Optional[Path]):
        self.dir = directory
        self.cases: dict[str, dict] = {}

    def case(self, nodeid: str, lease: "Lease") -> None:
        self.cases[nodeid] = {"lease": lease.id, "devices": list(lease.devices) if lease.named else None}
        if self.dir is not None:
            temporary = self.dir / (LEASES_FILE + ".tmp")
            temporary.write_text(json.dumps(self.cases))
            os.replace(temporary, self.dir / LEASES_FILE)

    def ready(self, lease: "Lease") -> None:
        if self.dir is not None:
            (self.dir / f"ready-{lease.id}").touch()


def lease_of(config: pytest.Config, nodeid: str) -> Optional[dict]:
    """Worker: the lease the controller granted this collective case ({"lease": id, "devices":
    [entries] or None}), or None outside a leasing xdist session."""
    directory = getattr(config, "workerinput", {}).get(CRASH_DIR_KEY)
    path = Path(directory) / LEASES_FILE if directory else None
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get(nodeid)


def wait_ready(config: pytest.Config, lease: dict, timeout_s: float) -> float:
    """Worker: wait until the controller marks the lease ready (its devices free); the seconds
    waited. TimeoutError after timeout_s."""
    path = Path(config.workerinput[CRASH_DIR_KEY]) / f"ready-{lease['lease']}"
    started = time.monotonic()
    while not path.exists():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"the devices of lease {lease['lease']} ({lease['devices']}) were not free within "
                               f"{timeout_s:g} s")
        time.sleep(READY_POLL_S)
    return time.monotonic() - started


@dataclass(eq=False)
class Lease:
    """k devices for one group: its leader runs the cases, its lenders (the other workers on those
    devices) wait. `cases`: sent to the leader and not complete. `named`: the devices are real
    devices (told to the ranks), not one slot per unpinned worker."""

    id: int
    size: float
    devices: tuple
    leader: Any
    named: bool
    cases: list = field(default_factory=list)
    closing: bool = False  # no more cases will be sent to it
    ready: bool = False


class _KernelView:
    """A worker as xdist's scheduler sees it: its collection holds the kernel cases alone (indices
    mapped to the worker's own), and it is 'shutting down' while it leads or lends, so that the
    scheduler sends it nothing; what it is sent then is held back until it is free."""

    def __init__(self, node: Any, owner: "Leases"):
        self.node = node
        self.to_full: list[int] = []  # the scheduler's index -> the worker's
        self.withheld: list[int] = []  # the worker's indices, sent by the scheduler while the worker was leased
        self.told_done = False  # the scheduler said shutdown and has sent nothing since
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.node, name)

    def __repr__(self) -> str:
        return repr(self.node)

    @property
    def shutting_down(self) -> bool:
        return self.node.shutting_down or not self._owner.free_for_kernels(self.node)

    def send_runtest_some(self, indices: Sequence[int]) -> None:
        if indices:
            self.told_done = False
        self._owner.send_kernels(self.node, [self.to_full[i] for i in indices])

    def send_runtest_all(self) -> None:
        self.send_runtest_some(range(len(self.to_full)))

    def send_steal(self, indices: Sequence[int]) -> None:
        self.node.send_steal([self.to_full[i] for i in indices])

    def shutdown(self) -> None:
        self.told_done = True  # acted on once the scheduler's call returns (Leases.plan)


class Leases:
    """xdist's scheduler for the kernel cases, wrapped; the collective cases dealt on leases of
    free devices. DSession talks to this with the real workers.

    devices: every device entry of the host ('0', '1', ... as the workers' pinning names them);
    None where the workers are not pinned (a CPU): then each worker is a slot of its own, and a
    group of k ranks waits for k idle workers (their cores)."""

    def __init__(self, inner: Any, is_collective_case: Callable[[str], bool] = is_collective_id,
                 devices: Optional[Sequence[str]] = None, device_of: Callable[[Any], Optional[str]] = lambda n: None,
                 board: Optional[LeaseBoard] = None, end_s: float = END_S):
        self.inner = inner
        self.is_collective = is_collective_case
        self.host = list(devices) if devices else None
        self.device_of = device_of
        self.board = board or LeaseBoard(None)
        self.end_s = end_s
        self._views: dict[Any, _KernelView] = {}
        self._collections: dict[Any, list[str]] = {}
        self._to_inner: dict[Any, dict[int, int]] = {}  # worker -> its kernel index -> the scheduler's
        self._kernel_at: list[int] = []  # the kernel cases' places in the collection (every worker's is the same)
        self._order: dict[str, int] = {}  # node id -> its place in the collection
        self._held: dict[float, list[str]] = {}  # group size -> collective cases not sent yet
        self._sent: dict[Any, list[int]] = {}  # worker -> indices sent to it, not complete, in order
        self._leases: list[Lease] = []
        self._lease_of: dict[str, Lease] = {}  # collective case sent -> its lease
        self._kernel_role: set = set()  # workers whose kernel cases may run though their device is leased
        self._started = False
        self._planning = False
        self._awaited = 0  # replacements of dead workers not joined yet
        self._next_id = 0

    # -- the scheduler protocol (DSession) --

    @property
    def nodes(self) -> list:
        return list(self._views)

    @property
    def collection_is_completed(self) -> bool:
        return self.inner.collection_is_completed

    @property
    def tests_finished(self) -> bool:
        return self.inner.tests_finished and not self._held_any() and not self._leases

    @property
    def has_pending(self) -> bool:
        return self.inner.has_pending or self._held_any() or bool(self._leases)

    def add_node(self, node: Any) -> None:
        # A worker that joins once the collection is known (a replacement) may be sent cases before
        # its own collection arrives: xdist relies on every worker collecting the same items.
        view = self._views[node] = _KernelView(node, self)
        view.to_full = list(self._kernel_at)
        self._to_inner[node] = {full: i for i, full in enumerate(self._kernel_at)}
        self._sent[node] = []
        self._awaited = max(0, self._awaited - 1)
        self.inner.add_node(view)

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        collection = list(collection)
        kernel = [i for i, nodeid in enumerate(collection) if not self.is_collective(nodeid)]
        self._collections[node] = collection
        self._views[node].to_full = kernel
        self._to_inner[node] = {full: i for i, full in enumerate(kernel)}
        if not self._order:
            self._kernel_at = kernel
            self._order = {nodeid: i for i, nodeid in enumerate(collection)}
            for nodeid in collection:
                if self.is_collective(nodeid):
                    self._held.setdefault(self._size(nodeid), []).append(nodeid)
        self.inner.add_node_collection(self._views[node], [collection[i] for i in kernel])

    def schedule(self) -> None:
        if not self._started:  # the collective cases' leases first: the kernel cases' first deal skips their workers
            self._started = True
            self.plan()
        self.inner.schedule()
        self.plan()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self._sent[node].remove(item_index)
        inner_index = self._to_inner[node].get(item_index)
        if inner_index is None:
            lease = self._lease_of.pop(self._collections[node][item_index])
            lease.cases.remove(self._collections[node][item_index])
        else:
            self.inner.mark_test_complete(self._views[node], inner_index, duration)
        self.plan()

    def mark_test_pending(self, item: str) -> None:
        if self.is_collective(item):
            self._held.setdefault(self._size(item), []).insert(0, item)
            self.plan()
        else:
            self.inner.mark_test_pending(item)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        for index in indices:
            self._sent[node].remove(index)
        self.inner.remove_pending_tests_from_node(self._views[node], [self._to_inner[node][i] for i in indices])
        self.plan()

    def remove_node(self, node: Any) -> Optional[str]:
        """The crash item (the case the worker was running), or None for a worker that finished.
        Its other collective cases are dealt again; a lease it led ends."""
        view = self._views.pop(node)
        finished = getattr(node, "workeroutput", None) is not None
        if not finished:
            self._awaited += 1
        collection = self._collections.pop(node, None) or []
        sent = [collection[i] if i < len(collection) else None for i in self._sent.pop(node, [])]
        self._to_inner.pop(node, None)
        self._kernel_role.discard(node)
        crash = self.inner.remove_node(view) if view in self.inner.nodes else None
        if sent and sent[0] is not None and self._is_leased_case(sent[0]) and not finished:
            if crash is not None:  # the scheduler blamed a kernel case the worker had not reached
                with contextlib.suppress(NotImplementedError):
                    self.inner.mark_test_pending(crash)
            crash = sent[0]
        for nodeid in reversed([n for n in sent if n is not None and self._is_leased_case(n)]):
            self._lease_of.pop(nodeid).cases.remove(nodeid)
            if nodeid != crash:
                self._held.setdefault(self._size(nodeid), []).insert(0, nodeid)
        for lease in [lease for lease in self._leases if lease.leader is node]:
            lease.closing = True
            lease.cases.clear()
        if finished and (self._held_any() or self._leases) and self.host is not None:
            end_worker(node, self.end_s)  # its device may be lent: its process and memory go first
        self.plan()
        return crash

    # -- the kernel cases' side --

    def free_for_kernels(self, node: Any) -> bool:
        """The worker may run kernel cases: its device is in no lease, or it led one that has its
        last case sent (its kernel cases run after that)."""
        return node in self._kernel_role or not any(self._device(node) in lease.devices for lease in self._leases)

    def send_kernels(self, node: Any, indices: list[int]) -> None:
        view = self._views[node]
        if self.free_for_kernels(node) and not node.shutting_down:
            self._send(node, indices)
        else:
            view.withheld.extend(indices)

    # -- leases --

    def plan(self) -> None:
        """Bring every lease and worker up to date: leases that ended, leases now ready, leaders that
        need their next case, new leases on free devices, workers with nothing left."""
        if not self._started or self._planning:
            return
        self._planning = True
        try:
            moved = True
            while moved:
                moved = self._end_leases()
                for lease in self._leases:
                    if not lease.ready and self._can_start(lease):
                        lease.ready = True
                        self.board.ready(lease)
                for lease in list(self._leases):
                    moved |= self._feed(lease)
                moved |= self._form()
                moved |= self._release_kernels()
            self._retire()
        finally:
            self._planning = False

    def _end_leases(self) -> bool:
        ended = [lease for lease in self._leases if lease.closing and not lease.cases]
        for lease in ended:
            self._leases.remove(lease)
            self._kernel_role.discard(lease.leader)  # its device is free now: kernel cases go there anyway
        return bool(ended)

    def _can_start(self, lease: Lease) -> bool:
        """Its devices are in no other lease, and every worker on them but its leader is idle."""
        if any(other is not lease and set(other.devices) & set(lease.devices) for other in self._leases
               if self._leases.index(other) < self._leases.index(lease)):
            return False
        return all(self._idle(w) for d in lease.devices for w in self._workers_on(d) if w is not lease.leader)

    def _feed(self, lease: Lease) -> bool:
        """Keep the leader two cases ahead (the one it runs, the one it will run next); when its size
        has no cases left, give the leader its next work."""
        leader = lease.leader
        if leader not in self._views or leader.shutting_down or len(self._sent[leader]) > 1:
            return False
        if lease.closing:
            if len(self._sent[leader]) == 1 and self._waits_for_next(lease):
                return self._after(lease)
            return False
        queue = self._held.get(lease.size)
        if queue:
            nodeid = queue.pop(0)
            lease.cases.append(nodeid)
            self._lease_of[nodeid] = lease
            self.board.case(nodeid, lease)
            self._send(leader, [self._collections[leader].index(nodeid)])
            return True
        lease.closing = True
        return self._after(lease) if self._sent[leader] else True

    def _waits_for_next(self, lease: Lease) -> bool:
        """The leader holds this lease's last case and knows nothing after it."""
        sent = self._sent[lease.leader]
        return len(sent) == 1 and self._collections[lease.leader][sent[0]] in lease.cases

    def _after(self, lease: Lease) -> bool:
        """The leader of a lease with no cases left: the next size's lease on its devices, else kernel
        cases, else the stop (or, the last worker, it waits for a lease that fits)."""
        leader = lease.leader
        for size in self._sizes():
            need = self._need(size)
            pool = list(dict.fromkeys([*lease.devices, *self._free_devices()]))
            if need <= len(pool):
                self._lease(size, leader, pool, need)
                return True
        self._kernel_role.add(leader)
        if self._release_kernels():
            return True
        if not self._held_any() or any(w is not leader and not w.shutting_down for w in self._views):
            if self._views[leader].told_done or not self.inner.has_pending:
                leader.shutdown()
                return True
        return False

    def _form(self) -> bool:
        """New leases on free devices, the largest groups first."""
        formed = False
        if self._awaited:  # a replacement is starting on some device (its context, its memory): not beside a group
            return formed
        for size in self._sizes():
            need = self._need(size)
            while self._held.get(size):
                free = self._free_devices()
                leaders = [w for d in free for w in self._workers_on(d) if not w.shutting_down]
                if len(free) < need or not leaders:
                    break
                holding = [w for w in leaders if self._sent[w]]  # its held case runs before the group
                leader = (holding or leaders)[0]
                self._lease(size, leader, free, need)
                formed = True
        return formed

    def _lease(self, size: float, leader: Any, pool: list, need: int) -> Lease:
        mine = self._device(leader)
        devices = tuple([mine] + [d for d in pool if d != mine][:need - 1])
        lease = Lease(self._next_id, size, devices, leader, named=self.host is not None)
        self._next_id += 1
        self._leases.append(lease)
        self._kernel_role.discard(leader)
        self._feed(lease)
        return lease

    def _release_kernels(self) -> bool:
        """Workers free for kernel cases again: what was held back for them is sent, and the
        scheduler deals to them (its schedule() reschedules every worker)."""
        moved = False
        for node, view in self._views.items():
            if view.withheld and self.free_for_kernels(node) and not node.shutting_down:
                indices, view.withheld = view.withheld, []
                self._send(node, indices)
                moved = True
        idle = [n for n in self._views if self.free_for_kernels(n) and len(self._sent[n]) < 2
                and not n.shutting_down and not self._views[n].told_done]
        if idle and self.inner.collection_is_completed:
            before = sum(map(len, self._sent.values()))
            self.inner.schedule()
            moved |= sum(map(len, self._sent.values())) != before
        return moved

    def _retire(self) -> None:
        """Workers the kernel scheduler is done with, with nothing held back, no lease and no
        collective case left that could need them, are stopped (they run their last case)."""
        if self._held_any():
            return
        for node, view in list(self._views.items()):
            if view.told_done and not view.withheld and not node.shutting_down and self.free_for_kernels(node) \
                    and not any(lease.leader is node for lease in self._leases):
                node.shutdown()

    # -- small helpers --

    def _send(self, node: Any, indices: list[int]) -> None:
        self._sent[node].extend(indices)
        node.send_runtest_some(indices)

    def _is_leased_case(self, nodeid: str) -> bool:
        return nodeid in self._lease_of

    def _size(self, nodeid: str) -> float:
        size = group_size(nodeid)
        return 1 if size is None else size

    def _sizes(self) -> list[float]:
        return sorted((s for s, queue in self._held.items() if queue), reverse=True)

    def _held_any(self) -> bool:
        return any(self._held.values())

    def _universe(self) -> list:
        return self.host if self.host is not None else list(self._views)

    def _need(self, size: float) -> int:
        """Devices a group of `size` takes: a case larger than the host skips itself on one; on
        unpinned workers (a CPU, whose ranks need cores, not devices), as many slots as there are."""
        if self.host is None:
            return max(1, min(int(min(size, 1e9)), len(self._universe())))
        return int(size) if 1 <= size <= len(self.host) else 1

    def _device(self, node: Any) -> Any:
        if self.host is None:
            return node
        device = self.device_of(node)
        return device if device in self.host else node

    def _workers_on(self, device: Any) -> list:
        return [w for w in self._views if self._device(w) == device]

    def _idle(self, node: Any) -> bool:
        """Runs nothing: it holds at most one case, which it runs only once it knows the next."""
        sent = self._sent.get(node, [])
        return not sent or (len(sent) == 1 and not node.shutting_down)

    def _free_devices(self) -> list:
        leased = {d for lease in self._leases for d in lease.devices}
        return [d for d in self._universe() if d not in leased and all(self._idle(w) for w in self._workers_on(d))]


class LeasedDevices:
    """Controller hooks: xdist's scheduler wrapped in Leases, and each worker told every device of
    the host (`devices`: (visibility variable, entries), what run/xdist.py's pinning made; None:
    the workers are not pinned)."""

    def __init__(self, devices: Optional[tuple] = None, directory: Optional[Path] = None):
        self.devices = devices
        self.directory = directory

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if self.devices:
            node.workerinput[HOST_DEVICES_KEY] = self.devices

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        inner = yield
        if inner is None or config.getvalue("dist") == "each":
            return inner
        variable, entries = self.devices if self.devices else (None, None)
        return Leases(inner, devices=entries, device_of=spec_device(variable), board=LeaseBoard(self.directory))
