"""Command-line options, their ini keys, and their validation into one Settings object.

Every option but --device is prefixed --opperf-; each has an ini key of the same name with
underscores (``--opperf-max-cases`` <-> ``opperf_max_cases``); the command line wins.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf import files
from pytest_opperf.amounts import parse_fraction, parse_width
from pytest_opperf.catalog import tuned
from pytest_opperf.gate.rules import RULES
from pytest_opperf.gate.drift import NORMALIZE
from pytest_opperf.gate.noise import MAX_RUNS
from pytest_opperf.measure.inputs import CACHES
from pytest_opperf.measure.timers import TIMERS

# A collective case's sampling budget by default. torch_dist's loop below 16 MiB never reaches the 1%
# target (a process group's watchdog stalls it every ~100 ms; docs/collectives.md), so its cases
# spent a kernel case's whole budget: a quarter second bounds the sweep's collective phase, and the
# row's `drift` and `unstable` say whether its median held over that time.
COLLECTIVE_BUDGET_S = 0.25

# name, ini key, default, help. Defaults are strings: they pass through the same parsing as user input.
OPTIONS = [
    ("--device", "opperf_device", "", "hardware spec NAME (peaks, bandwidth) and database results/NAME.db; default: detected"),
    ("--opperf-configs", "opperf_configs", "configs", "directory of <op>.yaml configs, relative to the rootdir"),
    ("--opperf-config", "opperf_config", "", "config file(s) to use instead of the directory's for the op they name (repeatable)"),
    ("--opperf-results", "opperf_results", "results", "directory of the per-device SQLite files, relative to the rootdir"),
    ("--opperf-hardware", "opperf_hardware", "", "YAML file of extra hardware specs, same format as the built-in one"),
    ("--opperf-max-cases", "opperf_max_cases", "5000", "refuse a config whose grid has more cases than this"),
    ("--opperf-max-file-mb", "opperf_max_file_mb", "auto", "refuse a config, baseline, tuned table or specs file "
     f"larger than this many MiB (auto: env {files.ENV}, else {files.DEFAULT_MAX_MB:g})"),
    ("--opperf-version-mismatch", "opperf_version_mismatch", "error", "error|skip: what a backend version pin that the installed library does not satisfy does"),
    ("--opperf-sample-only", "opperf_sample_only", "", "measure but write no database (also env OPPERF_SAMPLE_ONLY=1)"),
    ("--opperf-timer", "opperf_timer", "auto", f"timer: auto|{'|'.join(sorted(TIMERS))}"),
    ("--opperf-cache", "opperf_cache", "auto", "auto|cold|hot|resident: flush the cache before each sample (cold), not (hot), or flush and then read a "
                      "case's resident inputs (resident)"),
    ("--opperf-kernel-names", "opperf_kernel_names", "auto", "auto|off: record the kernels each case ran (auto: from the profiler timer, else one profiled call on an accelerator)"),
    ("--opperf-benchmark-json", "opperf_benchmark_json", "", "write the results as pytest-benchmark JSON to this PATH at session end (readable by pytest-benchmark compare)"),
    ("--opperf-target", "opperf_target", "1%", "stop sampling once the median's 95% CI half-width is within this"),
    ("--opperf-min-samples", "opperf_min_samples", "10", "samples per case at least"),
    ("--opperf-max-samples", "opperf_max_samples", "10000", "samples per case at most"),
    ("--opperf-budget", "opperf_budget", "1.0", "seconds of sampling per case before giving up on the target"),
    ("--opperf-collective-budget", "opperf_collective_budget", "auto", "auto|SECONDS: seconds of sampling per "
     f"collective case before giving up on the target (auto: {COLLECTIVE_BUDGET_S:g}, or --opperf-budget where that "
     "is less)"),
    ("--opperf-warmup", "opperf_warmup", "auto", "auto|SECONDS: warm-up calls per case after its check, 2 at least, then until "
     "two rounds of about 1 ms agree within 5% (auto: at most 50 ms) or for SECONDS"),
    ("--opperf-clock-warmup", "opperf_clock_warmup", "auto", "auto|off|SECONDS: before the first case and after "
     "5 s without one, keep the GPU busy until its SM clock is steady (NVML; auto: at most 3 s), or for a fixed time "
     "without NVML (auto: 1 s); SECONDS bounds both; nothing on a CPU"),
    ("--opperf-seed", "opperf_seed", "0", "seed of the random inputs"),
    ("--opperf-contention", "opperf_contention", "auto", "auto|off: read whether other processes compete for the "
     "CPUs or the GPU around each case (columns contended, contention; the gate does not judge contended cases); "
     "off: read nothing, judge every case"),
    ("--opperf-threads", "opperf_threads", "auto", "auto|N: torch's intra-op threads for the cases (auto, on a CPU: "
     "at most the cores other processes leave free at the start, shared among xdist workers; N: exactly N)"),
    ("--opperf-flush-interval", "opperf_flush_interval", "60", "seconds between checkpoints of the rows so far to the database (between cases; a case that runs longer gets one from a timer)"),
    ("--opperf-summary", "opperf_summary", "100", "rows in the terminal summary (0: none)"),
    ("--opperf-columns", "opperf_columns", "", "the terminal summary's columns, comma-separated (e.g. "
     "case,time_us,util,cv,flags; docs/options.md lists them); default: case, time, throughput, MFU/MBU, CV, flags"),
    ("--opperf-width", "opperf_width", "auto", "auto|full|N: the width the summary and the gate's table fit "
     "(auto: the terminal's, or COLUMNS; no limit when the output is not a terminal; full: no limit)"),
    ("--opperf-timeout", "opperf_timeout", "0", "seconds a case may run before it is stopped and fails (0: no limit); "
     "under -n its worker is replaced"),
    ("--opperf-max-mem-gb", "opperf_max_mem_gb", "auto", "memory budget of a case in GB (1e9 bytes): a case whose "
     "estimated footprint exceeds it is skipped at collection; auto: the device's free memory (no check on a CPU); "
     "none: no check"),
    ("--opperf-shard", "opperf_shard", "", "I/N: run only the I-th (0 <= I < N) of N deterministic shares of the "
     "collected cases, balanced by their recorded time (the results database, or --opperf-durations), else by count"),
    ("--opperf-durations", "opperf_durations", "", "FILE of seconds per test id (JSON {node id: seconds}, pytest-split's "
     ".test_durations) that --opperf-shard balances and -n orders by, instead of the results database's times"),
    ("--opperf-baseline", "opperf_baseline", "", "baseline FILE (JSON) to gate this run against: a case slower beyond the threshold and the noise fails"),
    ("--opperf-max-regression", "opperf_max_regression", "5%", "gate threshold: slowdown a case may have over its baseline (configs' max_regression override it)"),
    ("--opperf-gate-rule", "opperf_gate_rule", "ci", f"how the gate tells a regression from noise: {'|'.join(RULES)}"),
    ("--opperf-save-baseline", "opperf_save_baseline", "", "write this run's cases into baseline FILE (merged into an existing one)"),
    ("--opperf-report-json", "opperf_report_json", "", "write a JSON report of this run (commit, device, p50/p95, ratio, verdict) to FILE"),
    ("--opperf-report-md", "opperf_report_md", "", "write a markdown report of the gate to FILE (also appended to $GITHUB_STEP_SUMMARY)"),
    ("--opperf-html", "opperf_html", "", "write a self-contained HTML report of the run's database (summary, plots, rows, gate verdicts) to PATH at session end"),
    ("--opperf-calibrate", "opperf_calibrate", "auto", "auto|missing|always|off: hold rows against the device's "
     "measured ceilings too (auto: the stored calibration, if any; missing: calibrate first when none is stored or it "
     "is stale; always: calibrate first; off: none)"),
    ("--opperf-trace", "opperf_trace", "", "write a torch.profiler Chrome trace of each case (its samples as opperf::sample[i] ranges) to DIR/<test id>.json, in a pass after the case's measurement"),
    ("--opperf-tuned", "opperf_tuned", "", "tuned-knobs table(s) of `opperf best --export` that our Triton kernels read when a case gives no knobs (repeatable; default: env OPPERF_TUNED)"),
    ("--opperf-baseline-runs", "opperf_baseline_runs", "5", "runs of each case --opperf-save-baseline keeps (the "
     "last N, 1..30); the gate allows for their spread (1: replace the case)"),
    ("--opperf-confirm", "opperf_confirm", "1", "re-measure a case that looks regressed this many times at the end of "
     "the session, with fresh inputs; it fails only if every re-measurement agrees (0: fail at once)"),
    ("--opperf-inconclusive", "opperf_inconclusive", "pass", "pass|fail: what a case the gate cannot judge does "
     "(contended while measured, a verdict the machine's drift could change, a slowdown against a baseline of "
     "fewer than 3 runs): pass, reported as inconclusive; fail"),
    ("--opperf-normalize", "opperf_normalize", "off", "off|reference: divide each case's time by the machine's "
     "drift, timed on reference kernels (a copy, a GEMM) against the baseline's"),
    ("--opperf-rank-timeout", "opperf_rank_timeout", "300", "seconds a collective's rank may take to answer one step "
     "(start, check, a batch of samples) before its case fails and its process group is ended"),
    ("--opperf-topology-tier", "opperf_topology_tier", "auto", "auto|0|1|2: the topology_tier of collective rows "
     "(0 across nodes, 1 within a node, 2 within a package); auto: from the ranks' hosts"),
    ("--opperf-comm-convention", "opperf_comm_convention", "auto", "auto|loop|graph|single: how a collective is "
     "timed (docs/collectives.md): loop, nccl-tests' back-to-back calls between host clock readings (auto); graph, "
     "those calls in a CUDA graph (nccl-tests -G); single, one call per sample"),
    ("--opperf-one-rank", "opperf_one_rank", "", "run collective cases of num_devices=1 too (a group of one rank "
     "moves no data: busbw 0); without it they are skipped, as cases that need more devices than the machine has"),
]
SWITCHES = ("--opperf-sample-only", "--opperf-one-rank")  # flags without a value (ini: true/false)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("opperf", "operator performance (pytest-opperf)")
    for flag, ini, default, help_text in OPTIONS:
        dest = ini
        parser.addini(ini, help=help_text, default=default)
        help_text = help_text.replace("%", "%%")  # argparse formats help strings with %
        default = default.replace("%", "%%")
        if flag in SWITCHES:
            group.addoption(flag, action="store_true", default=None, dest=dest, help=help_text)
        elif flag in ("--opperf-config", "--opperf-tuned"):
            group.addoption(flag, action="append", default=None, dest=dest, metavar="FILE", help=help_text)
        else:
            group.addoption(flag, action="store", default=None, dest=dest, help=f"{help_text} (default: {default or 'none'})")


def raw_value(config: pytest.Config, ini: str) -> str:
    """The option's text as given: the command line, else the ini key (a repeated option joined with ',')."""
    value = config.getoption(ini)
    if value is None:
        return str(config.getini(ini))
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


