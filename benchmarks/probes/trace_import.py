"""`opperf import` on a large synthetic torch.profiler trace and on a public 109k-event one: time and memory.

    python3 benchmarks/probes/trace_import.py [--events 1000000] [--real tests/data/traces/hta_rank0_109k_events.json.gz]
                                       [--out DIR] [--gzip]

Writes a synthetic Kineto trace of --events events (a training-like mix on two threads: nested
``cpu_op``s with ``Input Dims``/``Input type``, ``cuda_runtime`` launches, kernels on two streams
linked by ``External id`` and ``correlation``, some by the ``ac2g`` flow alone, ``ac2g`` flow
pairs, CPU-only ops, instant events), then runs ``opperf import`` on it, on --real and on a 7-event
trace (the command's fixed cost) in a fresh process each, and prints for each import its wall time,
the part of it spent reading and linking the trace (``profile.read``), and its peak resident memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

BF16 = "c10::BFloat16"
TRACES = Path(__file__).resolve().parents[2] / "tests" / "data" / "traces"
TINY = TRACES / "hta_backward_thread.json"


def _op(name, tid, ts, dur, ext, dims, types):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Record function id": 0, "Sequence number": ext, "Fwd thread id": 0,
                     "Input Dims": dims, "Input type": types, "Ev Idx": ext}}


def _launch(tid, ts, ext, corr, name, kernel_ts, dur, stream, with_ext=True):
    """A runtime launch, its kernel and their ac2g flow: four events."""
    kernel_args = {"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                   "registers per thread": 32, "shared memory": 0, "grid": [128, 1, 1], "block": [256, 1, 1]}
    if with_ext:
        kernel_args["External id"] = ext
    else:  # linked by the flow alone
        del kernel_args["correlation"]
    return [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 4,
         "args": {"External id": ext, "cbid": 211, "correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": kernel_ts, "dur": dur,
         "args": kernel_args},
        {"ph": "s", "id": corr, "pid": 1, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": kernel_ts, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]


def synthetic_events(n_events: int, seed: int = 0) -> Iterator[dict]:
    """About n_events events of a transformer-like step loop, nested and on two threads."""
    rng = random.Random(seed)
    ts = {1: 1_000_000.0, 2: 1_000_000.0}
    gpu = 1_000_000.0
    ext = corr = 0
    written = 0
    yield {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}}
    while written < n_events:
        tid = 1 if rng.random() < 0.7 else 2  # forward thread and autograd thread
        t = ts[tid]
        m, k, n = rng.choice([(128, 4096, 4096), (128, 4096, 11008), (512, 4096, 4096), (1, 4096, 128256)])
        events = []
        # aten::linear > aten::matmul > aten::mm > launch, as a GEMM is recorded
        ext += 3
        corr += 1
        gpu = max(gpu, t) + 2
        events += [_op("aten::linear", tid, t, 60, ext - 2, [[m, k], [n, k], []], [BF16, BF16, ""]),
                   _op("aten::matmul", tid, t + 5, 50, ext - 1, [[m, k], [k, n]], [BF16, BF16]),
                   _op("aten::mm", tid, t + 10, 40, ext, [[m, k], [k, n]], [BF16, BF16])]
        events += _launch(tid, t + 20, ext, corr, "sm90_xmma_gemm_bf16bf16_bf16f32", gpu, 30.0, 7)
        gpu += 30
        # aten::softmax > aten::_softmax > launch, linked by the flow alone
        ext += 2
        corr += 1
        events += [_op("aten::softmax", tid, t + 70, 30, ext - 1, [[m, n], [], []], [BF16, "Scalar", ""]),
                   _op("aten::_softmax", tid, t + 72, 25, ext, [[m, n], [], []], [BF16, "Scalar", "Scalar"])]
        events += _launch(tid, t + 80, ext, corr, "softmax_warp_forward", gpu, 8.0, 7, with_ext=False)
        gpu += 8
        # an elementwise add on the second stream, linked by correlation only
        ext += 1
        corr += 1
        events.append(_op("aten::add", tid, t + 105, 12, ext, [[m, n], [m, n], []], [BF16, BF16, "Scalar"]))
        launch = _launch(tid, t + 108, ext, corr, "vectorized_elementwise_kernel", gpu, 3.0, 13)
        del launch[1]["args"]["External id"]
        events += launch
        gpu += 3
        # CPU-only ops and an instant event
        ext += 2
        events += [_op("aten::empty", tid, t + 120, 2, ext - 1, [[], [], [], [], [], []], ["", "", "", "", "", ""]),
                   _op("aten::view", tid, t + 123, 1, ext, [[m, n], []], [BF16, ""]),
                   {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": t + 124,
                    "args": {"Device Type": 1, "Device Id": 0, "Bytes": 2 * m * n}}]
        ts[tid] = t + 130 + rng.random()
        written += len(events)
        yield from events


def write_trace(path: Path, n_events: int, seed: int = 0, compress: bool = False) -> int:
    """Write a synthetic trace, one event at a time; returns the number of events."""
    opener = gzip.open if compress else open
    count = 0
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic"}], "traceEvents": [\n')
        for event in synthetic_events(n_events, seed):
            fh.write((",\n" if count else "") + json.dumps(event))
            count += 1
        fh.write('\n], "displayTimeUnit": "ms"}\n')
    return count


# The import in a fresh process, which then prints how long reading the trace took (profile.read:
# reading, linking, signatures) and its own peak resident memory (KiB on Linux).
_CHILD = """import resource, sys, time
from pytest_opperf.pipeline.mapping import profile
read, spent = profile.read, []
def timed(*args):
    start = time.perf_counter()
    out = read(*args)
    spent.append(time.perf_counter() - start)
    return out
profile.read = timed
from pytest_opperf.cli import main
code = main(["import", sys.argv[1], "-o", sys.argv[2], "--force"])
print("read_s", spent[0], "peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def import_once(trace: Path, out: Path) -> str:
    """`opperf import TRACE` in a fresh process: its wall time, the time in reading the trace, peak memory."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(trace), str(out)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"opperf import {trace} failed:\n{done.stdout}{done.stderr}")
    lines = done.stdout.splitlines()
    _, read_s, _, peak_kib = lines[-1].split()
    return (f"{trace.name}: {seconds:.1f} s ({float(read_s):.1f} s reading and linking the trace), peak "
            f"{int(peak_kib) / 1024:.0f} MiB\n  {lines[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--real", type=Path,
                        default=TRACES / "hta_rank0_109k_events.json.gz")
    parser.add_argument("--out", type=Path, help="where the synthetic trace and the databases go (default: a temp dir)")
    parser.add_argument("--gzip", action="store_true", help="write the synthetic trace gzip-compressed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        # The command's own cost (Python, the catalogue and torch imported for the mapping) on a 7-event trace.
        for trace in (TINY, args.real):
            if trace and trace.is_file():
                print(import_once(trace, out / "real.db"))
        trace = out / ("synthetic.json.gz" if args.gzip else "synthetic.json")
        start = time.perf_counter()
        count = write_trace(trace, args.events, compress=args.gzip)
        print(f"{trace.name}: {count} events, {trace.stat().st_size / 2**20:.0f} MiB, "
              f"written in {time.perf_counter() - start:.0f} s")
        print(import_once(trace, out / "synthetic.db"))


if __name__ == "__main__":
    main()
