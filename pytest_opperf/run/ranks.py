"""One sweep over every rank of a torchrun world: who this rank is, which kernel cases it runs,
and how its rows reach rank 0, the one writer.

    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m pytest benches/

torchrun starts the processes and sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK (the node) and MASTER_ADDR/MASTER_PORT (its store). Each rank joins a gloo process
group (the control plane: plain data only), takes the GPU of its LOCAL_RANK, and collects the
same cases. Rank 0 deals the kernel cases (longest first where the results database knows their
times) and every rank runs its share; collective cases run on every rank, after the kernel
cases, in one order. A rank's rows and failures travel through torchrun's key-value store as
they are made (a mailbox per rank, read by rank 0 between its cases and at the end), so a rank
that dies loses at most the case it was running; a heartbeat per rank tells rank 0 which one
stopped answering.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

ENV_NEEDED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
BEAT_S = 1.0  # how often a rank tells rank 0 it is alive
POLL_S = 0.2  # how often rank 0 looks at the mailboxes while it waits for the other ranks


QUIET: dict = {}  # "log": where this rank > 0 writes what it prints (quiet_unless_writer)


def quiet_unless_writer(environ: Optional[dict] = None) -> Optional[Path]:
    """A rank > 0 of a torchrun world writes what it prints to a log file of its own, from before
    pytest captures anything: rank 0's terminal is the session's. The log's path, or None."""
    environ = os.environ if environ is None else environ
    if not launched(environ) or environ.get("RANK") == "0":
        return None
    run = environ.get("TORCHELASTIC_RUN_ID") or environ.get("MASTER_PORT", "")
    path = Path(tempfile.gettempdir()) / f"opperf-{run}-rank{environ['RANK']}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    QUIET["log"] = path
    return path


class RankError(Exception):
    """Joining the world failed, or another rank stopped answering: one line for the user."""