@dataclass(frozen=True)
class Settings:
    device: str
    configs_dir: Path
    config_files: tuple
    results_dir: Path
    hardware_file: Optional[Path]
    max_cases: int
    version_mismatch: str
    sample_only: bool
    timer: str
    cache: str
    kernel_names: bool
    benchmark_json: Optional[Path]
    target_rel: float
    min_samples: int
    max_samples: int
    budget_s: float
    collective_budget_s: float  # --opperf-collective-budget, auto resolved: min(COLLECTIVE_BUDGET_S, budget_s)
    warmup_s: Optional[float]  # seconds of warm-up calls at least; None: until steady (sampler.py)
    clock_warmup_s: Optional[float]  # explicit bound; None: see clock_warmup_auto
    clock_warmup_auto: bool  # the bound by what can be read (NVML or not); both unset: off
    seed: int
    flush_interval_s: float
    summary_rows: int
    timeout_s: float  # 0: no limit
    max_mem_gb: Optional[float]  # explicit budget; None: see mem_auto
    mem_auto: bool  # budget = free device memory (accelerators only)
    shard: Optional[tuple]  # (index, count) or None
    baseline_file: Optional[Path]
    max_regression: float
    gate_rule: str
    save_baseline_file: Optional[Path]
    report_json_file: Optional[Path]
    report_md_file: Optional[Path]
    html_file: Optional[Path]
    trace_dir: Optional[Path] = None
    durations_file: Optional[Path] = None  # --opperf-durations; None: the results database's times
    tuned_files: tuple = ()  # empty: the tables OPPERF_TUNED names, if any
    baseline_runs: int = 5
    confirm: int = 1  # re-measurements of a case that looks regressed
    normalize: str = "off"
    rank_timeout_s: float = 300.0
    topology_tier: Optional[int] = None  # None: detected
    one_rank: bool = False  # collective cases of num_devices=1 run (else they are skipped)
    comm_convention: str = "auto"  # how collectives are timed: auto (loop), loop, graph, single
    max_file_mb: Optional[float] = None  # None: env OPPERF_MAX_FILE_MB, else files.DEFAULT_MAX_MB
    threads: Optional[int] = None  # torch's intra-op threads; None: auto (run/session.py)
    inconclusive_fails: bool = False  # --opperf-inconclusive=fail
    contention: bool = True  # --opperf-contention=auto: read contention around each case
    columns: tuple = ()  # the summary's columns by name (view/cases.py checks them); empty: the default
    width: Optional[int] = 0  # 0: auto (the terminal's); None: no limit; else that many columns


