"""Measured ceilings in a session and on the command line: --opperf-calibrate and `opperf calibrate`.

A session finds the newest calibration of its device in its database and holds every row
against it too (`mfu_attainable`, `mbu_attainable`). --opperf-calibrate says when to measure:

    auto     use the stored calibration, if any; never measure (the default)
    missing  measure first when there is none, or the stored one is stale
    always   measure first
    off      neither measure nor use one: the attainable columns stay empty

A stored calibration taken under another driver, torch, clock setting, power limit or thread
count is stale: it is still used, and the run says so (the header, the summary and the runs
row's `calibration_stale`), so no row is held against it silently.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import pytest

from pytest_opperf.commands import HARDWARE, arg, command
from pytest_opperf.hardware import calibrate as measured
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.run import device as device_context
from pytest_opperf.store import ceilings as table
from pytest_opperf.store.database import StorageError

if TYPE_CHECKING:
    from pytest_opperf.run.env import RunEnv

MODES = ("auto", "missing", "always", "off")


def read_mode(config: pytest.Config) -> str:
    """The --opperf-calibrate value (ini key opperf_calibrate), checked."""
    value = config.getoption("opperf_calibrate")
    value = str(config.getini("opperf_calibrate") if value is None else value).strip().lower()
    if value not in MODES:
        raise pytest.UsageError(f"--opperf-calibrate={value}: expected one of {', '.join(MODES)}")
    return value


class SessionCalibration:
    """The calibration a session's rows are held against, and what the session says about it."""

    def __init__(self, mode: str, env: "RunEnv"):
        self.env = env
        self.mode = mode  # read_mode: --opperf-calibrate
        self.current: Optional[measured.Calibration] = None
        self.stale: list[str] = []
        self.lines: list[str] = []  # for the header and the summary
        self.started = False

    def start(self) -> None:
        """Controller, before any case: load the device's calibration, measure one if asked."""
        env = self.env
        if self.started or self.mode == "off":
            return
        self.started = True
        now = measured.environment(env.torch, env.device.accelerator.reported_name)
        try:
            self.current = table.latest(env.db_path, env.device.spec.name)
        except StorageError as exc:
            self.lines.append(f"warning: cannot read the calibration: {exc}")
        stale = self.current.stale_reasons(now) if self.current else []
        if self.mode == "always" or (self.mode == "missing" and (self.current is None or stale)):
            why = "asked" if self.mode == "always" else ("stale: " + ", ".join(stale) if stale else "none stored")
            self._measure(why)
            stale = []
        self.stale = stale
        if self.current is None:
            return
        c = self.current
        line = (f"ceilings of calibration {c.id} ({c.created_at}): {_brief(c)}")
        self.lines.append(line)
        if stale:
            self.lines.append(f"warning: calibration {c.id} is stale ({', '.join(stale)}): attainable MFU/MBU "
                              f"are held against it anyway; recalibrate with `opperf calibrate` or "
                              f"--opperf-calibrate=missing")

    def _measure(self, why: str) -> None:
        env = self.env
        notes: list[str] = []
        try:
            calibration = measured.calibrate(env.torch, env.device.spec, env.device.accelerator.reported_name,
                                             notes.append, env.settings.seed)
        except measured.CalibrationError as exc:
            self.lines.append(f"warning: calibration failed: {exc}")
            return
        self.lines.extend(notes)
        if env.settings.sample_only:
            self.lines.append(f"calibrated ({why}); sample-only: not stored")
        else:
            try:
                table.write(env.db_path, calibration.rows)
                self.lines.append(f"calibrated ({why}): stored in {env.db_path} as {calibration.id}")
            except StorageError as exc:
                self.lines.append(f"warning: {exc}; the calibration is used for this run only")
        self.current = calibration

    def attainable(self, record: dict) -> dict:
        return measured.attainable(record["flops"], record["bytes"], record["time_us"], self.current,
                                   record["peak_dtype"], record["peak_kind"])

    def summary_lines(self) -> list[str]:
        c = self.current
        if c is None:
            return []
        lines = [f"aMFU, aMBU: against the measured ceilings of calibration {c.id} ({c.created_at}; "
                 f"MFU, MBU: against the datasheet)"]
        if self.stale:
            lines.append(f"warning: calibration {c.id} is stale ({', '.join(self.stale)}): recalibrate with "
                         f"`opperf calibrate` or --opperf-calibrate=missing")
        return lines

    def run_fields(self) -> dict:
        """The runs row's calibration_id, calibrated_at and calibration_stale (None: fresh or none)."""
        c = self.current
        return {"calibration_id": c.id if c else None, "calibrated_at": c.created_at if c else None,
                "calibration_stale": ", ".join(self.stale) if self.stale else None}