@dataclass(frozen=True)
class Rank:
    """This process in the torchrun world."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int  # torchrun's GROUP_RANK
    num_nodes: int
    nodes: tuple  # the node of every rank, by rank
    hosts: tuple  # the host name of every rank, by rank
    run_id: str  # rank 0's: every row of the sweep carries it
    timeout_s: float  # --opperf-rank-timeout

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def placement(self) -> dict:
        """The columns every row of this rank carries."""
        return {"rank": self.rank, "num_nodes": self.num_nodes}


def launched(environ: Optional[dict] = None) -> bool:
    """This process was started by torchrun (or a launcher that sets the same variables)."""
    environ = os.environ if environ is None else environ
    return all(name in environ for name in ENV_NEEDED)


def join(timeout_s: float) -> Rank:
    """Join the world's control group (gloo) and learn every rank's node and host; a world that
    does not assemble within `timeout_s` is a RankError naming what was waited for."""
    import torch.distributed as dist

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    where = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    if not dist.is_initialized():
        try:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                    timeout=dt.timedelta(seconds=timeout_s))
        except Exception as exc:  # noqa: BLE001 (a network, a timeout, a refused port: said in one line)
            raise RankError(f"rank {rank} of {world}: could not join the world's process group at {where} within "
                            f"{timeout_s:g} s (--opperf-rank-timeout): {_first_line(exc)}") from None
    facts = [None] * world
    mine = (int(env.get("GROUP_RANK", 0)), socket.gethostname(), uuid.uuid4().hex[:16])
    try:
        dist.all_gather_object(facts, mine)
    except Exception as exc:  # noqa: BLE001
        raise RankError(f"rank {rank} of {world}: the other ranks did not answer within {timeout_s:g} s "
                        f"(--opperf-rank-timeout): {_first_line(exc)}") from None
    nodes = tuple(f[0] for f in facts)
    return Rank(rank, world, int(env["LOCAL_RANK"]), int(env.get("LOCAL_WORLD_SIZE", world)), mine[0],
                len(set(nodes)), nodes, tuple(f[1] for f in facts), facts[0][2], timeout_s)


def pin_device(rank: Rank) -> None:
    """Each rank measures on the device of its LOCAL_RANK (before the device is resolved)."""
    import torch

    if torch.accelerator.is_available():
        count = torch.accelerator.device_count()
        if rank.local_rank >= count:
            raise RankError(f"rank {rank.rank}: LOCAL_RANK {rank.local_rank} but this node shows {count} devices "
                            f"(--nproc-per-node at most the GPUs of a node)")
        torch.accelerator.set_device_index(rank.local_rank)


def broadcast(value, rank: Rank):
    """Rank 0's value on every rank (plain data), over the control group."""
    import torch.distributed as dist

    box = [value if rank.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_ids(ids: list, rank: Rank) -> list:
    """Every rank's list of collected case ids, by rank."""
    import torch.distributed as dist

    out: list = [None] * rank.world_size
    dist.all_gather_object(out, ids)
    return out


class Mailbox:
    """A rank's messages to rank 0 (rows, failures, its end) in torchrun's key-value store.

    Each message is a key of its own (`<prefix>/m/<rank>/<n>`) and a counter per rank says how
    many there are; rank 0 reads each rank's new messages from where it stopped.
    """

    def __init__(self, store, prefix: str, rank: Rank):
        self.store, self.prefix, self.rank = store, prefix, rank
        self.sent = 0
        self.read_upto = [0] * rank.world_size
        self.beats = [(-1, time.monotonic())] * rank.world_size  # (beat count, when it last changed)
        self.done = [False] * rank.world_size
        self.lock = threading.Lock()  # the heartbeat thread and the main thread share the store client

    @classmethod
    def open(cls, rank: Rank, timeout_s: float) -> "Mailbox":
        import torch.distributed as dist

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=dt.timedelta(seconds=timeout_s))
        return cls(store, f"opperf/{rank.run_id}", rank)

    def send(self, kind: str, body: dict) -> None:
        data = json.dumps({"kind": kind, **body}, default=str)
        with self.lock:
            self.store.set(f"{self.prefix}/m/{self.rank.rank}/{self.sent}", data)
            self.sent += 1
            self.store.add(f"{self.prefix}/n/{self.rank.rank}", 1)

    def beat(self) -> None:
        with self.lock:
            self.store.add(f"{self.prefix}/beat/{self.rank.rank}", 1)

    def receive(self) -> list:
        """Rank 0: the messages that arrived since the last call, as (rank, message)."""
        out = []
        with self.lock:
            for r in range(1, self.rank.world_size):
                count = self.store.add(f"{self.prefix}/n/{r}", 0)
                for n in range(self.read_upto[r], count):
                    message = json.loads(self.store.get(f"{self.prefix}/m/{r}/{n}"))
                    out.append((r, message))
                    self.done[r] = self.done[r] or message["kind"] == "done"
                self.read_upto[r] = count
                beats = self.store.add(f"{self.prefix}/beat/{r}", 0)
                if beats != self.beats[r][0]:
                    self.beats[r] = (beats, time.monotonic())
        return out

    def arrive(self, name: str) -> None:
        """This rank reached the meeting point `name` (meet())."""
        with self.lock:
            self.store.add(f"{self.prefix}/at/{name}", 1)

    def arrived(self, name: str) -> int:
        """How many ranks reached the meeting point `name`."""
        with self.lock:
            return self.store.add(f"{self.prefix}/at/{name}", 0)

    def call_off(self, name: str, why: str) -> None:
        """Tell every rank, once, why `name` is off: a meeting that will not be complete (rank 0 saw
        a rank stop answering; a rank ended its session before it), or the sweep itself (world.STOP:
        a rank stopped at a failure). Read with called_off."""
        with self.lock:
            self.store.set(f"{self.prefix}/off/{name}", why)

    def called_off(self, name: str) -> Optional[str]:
        """Why the meeting `name` was called off, or None."""
        with self.lock:
            if not self.store.check([f"{self.prefix}/off/{name}"]):
                return None
            return self.store.get(f"{self.prefix}/off/{name}").decode()

    def silent(self) -> list:
        """Rank 0: the ranks not done whose heartbeat stopped for the rank timeout, as (rank, seconds)."""
        now = time.monotonic()
        return [(r, now - since) for r, (_, since) in enumerate(self.beats)
                if r > 0 and not self.done[r] and now - since > self.rank.timeout_s]

    def wait_for_all(self, take: Callable[[int, dict], None]) -> list:
        """Rank 0, after its own cases: every message until every rank is done (a rank that was
        told to stop is done after its current case); the ranks that stopped answering, as (rank,
        seconds silent), if any. An interrupt (SIGTERM, Ctrl-C) ends the wait as KeyboardInterrupt."""
        while True:
            for r, message in self.receive():
                take(r, message)
            if all(self.done[1:]):
                return []
            silent = self.silent()
            if silent:
                return silent
            time.sleep(POLL_S)


class Heartbeat(threading.Thread):
    """A rank's beat every BEAT_S seconds, until the session ends; a lost store ends the process
    (rank 0, who held the world together, is gone) with one line."""

    def __init__(self, mailbox: Mailbox, on_lost: Callable[[str], None]):
        super().__init__(name="opperf-heartbeat", daemon=True)
        self.mailbox, self.on_lost = mailbox, on_lost
        self.stopped = threading.Event()

    def run(self) -> None:
        failures = 0
        while not self.stopped.wait(BEAT_S):
            try:
                self.mailbox.beat()
                failures = 0
            except Exception as exc:  # noqa: BLE001
                failures += 1
                if failures * BEAT_S >= self.mailbox.rank.timeout_s:
                    self.on_lost(_first_line(exc))
                    return


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
