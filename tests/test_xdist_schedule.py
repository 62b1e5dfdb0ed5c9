"""The collective cases under xdist (run/xdist_schedule.py): xdist's own schedulers hand out the
kernel cases, driven here as DSession drives them, with fake workers that keep xdist's rules; the
collective cases go to one worker, smallest groups first, once the other workers are gone."""

import pytest
from xdist.scheduler import LoadFileScheduling, LoadScheduling, WorkStealingScheduling

from pytest_opperf.catalog import load_builtin
from pytest_opperf.run.xdist import HOST_DEVICES_KEY
from pytest_opperf.run.xdist_schedule import CollectivesLast, CollectivesOnOneWorker, group_size, is_collective_id

load_builtin()


def _collective(op: str, n: int, size: int) -> str:
    return f"benches/test_collectives.py::test_{op}[torch_dist-bf16-num_devices={n}-message_bytes={size}]"


KERNELS = [f"benches/test_matmul.py::test_gemm[torch-bf16-m={m}]" for m in range(8)] + \
          [f"benches/test_norm.py::test_rms_norm[torch-fp32-n={n}]" for n in range(6)]
COLLECTIVES = [_collective("all_reduce", 4, 1024), _collective("all_gather", 2, 1024), _collective("broadcast", 4, 8),
               _collective("all_reduce", 2, 2048), _collective("send_recv", 2, 8)]
# The collective cases among the kernel cases, as a collection may hold them.
COLLECTION = KERNELS[:3] + COLLECTIVES[:2] + KERNELS[3:9] + COLLECTIVES[2:] + KERNELS[9:]
BY_GROUP = [COLLECTIVES[i] for i in (1, 3, 4, 0, 2)]  # num_devices 2, then 4; collection order within
SCHEDULERS = [LoadScheduling, WorkStealingScheduling, LoadFileScheduling]


