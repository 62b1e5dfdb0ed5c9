"""The rank side of a collective benchmark: the commands each rank process (measure/rankserver.py) runs.

The controlling process (run/collective.py) starts `num_devices` of these once per group size
and sends each of them the same commands, one at a time; each rank answers every command:

    case     build this rank's send buffer from its own seed, compute the reference of its output
             from every rank's buffer (regenerated from their seeds), run the collective once and
             compare: the functional check
    measure  the rest of the case among the ranks, with no round trip to the controller: warm-up,
             samples until the stopping rule is met, one more call made as the samples were and
             compared with the reference again, the buffers dropped. The ranks exchange what they
             measured after each batch of samples (a gloo all_gather of a few numbers): every rank
             holds the same samples and takes the leader's (rank 0's) clock and counts, so all
             make the same calls and stop together.

and, for probes and tests, the measure command's parts one at a time: warmup (`calls` untimed
calls), sample (`count` timed samples, this rank's own), verify, end_case.

How a sample is timed, by the convention (CONVENTIONS, docs/collectives.md):
  loop    nccl-tests' own: the ranks meet at a barrier, then each makes `iters` calls back to
          back between one pair of host clock readings (the last call waited for) and divides;
          a sample is the mean of the ranks' (nccl-tests' -a 1). The default.
  graph   nccl-tests' -G: the `iters` calls captured once in a CUDA graph, each sample one
          replay between host clock readings, divided; the mean of the ranks. CUDA only.
  single  one call per sample: with the `cpu` timer the ranks meet at a barrier and each reads
          the host clock around the call and a synchronize; with `event`, device events around
          the call after a spin kernel that keeps the device busy while the host queues it. A
          sample is the slowest rank's (the call is done when every rank is).

No pytest here: an error becomes an ("error", text) answer and the controller decides.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pytest_opperf.measure import accelerator, check
from pytest_opperf.measure.sampler import next_batch
from pytest_opperf.measure.stats import Stats, StoppingRule

CONVENTIONS = ("loop", "graph", "single")
LOOP_SAMPLE_S = 0.05  # the longest a `loop` or `graph` sample grows before it takes fewer calls
LOOP_CALLS = 20  # nccl-tests' default -n: the calls a `graph` captures
# The shortest a sample of many calls is: a sample of 20 small calls lasts a few hundred
# microseconds, and the host's jitter (a rank released late, an interrupt) is then a large share
# of it; more calls in one sample average it out (docs/collectives.md, "Stable rows").
MIN_SAMPLE_S = 0.002
# Samples of many calls between two exchanges of the ranks. Small messages in a loop are bound by
# the host's launches, and back to back for a second they drift between two rates (2x H200: 9 and
# 12 us a 1 KiB all_to_all, CV 0.16); met after every second sample, as nccl-tests' ranks meet
# before each of theirs, the rows read one rate, CV 0.02 (docs/collectives.md, "A case at the cost
# of its statistics").
SAMPLE_BATCH = 2
WARMUP_CALLS = 3  # a collective's warm-up makes at least this many calls
WARMUP_ROUND_S = 0.002  # a warm-up round lasts about this long (one call at least)
# nccl-tests moves its buffers by one message each call (-n 20 calls, -e 1G: the span it moves in),
# so a message the L2 holds is not re-read from it by every call; the nccl backend's loop and graph
# do the same, or 1-4 MiB rows would read the L2 where nccl-tests reads memory.
ROTATION_CALLS = 20
ROTATION_SPAN = 2**30


def loop_calls(per_call_s: float, min_sample_s: float = MIN_SAMPLE_S) -> int:
    """Calls in one sample of the `loop` convention: enough for min_sample_s, fewer where that
    would take longer than LOOP_SAMPLE_S (a call of milliseconds is timed alone: nccl-tests' 20
    calls a sample would cost 20 calls a sample and read the same).

    >>> loop_calls(10e-6), loop_calls(200e-6), loop_calls(3.2e-3), loop_calls(1.0)
    (200, 10, 1, 1)
    """
    per_call_s = max(per_call_s, 1e-9)
    wanted = math.ceil(min_sample_s / per_call_s)
    return max(1, min(wanted, int(LOOP_SAMPLE_S / per_call_s)))


def sample_shape(convention: str, per_call_s: float, min_sample_s: float = MIN_SAMPLE_S) -> tuple[int, int]:
    """(calls between clock readings or captured in the graph, graph replays a sample).

    `loop`: loop_calls, one pass. `graph`: nccl-tests' -n 20 -G R, 20 calls captured once (fewer
    where 20 exceed LOOP_SAMPLE_S) and replayed R times back to back for min_sample_s: a graph of
    400 collectives replays slower a call than one of 20 (docs/collectives.md, "Stable rows").

    >>> sample_shape("loop", 10e-6), sample_shape("graph", 10e-6), sample_shape("single", 10e-6)
    ((200, 1), (20, 10), (1, 1))
    """
    if convention == "single":
        return 1, 1
    if convention == "loop":
        return loop_calls(per_call_s, min_sample_s), 1
    per_call_s = max(per_call_s, 1e-9)
    iters = max(1, min(LOOP_CALLS, int(LOOP_SAMPLE_S / per_call_s)))
    per_replay = per_call_s * iters
    return iters, max(1, min(math.ceil(min_sample_s / per_replay), int(LOOP_SAMPLE_S / per_replay)))


def rotation_slots(send_bytes: int, recv_bytes: int) -> int:
    """How many buffer pairs a call moves through: nccl-tests' min(calls, span / the larger buffer).

    >>> rotation_slots(1024, 1024), rotation_slots(2**26, 2**26), rotation_slots(2**28, 2**29), rotation_slots(2**30, 2**30)
    (20, 16, 2, 1)
    """
    return max(1, min(ROTATION_CALLS, ROTATION_SPAN // max(send_bytes, recv_bytes, 1)))


@dataclass
class Comm:
    """What a collective backend gets besides its buffers: the group, this rank, the case.

        def all_reduce_torch(x, out, comm):
            dist.all_reduce(out, op=comm.reduce_op, group=comm.group)
            return out
    """

    group: Any  # torch.distributed ProcessGroup (None: the default group, all ranks of the case)
    rank: int
    size: int
    params: dict
    # A gloo group of the same ranks, for plain data on the host (None: `group` is gloo already,
    # or there is none): a backend's own communicator agrees on its id over it.
    control: Any = None

    @property
    def host_group(self):
        """The group to exchange plain Python values over: `control`, else `group`."""
        return self.control if self.control is not None else self.group

    @property
    def reduce_op(self):
        """The case's `reduce_op` as a torch.distributed.ReduceOp (SUM for ops without one)."""
        import torch.distributed as dist

        return getattr(dist.ReduceOp, self.params.get("reduce_op", "sum").upper())


