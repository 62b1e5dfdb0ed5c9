"""`bench(fn, *args)`: the plugin's timers outside pytest, for a script or a notebook.

    >>> import torch, pytest_opperf
    >>> a, b = torch.randn(256, 256), torch.randn(256, 256)
    >>> r = pytest_opperf.bench(torch.matmul, a, b, reference=lambda a, b: a.double() @ b.double())
    >>> r.time_us, r.ci_rel, r.timer, r.cache                  # doctest: +SKIP
    (312.4, 0.0061, 'cpu', 'hot')

The same path as a sweep's case (run/bench.py), without a database: one call checked against
`reference` (when given), warm-up, samples with the device's default timer until the median's
95% confidence interval is within `target` or `budget_s` is spent, then one timed call checked
again (a timer that timed other work raises). Nothing here needs pytest.
"""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

from pytest_opperf import dtypes
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure import check, clocks, contention, devstate, sampler, timers
from pytest_opperf.measure.inputs import CACHES, Workload, default_cache
from pytest_opperf.measure.stats import StoppingRule, is_unstable, median_ci

_WARMERS: dict = {}  # torch device -> its clock warmer: a notebook's later calls skip a warm-up already done


class BenchError(Exception):
    """A wrong argument, a failed check, or a timer that timed other work than it was given."""


# triton.testing.do_bench's return_mode values: the statistic float(result) gives, in ms.
RETURN_MODES = ("min", "max", "mean", "median", "all")


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """What bench() measured: the statistics of a sweep's row, and how they were taken.

    time_us is the median of one call, microseconds; ci_us the (low, high) bounds of its ~95%
    confidence interval, microseconds (None with fewer than 8 samples); samples the time of one
    call per sample, microseconds, in the order taken; contended and contention as a row's
    (other processes took the cores or the GPU while it was measured, and what was seen).

    Where do_bench's hands go: float(result) is milliseconds, the `return_mode` statistic (the
    median unless asked); with `quantiles`, unpacking gives their values in milliseconds, as
    do_bench returns them (`ms, lo, hi = bench(fn, quantiles=[0.5, 0.2, 0.8])`); with
    return_mode="all", every sample in milliseconds.
    """

    time_us: float
    ci_us: Optional[tuple[float, float]]
    ci_rel: Optional[float]  # the interval's half-width over the median, as a row's ci_rel
    target_met: bool
    time_us_mean: float
    time_us_p95: float
    time_us_std: float
    time_us_min: float
    cv: float  # a row's cv: the spread of the samples within the far-out fences (measure/stats.py)
    samples: list
    timer: str
    cache: str
    device: str
    kernels: Optional[list]  # kernel names in call order; None where the timer cannot tell (a CPU)
    warmup_calls: int
    first_call_ms: float  # the first (checked) call: compilation, autotuning, lazy set-up
    checked: bool  # the output was compared with `reference`
    check_floor: Optional[float] = None  # the smallest scale error the check surely catches (measure/check.py)
    contended: Optional[bool] = None  # None where nothing could be read
    contention: Optional[str] = None
    return_mode: str = "median"
    quantiles: Optional[tuple] = None  # the fractions asked for
    outliers: int = 0  # samples beyond the far-out fences, left out of cv
    drift: Optional[float] = None  # the later half's median over the earlier half's, less 1 (a row's drift)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def ms(self) -> float:
        """The return_mode statistic of one call, milliseconds (the median for 'all')."""
        chosen = {"min": self.time_us_min, "max": max(self.samples), "mean": self.time_us_mean}
        return chosen.get(self.return_mode, self.time_us) / 1e3

    @property
    def quantiles_ms(self) -> Optional[tuple]:
        """The samples' values at `quantiles`, milliseconds (linear interpolation, as torch.quantile)."""
        if self.quantiles is None:
            return None
        ordered = sorted(self.samples)
        return tuple(_quantile(ordered, q) / 1e3 for q in self.quantiles)

    def __float__(self) -> float:
        return self.ms

    def __iter__(self):
        if self.quantiles is not None:
            return iter(self.quantiles_ms)
        if self.return_mode == "all":
            return iter([s / 1e3 for s in self.samples])
        raise TypeError("a BenchResult unpacks with quantiles= or return_mode='all'; float(result) is "
                        "its time in ms")

    @property
    def unstable(self) -> bool:
        """As a row's: the median does not reproduce (the halves' medians differ over 3%)."""
        return is_unstable(self.drift)

    def __repr__(self) -> str:
        ci = f" +-{self.ci_rel:.1%}" if self.ci_rel is not None else " (too few samples for a CI)"
        flags = ("" if self.target_met else ", target missed") + (", unstable" if self.unstable else "")
        flags += ", contended" if self.contended else ""
        kernels = f", kernels {self.kernels}" if self.kernels else ""
        return (f"<bench {self.time_us:.3f} us median{ci} over {self.n} samples, cv {self.cv:.3f}; "
                f"timer {self.timer}, cache {self.cache}, {self.device}{flags}{kernels}>")