def read(config: pytest.Config) -> Settings:
    """Validate every option; a bad value is a UsageError naming the option and what it expects.

    It also sets this process's limit on the size of the files it reads (files.set_max_mb).
    """
    root = config.rootpath
    raw = {ini: raw_value(config, ini) for _, ini, _, _ in OPTIONS}
    settings = Settings(device=raw["opperf_device"].strip(), **_choices(raw), **_paths(root, raw), **_amounts(raw))
    _check_limits(settings)
    files.set_max_mb(settings.max_file_mb)
    _check_files(settings)
    return settings


def _choices(raw: dict) -> dict:
    """The options that name one of a few choices (and the gate's threshold), checked."""
    sample_only = raw["opperf_sample_only"].lower() in ("1", "true", "yes", "on") or os.environ.get(
        "OPPERF_SAMPLE_ONLY", "").lower() in ("1", "true", "yes", "on")
    timer = raw["opperf_timer"].strip()
    if timer != "auto" and timer not in TIMERS:
        raise pytest.UsageError(f"--opperf-timer={timer}: expected auto or one of {sorted(TIMERS)}")
    cache = raw["opperf_cache"].strip()
    if cache != "auto" and cache not in CACHES:
        raise pytest.UsageError(f"--opperf-cache={cache}: expected auto, cold, hot or resident")
    kernel_names = raw["opperf_kernel_names"].strip()
    if kernel_names not in ("auto", "off"):
        raise pytest.UsageError(f"--opperf-kernel-names={kernel_names}: expected auto or off")
    mismatch = raw["opperf_version_mismatch"].strip()
    if mismatch not in ("error", "skip"):
        raise pytest.UsageError(f"--opperf-version-mismatch={mismatch}: expected error or skip")
    rule = raw["opperf_gate_rule"].strip()
    if rule not in RULES:
        raise pytest.UsageError(f"--opperf-gate-rule={rule}: expected one of {', '.join(RULES)}")
    max_regression = raw["opperf_max_regression"]
    try:
        max_regression_rel = parse_fraction(max_regression)
    except ValueError:
        raise pytest.UsageError(f"--opperf-max-regression={max_regression}: expected a threshold above zero "
                                f"such as 5% or 0.05") from None
    contention = raw["opperf_contention"].strip().lower()
    if contention not in ("auto", "off"):
        raise pytest.UsageError(f"--opperf-contention={raw['opperf_contention']}: expected auto or off")
    convention = raw["opperf_comm_convention"].strip().lower()
    if convention not in ("auto", "loop", "graph", "single"):
        raise pytest.UsageError(f"--opperf-comm-convention={raw['opperf_comm_convention']}: expected auto, loop, "
                                f"graph or single")
    inconclusive = raw["opperf_inconclusive"].strip().lower()
    if inconclusive not in ("pass", "fail"):
        raise pytest.UsageError(f"--opperf-inconclusive={raw['opperf_inconclusive']}: expected pass or fail")
    return {"sample_only": sample_only, "timer": timer, "cache": cache, "kernel_names": kernel_names == "auto",
            "inconclusive_fails": inconclusive == "fail", "contention": contention == "auto",
            "version_mismatch": mismatch, "gate_rule": rule, "max_regression": max_regression_rel,
            "normalize": raw["opperf_normalize"].strip(), "comm_convention": convention, "one_rank": _switch(raw["opperf_one_rank"], "--opperf-one-rank"),
            **_terminal(raw)}