class Gateway:
    def __init__(self, name: str):
        self.id = name
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
    runs a case once it knows the next one or was told to stop, and nothing sent after the stop."""

    def __init__(self, name: str, host: "Host"):
        self.gateway = Gateway(name)
        self.channel = Channel()
        self.workerinput = {"workerid": name}
        self.host = host
        self.queue: list = []
        self.gone = False

    def __repr__(self):
        return f"<Worker {self.gateway.id}>"

    @property
    def shutting_down(self) -> bool:
        return STOP in self.queue or self.gone

    def send_runtest_some(self, indices):
        self.host.sent(self, list(indices))
        self.queue.extend(indices)

    def send_steal(self, indices):
        self.host.steals.append((self, list(indices)))

    def shutdown(self):
        if not self.gone:
            self.queue.append(STOP)

    def can_run(self) -> bool:
        return not self.gone and len(self.queue) >= 2 and self.queue[0] is not STOP

    def can_end(self) -> bool:
        return not self.gone and bool(self.queue) and self.queue[0] is STOP

    def pending(self) -> list[int]:
        return self.queue[:self.queue.index(STOP)] if STOP in self.queue else list(self.queue)


class Host:
    """DSession's part: add the workers, schedule, report what they ran and remove those that end."""

    def __init__(self, config, scheduler, workers: int = 2, collection=COLLECTION):
        self.sched = CollectivesLast(scheduler(config), is_collective_id)
        self.collection = collection
        self.workers: list[Worker] = []
        self.ran: list[tuple[str, str]] = []  # (worker, node id) as they completed
        self.sends: list[tuple[Worker, list[str]]] = []
        self.steals: list = []
        self.stolen: list[str] = []
        self.crashed: set[str] = set()
        self.finished_early = False
        for _ in range(workers):
            self.add_worker(collect=False)
        for worker in self.workers:
            self.sched.add_node_collection(worker, collection)
        self.sched.schedule()

    def add_worker(self, collect: bool = True) -> Worker:
        worker = Worker(f"gw{len(self.workers)}", self)
        self.workers.append(worker)
        self.sched.add_node(worker)
        if collect:
            self.sched.add_node_collection(worker, self.collection)
            self.sched.schedule()
        return worker

    def sent(self, worker: Worker, indices: list[int]):
        ids = [self.collection[i] for i in indices]
        self.sends.append((worker, ids))
        if any(is_collective_id(i) for i in ids):
            others = [w for w in self.workers if w is not worker]
            assert all(w.gone for w in others), "a collective case sent beside a live worker"
            assert all(w.gateway.exited for w in others if hasattr(w, "workeroutput")), "a finished worker still there"
            queued = {self.collection[i] for i in worker.pending()}
            kernels = {n for n in self.collection if not is_collective_id(n)}
            unrun = kernels - {n for _, n in self.ran} - self.crashed
            assert unrun <= queued, "a collective case sent before the kernel cases"

    def step(self, worker: Worker) -> bool:
        """One event of `worker`: a case completes, or it ends. False when it has nothing to do."""
        if worker.can_run():
            index = worker.queue.pop(0)
            self.ran.append((worker.gateway.id, self.collection[index]))
            self.sched.mark_test_complete(worker, index, 0.0)
        elif worker.can_end():
            worker.gone = True
            worker.workeroutput = {}
            if worker in self.sched.nodes:  # as worker_workerfinished
                assert self.sched.remove_node(worker) is None
        else:
            return False
        self._after_event()
        return True

    def _after_event(self):
        while self.steals:
            worker, indices = self.steals.pop(0)
            stolen = indices if set(indices) <= set(worker.pending()) else []
            worker.queue = [i for i in worker.queue if i is STOP or i not in stolen]
            self.stolen += [self.collection[i] for i in stolen]
            self.sched.remove_pending_tests_from_node(worker, stolen)
        if self.sched.tests_finished:  # DSession.loop_once: triggershutdown
            self.finished_early |= len(self.ran) < len(self.collection)
            for node in self.sched.nodes:
                node.shutdown()

    def run(self, pattern=(0, 1, 1)):
        """Until no worker moves; `pattern` says whose turn it is (gw1 twice as fast as gw0, ...)."""
        turn = 0
        while any(w.can_run() or w.can_end() for w in self.workers):
            worker = self.workers[pattern[turn % len(pattern)] % len(self.workers)]
            if not self.step(worker):
                any(self.step(other) for other in self.workers)
            turn += 1

    def crash(self, worker: Worker):
        """The worker dies: DSession removes it and reports its crash item (a replacement comes later)."""
        worker.gone = True
        crash = self.sched.remove_node(worker)
        self.crashed.add(crash)
        return crash

    def collective_runs(self) -> list[tuple[str, str]]:
        return [(w, n) for w, n in self.ran if is_collective_id(n)]

    def until_a_collective_ran(self) -> Worker:
        """Step until the kept worker completed its first collective case; that worker."""
        while not self.collective_runs():
            assert any(self.step(w) for w in self.workers)
        return next(w for w in self.workers if w.gateway.id == self.collective_runs()[0][0])


@pytest.fixture
def config(pytester):
    return pytester.parseconfig("--tx", "2*popen")