def bench(fn: Callable, *args: Any, reference: Any = None, cache: Optional[str] = None,
          timer: Optional[str] = None, device: Any = None, target: float = 0.01, budget_s: float = 1.0,
          min_samples: int = 10, max_samples: int = 10_000, warmup_s: Optional[float] = None,
          tolerance: Optional[float] = None, clock_warmup: bool = True, quantiles: Optional[Sequence[float]] = None,
          return_mode: str = "median", **kwargs: Any) -> BenchResult:
    """Check fn(*args, **kwargs) against `reference`, then time it as a sweep times a case.

    reference: None (no check), a callable taking fn's arguments, or the expected output;
    compared normwise (measure/check.py) within `tolerance`, default an elementwise op's bound
    (2 units of the output dtype's roundoff, catalog/precision.py).
    cache: "hot" (the same inputs back to back) or "cold" (inputs out of the last-level cache);
    default as a sweep's: hot on a CPU, cold on an accelerator. timer: cpu, event, cuda_graph
    or profiler; default as a sweep's: profiler on CUDA, event on other accelerators, cpu on a
    CPU. device: where fn runs; default the device of the first tensor argument.
    target, budget_s, min_samples, max_samples, warmup_s: as --opperf-target (a fraction),
    --opperf-budget, --opperf-min-samples, --opperf-max-samples, --opperf-warmup (None: auto).
    clock_warmup: hold an idle GPU busy until its clock is steady first (--opperf-clock-warmup=auto).
    quantiles, return_mode: as triton.testing.do_bench's, for what float() and unpacking give (ms).
    Other keyword arguments go to fn.
    """
    import torch

    if not callable(fn):
        raise BenchError(f"fn={_short(fn)}: expected a callable to time (bench(fn, *args)), got "
                         f"{type(fn).__name__}")
    if return_mode not in RETURN_MODES:
        raise BenchError(f"return_mode={return_mode!r}: expected one of {', '.join(RETURN_MODES)}")
    wanted = _quantiles(quantiles)
    dev = _device(device, args)
    timer = timer or timers.default_timer(dev.type)
    cache = cache or default_cache(dev.type)
    _check_choices(timer, cache, dev.type)
    rule = _rule(target, budget_s, min_samples, max_samples, warmup_s)
    work = Workload(fn, args, kwargs)
    with torch.inference_mode():
        first = _Checked(work, reference, tolerance, dev.type)
        warmer = _warmer(dev, clock_warmup)
        warmer.before_case()
        probe = contention.Probe(devstate.open_monitor(dev))
        probe.start(contention.own_threads(dev.type))
        try:
            m = sampler.measure(work, dev, timer, cache, rule, warmup_s=warmup_s, cache_bytes=_cache_bytes(dev),
                                kernel_names=True, check=first.timed if reference is not None else None)
        except timers.TimerError as exc:
            raise BenchError(f"timer {timer}: {exc}") from None
        finally:
            warmer.after_case()
        seen = probe.stop()
    result = _result(m, str(dev), first)
    contended = None if seen["contended"] is None else bool(seen["contended"])
    return dataclasses.replace(result, contended=contended, contention=seen["contention"], return_mode=return_mode,
                               quantiles=wanted)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _quantiles(quantiles: Optional[Sequence[float]]) -> Optional[tuple]:
    if quantiles is None:
        return None
    try:
        wanted = tuple(float(q) for q in quantiles)
    except (TypeError, ValueError):
        wanted = ()
    if not wanted or not all(0 <= q <= 1 for q in wanted):
        raise BenchError(f"quantiles={_short(quantiles)}: expected a list of fractions between 0 and 1, "
                         f"as do_bench's [0.5, 0.2, 0.8]")
    return wanted