def _terminal(raw: dict) -> dict:
    """--opperf-columns (names, checked by the view that knows them) and --opperf-width."""
    try:
        width = parse_width(raw["opperf_width"], "--opperf-width")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    columns = tuple(c.strip() for c in raw["opperf_columns"].split(",") if c.strip())
    return {"columns": columns, "width": width}


def _switch(text: str, flag: str) -> bool:
    """A flag's value: given on the command line, or its ini key: true/false (1/0, yes/no, on/off)."""
    word = text.strip().lower()
    if word in ("", "0", "false", "no", "off"):
        return False
    if word in ("1", "true", "yes", "on"):
        return True
    ini = flag.lstrip("-").replace("-", "_")
    raise pytest.UsageError(f"{flag} (ini {ini}): expected true or false, got {text!r}")


def _paths(root: Path, raw: dict) -> dict:
    """The files and directories the options name, relative to the rootdir (None: not given)."""
    return {
        "configs_dir": root / raw["opperf_configs"].strip(),
        "config_files": _path_list(root, raw["opperf_config"]),
        "results_dir": root / raw["opperf_results"].strip(),
        "hardware_file": _path(root, raw["opperf_hardware"]),
        "benchmark_json": _path(root, raw["opperf_benchmark_json"]),
        "baseline_file": _path(root, raw["opperf_baseline"]),
        "save_baseline_file": _path(root, raw["opperf_save_baseline"]),
        "report_json_file": _path(root, raw["opperf_report_json"]),
        "report_md_file": _path(root, raw["opperf_report_md"]),
        "html_file": _path(root, raw["opperf_html"]),
        "trace_dir": _path(root, raw["opperf_trace"]),
        "durations_file": _path(root, raw["opperf_durations"]),
        "tuned_files": _path_list(root, raw["opperf_tuned"]),
    }


