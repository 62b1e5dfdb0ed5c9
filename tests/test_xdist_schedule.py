"""The cases under xdist (run/xdist_schedule.py): xdist's own schedulers deal the kernel cases,
driven here as DSession drives them, with fake workers that keep xdist's rules (a worker runs a
case once it knows the next one or was told to stop) on a simulated clock; the collective cases
run on leases of devices that nothing else uses meanwhile."""

import itertools

import pytest
from xdist.scheduler import LoadFileScheduling, LoadScheduling, WorkStealingScheduling

from pytest_opperf.catalog import load_builtin
from pytest_opperf.run.xdist import HOST_DEVICES_KEY
from pytest_opperf.run.xdist_schedule import LeasedDevices, Leases, group_size, is_collective_id

load_builtin()


def _collective(op: str, n: int, size: int) -> str:
    return f"benches/test_collectives.py::test_{op}[torch_dist-bf16-num_devices={n}-message_bytes={size}]"


def _kernels(count: int) -> list[str]:
    return [f"benches/test_matmul.py::test_gemm[torch-bf16-m={m}]" for m in range(count)]


KERNELS = _kernels(8) + [f"benches/test_norm.py::test_rms_norm[torch-fp32-n={n}]" for n in range(6)]
COLLECTIVES = [_collective("all_reduce", 4, 1024), _collective("all_gather", 2, 1024), _collective("broadcast", 4, 8),
               _collective("all_reduce", 2, 2048), _collective("send_recv", 2, 8)]
# The collective cases among the kernel cases, as a collection may hold them.
COLLECTION = KERNELS[:3] + COLLECTIVES[:2] + KERNELS[3:9] + COLLECTIVES[2:] + KERNELS[9:]
SCHEDULERS = [LoadScheduling, WorkStealingScheduling, LoadFileScheduling]
KERNEL_S, COLLECTIVE_S = 1.0, 3.0


class Spec:
    def __init__(self, device):
        self.env = {} if device is None else {"CUDA_VISIBLE_DEVICES": device}


class Gateway:
    def __init__(self, name: str, device):
        self.id = name
        self.spec = Spec(device)
        self.exited = False

    def exit(self):
        self.exited = True

    def join(self, timeout=None):
        pass


class Channel:
    def waitclose(self, timeout=None):
        pass


STOP = None  # the shutdown command in a worker's queue


class Worker:
    """A fake xdist worker, as the controller sees one (WorkerController). Like xdist's worker it
    runs the first case of its queue once it knows the next one or was told to stop, and nothing
    sent after the stop; its running case and the next one are out of reach of a steal."""

    def __init__(self, name: str, device, host: "Host"):
        self.gateway = Gateway(name, device)
        self.channel = Channel()
        self.workerinput = {"workerid": name}
        self.device = device
        self.host = host
        self.queue: list = []
        self.gone = False
        self.running = None  # (start, end) of the first case of the queue, while it runs

    def __repr__(self):
        return f"<Worker {self.gateway.id} on {self.device}>"

    @property
    def shutting_down(self) -> bool:
        return STOP in self.queue or self.gone

    def send_runtest_some(self, indices):
        assert not self.gone
        self.host.sends.append((self, [self.host.collection[i] for i in indices]))
        self.queue.extend(indices)

    def send_steal(self, indices):
        self.host.steals.append((self, list(indices)))

    def shutdown(self):
        if not self.gone:
            self.queue.append(STOP)

    def can_start(self) -> bool:
        return not self.gone and self.running is None and len(self.queue) >= 2 and self.queue[0] is not STOP

    def can_end(self) -> bool:
        return not self.gone and self.running is None and bool(self.queue) and self.queue[0] is STOP

    def pending(self) -> list[int]:
        return self.queue[:self.queue.index(STOP)] if STOP in self.queue else list(self.queue)

    def stealable(self) -> list[int]:
        return self.pending()[2 if self.running else 1:]


class Board:
    """What the leaders read: each case's lease, and which leases are ready."""

    def __init__(self):
        self.cases: dict[str, tuple] = {}
        self.readied: dict[int, float] = {}
        self.clock = lambda: 0.0

    def case(self, nodeid, lease):
        self.cases[nodeid] = (lease.id, lease.devices)

    def ready(self, lease):
        self.readied.setdefault(lease.id, self.clock())


