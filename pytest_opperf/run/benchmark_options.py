"""pytest-benchmark beside opperf: its options set its own `benchmark` fixture, which opperf
cases do not use. Those given are named once, in the header, with what does their job here;
its header line (176 columns of defaults) is kept to its version unless -v asks for more.
Nothing here needs pytest-benchmark: without it there is nothing to say.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import pytest

PLUGIN = "benchmark"  # pytest-benchmark's entry-point name
HEADER = "benchmark: "  # how its header line starts
_STORED = "results/<device>.db or --opperf-save-baseline"
_SUMMARY = "the opperf summary or opperf report"
# What does each option's job for opperf cases (None: nothing needs to).
INSTEAD = {
    "--benchmark-autosave": _STORED, "--benchmark-save": _STORED, "--benchmark-save-data": _STORED,
    "--benchmark-storage": "--opperf-results",
    "--benchmark-compare": "--opperf-baseline or opperf compare",
    "--benchmark-compare-fail": "--opperf-max-regression",
    "--benchmark-histogram": "opperf plot or --opperf-html",
    "--benchmark-json": "--opperf-benchmark-json",
    "--benchmark-columns": _SUMMARY, "--benchmark-sort": _SUMMARY, "--benchmark-group-by": _SUMMARY,
    "--benchmark-name": _SUMMARY, "--benchmark-time-unit": _SUMMARY,
    "--benchmark-min-rounds": "--opperf-min-samples", "--benchmark-max-time": "--opperf-budget",
    "--benchmark-min-time": "--opperf-target", "--benchmark-calibration-precision": "--opperf-target",
    "--benchmark-warmup": "--opperf-warmup", "--benchmark-warmup-iterations": "--opperf-warmup",
    "--benchmark-timer": "--opperf-timer",
    "--benchmark-cprofile": "--opperf-trace", "--benchmark-cprofile-loops": "--opperf-trace",
    "--benchmark-cprofile-top": "--opperf-trace", "--benchmark-cprofile-dump": "--opperf-trace",
    "--benchmark-skip": "-k or -m", "--benchmark-only": "-k or -m",
    "--benchmark-disable": "--opperf-sample-only",
}


def given(config: pytest.Config) -> list[str]:
    """The --benchmark-* options of this session (command line, PYTEST_ADDOPTS, ini addopts), in order."""
    tokens = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *_ini_addopts(config),
              *map(str, config.invocation_params.args)]
    flags = [t.split("=", 1)[0] for t in tokens if t.startswith("--benchmark-")]
    return list(dict.fromkeys(flags))


def _ini_addopts(config: pytest.Config) -> list[str]:
    try:
        return [str(a) for a in config.getini("addopts")]
    except (ValueError, KeyError):
        return []


def note(config: pytest.Config) -> Optional[str]:
    """One line naming the pytest-benchmark options given and what to use for opperf cases; None
    when none was given or pytest-benchmark is not loaded."""
    if not config.pluginmanager.hasplugin(PLUGIN):
        return None
    flags = given(config)
    if not flags:
        return None
    named = [f"{flag} -> {INSTEAD[flag]}" if INSTEAD.get(flag) else flag for flag in flags]
    return f"opperf: no effect on opperf cases (pytest-benchmark's fixture only): {'; '.join(named)}"


def shorten(lines: list, verbose: int) -> list:
    """The header lines with pytest-benchmark's (its defaults, 176 columns) cut to its version,
    unless -v; the others as they are."""
    if verbose > 0:
        return lines
    return [_short(entry) for entry in lines]


def _short(entry):
    if isinstance(entry, str) and entry.startswith(HEADER) and " (defaults:" in entry:
        return entry.split(" (defaults:", 1)[0] + " (pytest-benchmark; its defaults: -v)"
    return entry


def storage_folder(config: pytest.Config) -> Optional[Path]:
    """pytest-benchmark's storage folder (--benchmark-storage, ./.benchmarks by default), where it is a
    local one; None without pytest-benchmark or for another storage (elasticsearch)."""
    if not config.pluginmanager.hasplugin(PLUGIN):
        return None
    try:
        where = str(config.getoption("benchmark_storage"))
    except ValueError:
        return None
    if where.startswith("file://"):
        where = where[len("file://"):]
    elif "://" in where:
        return None
    return (Path.cwd() / where).resolve()


class EmptyStorage:
    """pytest-benchmark makes its storage folder in every session, saved into or not: a `.benchmarks/`
    left empty in the user's directory. Registered before its pytest_configure runs (which makes the
    folder), this removes the folder at the end when this session made it and left it empty."""

    def __init__(self, config: pytest.Config):
        folder = storage_folder(config)
        self.folder = folder if folder is not None and not folder.exists() else None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.folder is None:
            return
        try:
            self.folder.rmdir()  # only an empty folder goes: anything saved into it stays
        except OSError:
            pass


class HeaderTrim:
    """Registered by the plugin: wraps every plugin's header lines to shorten pytest-benchmark's."""

    @pytest.hookimpl(wrapper=True)
    def pytest_report_header(self, config: pytest.Config):
        lines = yield
        return shorten(lines, config.get_verbosity())
