"""The rank side of a collective benchmark: one process per device, driven over a pipe.

The controlling process (run/collective.py) starts `num_devices` of these once per group size
and sends each of them the same commands, one at a time; each rank answers every command:

    case     build this rank's send buffer from its own seed, compute the reference of its output
             from every rank's buffer (regenerated from their seeds), run the collective once and
             compare: the functional check
    warmup   `calls` untimed calls
    sample   `count` timed calls: this rank's time of each, in microseconds
    verify   one more call made as the samples were, compared with the reference again
    end_case drop the case's buffers

A sample's time on the controller is the slowest rank's (the call is done when every rank is).
Timing, by the case's timer: `cpu` (the default on a CPU) - the ranks meet at a barrier before
each call and each reads the host clock around the call and a device synchronize; `event` (the
default on an accelerator) - each rank records device events around the call on its current
stream (the communicator's stream joins it both ways), after a spin kernel that keeps the device
busy while the host queues the call, as the event timer of single-device ops does.

No pytest here: an error becomes an ("error", text) answer and the controller decides.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Optional

from pytest_opperf.measure import accelerator, check


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

    @property
    def reduce_op(self):
        """The case's `reduce_op` as a torch.distributed.ReduceOp (SUM for ops without one)."""
        import torch.distributed as dist

        return getattr(dist.ReduceOp, self.params.get("reduce_op", "sum").upper())


def rank_main(rank: int, world: int, setup: dict, conn) -> None:
    """Process entry: join the group, answer ("ready", facts), then serve commands until "close"."""
    try:
        server = RankServer(rank, world, setup, conn)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    server.serve()
    # Leave at once: torch's exit handlers hold a rank several seconds after its group is gone
    # (measured: 4.7 s with gloo), and everything this process owed was sent before its answer.
    conn.close()
    os._exit(0)


class RankServer:
    def __init__(self, rank: int, world: int, setup: dict, conn):
        import torch
        import torch.distributed as dist

        for module in setup.get("imports", ()):
            importlib.import_module(module)  # torch_npu registers the npu device type
        self.rank, self.world, self.conn = rank, world, conn
        self.device_type = setup["device_type"]
        if self.device_type == "cpu":
            self.device = torch.device("cpu")
        else:
            torch.accelerator.set_device_index(rank)
            self.device = torch.device(self.device_type, rank)
        timeout = dt.timedelta(seconds=setup["timeout_s"])
        store = dist.TCPStore(setup["host"], setup["port"], is_master=False, timeout=timeout)
        extra = {"device_id": self.device} if self.device_type != "cpu" else {}
        dist.init_process_group(setup["comm_backend"], store=dist.PrefixStore(setup["prefix"], store), rank=rank,
                                world_size=world, timeout=timeout, **extra)
        hosts: list = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        self.case: Optional[dict] = None
        conn.send(("ready", {"hosts": hosts, "pid": os.getpid()}))

    def serve(self) -> None:
        import torch.distributed as dist

        while True:
            try:
                command, args = self.conn.recv()
            except (EOFError, OSError):
                break  # the controller is gone
            if command == "close":
                break
            try:
                self.conn.send(("ok", getattr(self, "do_" + command)(**args)))
            except Exception:
                self.conn.send(("error", traceback.format_exc()))
        try:
            dist.destroy_process_group()
        except Exception:
            pass  # a broken group: the process ends anyway

    # --- commands ---------------------------------------------------------------------------

    def do_case(self, parts: dict, params: dict, dtypes, seeds: list, tolerance: float) -> dict:
        """parts: the op's `inputs`, `reference`, `output`, `prepare` and the backend `fn` (functions
        travel by name: this process imports their modules)."""
        import torch

        with torch.inference_mode():
            # Every rank's send buffer from that rank's seed: the same values the other ranks send.
            sent = [parts["inputs"](params, dtypes, self.device, torch.Generator(self.device).manual_seed(s))[0]
                    for s in seeds]
            reference = parts["reference"](sent, self.rank, params)
            x = sent[self.rank]
            del sent
            out = parts["output"](x, self.world)
        comm = Comm(None, self.rank, self.world, params)
        self.case = {"fn": parts["fn"], "x": x, "out": out, "comm": comm, "prepare": parts["prepare"],
                     "reference": reference, "dtype": dtypes.output, "tolerance": tolerance}
        start = time.perf_counter()
        problem = self._checked_call()
        return {"problem": problem, "first_call_ms": (time.perf_counter() - start) * 1e3}

    def do_warmup(self, calls: int) -> None:
        import torch

        with torch.inference_mode():
            for _ in range(calls):
                self._call()
        accelerator.synchronize(self.device_type)

    def do_sample(self, count: int, timer: str) -> list[float]:
        import torch

        with torch.inference_mode():
            return self._host_samples(count) if timer == "cpu" else self._event_samples(count)

    def do_verify(self) -> Optional[str]:
        return self._checked_call()

    def do_end_case(self) -> None:
        self.case = None
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
            problem = check.compare(out, c["reference"], c["dtype"], c["tolerance"])
        return None if problem is None else f"rank {self.rank}: {problem}"

    def _host_samples(self, count: int) -> list[float]:
        import torch.distributed as dist

        c, times = self.case, []
        for _ in range(count):
            if c["prepare"] is not None:
                c["prepare"](c["x"], c["out"], c["comm"])
            accelerator.synchronize(self.device_type)
            dist.barrier()  # every rank starts its clock as the others arrive
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
