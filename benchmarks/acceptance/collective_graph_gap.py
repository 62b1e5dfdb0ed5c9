"""Where a CUDA graph of NCCL calls loses time, and what a loop of them costs from Python and from C.

    python3 benchmarks/acceptance/collective_graph_gap.py [--ranks 2] [--sizes 1K,16K,256K,1M,4M,16M] [--out DIR]
        [--nccl-tests .anchors/nccl-tests]

One process per GPU (as the plugin's ranks), NCCL called through the nccl backend's ctypes
bindings. For each message size (bf16 all_reduce, out of place) the same 20 calls are captured
and replayed several ways, and made in a host loop several ways; each way is timed as
nccl-tests times (ranks meet, then back-to-back replays or calls between two host clock
readings, divided by the calls; 15 samples of at least 5 ms, the median; the mean of the ranks),
then profiled once (torch.profiler: each NCCL kernel's duration and the gap before the next).
The graphs' nodes are counted by type (cudaGraphGetNodes). Process settings (NCCL variables
read once per process, torch's own NCCL process group or not) each get a pair of processes.
With --nccl-tests, nccl-tests' all_reduce runs on the same machine beside them: its loop, `-G`,
NCCL_GRAPH_MIXING_SUPPORT=0. The table ends the output; every figure
is in OUT/graph_gap.json. docs/collectives.md says what it found.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALLS = 20  # nccl-tests' -n: the calls a graph captures
SAMPLE_S = 0.005

# Process settings: NCCL reads its variables once a process; the plugin's ranks also hold torch's
# NCCL process group (eagerly made, with its watchdog) beside the backend's own communicator.
SETTINGS = {
    "plugin": {"env": {}, "torch_pg": True},
    "no_torch_pg": {"env": {}, "torch_pg": False},
    "mixing0": {"env": {"NCCL_GRAPH_MIXING_SUPPORT": "0"}, "torch_pg": True},
    "register0": {"env": {"NCCL_GRAPH_REGISTER": "0"}, "torch_pg": True},
}
# (capture, buffers, replay stream): capture "torch" is torch.cuda.graph (global capture mode),
# "torch_tl" the same in thread-local mode, "raw_tl"/"raw_global" cudaStreamBeginCapture through the
# CUDA runtime on a non-blocking stream of its own, as nccl-tests does; buffers from NCCL's allocator
# (the backend's pool) or torch's caching allocator; "rot" moves the buffers one message a call, as
# nccl-tests does; replayed on torch's current stream ("default") or the capture stream ("capture").
GRAPHS = [
    ("torch", "nccl", "default"),  # the plugin's graph before issue 51
    ("torch", "caching", "default"),
    ("torch_tl", "nccl", "default"),
    ("torch", "nccl", "capture"),
    ("raw_tl", "nccl", "capture"),  # nccl-tests' way
    ("raw_tl", "nccl_rot", "capture"),
    ("raw_tl", "caching", "capture"),
    ("raw_global", "nccl", "capture"),
    ("raw_tl", "nccl", "default"),
    ("torch_dist", "caching", "default"),  # plain PyTorch: dist.all_reduce in place, torch.cuda.graph
]
# (driver, buffers, stream): "backend" the backend's call in a Python loop (before issue 51),
# "bound" its arguments converted once, still a Python loop, "c" the compiled loop.
LOOPS = [
    ("backend", "nccl", "default"),
    ("bound", "nccl", "default"),
    ("c", "nccl", "default"),
    ("c", "nccl_rot", "default"),
    ("c", "nccl", "own"),
    ("c", "caching", "default"),
    ("torch_dist", "caching", "default"),  # plain PyTorch: dist.all_reduce in place, a Python loop
]
SHORT = ("plugin",)  # settings that run every way; the others run the few that tell them apart
FEW_GRAPHS = [("torch", "nccl", "default"), ("raw_tl", "nccl", "capture")]
FEW_LOOPS = [("c", "nccl", "default")]


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


# --- one rank ---------------------------------------------------------------------------------

class Rank:
    def __init__(self, rank: int, world: int, port: int, setting: dict):
        import torch
        import torch.distributed as dist

        from pytest_opperf.catalog.backends import nccl as backend
        from pytest_opperf.measure.collective import Comm

        self.torch, self.dist, self.backend = torch, dist, backend
        torch.cuda.set_device(rank)
        self.device = torch.device("cuda", rank)
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
        if setting["torch_pg"]:
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=self.device)
            self.control = dist.new_group(backend="gloo")
        else:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
            self.control = None
        self.rank, self.world = rank, world
        self.comm = Comm(None, rank, world, {"reduce_op": "sum"}, self.control)
        from pytest_opperf.measure.cudart import runtime

        self.rt = runtime()
        self.own_stream = self.rt.stream()
        self.torch_pg = setting["torch_pg"]
        self.profiled: set = set()  # the sizes whose ways are profiled too

    def barrier(self):
        self.torch.cuda.synchronize()
        self.dist.barrier(group=self.control)

    def leaders(self, value):
        """Rank 0's value on every rank: calls a sample must be the same on every rank, or one rank's
        last calls wait forever for a peer that made fewer."""
        box = [value]
        self.dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def agree(self, error) -> None:
        """Every rank's capture went well, or every rank stops this way: a rank that launched a graph
        its peer never captured would wait for it forever."""
        said = [None] * self.world
        self.dist.all_gather_object(said, error, group=self.control)
        failed = [f"rank {r}: {e}" for r, e in enumerate(said) if e]
        if failed:
            raise RuntimeError("; ".join(failed))

    def buffers(self, size: int, kind: str):
        """(send, recv, slots): bf16 buffers of `size` bytes, random; `slots` copies for rotation."""
        torch = self.torch
        slots = CALLS if kind.endswith("_rot") else 1
        place = self.backend.buffers(None) if kind.startswith("nccl") and self.torch_pg else None
        numel = size // 2
        ctx = place if place is not None else _null()
        with ctx:
            send = torch.randn(slots * numel, device=self.device).to(torch.bfloat16)
            recv = torch.empty(slots * numel, dtype=torch.bfloat16, device=self.device)
        return send, recv, slots

    def bound(self, send, recv, slots, stream=None):
        """The backend's bound all_reduce of one slot, on `stream` (a raw cudaStream_t) or torch's current one."""
        numel = send.numel() // slots
        x, out = send[:numel], recv[:numel]
        torch = self.torch
        on = torch.cuda.ExternalStream(stream, device=self.device) if stream is not None else torch.cuda.current_stream()
        with torch.cuda.stream(on):  # the backend binds its call to the current stream
            call = self.backend.bind_all_reduce(x, out, self.comm)
        return call.rotating(slots, x.nbytes, out.nbytes)

    # --- timing ---

    def samples(self, run, per_sample_calls: int, align, count: int = 15) -> list:
        out = []
        for _ in range(count):
            self.barrier()
            align()
            self.torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            run()
            self.torch.cuda.synchronize()
            out.append((time.perf_counter_ns() - t0) / 1e3 / per_sample_calls)
        return out

    def profile(self, run) -> dict:
        """One run under torch.profiler: NCCL kernels' durations and the gaps between them (us)."""
        from torch.profiler import ProfilerActivity, profile

        self.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            self.torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.load(open(f.name)).get("traceEvents", [])
        device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        kernels = sorted((e for e in device if e["cat"] == "kernel" and "nccl" in e["name"].lower()),
                         key=lambda e: e["ts"])
        others: dict = {}
        for e in device:
            if not (e["cat"] == "kernel" and "nccl" in e["name"].lower()):
                key = f"{e['cat']}:{e['name'][:40]}"
                others[key] = others.get(key, 0) + 1
        durations = [e["dur"] for e in kernels]
        gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(kernels, kernels[1:])]
        return {"kernels": len(kernels), "kernel_us": _median(durations), "gap_us": _median(gaps),
                "gap_p90_us": _quantile(gaps, 0.9), "kernel_name": kernels[0]["name"][:60] if kernels else None,
                "other_device_events": others}

    # --- the ways ---

    def graph_way(self, size: int, capture: str, buffers: str, replay: str) -> dict:
        from pytest_opperf.measure import cudart

        torch, rt = self.torch, self.rt
        send, recv, slots = self.buffers(size, buffers)
        nodes = None
        if capture == "torch_dist":
            return self.plain_graph(send, recv)
        if capture.startswith("torch"):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            try:
                graph = torch.cuda.CUDAGraph(keep_graph=True)
            except TypeError:
                graph = torch.cuda.CUDAGraph()
            mode = "thread_local" if capture == "torch_tl" else "global"
            error = None
            with torch.cuda.stream(side):
                self.bound(send, recv, slots)()  # NCCL's lazy set-up on the capture stream
                side.synchronize()
                try:
                    with torch.cuda.graph(graph, stream=side, capture_error_mode=mode):
                        self.bound(send, recv, slots).repeat(CALLS)
                    if hasattr(graph, "instantiate"):
                        graph.instantiate()
                except Exception as exc:  # noqa: BLE001
                    error = f"{type(exc).__name__}: {str(exc)[:120]}"
            torch.cuda.current_stream().wait_stream(side)
            self.agree(error)
            try:
                nodes = rt.nodes(ctypes.c_void_p(graph.raw_cuda_graph()))
            except Exception as exc:  # noqa: BLE001
                nodes = {"unavailable": str(exc)[:80]}
            replay_stream = side if replay == "capture" else torch.cuda.current_stream()
            eager = self.bound(send, recv, slots)

            def launch(k):
                with torch.cuda.stream(replay_stream):
                    for _ in range(k):
                        graph.replay()
            keep = graph
        else:
            stream = self.own_stream
            self.bound(send, recv, slots, stream)()
            rt.check(rt.cudaStreamSynchronize(stream), "sync")
            mode = cudart.CAPTURE_THREAD_LOCAL if capture == "raw_tl" else cudart.CAPTURE_GLOBAL
            g, exe = ctypes.c_void_p(), ctypes.c_void_p()
            error = None
            try:
                rt.check(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
                try:
                    self.bound(send, recv, slots, stream).repeat(CALLS)
                finally:
                    rt.check(rt.cudaStreamEndCapture(stream, ctypes.byref(g)), "cudaStreamEndCapture")
                rt.check(rt.cudaGraphInstantiateWithFlags(ctypes.byref(exe), g, 0), "cudaGraphInstantiate")
            except Exception as exc:  # noqa: BLE001
                error = f"{type(exc).__name__}: {str(exc)[:120]}"
            self.agree(error)
            nodes = rt.nodes(g)
            target = stream if replay == "capture" else torch.cuda.current_stream().cuda_stream
            eager = self.bound(send, recv, slots, stream)

            def launch(k):
                for _ in range(k):
                    rt.check(rt.cudaGraphLaunch(exe, target), "cudaGraphLaunch")
            keep = (g, exe)
        timed = self._time_graph(launch, eager, nodes, size)
        if not capture.startswith("torch"):
            rt.cudaGraphExecDestroy(keep[1])
            rt.cudaGraphDestroy(keep[0])
        return timed

    def plain_graph(self, send, recv) -> dict:
        """What a PyTorch user writes: dist.all_reduce (in place) captured 20 times by torch.cuda.graph,
        replayed on the current stream."""
        torch, dist = self.torch, self.dist
        recv.copy_(send[:recv.numel()])  # random values, never an empty buffer's
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            dist.all_reduce(recv)
            side.synchronize()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(CALLS):
                    dist.all_reduce(recv)
        torch.cuda.current_stream().wait_stream(side)
        self.agree(None)

        def launch(k):
            for _ in range(k):
                graph.replay()
        return self._time_graph(launch, lambda: dist.all_reduce(recv), None, recv.numel() * recv.element_size())

    def _time_graph(self, launch, eager, nodes, size: int) -> dict:
        """launch(k) replays the graph k times: rank 0's replays a sample for SAMPLE_S, then samples."""
        torch = self.torch
        launch(2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch(3)
        torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / (3 * CALLS)
        replays = self.leaders(max(1, min(200, int(SAMPLE_S / max(per_call * CALLS, 1e-7)) + 1)))
        times = self.samples(lambda: launch(replays), replays * CALLS, eager)
        prof = self.profile(lambda: launch(3)) if size in self.profiled else {}
        return {"us": _median(times), "min_us": min(times), "replays": replays, "nodes": nodes, **prof}

    def loop_way(self, size: int, driver: str, buffers: str, stream_kind: str) -> dict:
        send, recv, slots = self.buffers(size, buffers)
        if driver == "torch_dist":
            dist = self.dist
            recv.copy_(send[:recv.numel()])

            def plain(k):
                for _ in range(k):
                    dist.all_reduce(recv)
            return self._time_loop(plain, lambda: dist.all_reduce(recv), size)
        stream = self.own_stream if stream_kind == "own" else None
        numel = send.numel() // slots
        x, out = send[:numel], recv[:numel]
        bound = self.bound(send, recv, slots, stream)
        if driver == "backend":
            fn = self.backend.all_reduce_nccl

            def run(k):
                for _ in range(k):
                    fn(x, out, self.comm)
        elif driver == "bound":
            bound.helper = None  # the Python loop over the bound call

            def run(k):
                bound.repeat(k)
        else:
            if bound.helper is None:
                return {"error": "the C helper could not be built"}

            def run(k):
                bound.repeat(k)
        return self._time_loop(run, bound, size)

    def _time_loop(self, run, align, size: int) -> dict:
        torch = self.torch
        run(20)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(50)
        torch.cuda.synchronize()
        per_call = (time.perf_counter() - t0) / 50
        calls = self.leaders(max(CALLS, min(5000, int(SAMPLE_S / max(per_call, 1e-7)) + 1)))
        times = self.samples(lambda: run(calls), calls, align)
        prof = self.profile(lambda: run(60)) if size in self.profiled else {}
        return {"us": _median(times), "min_us": min(times), "calls": calls, **prof}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _median(values):
    return statistics.median(values) if values else None


def _quantile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def rank_main(rank: int, world: int, port: int, setting_name: str, sizes: list, profiled: list,
              out_path: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(40, repeat=True)  # a rank stuck anywhere shows where
    setting = SETTINGS[setting_name]
    os.environ.update(setting["env"])
    r = Rank(rank, world, port, setting)
    r.profiled = set(profiled)
    full = setting_name in SHORT
    results = []
    partial = Path(f"{out_path}.rank{rank}.jsonl")
    for size in sizes:
        ways = [("graph", w) for w in (GRAPHS if full else FEW_GRAPHS)]
        ways += [("loop", w) for w in (LOOPS if full else FEW_LOOPS)]
        if os.environ.get("GAP_WAYS"):
            ways = [(k, w) for k, w in ways if w[0].startswith(os.environ["GAP_WAYS"])]
        for kind, way in ways:
            t0 = time.perf_counter()
            run = (lambda w=way: r.graph_way(size, *w)) if kind == "graph" else (lambda w=way: r.loop_way(size, *w))
            got = _attempt(r, kind, way, run, size)
            results.append(got)
            with open(partial, "a") as f:
                f.write(json.dumps(got) + "\n")
            if rank == 0:
                print(f"  {setting_name} {size} {kind} {'/'.join(way)}: {got.get('us')} us "
                      f"{got.get('error') or ''} ({time.perf_counter() - t0:.1f} s)", flush=True)
    gathered = [None] * world
    r.dist.all_gather_object(gathered, results, group=r.control)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    r.dist.barrier(group=r.control)
    faulthandler.cancel_dump_traceback_later()
    r.dist.destroy_process_group()


def _attempt(r: Rank, kind: str, way: tuple, run, size: int) -> dict:
    try:
        got = run()
    except Exception as exc:  # noqa: BLE001 (one way failing says so and the rest go on)
        got = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"}
        try:
            r.torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
    return {"kind": kind, "way": "/".join(way), "size": size, **got}


# --- the controller ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_setting(name: str, ranks: int, sizes: list, profiled: list, out: Path, limit_s: float) -> list:
    """One pair of rank processes under a setting; their rows (a rank's partial rows where they did
    not finish within limit_s: they are then ended)."""
    import torch.multiprocessing as mp

    saved = dict(os.environ)
    os.environ.update(SETTINGS[name]["env"])
    path = out / f"gap_{name}.json"
    try:
        ctx = mp.start_processes(rank_main, args=(ranks, free_port(), name, sizes, profiled, str(path)),
                                 nprocs=ranks, start_method="spawn", join=False)
        deadline = time.monotonic() + limit_s
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    print(f"setting {name}: not done in {limit_s:g} s; its ranks are ended", flush=True)
                    for p in ctx.processes:
                        p.kill()
                    break
        except Exception as exc:  # noqa: BLE001 (a rank that raised: the rows it wrote stay)
            print(f"setting {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if path.exists():
        per_rank = json.loads(path.read_text())
    else:
        per_rank = []
        for r in range(ranks):
            part = Path(f"{path}.rank{r}.jsonl")
            per_rank.append([json.loads(line) for line in part.read_text().splitlines()] if part.exists() else [])
        done = min(len(p) for p in per_rank)
        per_rank = [p[:done] for p in per_rank]
    rows = []
    for i, row in enumerate(per_rank[0]):
        ranks_rows = [p[i] for p in per_rank]
        times = [x.get("us") for x in ranks_rows]
        merged = dict(row, setting=name)
        merged["us"] = sum(times) / len(times) if None not in times else None
        merged["us_by_rank"] = times
        rows.append(merged)
    return rows


def nccl_tests(source: Path, ranks: int, out: Path) -> list:
    """nccl-tests' all_reduce on this machine (one thread per GPU): loop, -G 10, the NULL stream,
    NCCL_GRAPH_MIXING_SUPPORT=0; (label, size, out-of-place us) rows."""
    from collectives_table import nccl_times  # beside this script

    script = source.parent / "nccl-tests.sh"
    rows = []
    for label, flags, env in [("loop", ["-G", "0"], {}), ("-G 10", ["-G", "10"], {}),
                              ("-G 10 mixing0", ["-G", "10"], {"NCCL_GRAPH_MIXING_SUPPORT": "0"})]:
        log = out / f"nccl_tests_{label.replace(' ', '_')}.txt"
        cmd = ["bash", str(script), str(source), "all_reduce", "1", "-t", str(ranks), "-b", "1K", "-e", "16M",
               "-f", "4", "-w", "5", "-n", "20", *flags]
        with open(log, "w") as f:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env}, timeout=300)
        for size, us in nccl_times(log, in_place=False).items():
            rows.append({"label": label, "size": size, "us": us})
    return rows


def table(rows: list, tests: list, sizes: list) -> str:
    ref = {(t["label"], t["size"]): t["us"] for t in tests}
    head = ["setting", "kind", "way"] + [_size_name(s) for s in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = list(dict.fromkeys((r["setting"], r["kind"], r["way"]) for r in rows))
    by = {(r["setting"], r["kind"], r["way"], r["size"]): r for r in rows}
    for key in keys:
        cells = []
        for s in sizes:
            r = by.get((*key, s))
            if r is None:
                cells.append("")
            elif r.get("error"):
                cells.append("error")
            else:
                base = ref.get(("-G 10" if key[1] == "graph" else "loop", s))
                ratio = f" ({r['us'] / base:.2f}x)" if base and r.get("us") else ""
                prof = f" k{r['kernel_us']:.1f}/g{r['gap_us']:.1f}" if r.get("kernel_us") and r.get("gap_us") is not None else ""
                cells.append(f"{r['us']:.2f}{ratio}{prof}")
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    for label in dict.fromkeys(t["label"] for t in tests):
        lines.append("| nccl-tests | | " + label + " | " + " | ".join(
            f"{ref[(label, s)]:.2f}" if (label, s) in ref else "" for s in sizes) + " |")
    return "\n".join(lines)


def against_plugin(rows: list, results: Path) -> str:
    """The plugin's torch_dist all_reduce rows (loop and graph) over plain torch.distributed's
    (the torch_dist ways above), size by size: PyTorch's cost is what that backend's rows answer."""
    import sqlite3

    plain = {(r["kind"], r["size"]): r["us"] for r in rows if r["way"].startswith("torch_dist") and r.get("us")}
    lines = ["| convention | size | plugin torch_dist us | plain torch.distributed us | ratio |", "|---|---:|---:|---:|---:|"]
    for db in sorted(results.glob("*.db")):
        con = sqlite3.connect(db)
        try:
            found = con.execute("select timer, message_bytes, time_us from all_reduce where backend = 'torch_dist' "
                                "and num_devices = 2 and dtype_in = 'bf16' order by timer, message_bytes").fetchall()
        except sqlite3.OperationalError:
            found = []
        for timer, size, us in found:
            base = plain.get(("graph" if timer == "graph" else "loop", size))
            if base:
                lines.append(f"| {timer} | {_size_name(size)} | {us:.2f} | {base:.2f} | {us / base:.3f} |")
    return "\n".join(lines)


def _size_name(size: int) -> str:
    for unit, name in ((2**30, "G"), (2**20, "M"), (2**10, "K")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return str(size)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="1K,64K,1M,4M")
    ap.add_argument("--profile", default="1K,1M", help="the sizes whose ways are profiled too")
    ap.add_argument("--settings", default="plugin,no_torch_pg,mixing0")
    ap.add_argument("--limit", type=float, default=150, help="seconds a setting may take")
    ap.add_argument("--ways", default=None, help="only the ways whose name starts with this (torch_dist: plain PyTorch)")
    ap.add_argument("--compare-db", type=Path, default=None,
                    help="a results folder with the plugin's torch_dist all_reduce rows, set beside plain torch.distributed")
    ap.add_argument("--nccl-tests", type=Path, default=None, help="nccl-tests' source (.anchors/nccl-tests)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.ways:
        os.environ["GAP_WAYS"] = args.ways  # the ranks inherit it
    profiled = [parse_size(p) for p in args.profile.split(",") if p and p != "none"]
    tests = []
    if args.nccl_tests is not None:
        t0 = time.time()
        tests = nccl_tests(args.nccl_tests, args.ranks, args.out)
        print(f"nccl-tests: {len(tests)} figures in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for name in args.settings.split(","):
        t0 = time.time()
        rows += run_setting(name, args.ranks, sizes, profiled, args.out, args.limit)
        print(f"setting {name}: {time.time() - t0:.0f} s", flush=True)
    (args.out / "graph_gap.json").write_text(json.dumps({"rows": rows, "nccl_tests": tests}, indent=1))
    for r in rows:
        if r.get("nodes") or r.get("other_device_events") or r.get("error"):
            print(f"{r['setting']} {r['kind']} {r['way']} {_size_name(r['size'])}: nodes={r.get('nodes')} "
                  f"other={r.get('other_device_events')} kernel={r.get('kernel_name')} err={r.get('error')}")
    print("us a call, mean of ranks (ratio to nccl-tests' loop or -G 10 on this machine); kNCCL kernel us / g gap us")
    print(table(rows, tests, sizes))
    if args.compare_db is not None:
        print("torch_dist against plain torch.distributed (same machine):")
        print(against_plugin(rows, args.compare_db))
    return 0


if __name__ == "__main__":
    sys.exit(main())
