"""A rank process of a collective benchmark: it joins its group, then serves the controller's
commands (measure/collective.py's RankWork) over a pipe until it is told to close.

Started by run/collective.py's RankGroup, one process per device, forked from a server that
imported torch and this module once.
"""

from __future__ import annotations

import datetime as dt
import gc
import importlib
import os
import socket
import traceback

from pytest_opperf.measure.collective import RankWork


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
    """A rank process: joins its group, then runs the controller's commands (RankWork) one by one."""

    def __init__(self, rank: int, world: int, setup: dict, conn):
        import torch
        import torch.distributed as dist

        # Before the device is touched: the devices of the host, where the process that started this
        # rank sees only its own (an xdist worker pinned to one GPU).
        os.environ.update(setup.get("environ", {}))
        for module in setup.get("imports", ()):
            importlib.import_module(module)  # torch_npu registers the npu device type
        self.conn = conn
        device_type = setup["device_type"]
        if device_type == "cpu":
            device = torch.device("cpu")
        else:
            torch.accelerator.set_device_index(rank)
            device = torch.device(device_type, rank)
        timeout = dt.timedelta(seconds=setup["timeout_s"])
        store = dist.TCPStore(setup["host"], setup["port"], is_master=False, timeout=timeout)
        extra = {"device_id": device} if device_type != "cpu" else {}
        dist.init_process_group(setup["comm_backend"], store=dist.PrefixStore(setup["prefix"], store), rank=rank,
                                world_size=world, timeout=timeout, **extra)
        # The ranks meet on the host before a sample, as nccl-tests' barrier does: a gloo group
        # beside the device's (a barrier of NCCL is a collective on the device, and its end on the
        # host is not the same instant on every rank).
        control = dist.new_group(backend="gloo", timeout=timeout) if setup["comm_backend"] != "gloo" else None
        hosts: list = [None] * world
        dist.all_gather_object(hosts, socket.gethostname(), group=control)
        self.work = RankWork(rank, world, device_type, device, control=control)
        # What is alive now lives as long as the process: a full collection then skips it (a case's
        # end collects its buffers' cycles: 75 ms a case in a process that imported torch, 0.1 ms so).
        gc.collect()
        gc.freeze()
        conn.send(("ready", {"hosts": hosts, "pid": os.getpid(), "link": link_of(device_type, world)}))

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
                self.conn.send(("ok", getattr(self.work, "do_" + command)(**args)))
            except Exception:
                self.conn.send(("error", traceback.format_exc()))
        try:
            dist.destroy_process_group()
        except Exception:
            pass  # a broken group: the process ends anyway


def link_of(device_type: str, ranks_on_host: int) -> str:
    """The link a group within one host crosses, as the driver reports it: nvlink where this GPU has
    an active NVLink (NVML), pcie without; loopback on a CPU; the device type elsewhere."""
    if device_type == "cpu":
        return "loopback"
    if device_type != "cuda" or ranks_on_host < 2:
        return device_type
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            for link in range(18):  # NVML_NVLINK_MAX_LINKS on Hopper
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        return "nvlink"
                except pynvml.NVMLError:
                    break
            return "pcie"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 (no NVML: say what is known)
        return "unknown"
