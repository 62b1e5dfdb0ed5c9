"""`opperf version`, `opperf devices`, `opperf catalog`: what the plugin knows before any run."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_opperf import __version__
from pytest_opperf.catalog.table import TableError
from pytest_opperf.commands import HARDWARE, CommandError, arg, command
from pytest_opperf.hardware.specs import SpecError, detect_accelerator, load_specs


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


@command("catalog", help="list the built-in ops; with OP: its parameters, formulas and backends here",
         description="The built-in ops: family and backends. With OP: its parameters (types, defaults), FLOP and "
                     "byte formulas, and each backend on this machine (the dtypes it runs, or why it cannot).",
         args=[arg("op", nargs="?", help="one op to show in detail"),
               arg("--markdown", action="store_true", help="print docs/catalog.md's markdown table"),
               arg("--readme", type=Path, metavar="FILE",
                   help="rewrite the table between <!-- catalog --> and <!-- /catalog --> in FILE")],
         errors=(OSError, TableError), outputs=("readme",))
def _catalog(args: argparse.Namespace) -> int:
    from pytest_opperf.catalog import load_builtin, table

    load_builtin()
    if args.op is not None:
        if args.markdown or args.readme is not None:
            raise CommandError("OP shows one op: leave out --markdown and --readme")
        print(table.details(args.op, *_this_machine()))
        return 0
    if args.readme is None:
        print(table.markdown() if args.markdown else table.text())
        return 0
    changed = table.update_readme(args.readme)
    print(f"{args.readme}: catalogue table {'updated' if changed else 'already up to date'}")
    return 0


def _this_machine() -> tuple[str, tuple]:
    """(device type, CUDA capability or (0, 0)): what backends' `supports` are asked about."""
    device_type = detect_accelerator().type
    if device_type != "cuda":
        return device_type, (0, 0)
    import torch

    return device_type, torch.cuda.get_device_capability()