def _quantile(ordered: list, q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly between neighbours (numpy's default).

    >>> _quantile([1.0, 2.0, 3.0, 4.0], 0.5), _quantile([1.0, 2.0, 3.0, 4.0], 0.2)
    (2.5, 1.6)
    """
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


class _Checked:
    """The first call, checked against the reference; then the check of a timed call's output."""

    def __init__(self, work: Workload, reference: Any, tolerance: Optional[float], device_type: str):
        from pytest_opperf.measure.accelerator import synchronize

        self.work, self.reference, self.tolerance = work, reference, tolerance
        start = time.perf_counter()
        out = work()
        synchronize(device_type)
        self.first_call_ms = (time.perf_counter() - start) * 1e3
        self.expected = self._expected(work.args) if reference is not None else None
        problem, self.floor = self._compare(out, self.expected) if reference is not None else (None, None)
        if problem:
            raise BenchError(f"check against the reference failed: {problem}")

    def timed(self, args: tuple, out: Any) -> Optional[str]:
        """Why the output of a call the timer made is wrong (its inputs may be copies), or None."""
        expected = self.expected if check.same_values(args, self.work.args) else self._expected(args)
        problem = self._compare(out, expected)[0]
        return f"the timed call's output differs from the reference: {problem}" if problem else None

    def _expected(self, args: tuple) -> Any:
        if callable(self.reference):
            return self.reference(*args, **self.work.kwargs)
        return self.reference

    def _compare(self, out: Any, expected: Any) -> tuple[Optional[str], Optional[float]]:
        """(why out is wrong or None, the check's detection floor): check.examine."""
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        try:
            dtype_out = dtypes.lookup(str(first.dtype).rpartition(".")[2])
        except (AttributeError, KeyError):
            return f"fn returned {type(first).__name__}, expected a tensor of a known dtype", None
        if self.tolerance is None:
            from pytest_opperf.catalog.precision import elementwise_tolerance
            from pytest_opperf.catalog.registry import DTypes

            return check.examine(out, expected, dtype_out, elementwise_tolerance(DTypes(dtype_out, dtype_out)))
        return check.examine(out, expected, dtype_out, self.tolerance)


def _device(device: Any, args: tuple):
    import torch

    if device is not None:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise BenchError(f"device={device!r}: {exc}") from None
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _check_choices(timer: str, cache: str, device_type: str) -> None:
    if timer not in timers.TIMERS:
        raise BenchError(f"timer={timer!r}: expected one of {', '.join(timers.TIMERS)}")
    reason = timers.unsupported(timer, device_type)
    if reason:
        raise BenchError(f"timer={timer!r}: {reason}")
    if cache not in CACHES:
        raise BenchError(f"cache={cache!r}: expected one of {', '.join(CACHES)}")


def _rule(target: float, budget_s: float, min_samples: int, max_samples: int,
          warmup_s: Optional[float]) -> StoppingRule:
    if not 0 < target < 1:
        raise BenchError(f"target={target!r}: expected a fraction between 0 and 1 (0.01 is 1%)")
    if budget_s < 0 or (warmup_s is not None and warmup_s < 0):
        raise BenchError(f"budget_s={budget_s!r}, warmup_s={warmup_s!r}: expected seconds >= 0")
    try:
        return StoppingRule(target, int(min_samples), int(max_samples), budget_s)
    except ValueError as exc:
        raise BenchError(str(exc).replace("StoppingRule", "bench")) from None


def _cache_bytes(dev) -> Optional[int]:
    """The last-level cache cold timing must clear: the GPU's L2, else the detected spec's figure."""
    if dev.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(dev).L2_cache_size
    spec = hardware.load_specs(None).get("cpu") if dev.type == "cpu" else None
    return int(spec.l2_mbytes * 1e6) if spec is not None and spec.l2_mbytes else None


def _warmer(dev, clock_warmup: bool) -> clocks.ClockWarmer:
    """The process's clock warmer for this device, as a sweep makes it (auto, or off)."""
    if not clock_warmup:
        return clocks.open_warmer(SimpleNamespace(clock_warmup_auto=False, clock_warmup_s=None), dev, None)
    if dev not in _WARMERS:
        settings = SimpleNamespace(clock_warmup_auto=True, clock_warmup_s=None)
        _WARMERS[dev] = clocks.open_warmer(settings, dev, devstate.open_monitor(dev))
    return _WARMERS[dev]


def _result(m: sampler.Measurement, device: str, first: _Checked) -> BenchResult:
    s = m.stats
    lo, hi = median_ci(s.data)
    return BenchResult(
        time_us=s.median, ci_us=None if lo is None else (lo, hi),
        ci_rel=None if math.isinf(s.median_ci_rel) else s.median_ci_rel, target_met=m.met,
        time_us_mean=s.mean, time_us_p95=s.p95, time_us_std=s.std, time_us_min=s.min, cv=s.steady.cv,
        samples=list(m.samples), timer=m.timer, cache=m.cache, device=device, kernels=m.kernels,
        warmup_calls=m.warmup_calls, first_call_ms=first.first_call_ms, checked=first.reference is not None,
        check_floor=first.floor, outliers=s.outliers, drift=s.drift)