@pytest.mark.parametrize("pattern", [(0, 1, 1), (0, 0, 0, 1), (1,)], ids=["gw1-faster", "gw0-faster", "gw1-alone"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_collective_cases_run_last_on_one_worker_smallest_groups_first(config, scheduler, pattern):
    host = Host(config, scheduler)
    host.run(pattern)
    ran = [n for _, n in host.ran]
    assert sorted(ran) == sorted(COLLECTION) and len(set(ran)) == len(ran)  # each case once
    runs = host.collective_runs()
    assert [n for _, n in runs] == BY_GROUP and ran[-len(BY_GROUP):] == BY_GROUP
    assert len({w for w, _ in runs}) == 1
    assert [ids for _, ids in host.sends if is_collective_id(ids[0])] == [BY_GROUP]  # one send
    assert host.sched.tests_finished and not host.finished_early
    assert all(w.gone for w in host.workers)


def test_worksteal_steals_kernel_cases_only(config):
    host = Host(config, WorkStealingScheduling)
    host.run((0, 1, 1, 1))
    assert host.stolen and not any(map(is_collective_id, host.stolen))
    assert [n for _, n in host.collective_runs()] == BY_GROUP


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_other_worker_is_ended_before_the_collective_cases_and_the_kept_one_after(config, scheduler):
    host = Host(config, scheduler)
    host.run()
    kept = next(w for w in host.workers if w.gateway.id == host.collective_runs()[0][0])
    other = next(w for w in host.workers if w is not kept)
    assert other.gateway.exited and not kept.gateway.exited  # xdist ends the last one at the session's end


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_worker_that_dies_in_a_collective_case_fails_it_and_a_replacement_runs_the_rest(config, scheduler):
    host = Host(config, scheduler)
    kept = host.until_a_collective_ran()
    assert not host.sched.tests_finished and host.sched.has_pending
    assert host.crash(kept) == BY_GROUP[1]  # it died in the second
    sends = len(host.sends)
    replacement = host.add_worker()
    assert host.sends[sends:] == [(replacement, BY_GROUP[2:])]
    host.run()
    assert [n for _, n in host.collective_runs()] == [BY_GROUP[0], *BY_GROUP[2:]]
    assert host.sched.tests_finished and host.sched.nodes == []


def test_a_collective_case_marked_pending_again_goes_to_the_replacement_with_the_others(config):
    # What a rerun plugin does in pytest_handlecrashitem, before DSession starts the replacement.
    host = Host(config, LoadScheduling)
    crash = host.crash(host.until_a_collective_ran())
    host.sched.mark_test_pending(crash)
    host.add_worker()
    host.run()
    assert [n for _, n in host.collective_runs()] == BY_GROUP


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_worker_dying_in_its_last_kernel_case_holds_the_collective_cases_for_its_replacement(config, scheduler):
    host = Host(config, scheduler)
    while not any(w.shutting_down and w.pending() for w in host.workers):
        assert any(host.step(w) for w in host.workers)  # until one is let go with a case still to run
    dying = next(w for w in host.workers if w.shutting_down)
    kept = next(w for w in host.workers if w is not dying)
    assert host.crash(dying) in KERNELS
    assert not any(is_collective_id(n) for _, ids in host.sends for n in ids)
    host.add_worker()
    host.run()
    runs = host.collective_runs()
    assert [n for _, n in runs] == BY_GROUP and {w for w, _ in runs} == {kept.gateway.id}


# loadfile's scheduler itself cannot hand work to a worker before its collection (xdist's own KeyError).
@pytest.mark.parametrize("scheduler", [LoadScheduling, WorkStealingScheduling])
def test_a_crash_while_a_replacement_is_still_collecting_sends_it_cases_it_will_hold(config, scheduler):
    # Two crashes in a row (tests/test_multigpu.py's crashing cases, CI 2026-11-26): the first
    # worker's replacement joins, and before its collection arrives the second crash hands the
    # dead worker's cases out to every worker, the replacement too. xdist may send to a worker that
    # has not collected yet (every worker collects the same items); the wrapper mapped its indices
    # through the worker's own collection, which it did not have yet: IndexError, INTERNALERROR.
    host = Host(config, scheduler)
    for _ in range(3):
        assert any(host.step(w) for w in host.workers)
    first, second = host.workers
    host.crash(first)
    replacement = host.add_worker(collect=False)
    host.crash(second)
    host.sched.add_node_collection(replacement, COLLECTION)
    host.sched.schedule()
    host.add_worker()  # the second crash's replacement, as DSession starts one
    host.run()
    ran = [n for _, n in host.ran]
    assert sorted(ran + sorted(host.crashed)) == sorted(COLLECTION) and len(set(ran)) == len(ran)
    assert [n for _, n in host.collective_runs()] == BY_GROUP
    assert host.sched.tests_finished and host.sched.nodes == []


def test_a_replacement_that_dies_before_its_collection_is_removed_cleanly(config):
    host = Host(config, LoadScheduling)
    host.crash(host.workers[0])
    replacement = host.add_worker(collect=False)
    replacement.gone = True
    host.sched.remove_node(replacement)  # no KeyError: it never collected
    host.add_worker()  # its own replacement
    host.run()
    assert [n for _, n in host.collective_runs()] == BY_GROUP


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_only_collective_cases_go_to_the_first_worker_and_the_others_leave(config, scheduler):
    host = Host(config, scheduler, collection=COLLECTIVES)
    assert host.workers[1].shutting_down and not host.sends
    host.run()
    assert host.collective_runs() == [("gw0", n) for n in BY_GROUP]
    assert host.sched.tests_finished


def test_without_collective_cases_the_wrapper_changes_nothing(config):
    host = Host(config, LoadScheduling, collection=KERNELS)
    host.run()
    assert sorted(n for _, n in host.ran) == sorted(KERNELS) and host.sched.tests_finished
    assert not any(w.gateway.exited for w in host.workers)


@pytest.mark.parametrize("kept", [False, True], ids=["at-once", "after-one-was-kept"])
def test_the_workers_go_down_when_the_session_stops_early(config, kept):
    # -x, or too many crashed workers: DSession shuts down every worker the scheduler names, and a
    # worker ignores what it is sent after that.
    host = Host(config, LoadScheduling)
    while kept and not any(w.shutting_down for w in host.workers):  # the other one was let go first
        assert any(host.step(w) for w in host.workers)
    for node in host.sched.nodes:
        node.shutdown()
    host.run()
    assert not any(is_collective_id(n) for _, ids in host.sends for n in ids)
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
    config.option.dist = dist
    inner = LoadScheduling(config)
    hook = CollectivesOnOneWorker().pytest_xdist_make_scheduler(config, None)
    next(hook)
    with pytest.raises(StopIteration) as made:
        hook.send(inner)
    assert isinstance(made.value.value, CollectivesLast) is wrapped
    assert made.value.value is inner or made.value.value.inner is inner


def test_each_worker_is_told_every_device_of_the_host():
    host_devices = ("CUDA_VISIBLE_DEVICES", ["0", "1"])
    node = Worker("gw0", None)
    CollectivesOnOneWorker(host_devices).pytest_configure_node(node)
    assert node.workerinput[HOST_DEVICES_KEY] == host_devices
    bare = Worker("gw1", None)
    CollectivesOnOneWorker(None).pytest_configure_node(bare)
    assert HOST_DEVICES_KEY not in bare.workerinput


# A real xdist session: the collective cases write down where and when they ran, and find the other
# worker's process gone.
CONFTEST = """
def pytest_configure(config):
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        from pytest_opperf.catalog import load_builtin
        from pytest_opperf.run.xdist_schedule import CollectivesOnOneWorker

        load_builtin()
        config.pluginmanager.register(CollectivesOnOneWorker(), "collectives-on-one-worker")
"""

CASES = """
import os, pathlib, time
import pytest

HERE = pathlib.Path(__file__).parent


def _log(line):
    with open(HERE / "log.txt", "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {line}\\n")


@pytest.mark.parametrize("p", ["num_devices=4-message_bytes=8", "num_devices=2-message_bytes=8"])
def test_all_reduce(p):
    me = os.environ["PYTEST_XDIST_WORKER"]
    for path in HERE.glob("gw*.pid"):
        if path.stem != me:
            with pytest.raises(ProcessLookupError):
                os.kill(int(path.read_text()), 0)
    _log(f"all_reduce[{p}]")


@pytest.mark.parametrize("p", ["num_devices=2-message_bytes=16"])
def test_broadcast(p):
    _log(f"broadcast[{p}]")


@pytest.mark.parametrize("m", range(8))
def test_gemm(m):
    (HERE / f"{os.environ['PYTEST_XDIST_WORKER']}.pid").write_text(str(os.getpid()))
    time.sleep(0.05)
    _log(f"gemm[{m}]")
"""


def test_under_xdist_the_collective_cases_run_last_on_one_worker(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-n", "2", "-p", "no:opperf", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=11)
    lines = [line.split() for line in (pytester.path / "log.txt").read_text().splitlines()]
    assert {w for w, _ in lines} == {"gw0", "gw1"}  # the kernel cases were shared
    last = lines[-3:]  # after every kernel case, on one worker, num_devices=2 first
    assert [c for _, c in last] == ["all_reduce[num_devices=2-message_bytes=8]",
                                    "broadcast[num_devices=2-message_bytes=16]", "all_reduce[num_devices=4-message_bytes=8]"]
    assert len({w for w, _ in last}) == 1


def test_a_worker_pinned_to_one_gpu_expands_num_devices_all_to_the_hosts_gpus():
    # -n 2 on a 2-GPU host: each worker sees one GPU (CUDA_VISIBLE_DEVICES), and `num_devices: [all]`
    # must still mean 2, or every such case vanishes from the collection (seen on 2 H200s: 110 of 132).
    from types import SimpleNamespace

    from pytest_opperf.run.collect import Collection

    collection = Collection.__new__(Collection)
    collection.env = SimpleNamespace(world=None, device=SimpleNamespace(type="cuda"))
    collection.config = SimpleNamespace(workerinput={"opperf_host_devices": ("CUDA_VISIBLE_DEVICES", ["0", "1"])})
    assert collection._ranks_available() == 2