class Host:
    """DSession's part, on a simulated clock: add the workers, schedule, start what each worker
    can start (a collective case once its lease is ready), complete the earliest, remove the
    workers that end; every run is kept as (start, end, worker, device, node id)."""

    def __init__(self, config, scheduler, devices=("0", "1"), workers=None, collection=COLLECTION,
                 pinned=True, durations=None):
        self.board = Board()
        self.board.clock = lambda: self.now
        self.devices = list(devices)
        self.pinned = pinned
        count = len(self.devices) if workers is None else workers
        self.sched = Leases(scheduler(config(count)), is_collective_id, devices=self.devices if pinned else None,
                            device_of=lambda node: node.device, board=self.board)
        self.collection = collection
        self.durations = durations or {}
        self.now = 0.0
        self.workers: list[Worker] = []
        self.runs: list[tuple] = []
        self.sends: list = []
        self.steals: list = []
        self.stolen: list[str] = []
        self.crashed: set[str] = set()
        self.names = itertools.count()
        for i in range(count):
            self.add_worker(self.devices[i % len(self.devices)], collect=False)
        for worker in self.workers:
            self.sched.add_node_collection(worker, collection)
        self.sched.schedule()

    def add_worker(self, device, collect: bool = True) -> Worker:
        worker = Worker(f"gw{next(self.names)}", device, self)
        self.workers.append(worker)
        self.sched.add_node(worker)
        if collect:
            self.sched.add_node_collection(worker, self.collection)
            self.sched.schedule()
        return worker

    def duration(self, nodeid: str) -> float:
        return self.durations.get(nodeid, COLLECTIVE_S if is_collective_id(nodeid) else KERNEL_S)

    def _startable(self, worker: Worker) -> bool:
        if not worker.can_start():
            return False
        nodeid = self.collection[worker.queue[0]]
        return not is_collective_id(nodeid) or self.board.cases[nodeid][0] in self.board.readied

    def start(self):
        for worker in self.workers:
            if self._startable(worker):
                worker.running = (self.now, self.now + self.duration(self.collection[worker.queue[0]]))

    def step(self) -> bool:
        """Start what can start, end what ended, complete the earliest case. False when nothing moves."""
        self.start()
        for worker in self.workers:
            if worker.can_end():
                worker.gone = True
                worker.workeroutput = {}
                if worker in self.sched.nodes:  # as worker_workerfinished
                    assert self.sched.remove_node(worker) is None
                self._after_event()
                return True
        running = [w for w in self.workers if w.running]
        if not running:
            return False
        worker = min(running, key=lambda w: w.running[1])
        start, self.now = worker.running
        worker.running = None
        index = worker.queue.pop(0)
        nodeid = self.collection[index]
        self.runs.append((start, self.now, worker, worker.device, nodeid))
        self.sched.mark_test_complete(worker, index, self.now - start)
        self._after_event()
        return True

    def _after_event(self):
        while self.steals:
            worker, indices = self.steals.pop(0)
            stolen = indices if set(indices) <= set(worker.stealable()) else []
            worker.queue = [i for i in worker.queue if i is STOP or i not in stolen or i in worker.queue[:1]]
            self.stolen += [self.collection[i] for i in stolen]
            self.sched.remove_pending_tests_from_node(worker, stolen)
        if self.sched.tests_finished:  # DSession.loop_once: triggershutdown
            for node in self.sched.nodes:
                node.shutdown()

    def run(self):
        while self.step():
            pass

    def crash(self, worker: Worker):
        """The worker dies: DSession removes it and reports its crash item (a replacement comes later)."""
        worker.gone = True
        worker.running = None
        crash = self.sched.remove_node(worker)
        self.crashed.add(crash)
        return crash

    def ran(self) -> list[str]:
        return [nodeid for *_, nodeid in self.runs]

    def collective_runs(self) -> list[tuple]:
        return [run for run in self.runs if is_collective_id(run[-1])]

    def check_leases(self):
        """Every collective case ran on its lease's devices with nothing else on them: from the
        start of its lease's first case to the end of its last (the group's life), no other worker
        on those devices ran anything, and the leader ran only that lease's cases."""
        by_lease: dict[int, list] = {}
        for run in self.collective_runs():
            by_lease.setdefault(self.board.cases[run[-1]][0], []).append(run)
        for lease, runs in by_lease.items():
            devices = set(self.board.cases[runs[0][-1]][1])
            leader = runs[0][2]
            start, end = min(r[0] for r in runs), max(r[1] for r in runs)
            assert {r[2] for r in runs} == {leader}
            assert self.board.readied[lease] <= start
            for s, e, worker, device, nodeid in self.runs:
                overlaps = s < end and e > start
                if not overlaps:
                    continue
                if worker is leader:
                    assert self.board.cases.get(nodeid, (None,))[0] == lease, f"{nodeid} inside lease {lease}"
                elif self.pinned:
                    assert device not in devices, f"{nodeid} on {device} beside lease {lease} {sorted(devices)}"
                else:
                    assert len(runs) and worker.gateway.id not in devices, f"{nodeid} beside lease {lease}"
        return by_lease

    def makespan(self) -> float:
        return max(e for _, e, *_ in self.runs)