def _amounts(raw: dict) -> dict:
    """The numeric options, each read and held to its range."""
    return {
        "max_cases": _int(raw, "opperf_max_cases", "--opperf-max-cases", 1),
        "target_rel": _fraction(raw["opperf_target"], "--opperf-target"),
        "min_samples": _int(raw, "opperf_min_samples", "--opperf-min-samples", 1),
        "max_samples": _int(raw, "opperf_max_samples", "--opperf-max-samples", 1),
        "budget_s": _float(raw, "opperf_budget", "--opperf-budget", 0.0),
        "collective_budget_s": _collective_budget(raw),
        "warmup_s": _warmup(raw["opperf_warmup"]),
        **_clock_warmup(raw["opperf_clock_warmup"]),
        "seed": _int(raw, "opperf_seed", "--opperf-seed", 0),
        "flush_interval_s": _float(raw, "opperf_flush_interval", "--opperf-flush-interval", 0.0),
        "summary_rows": _int(raw, "opperf_summary", "--opperf-summary", 0),
        "timeout_s": _float(raw, "opperf_timeout", "--opperf-timeout", 0.0),
        **_memory_budget(raw["opperf_max_mem_gb"]),
        "shard": _shard(raw["opperf_shard"]),
        "baseline_runs": _int(raw, "opperf_baseline_runs", "--opperf-baseline-runs", 1),
        "confirm": _int(raw, "opperf_confirm", "--opperf-confirm", 0),
        "rank_timeout_s": _positive(raw["opperf_rank_timeout"], "--opperf-rank-timeout"),
        "topology_tier": _tier(raw["opperf_topology_tier"]),
        "max_file_mb": _max_file_mb(raw["opperf_max_file_mb"]),
        "threads": None if raw["opperf_threads"].strip().lower() == "auto" else _threads(raw),
    }