class SendBuffers(Sequence):
    """Every rank's send buffer, as a sequence: `sent[r]` regenerates rank r's from its seed.

    One buffer is made at a time (a reference that folds them in holds one, not n), and the
    rank's own is kept as given. `list(sent)` makes them all, for a reference that needs that.
    """

    def __init__(self, make: Callable[[int], Any], count: int, known: Optional[dict] = None):
        self.make, self.count, self.known = make, count, dict(known or {})

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(self.count))]
        if not -self.count <= rank < self.count:
            raise IndexError(f"rank {rank} of {self.count}")
        rank %= self.count
        return self.known[rank] if rank in self.known else self.make(rank)


class RankWork:
    """One rank's part of a collective case: the commands every rank of a group runs in step.

    A rank process driven over a pipe (RankServer, below) and a torchrun rank that is itself a
    member of the group (run/collective.py) run the same commands.
    """

    def __init__(self, rank: int, size: int, device_type: str, device, group=None, control=None):
        self.rank, self.world = rank, size
        self.device_type, self.device = device_type, device
        self.group = group  # the collective's group (None: the default group)
        self.control = control  # the group the ranks meet in before a sample (None: `group`)
        self.case: Optional[dict] = None
        self.graph = None  # the captured calls of the `graph` convention, per case
        self.raw_stream = None  # the stream a bound backend's graph is captured and launched on (cudart)
        self.floor: Optional[float] = None  # the check's detection floor on the case (check.examine)

    def do_case(self, parts: dict, params: dict, dtypes, seeds: list, tolerance: float,
                need_bytes: Optional[float] = None) -> dict:
        """parts: the op's `inputs`, `reference`, `output`, `prepare` and the backend `fn` (functions
        travel by name: this process imports their modules). need_bytes: the op's estimate of what a
        rank holds; a device with less free is skipped before anything is made ({"skip": why})."""
        import torch

        short = self._short_of(need_bytes)
        if short:
            return {"skip": short}
        with torch.inference_mode():
            def make(rank: int):
                gen = torch.Generator(self.device).manual_seed(seeds[rank])
                return parts["inputs"](params, dtypes, self.device, gen)[0]

            # Every rank's send buffer from that rank's seed: the same values the other ranks send,
            # made one at a time as the reference reads them. A backend may say where its own buffers
            # live (`fn.buffers(group)`: a context they are made in; the nccl backend's: NCCL's memory).
            place = getattr(parts["fn"], "buffers", None)
            with place(self.group) if place is not None else contextlib.nullcontext():
                x = make(self.rank)
                out = parts["output"](x, self.world)
            reference = parts["reference"](SendBuffers(make, len(seeds), {self.rank: x}), self.rank, params)
        comm = Comm(self.group, self.rank, self.world, params, self.control)
        self.case = {"fn": parts["fn"], "x": x, "out": out, "comm": comm, "prepare": parts["prepare"],
                     "reference": reference, "dtype": dtypes.output, "tolerance": tolerance}
        self.graph = None
        start = time.perf_counter()
        problem = self._checked_call()
        answer = {"problem": problem, "first_call_ms": (time.perf_counter() - start) * 1e3, "floor": self.floor}
        if problem is None:
            answer["loop_driver"] = self.loop_driver()
        return answer

    def _short_of(self, need_bytes: Optional[float]) -> Optional[str]:
        """Why this rank's device cannot hold the case (None: it can, or its free memory is unknown)."""
        if not need_bytes or self.device_type == "cpu":
            return None
        import torch

        module = getattr(torch, self.device_type, None)
        if module is None or not hasattr(module, "mem_get_info"):
            return None
        free, total = module.mem_get_info(self.device)  # do_end_case gave back what the last case cached
        if need_bytes <= free:
            return None
        return (f"needs {need_bytes / 2**30:.2f} GiB on each rank's device; rank {self.rank}'s {self.device} has "
                f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB")

    def do_warmup(self, calls: int) -> None:
        import torch

        with torch.inference_mode():
            for _ in range(calls):
                self._call()
        accelerator.synchronize(self.device_type)

    def do_sample(self, count: int, timer: str, convention: str = "single", iters: int = 1,
                  replays: int = 1) -> list[float]:
        """`count` samples, this rank's time of one call in each, in microseconds (CONVENTIONS).

        Python's collector is off while they are taken: a full collection of a process that
        imported torch takes tens of milliseconds, and one inside a host-timed sample of a
        fraction of a millisecond is an outlier hundreds of times the rest."""
        import torch

        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.inference_mode():
                if convention == "loop":
                    return self._loop_samples(count, iters)
                if convention == "graph":
                    return self._graph_samples(count, iters, replays)
                return self._host_samples(count) if timer == "cpu" else self._event_samples(count)
        finally:
            if collecting:
                gc.enable()

    def do_verify(self) -> Optional[str]:
        return self._checked_call()

    def do_measure(self, timer: str, convention: str, rule: tuple, warmup_s: float,
                   min_sample_s: float = MIN_SAMPLE_S, batch: int = SAMPLE_BATCH) -> dict:
        """The case after its check, among the ranks: warm-up, samples until `rule` (a StoppingRule's
        fields) stops them, the timed-call check, the buffers dropped (module docstring).

        Every rank answers the same: the samples (each the ranks' mean for `loop` and `graph`, as
        nccl-tests' -a 1, the slowest rank's for `single`: its call is done when every rank's is),
        the warm-up's calls and the leader's seconds a call, the sample's shape, and the phases'
        seconds; `problem` is this rank's timed-call check (None: it passed)."""
        import torch

        rule = StoppingRule(*rule)
        began = time.perf_counter()
        collecting = gc.isenabled()
        gc.disable()  # as in do_sample: a collection inside a sample is an outlier of tens of ms
        try:
            with torch.inference_mode():
                bound = self._bound(rotate=True) if convention == "loop" else None
                calls, per_call = self._warm(warmup_s, bound)
                # the leader's shape: a rank that sized its samples otherwise would wait forever
                iters, replays = (int(v) for v in self._gathered(sample_shape(convention, per_call, min_sample_s))[0])
                if convention == "graph":
                    self._graph_samples(1, iters, replays)  # the capture, and one untimed replay of it
                warmed = time.perf_counter()
                samples = self._sampled(rule, timer, convention, iters, replays, bound, batch)
        finally:
            if collecting:
                gc.enable()
        sampled = time.perf_counter()
        problem = self._checked_call()
        self.do_end_case()
        return {"samples": samples, "warmup_calls": calls, "per_call_s": per_call, "iters": iters,
                "replays": replays, "problem": problem,
                "phase_s": {"warmup": warmed - began, "sampling": sampled - warmed,
                            "verify": time.perf_counter() - sampled}}

    def _warm(self, warmup_s: float, bound=None) -> tuple[int, float]:
        """Rounds of calls, each waited for, until WARMUP_CALLS are made and warmup_s has passed on
        the leader's clock; (calls, the leader's seconds a call in the last round). A round lasts
        about WARMUP_ROUND_S, sized from the leader's last round: every rank makes the same calls."""
        c = self.case
        calls, size = 0, 1
        start = time.perf_counter()
        while True:
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])
            t0 = time.perf_counter()
            if bound is not None:
                bound.repeat(size)
            else:
                for _ in range(size):
                    c["fn"](c["x"], c["out"], c["comm"])
            accelerator.synchronize(self.device_type)
            now = time.perf_counter()
            calls += size
            elapsed, per_call = self._gathered([now - start, (now - t0) / size])[0]  # the leader's
            if calls >= WARMUP_CALLS and elapsed >= warmup_s:
                return calls, per_call
            size = max(1, min(2 * size, round(WARMUP_ROUND_S / max(per_call, 1e-9))))

    def _sampled(self, rule: StoppingRule, timer: str, convention: str, iters: int, replays: int,
                 bound=None, batch: int = SAMPLE_BATCH) -> list[float]:
        """Samples until `rule` is done by the leader's clock, `batch` at a time for the loop and
        graph conventions (SAMPLE_BATCH); for `single`, one call a sample, the rule's min_samples
        first, then as many as the median's interval says the target needs (sampler.next_batch).
        After a batch the ranks gather each other's times: every rank then holds the same samples
        and makes the same decision."""
        combine = max if convention == "single" else _mean
        samples: list[float] = []
        stats, elapsed = None, 0.0
        start = time.perf_counter()
        size = rule.min_samples if convention == "single" else batch
        while not rule.done(stats, elapsed):
            size = max(1, min(size, rule.max_samples - len(samples)))
            began = time.perf_counter()
            times = self._timed(size, timer, convention, iters, replays, bound)
            now = time.perf_counter()
            rows = self._gathered([*times, now - start, now - began])
            samples.extend(combine(column) for column in zip(*(row[:size] for row in rows)))
            elapsed, took = rows[0][size:]
            stats = Stats(samples)
            if convention == "single":
                size = next_batch(stats, rule, 1, took / size, rule.budget_s - elapsed)
        return samples

    def _timed(self, count: int, timer: str, convention: str, iters: int, replays: int, bound=None) -> list[float]:
        if convention == "loop":
            return self._loop_samples(count, iters, bound)
        if convention == "graph":
            return self._graph_samples(count, iters, replays)
        return self._host_samples(count) if timer == "cpu" else self._event_samples(count)

    def _gathered(self, values: list) -> list[list[float]]:
        """Every rank's `values` (the same count on each), in rank order, on every rank: a gloo
        all_gather on the host, where the ranks meet before a sample."""
        import torch
        import torch.distributed as dist

        if self.world == 1:
            return [[float(v) for v in values]]
        mine = torch.tensor(values, dtype=torch.float64)
        rows = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine, group=self.control if self.control is not None else self.group)
        return [row.tolist() for row in rows]

    def do_end_case(self) -> None:
        self.case = None
        self.graph = None
        gc.collect()
        if self.device_type != "cpu":
            import torch

            module = getattr(torch, self.device_type, None)
            if module is not None and hasattr(module, "empty_cache"):
                module.empty_cache()

    # --- calls ------------------------------------------------------------------------------

    def _call(self) -> Any:
        c = self.case
        if c["prepare"] is not None:
            c["prepare"](c["x"], c["out"], c["comm"])
        return c["fn"](c["x"], c["out"], c["comm"])

    def _checked_call(self) -> Optional[str]:
        """One call on a receive buffer filled with NaN (floats), compared with the reference."""
        import torch

        c = self.case
        with torch.inference_mode():
            if c["out"].dtype.is_floating_point:
                c["out"].fill_(float("nan"))  # a part the collective did not write cannot pass
            out = self._call()
            accelerator.synchronize(self.device_type)
            problem, self.floor = check.examine(out, c["reference"], c["dtype"], c["tolerance"])
        return None if problem is None else f"rank {self.rank}: {problem}"

    def _meet(self) -> None:
        """Every rank starts its clock as the others arrive, with nothing of its own queued."""
        import torch.distributed as dist

        accelerator.synchronize(self.device_type)
        dist.barrier(group=self.control if self.control is not None else self.group)

    def _host_samples(self, count: int) -> list[float]:
        c, times = self.case, []
        for _ in range(count):
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])
            self._meet()
            t0 = time.perf_counter_ns()
            c["fn"](c["x"], c["out"], c["comm"])
            accelerator.synchronize(self.device_type)  # an accelerator's collective returns before it is done
            times.append((time.perf_counter_ns() - t0) / 1e3)
        return times

    def _event_samples(self, count: int) -> list[float]:
        import torch

        c = self.case
        pairs = [(torch.Event(device=self.device, enable_timing=True),
                  torch.Event(device=self.device, enable_timing=True)) for _ in range(count)]
        for start, end in pairs:
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])
            accelerator.hold_device(self.device_type)
            start.record()
            c["fn"](c["x"], c["out"], c["comm"])
            end.record()
        accelerator.synchronize(self.device_type)
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]

    def _align(self) -> None:
        """The ranks meet at the host barrier, then make one untimed call and wait for it: a host
        barrier releases the ranks hundreds of microseconds apart (gloo, 2 H100s: a 1 KiB loop of 20
        calls read 47 us a call against nccl-tests' 16.5), and a rank released early would wait out
        the others inside its first timed call; the call ends on every rank within microseconds."""
        c = self.case
        self._meet()
        c["fn"](c["x"], c["out"], c["comm"])
        accelerator.synchronize(self.device_type)

    def _bound(self, rotate: bool = False):
        """The case's call bound once on the current stream (the backend's `bind(x, out, comm)`: a
        BoundCall whose `repeat(n)` makes n calls below Python), or None where the backend has no
        `bind`. rotate: over nccl-tests' moving buffers (rotation_slots), slot 0 the checked one."""
        c = self.case
        bind = getattr(c["fn"], "bind", None)
        if bind is None:
            return None
        if not rotate:
            return bind(c["x"], c["out"], c["comm"])
        if "rotation" not in c:
            c["rotation"] = self._rotation_buffers()
        slots, xs, outs = c["rotation"]
        if slots == 1:
            return bind(c["x"], c["out"], c["comm"])
        x, out = c["x"], c["out"]
        bound = bind(xs[:x.numel()].view_as(x), outs[:out.numel()].view_as(out), c["comm"])
        return bound.rotating(slots, x.numel() * x.element_size(), out.numel() * out.element_size())

    def _rotation_buffers(self) -> tuple:
        """(slots, send region, receive region): `slots` copies of the send buffer and room for as many
        outputs, in the backend's memory; (1, None, None) where one slot is all, or they do not fit."""
        import torch

        c = self.case
        x, out = c["x"], c["out"]
        slots = rotation_slots(x.numel() * x.element_size(), out.numel() * out.element_size())
        if slots == 1:
            return 1, None, None
        place = getattr(c["fn"], "buffers", None)
        try:
            with place(self.group) if place is not None else contextlib.nullcontext():
                xs = x.reshape(-1).repeat(slots)
                outs = torch.empty(slots * out.numel(), dtype=out.dtype, device=out.device)
        except torch.OutOfMemoryError:
            return 1, None, None  # one slot, as a case that fits only once
        return slots, xs, outs

    def loop_driver(self) -> str:
        """Who makes the `loop` convention's calls: "c" (the backend's compiled loop) or "python"."""
        bound = self._bound()
        return "python" if bound is None else bound.driver

    def _loop_samples(self, count: int, iters: int, bound=None) -> list[float]:
        """nccl-tests' convention: the ranks meet, then `iters` calls back to back between one pair
        of host clock readings (the last call waited for), divided by `iters`. A backend that binds
        its call makes them below Python (nccl: C), else each is a Python call of the backend.
        bound: the call bound already (_bound(rotate=True)), where the caller made it."""
        c, times = self.case, []
        bound = self._bound(rotate=True) if bound is None else bound
        for _ in range(count):
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])  # untimed, once a sample: in place ops reuse their buffer
            self._align()
            t0 = time.perf_counter_ns()
            if bound is not None:
                bound.repeat(iters)
            else:
                for _ in range(iters):
                    c["fn"](c["x"], c["out"], c["comm"])
            accelerator.synchronize(self.device_type)
            times.append((time.perf_counter_ns() - t0) / 1e3 / iters)
        return times

    def _graph_samples(self, count: int, iters: int, replays: int = 1) -> list[float]:
        """nccl-tests' -G: `iters` calls captured once in a CUDA graph; each sample launches it
        `replays` times back to back between one pair of host clock readings, divided by the calls.
        A backend that binds its call (nccl) is captured as nccl-tests captures (_captured), any
        other by torch.cuda.graph, as a PyTorch program captures it (_torch_graph)."""
        c = self.case
        if self.graph is None or self.graph[1] != iters:
            binds = getattr(c["fn"], "bind", None) is not None
            self.graph = (self._captured(iters) if binds else self._torch_graph(iters), iters)
        graph, times = self.graph[0], []
        for _ in range(count):
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])
            self._align()
            t0 = time.perf_counter_ns()
            graph.launch(replays)
            accelerator.synchronize(self.device_type)
            times.append((time.perf_counter_ns() - t0) / 1e3 / (iters * replays))
        return times

    def _torch_graph(self, iters: int) -> "_Replayed":
        """The calls captured by torch.cuda.graph on a side stream, replayed on the current one."""
        import torch

        c = self.case
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            c["fn"](c["x"], c["out"], c["comm"])  # a call on the capture stream first: NCCL's lazy set-up
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(iters):
                    c["fn"](c["x"], c["out"], c["comm"])
        torch.cuda.current_stream().wait_stream(stream)
        return _Replayed(graph)

    def _captured(self, iters: int):
        """The bound calls over the moving buffers, captured through the CUDA runtime in
        thread-local mode on a non-blocking stream of this rank's own and launched there, as
        nccl-tests does: replayed on torch's current stream (the legacy default stream) the event
        nodes NCCL adds beside each kernel cost microseconds a call (docs/collectives.md)."""
        import torch

        from pytest_opperf.measure import cudart

        rt = cudart.runtime()
        if self.raw_stream is None:
            self.raw_stream = rt.stream()
        with torch.cuda.stream(torch.cuda.ExternalStream(self.raw_stream, device=self.device)):
            bound = self._bound(rotate=True)
            bound()  # NCCL's lazy set-up of this stream, outside the capture
            rt.check(rt.cudaStreamSynchronize(self.raw_stream), "cudaStreamSynchronize")
            return cudart.Graph(rt, self.raw_stream, lambda: bound.repeat(iters))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


class _Replayed:
    """A torch.cuda.CUDAGraph with cudart.Graph's launch(times): one sample loop serves both."""

    def __init__(self, graph):
        self.graph = graph

    def launch(self, times: int = 1) -> None:
        for _ in range(times):
            self.graph.replay()