@pytest.fixture
def config(pytester):
    """A controller's config for n workers (xdist's schedulers count the workers they wait for)."""
    return lambda n: pytester.parseconfig("--tx", f"{n}*popen")


def _each_once(host: Host, collection=COLLECTION):
    ran = host.ran()
    assert sorted(ran + [c for c in host.crashed if c]) == sorted(collection) and len(set(ran)) == len(ran)


@pytest.mark.parametrize("devices", [("0", "1"), ("0", "1", "2", "3")], ids=["2-devices", "4-devices"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_each_case_runs_once_and_a_group_shares_its_devices_with_nothing(config, scheduler, devices):
    host = Host(config, scheduler, devices)
    host.run()
    _each_once(host)
    leases = host.check_leases()
    assert host.sched.tests_finished and all(w.gone for w in host.workers)
    for runs in leases.values():  # a group larger than the host skips itself on one device
        size = group_size(runs[0][-1])
        assert len(host.board.cases[runs[0][-1]][1]) == (size if size <= len(devices) else 1)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_largest_groups_run_first_then_the_smaller_then_the_kernel_cases(config, scheduler):
    host = Host(config, scheduler, ("0", "1", "2", "3"))
    host.run()
    sizes = [group_size(n) for *_, n in sorted(host.collective_runs(), key=lambda r: r[0])]
    assert sizes == sorted(sizes, reverse=True) == [4, 4, 2, 2, 2]
    last_collective = max(e for _, e, *_ in host.collective_runs())
    assert min(s for s, _, _, _, n in host.runs if not is_collective_id(n)) >= last_collective - COLLECTIVE_S


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_on_four_devices_two_pairs_run_side_by_side_and_the_sweep_takes_its_share(config, scheduler):
    pairs = [_collective("all_reduce", 2, 2 ** i) for i in range(10)]
    collection = _kernels(40) + pairs + [_collective("all_reduce", 4, 2 ** i) for i in range(3)]
    host = Host(config, scheduler, ("0", "1", "2", "3"), collection=collection)
    host.run()
    _each_once(host, collection)
    host.check_leases()
    runs = [r for r in host.collective_runs() if group_size(r[-1]) == 2]
    assert any(a[0] < b[1] and b[0] < a[1] and set(host.board.cases[a[-1]][1]).isdisjoint(host.board.cases[b[-1]][1])
               for a, b in itertools.combinations(runs, 2))
    work = 40 * KERNEL_S + 10 * 2 * COLLECTIVE_S + 3 * 4 * COLLECTIVE_S  # device-seconds
    if scheduler is not LoadFileScheduling:  # loadfile gives one file's cases to one worker, by design
        assert host.makespan() <= work / 4 * 1.1  # every device busy: within 10% of a perfect packing


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_lenders_hold_no_case_while_they_wait(config, scheduler):
    # At the start every device is free: the groups form before the kernel cases are dealt, and
    # what xdist's first deal sends a lender is held back until its device is free again.
    host = Host(config, scheduler, ("0", "1", "2", "3"))
    first = min(host.collective_runs() or [None], key=lambda r: r[0]) if host.runs else None
    assert first is None
    while not host.collective_runs():
        assert host.step()
    run = host.collective_runs()[0]
    assert [w.queue for w in host.workers if w is not run[2]] == [[], [], []]
    host.run()
    _each_once(host)


@pytest.mark.parametrize("scheduler", [LoadScheduling, WorkStealingScheduling])
def test_two_workers_on_four_devices_lease_the_devices_no_worker_has(config, scheduler):
    host = Host(config, scheduler, ("0", "1", "2", "3"), workers=2)
    host.run()
    _each_once(host)
    host.check_leases()
    assert {len(host.board.cases[n][1]) for n in COLLECTIVES} == {2, 4}


@pytest.mark.parametrize("scheduler", [LoadScheduling, WorkStealingScheduling])
def test_four_workers_on_two_devices_wait_for_both_workers_of_each_device(config, scheduler):
    host = Host(config, scheduler, ("0", "1"), workers=4)
    host.run()
    _each_once(host)
    host.check_leases()
    assert all(len(host.board.cases[n][1]) == 1 for n in COLLECTIVES if group_size(n) == 4)  # too large: skips on one


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_unpinned_workers_are_slots_a_group_of_two_waits_for_two_idle_workers(config, scheduler):
    # A CPU: gloo's two ranks need two cores, so the other worker is idle while they run.
    host = Host(config, scheduler, ("a", "b"), pinned=False)
    host.run()
    _each_once(host)
    for start, end, leader, _, nodeid in host.collective_runs():
        assert not any(w is not leader and s < end and e > start for s, e, w, _, _ in host.runs), nodeid


@pytest.mark.parametrize("seed", range(40))
def test_any_host_and_mix_of_groups_ends_with_every_case_run_once_and_no_device_shared(config, seed):
    import random

    rng = random.Random(seed)
    count = rng.choice([2, 3, 4, 6, 8])
    devices = tuple(str(d) for d in range(count))
    sizes = [s for s in (2, 3, 4, 8) if rng.random() < 0.7] or [2]
    collection = _kernels(rng.randrange(0, 40)) + \
        [_collective(rng.choice(["all_reduce", "all_gather"]), rng.choice(sizes), 2 ** i) for i in range(rng.randrange(1, 20))]
    collection = list(dict.fromkeys(rng.sample(collection, len(collection))))
    durations = {n: rng.choice([0.1, 1.0, 5.0]) for n in collection}
    scheduler = rng.choice([LoadScheduling, WorkStealingScheduling])
    host = Host(config, scheduler, devices, workers=rng.choice([count, max(1, count // 2), count * 2]),
                collection=collection, durations=durations)
    crashes = rng.choice([0, 0, 1, 3])
    while host.step():
        running = [w for w in host.workers if w.running]
        if crashes and running and rng.random() < 0.05:  # a worker dies mid-case; xdist replaces it
            crashes -= 1
            dead = rng.choice(running)
            assert host.crash(dead) == host.collection[dead.queue[0]]  # the case it was running
            host.add_worker(dead.device)
    _each_once(host, collection)
    host.check_leases()
    assert host.sched.tests_finished and all(w.gone for w in host.workers)


def test_worksteal_steals_kernel_cases_only(config):
    host = Host(config, WorkStealingScheduling, durations={n: 5.0 for n in KERNELS[:4]})
    host.run()
    assert host.stolen and not any(map(is_collective_id, host.stolen))
    _each_once(host)


def _running_collective(host: Host) -> Worker:
    """Step until a worker runs a collective case (its second, so that one ran before); that worker."""
    while True:
        host.start()
        running = [w for w in host.workers if w.running and is_collective_id(host.collection[w.queue[0]])]
        if running and host.collective_runs():
            return running[0]
        assert host.step()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_leader_that_dies_in_a_collective_case_fails_it_and_the_others_run_elsewhere(config, scheduler):
    host = Host(config, scheduler, ("0", "1", "2", "3"))
    leader = _running_collective(host)
    dying = host.collection[leader.queue[0]]
    assert host.crash(leader) == dying
    replacement = host.add_worker(leader.device)
    host.run()
    assert dying not in host.ran()
    _each_once(host)
    host.check_leases()
    if scheduler is not LoadFileScheduling:  # loadfile had dealt every file before the replacement came
        assert any(worker is replacement for _, _, worker, _, _ in host.runs)


@pytest.mark.parametrize("scheduler", [LoadScheduling, WorkStealingScheduling])
def test_a_crashed_kernel_case_on_a_leader_is_its_crash_and_no_kernel_case_is_lost(config, scheduler):
    # A worker that led a lease and went back to kernel cases dies in one: that one is the crash.
    host = Host(config, scheduler, ("0", "1"))
    while not any(w.running and not is_collective_id(host.collection[w.queue[0]]) for w in host.workers):
        assert host.step()
    worker = next(w for w in host.workers if w.running and not is_collective_id(host.collection[w.queue[0]]))
    dying = host.collection[worker.queue[0]]
    assert host.crash(worker) == dying
    host.add_worker(worker.device)
    host.run()
    _each_once(host)


def test_a_lender_that_dies_is_replaced_as_a_lender(config):
    pairs = [n for n in COLLECTIVES if group_size(n) == 2]
    host = Host(config, LoadScheduling, ("0", "1"), collection=KERNELS + pairs)
    leader = _running_collective(host)
    lender = next(w for w in host.workers if w is not leader)
    assert lender.running is None and host.crash(lender) in (None, *KERNELS)  # it ran nothing: at most it held one
    replacement = host.add_worker(lender.device)
    assert replacement.queue == []  # its device is leased: nothing for it yet
    host.run()
    _each_once(host, KERNELS + pairs)
    host.check_leases()


def test_a_collective_case_marked_pending_again_runs_on_a_new_lease(config):
    # What a rerun plugin does in pytest_handlecrashitem, before DSession starts the replacement.
    host = Host(config, LoadScheduling, ("0", "1"))
    leader = _running_collective(host)
    crash = host.crash(leader)
    host.sched.mark_test_pending(crash)
    host.add_worker(leader.device)
    host.run()
    assert sorted(host.ran()) == sorted(COLLECTION)
    host.check_leases()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_only_collective_cases(config, scheduler):
    host = Host(config, scheduler, ("0", "1", "2", "3"), collection=COLLECTIVES)
    host.run()
    _each_once(host, COLLECTIVES)
    host.check_leases()
    assert host.sched.tests_finished and all(w.gone for w in host.workers)


def test_without_collective_cases_the_wrapper_changes_nothing(config):
    host = Host(config, LoadScheduling, collection=KERNELS)
    host.run()
    assert sorted(host.ran()) == sorted(KERNELS) and host.sched.tests_finished
    assert not host.board.cases and not any(w.gateway.exited for w in host.workers)


def test_the_workers_go_down_when_the_session_stops_early(config):
    # -x, or too many crashed workers: DSession shuts down every worker the scheduler names, and a
    # worker ignores what it is sent after that.
    host = Host(config, LoadScheduling)
    for node in host.sched.nodes:
        node.shutdown()
    host.run()
    assert all(w.gone for w in host.workers) and not host.sched.tests_finished


@pytest.mark.parametrize("nodeid, expected", [
    (_collective("all_reduce", 2, 1024), True),
    ("benches/test_collectives.py::TestX::test_all_to_all[nccl-bf16-num_devices=8-message_bytes=1]", True),
    ("benches/test_collectives.py::test_all_reduce[torch_dist-bf16-message_bytes=1024]", False),
    ("benches/test_collectives.py::test_all_reduce", False),
    ("benches/test_matmul.py::test_gemm[torch-bf16-num_devices=2]", False),
])
def test_a_collective_case_is_a_collective_op_with_a_group_size(nodeid, expected):
    assert is_collective_id(nodeid) is expected


def test_group_sizes_order_all_last():
    assert sorted(["x[num_devices=all]", "x[num_devices=8]", "x[num_devices=2]"], key=group_size) == \
        ["x[num_devices=2]", "x[num_devices=8]", "x[num_devices=all]"]


@pytest.mark.parametrize("dist, wrapped", [("load", True), ("worksteal", True), ("loadfile", True), ("each", False)])
def test_the_hook_wraps_every_scheduler_but_each(config, dist, wrapped):
    config = config(2)
    config.option.dist = dist
    inner = LoadScheduling(config)
    hook = LeasedDevices(("CUDA_VISIBLE_DEVICES", ["0", "1"])).pytest_xdist_make_scheduler(config, None)
    next(hook)
    with pytest.raises(StopIteration) as made:
        hook.send(inner)
    assert isinstance(made.value.value, Leases) is wrapped
    assert made.value.value is inner or (made.value.value.inner is inner and made.value.value.host == ["0", "1"])


def test_each_worker_is_told_every_device_of_the_host():
    host_devices = ("CUDA_VISIBLE_DEVICES", ["0", "1"])
    node = Worker("gw0", "0", None)
    LeasedDevices(host_devices).pytest_configure_node(node)
    assert node.workerinput[HOST_DEVICES_KEY] == host_devices
    bare = Worker("gw1", None, None)
    LeasedDevices(None).pytest_configure_node(bare)
    assert HOST_DEVICES_KEY not in bare.workerinput


def test_a_leader_reads_its_lease_and_waits_until_it_is_ready(tmp_path):
    from types import SimpleNamespace

    from pytest_opperf.run.xdist_schedule import Lease, LeaseBoard, lease_of, wait_ready

    board = LeaseBoard(tmp_path)
    lease = Lease(7, 2, ("2", "3"), leader=None, named=True)
    board.case("b.py::test_all_reduce[num_devices=2]", lease)
    worker = SimpleNamespace(workerinput={"opperf_crash_dir": str(tmp_path)})
    assert lease_of(worker, "b.py::test_all_reduce[num_devices=2]") == {"lease": 7, "devices": ["2", "3"]}
    assert lease_of(worker, "b.py::test_gemm") is None
    with pytest.raises(TimeoutError, match="lease 7"):
        wait_ready(worker, {"lease": 7, "devices": ["2", "3"]}, timeout_s=0.01)
    board.ready(lease)
    assert wait_ready(worker, {"lease": 7, "devices": ["2", "3"]}, timeout_s=0.01) < 0.01


# A real xdist session (unpinned workers: each one a slot): the collective cases write down where
# and when they ran, and find the other worker idle.
CONFTEST = """
def pytest_configure(config):
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        from pytest_opperf.catalog import load_builtin
        from pytest_opperf.run.xdist_schedule import LeasedDevices

        load_builtin()
        config.pluginmanager.register(LeasedDevices(), "leased-devices")
"""

CASES = """
import os, pathlib, time
import pytest

HERE = pathlib.Path(__file__).parent


def _log(line):
    with open(HERE / "log.txt", "a") as f:
        f.write(f"{time.monotonic():.4f} {os.environ['PYTEST_XDIST_WORKER']} {line}\\n")


@pytest.mark.parametrize("p", ["num_devices=2-message_bytes=8", "num_devices=2-message_bytes=16"])
def test_all_reduce(p):
    _log(f"start all_reduce[{p}]")
    time.sleep(0.2)
    _log(f"end all_reduce[{p}]")


@pytest.mark.parametrize("m", range(8))
def test_gemm(m):
    _log(f"start gemm[{m}]")
    time.sleep(0.05)
    _log(f"end gemm[{m}]")
"""


def test_under_xdist_a_group_of_two_runs_with_the_other_worker_idle(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-n", "2", "-p", "no:opperf", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=10)
    lines = [line.split() for line in (pytester.path / "log.txt").read_text().splitlines()]
    spans: dict[tuple, list] = {}
    for t, worker, what, case in lines:
        spans.setdefault((worker, case), []).append(float(t))
    collective = [(w, c, *ts) for (w, c), ts in spans.items() if c.startswith("all_reduce")]
    assert len(collective) == 2 and len({w for w, *_ in collective}) == 1
    for worker, case, start, end in collective:
        beside = [c for (w, c), (s, e) in spans.items() if w != worker and s < end and e > start]
        assert not beside, f"{case} ran beside {beside}"
    assert {w for (w, c) in spans if c.startswith("gemm")} == {"gw0", "gw1"}  # the kernel cases were shared
