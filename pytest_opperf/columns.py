"""The columns every op table has besides the op's parameters: the one declaration of their
names, order, SQLite types, units and meanings.

The store creates and writes them (store/database.py), the catalogue keeps an op's parameter
names clear of them (catalog/registry.py), the measuring code fills its groups (DEVICE_STATE,
CONTENTION, CLOCK_WARMUP) and the views describe them (view/datasette.py). It imports nothing of the
package, so every layer may import it. A new column is one line here, and one in docs/database.md's
column table.

>>> MEASURE["time_us"]
Column(type=<class 'float'>, description='median time of one call', unit='us')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Column:
    type: type  # int, float or str: the SQLite type the store declares
    description: str
    # Pint's name of the unit, which Datasette displays; None where Pint has none (FLOP/s),
    # the description then says it.
    unit: Optional[str] = None


# With the op's parameters, these make up the unique index of its table.
KEY = {
    "dtype_in": Column(str, "input dtype"),
    "dtype_out": Column(str, "output dtype"),
    "backend": Column(str, "backend: the implementation that ran"),
    "backend_version": Column(str, "installed version of the backend's library"),
    "knobs": Column(str, "the backend's tuning knobs as JSON ('' without)"),
    "timer": Column(str, "how a sample was timed: cpu, event, cuda_graph or profiler"),
    "cache": Column(str, "cache state: cold (the last-level cache flushed by a read before each call), hot, or "
                         "resident (flushed, then the case's resident inputs read into it)"),
}

# Read through NVML before and after each case (measure/devstate.py).
DEVICE_STATE = {
    "sm_clock_mhz_before": Column(int, "GPU SM clock before the case (NVML)", "MHz"),
    "sm_clock_mhz_after": Column(int, "GPU SM clock after the case (NVML)", "MHz"),
    "mem_clock_mhz": Column(int, "GPU memory clock (NVML)", "MHz"),
    "temp_c_before": Column(int, "GPU temperature before the case", "degC"),
    "temp_c_after": Column(int, "GPU temperature after the case", "degC"),
    "power_w_before": Column(float, "GPU power draw before the case", "W"),
    "power_w_after": Column(float, "GPU power draw after the case", "W"),
    "throttle_reasons": Column(str, "clock-event reasons seen during the case"),
    "throttled": Column(int, "1 if a reason that slows the GPU was seen (power cap, thermal, HW slowdown)"),
}

# Whether other processes competed for the CPUs or the GPU while the case was measured (measure/contention.py).
CONTENTION = {
    "contended": Column(int, "1 if other processes took the cores the case's threads needed, its threads waited for "
                             "a CPU, or another process computed on its GPU while it was measured"),
    "contention": Column(str, "what was seen while the case was measured: others' CPU share, our threads' run-queue "
                              "wait, other GPU processes"),
}

# What clock warm-up ran right before the case (measure/clocks.py).
CLOCK_WARMUP = {
    "clock_warmup_s": Column(float, "seconds the device was held busy before this case until its clock was steady, "
                                    "or left idle until a heavy case's low clock came back", "s"),
    "clock_warmup_method": Column(str, "how the clock warm-up ended: steady, bound or fixed; settled or settle-bound "
                                       "after a heavy case"),
    "clock_warmup_mhz_start": Column(int, "SM clock when the warm-up began", "MHz"),
    "clock_warmup_mhz_end": Column(int, "SM clock when the warm-up ended", "MHz"),
}

# Where the case's wall time went (measure/phases.py), and when it ran.
PHASES = {
    "phase_setup_ms": Column(float, "pytest set-up of the case's fixtures, its inputs left out (collectives: and "
                                    "starting the rank group, in the first case of its size)", "ms"),
    "phase_inputs_ms": Column(float, "creation of the case's random inputs (inputs fixture)", "ms"),
    "phase_check_ms": Column(float, "the functional check before timing: first call, reference, comparison", "ms"),
    "phase_warmup_ms": Column(float, "clock warm-up and warm-up calls", "ms"),
    "phase_devstate_ms": Column(float, "device-state (NVML) and contention readings before and after the case", "ms"),
    "phase_sampling_ms": Column(float, "the timer's sampling loop, its cache flushes and graph capture included", "ms"),
    "phase_verify_ms": Column(float, "the check of one timed call after sampling, and kernel names", "ms"),
    "phase_record_ms": Column(float, "making the row and the gate's verdict", "ms"),
    "started_unix_s": Column(float, "when the case's set-up began, host clock, seconds since the epoch", "s"),
    "ended_unix_s": Column(float, "when the case's record was made, host clock, seconds since the epoch", "s"),
}

MEASURE = {
    "time_us": Column(float, "median time of one call", "us"),
    "time_us_mean": Column(float, "mean time of one call", "us"),
    "time_us_p95": Column(float, "95th percentile of the time of one call", "us"),
    "time_us_std": Column(float, "standard deviation of the samples", "us"),
    "time_us_min": Column(float, "fastest sample", "us"),
    "time_us_first": Column(float, "the case's first measurement, in its turn, when the gate re-measured it "
                                   "(--opperf-confirm): time_us is then the re-measurement the gate judged", "us"),
    "cv": Column(float, "coefficient of variation of the steady state: std / mean of the samples within Tukey's "
                       "far-out fences (3 IQR past the quartiles); the samples beyond are the outliers"),
    "outliers": Column(int, "samples beyond Tukey's far-out fences, left out of cv: stalls and interruptions, "
                            "counted rather than blended"),
    "outlier_share": Column(float, "the outliers' fraction of the samples"),
    "outlier_us": Column(float, "the outliers' typical size: the median of their distance from time_us (positive: "
                                "slower); NULL without outliers", "us"),
    "samples": Column(int, "samples taken"),
    "ci_rel": Column(float, "half-width of the median's 95% confidence interval, relative to the median"),
    "target_met": Column(int, "1 if ci_rel reached the precision target within the time budget (a collective's: "
                              "--opperf-collective-budget)"),
    "median_drift": Column(float, "the median of the later half of the samples (in the order taken) over the earlier "
                           "half's, less 1; NULL under 4 samples"),
    "unstable": Column(int, "1 if the median does not reproduce: |drift| > 0.03"),
    "gflops": Column(float, "achieved GFLOP/s (1e9 floating-point operations per second)"),
    "gbytes_per_s": Column(float, "achieved memory throughput, GB/s (1e9 bytes per second)", "GB/s"),
    "mfu": Column(float, "model FLOP utilisation: achieved FLOP/s over the device's peak for the dtype"),
    "mbu": Column(float, "memory bandwidth utilisation: achieved bytes/s over the device's peak bandwidth"),
    "mfu_attainable": Column(float, "achieved FLOP/s over the device's measured ceiling for the dtype "
                                    "(opperf calibrate)"),
    "mbu_attainable": Column(float, "achieved bytes/s over the device's measured memory bandwidth (opperf calibrate)"),
    "flops": Column(float, "floating-point operations of one call (the op's formula)"),
    "bytes": Column(float, "fewest bytes one call must move (the op's formula)", "B"),
    "peak_dtype": Column(str, "the dtype whose peak MFU uses"),
    "peak_kind": Column(str, "the units whose peak MFU uses: matrix or vector"),
    "kernels": Column(str, "JSON list of the kernels one call ran"),
    "warmup_calls": Column(int, "warm-up calls before sampling"),
    "calls_per_sample": Column(int, "calls one sample averages"),
    "cache_flush": Column(str, "how the cache was cleared before the timed calls: read (a read of twice the "
                               "last-level cache before each call), read-per-sample (before each sample's first "
                               "call) or none (hot); +resident: then a read of the resident inputs"),
    "first_call_ms": Column(float, "wall time of the first (checked) call: compilation, autotuning, lazy set-up", "ms"),
    "check_floor": Column(float, "the functional check's detection floor on this case: the smallest scale error "
                                 "(an output 1 + e times the correct one) its check surely fails, relative, from "
                                 "the checked output's own error (measure/check.py); above 0.01 a kernel 1% off "
                                 "could pass. 0 where every output is compared exactly (any wrong element fails)"),
    "check_failed": Column(str, "set on a stored row when its case's functional check failed in a later run "
                                "('run_id: message'): kept as history, no view takes it as current"),
    **DEVICE_STATE,
    **CONTENTION,
    **CLOCK_WARMUP,
    "extra_info": Column(str, "bench.extra_info as JSON"),
    "test_id": Column(str, "the pytest node id"),
    "run_id": Column(str, "the run that wrote the row (see the runs table)"),
    "created_at": Column(str, "when the row was written (UTC)"),
    "worker": Column(str, "the xdist worker that ran the case"),
    "gpu": Column(int, "index of the physical GPU that ran the case"),
    "gpu_uuid": Column(str, "UUID of the GPU that ran the case"),
    "gpus": Column(str, "a collective case: the devices its ranks ran on, as the visibility variable names "
                        "them ('0,1'; under -n, the devices the scheduler leased it)"),
    "rank": Column(int, "the torchrun rank that measured the case (NULL outside torchrun)"),
    "num_nodes": Column(int, "nodes of the sweep (torchrun's); collectives: nodes the case's group spans"),
    # Collectives only (NULL elsewhere): nccl-tests' bandwidths and what the traffic crossed.
    "topology_tier": Column(int, "collectives: 0 across nodes, 1 within a node, 2 within a package"),
    "comm_backend": Column(str, "collectives: the torch.distributed backend (nccl, gloo, hccl)"),
    "comm_convention": Column(str, "collectives: how a call was timed: loop (nccl-tests' back-to-back calls), "
                                   "graph (those calls in a CUDA graph, nccl-tests -G) or single (one call)"),
    "topology_link": Column(str, "collectives: the link the group's traffic crosses: nvlink, pcie, loopback "
                                 "(a CPU) or network (across nodes)"),
    "algbw_gbps": Column(float, "collectives: algorithm bandwidth S / time (nccl-tests)", "GB/s"),
    "busbw_gbps": Column(float, "collectives: bus bandwidth, algbw times the op's factor (nccl-tests)", "GB/s"),
    "link_gbps": Column(float, "collectives: the device's link bandwidth, one direction (the spec)", "GB/s"),
    "busbw_util": Column(float, "collectives: busbw over the link bandwidth"),
    "tuned_table": Column(str, "the tuned-knobs file the kernel took the row's knobs from (--opperf-tuned), if any"),
    **PHASES,
}

# Names an op's parameter may not take: the table's own columns and SQLite's row names.
RESERVED = frozenset(KEY) | frozenset(MEASURE) | {"op", "rowid", "id"}


def types(columns: dict) -> dict:
    """name -> SQLite type, in order: the form the store builds its tables from.

    >>> types(CLOCK_WARMUP)["clock_warmup_method"]
    <class 'str'>
    """
    return {name: column.type for name, column in columns.items()}


def key_columns(params) -> list:
    """The columns of an op table's unique index: the op's parameters, then the KEY columns.

    >>> key_columns(["m", "n"])[:3]
    ['m', 'n', 'dtype_in']
    """
    return [*params, *KEY]

