"""`opperf version`, `opperf devices`, `opperf catalog`: what the plugin knows before any run."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_opperf import __version__
from pytest_opperf.catalog.table import TableError
from pytest_opperf.commands import HARDWARE, arg, command
from pytest_opperf.hardware.specs import SpecError, load_specs


@command("version", help="print the plugin version")
def _version(args: argparse.Namespace) -> int:
    print(__version__)
    return 0


@command("devices", help="list the hardware specs", args=[HARDWARE], errors=(SpecError,), prefix="opperf")
def _devices(args: argparse.Namespace) -> int:
    specs = load_specs(args.hardware)
    print(f"{'name':<12} {'backend':<7} {'bf16 TFLOP/s':>12} {'fp32 TFLOP/s':>12} {'GB/s':>7}  title")
    for spec in specs.values():
        bf16, fp32 = spec.matrix_tflops.get("bf16"), spec.matrix_tflops.get("fp32")
        print(f"{spec.name:<12} {spec.backend:<7} {_f(bf16):>12} {_f(fp32):>12} {_f(spec.mem_bw_gbytes_per_s):>7}  {spec.title}")
    return 0


def _f(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@command("catalog", help="list the built-in ops, their backends and formulas",
         description="The built-in ops: family, parameters, backends, FLOP and byte formulas.",
         args=[arg("--markdown", action="store_true", help="print README's markdown table"),
               arg("--readme", type=Path, metavar="FILE",
                   help="rewrite the table between <!-- catalog --> and <!-- /catalog --> in FILE")],
         errors=(OSError, TableError), outputs=("readme",))
def _catalog(args: argparse.Namespace) -> int:
    from pytest_opperf.catalog import load_builtin, table

    load_builtin()
    if args.readme is None:
        print(table.markdown() if args.markdown else table.text())
        return 0
    changed = table.update_readme(args.readme)
    print(f"{args.readme}: catalogue table {'updated' if changed else 'already up to date'}")
    return 0