def _brief(c: measured.Calibration) -> str:
    parts = []
    if c.mem_bytes_per_s:
        parts.append(f"memory {c.mem_bytes_per_s / 1e9:.4g} GB/s")
    for row in c.rows:
        if row["quantity"] in ("matrix", "vector") and row.get("tflops"):
            parts.append(f"{row['dtype']} {row['quantity']} {_flops(row['tflops'])} ({row['shape']})")
    if c.launch_us:
        parts.append(f"launch {c.launch_us:.3g} us")
    return ", ".join(parts)


# --- `opperf calibrate` -----------------------------------------------------------------------


@command("calibrate", help="measure this device's ceilings and store them in its database",
         description="Measure memory bandwidth (copy and read-only reduction), the GEMM ceiling per dtype, the "
                     "vector (FMA) ceiling and launch overhead on this machine's device; print them beside the "
                     "datasheet and store them in the device's results database (table ceilings), where sweeps "
                     "find them.",
         args=[arg("--device", help="hardware spec NAME, as pytest's --device (default: detected)"),
               arg("--db", type=Path, help="database to store into (default: RESULTS/<device>.db)"),
               arg("--results", type=Path, default=Path("results"), help="results directory (default: results)"),
               HARDWARE,
               arg("--seed", type=int, default=0, help="seed of the random inputs (default 0)")],
         errors=(hardware.SpecError, measured.CalibrationError, StorageError), outputs=("db",))
def _calibrate(args: argparse.Namespace) -> int:
    """`opperf calibrate`: 0 when measured and stored, 2 on bad input (one line naming it)."""
    ctx = device_context.resolve(args.device, args.hardware, hardware_flag="--hardware FILE")
    spec, acc, device = ctx.spec, ctx.accelerator, ctx.torch
    db = args.db if args.db is not None else args.results / f"{spec.name}.db"
    print(f"opperf calibrate: {spec.name} ({acc.reported_name}, torch {device}) -> {db}", flush=True)
    calibration = measured.calibrate(device, spec, acc.reported_name, lambda line: print(line, flush=True), args.seed)
    table.write(db, calibration.rows)
    print(render(calibration))
    print(f"opperf calibrate: stored in {db} as calibration {calibration.id}")
    return 0


def render(calibration: measured.Calibration) -> str:
    """A markdown table of a calibration: measured beside datasheet, per quantity and dtype."""
    lines = ["| quantity | dtype | shape | measured | datasheet | measured/datasheet | cv | timer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in calibration.rows:
        if r.get("tflops") is not None and r["quantity"] != "launch":
            got, sheet = _flops(r["tflops"]), "-" if r.get("datasheet_tflops") is None else _flops(r["datasheet_tflops"])
        elif r.get("gbytes_per_s") is not None:
            got, sheet = f"{r['gbytes_per_s']:.4g} GB/s", _f(r.get("datasheet_gbytes_per_s"), "GB/s")
        else:
            got, sheet = f"{r['time_us']:.3g} us a call", "-"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.1%}"
        lines.append(f"| {r['quantity']} | {r['dtype'] or '-'} | {r['shape']} | {got} | {sheet} | {ratio} | "
                     f"{r['cv']:.3f} | {r['timer']} |")
    return "\n".join(lines)


def _flops(tflops: float) -> str:
    return f"{tflops:.4g} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.4g} GFLOP/s"


def _f(value, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {unit}"