def _threads(raw: dict) -> int:
    text = raw["opperf_threads"].strip()
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"--opperf-threads={text}: expected auto or an integer >= 1")
    return int(text)


def _check_limits(settings: Settings) -> None:
    """What one option alone cannot say: a range that depends on another module or option."""
    if settings.baseline_runs > MAX_RUNS:
        raise pytest.UsageError(f"--opperf-baseline-runs={settings.baseline_runs}: expected an integer from 1 to {MAX_RUNS}")
    if settings.normalize not in NORMALIZE:
        raise pytest.UsageError(f"--opperf-normalize={settings.normalize}: expected {' or '.join(NORMALIZE)}")
    if settings.max_samples < settings.min_samples:
        raise pytest.UsageError(
            f"--opperf-max-samples={settings.max_samples} is below --opperf-min-samples={settings.min_samples}")


def _check_files(settings: Settings) -> None:
    """The files the run reads exist (the ones it writes are made when written)."""
    for f in settings.config_files:
        if not f.is_file():
            raise pytest.UsageError(f"--opperf-config={f}: no such file")
    for f in settings.tuned_files:
        if not f.is_file():
            raise pytest.UsageError(f"--opperf-tuned={f}: no such file (write one with `opperf best DB --op OP --export FILE`)")
    if settings.durations_file is not None and not settings.durations_file.is_file():
        raise pytest.UsageError(f"--opperf-durations={settings.durations_file}: no such file (expected JSON "
                                f"{{test id: seconds}}, as pytest-split's .test_durations)")
    if settings.hardware_file is not None and not settings.hardware_file.is_file():
        raise pytest.UsageError(f"--opperf-hardware={settings.hardware_file}: no such file")
    if settings.baseline_file is not None and not settings.baseline_file.is_file():
        raise pytest.UsageError(f"--opperf-baseline={settings.baseline_file}: no such file (write one with "
                                f"--opperf-save-baseline=FILE or `opperf baseline results/<device>.db -o FILE`)")


def _path(root: Path, text: str) -> Optional[Path]:
    text = text.strip()
    return root / text if text else None


def _path_list(root: Path, text: str) -> tuple:
    """A repeatable option (joined with ',') or an ini list (one a line): each path under the rootdir."""
    return tuple(root / f.strip() for f in text.replace("\n", ",").split(",") if f.strip())


def _int(raw: dict, ini: str, flag: str, minimum: int) -> int:
    return _at_least(raw, ini, flag, minimum, int)


def _float(raw: dict, ini: str, flag: str, minimum: float) -> float:
    return _at_least(raw, ini, flag, minimum, float)


def _at_least(raw: dict, ini: str, flag: str, minimum, kind: type):
    """The option's value read as `kind` (int or float), refused below `minimum` or unreadable."""
    text = raw[ini].strip()
    try:
        value = kind(text)
    except ValueError:
        value = math.nan
    if not value >= minimum:
        raise pytest.UsageError(f"{flag}={text}: expected {'an integer' if kind is int else 'a number'} >= {minimum:g}")
    return value


def _memory_budget(text: str) -> dict:
    """'auto' | 'none' | a number of GB > 0 -> the Settings fields max_mem_gb and mem_auto."""
    word, value = _word_or_amount(text, "--opperf-max-mem-gb", ("auto", "none"), "GB")
    return {"max_mem_gb": value, "mem_auto": word == "auto"}


def _warmup(text: str) -> Optional[float]:
    """'auto' (None: until steady) | seconds >= 0 -> the Settings field warmup_s."""
    if text.strip() == "auto":
        return None
    try:
        return _float({"opperf_warmup": text}, "opperf_warmup", "--opperf-warmup", 0.0)
    except pytest.UsageError:
        raise pytest.UsageError(f"--opperf-warmup={text.strip()}: expected auto or seconds >= 0") from None


