"""Export in pytest-benchmark's JSON format, so its tools (`pytest-benchmark compare`) read our runs.

    pytest benches/ --opperf-benchmark-json=out.json
    pytest-benchmark compare out.json

The statistics of each case are pytest-benchmark's own (pytest_benchmark.stats.Stats) over
our samples, in seconds per call as pytest-benchmark stores them. A record carries its samples
only when the export is asked for; the controller computes the statistics (stats_of) as it
writes the file at session end (document, write), with or without xdist.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Iterable

from pytest_opperf.record import SAMPLES_KEY, Record
from pytest_opperf.vcs import git



def stats_of(samples_us: Iterable[float], calls_per_sample: int) -> dict:
    """pytest-benchmark's stats fields over samples given in microseconds per call; seconds out.

    >>> s = stats_of([1.0, 2.0, 3.0, 4.0], 1)
    >>> s["median"], s["rounds"], s["iterations"]
    (2.5e-06, 4, 1)
    """
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for x in samples_us:
        stats.update(float(x) * 1e-6)
    out = {name: getattr(stats, name) for name in Stats.fields}
    out["iterations"] = int(calls_per_sample)
    return out


def document(records: list[dict], machine_info: dict, commit_info: dict) -> dict:
    """The whole file: machine_info, commit_info, benchmarks, datetime, version."""
    from pytest_benchmark import __version__

    return {
        "machine_info": machine_info,
        "commit_info": commit_info,
        "benchmarks": [Record(r).to_benchjson(stats_of(r[SAMPLES_KEY], r["calls_per_sample"]))
                       for r in records if SAMPLES_KEY in r],
        "datetime": dt.datetime.now(dt.timezone.utc).isoformat(),
        "version": __version__,
    }


def machine_info(run: dict) -> dict:
    """pytest-benchmark's machine_info keys, and the run's device and environment under 'opperf'.

    The CPU entry is kept short: py-cpuinfo (what pytest-benchmark calls) takes about a second.
    """
    return {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {"count": os.cpu_count(), "arch_string_raw": platform.machine()},
        "opperf": run,
    }


def commit_info(run: dict, rootpath: Path) -> dict:
    """pytest-benchmark's commit_info keys for the checkout the run measured (from the run row)."""
    commit = run.get("git_commit")
    branch = git(rootpath, "rev-parse", "--abbrev-ref", "HEAD") if commit else None
    return {
        "id": commit or "unversioned",
        "time": git(rootpath, "show", "-s", "--format=%cI", "HEAD") if commit else None,
        "author_time": git(rootpath, "show", "-s", "--format=%aI", "HEAD") if commit else None,
        "dirty": bool(run.get("git_dirty")),
        "project": rootpath.name,
        "branch": "(detached head)" if branch == "HEAD" else branch or "(unknown)",
    }


def write(path: Path, records: list[dict], run: dict, rootpath: Path) -> int:
    """Write the file (its folder created); returns the number of benchmarks in it."""
    doc = document(records, machine_info(run), commit_info(run, rootpath))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=4, default=str))
    os.replace(tmp, path)  # a reader never sees half a file
    return len(doc["benchmarks"])