def _collective_budget(raw: dict) -> float:
    """'auto' (COLLECTIVE_BUDGET_S, or --opperf-budget where that is less: a budget lowered for a
    quick run lowers the collectives' too) | seconds >= 0 -> the Settings field collective_budget_s."""
    if raw["opperf_collective_budget"].strip().lower() == "auto":
        return min(COLLECTIVE_BUDGET_S, _float(raw, "opperf_budget", "--opperf-budget", 0.0))
    try:
        return _float(raw, "opperf_collective_budget", "--opperf-collective-budget", 0.0)
    except pytest.UsageError:
        raise pytest.UsageError(f"--opperf-collective-budget={raw['opperf_collective_budget'].strip()}: expected "
                                f"auto or seconds >= 0") from None


def _clock_warmup(text: str) -> dict:
    """'auto' | 'off' | seconds > 0 -> the Settings fields clock_warmup_s and clock_warmup_auto."""
    word, value = _word_or_amount(text, "--opperf-clock-warmup", ("auto", "off"), "seconds")
    return {"clock_warmup_s": value, "clock_warmup_auto": word == "auto"}


def _word_or_amount(text: str, flag: str, words: tuple, unit: str) -> tuple:
    """(word, None) for one of the two `words`, else (None, a finite number > 0); a UsageError otherwise.

    >>> _word_or_amount(" Auto", "--opperf-x", ("auto", "off"), "seconds"), _word_or_amount("2.5", "--opperf-x", ("auto", "off"), "s")
    (('auto', None), (None, 2.5))
    """
    t = text.strip().lower()
    if t in words:
        return t, None
    try:
        value = float(t)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise pytest.UsageError(f"{flag}={text}: expected {words[0]}, {words[1]} or a number of {unit} > 0")
    return None, value


def _shard(text: str) -> Optional[tuple]:
    """'' -> None; '2/8' -> (2, 8)."""
    t = text.strip()
    if not t:
        return None
    index, sep, count = t.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise pytest.UsageError(f"--opperf-shard={text}: expected I/N with N >= 1 and 0 <= I < N, e.g. 0/4")
    return i, n


def _fraction(text: str, flag: str) -> float:
    """'1%' -> 0.01, '0.02' -> 0.02."""
    try:
        value = parse_fraction(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise pytest.UsageError(f"{flag}={text}: expected a fraction between 0 and 100%")
    return value


def _positive(text: str, flag: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise pytest.UsageError(f"{flag}={text}: expected a number of seconds > 0")
    return value


def _max_file_mb(text: str) -> Optional[float]:
    """'auto' -> None (env, else the default); a number of MiB > 0 -> it; the env var checked too."""
    try:
        value = files.parse_max_mb(text, "--opperf-max-file-mb")
        if value is None:
            files.parse_max_mb(os.environ.get(files.ENV, ""), f"env {files.ENV}")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return value


def _tier(text: str) -> Optional[int]:
    """'auto' -> None (detected); '0', '1' or '2' -> that tier."""
    t = text.strip().lower()
    if t == "auto":
        return None
    if t not in ("0", "1", "2"):
        raise pytest.UsageError(f"--opperf-topology-tier={text}: expected auto, 0 (across nodes), 1 (within a node) "
                                f"or 2 (within a package)")
    return int(t)


def use_tuned(settings: Settings) -> list[str]:
    """Load the tuned-knobs tables of --opperf-tuned (else OPPERF_TUNED) for this process; the
    header lines that say so. A table that cannot be read is a usage error naming it."""
    try:
        tables = tuned.use(settings.tuned_files or None)
    except tuned.TunedError as exc:
        where = "--opperf-tuned" if settings.tuned_files else f"env {tuned.ENV}"
        raise pytest.UsageError(f"{where}: {exc}") from None
    return [f"opperf: tuned knobs from {', '.join(map(str, tables))} (kernels called without knobs use them)"] if tables else []
