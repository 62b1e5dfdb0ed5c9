"""The `opperf` command: one parser built from the registry of commands (pytest_opperf/commands.py).

Benchmarks run with `pytest benches/`; `opperf` looks at what the plugin knows and what it
stored. Each command is declared once, next to the code it runs, in one of COMMAND_MODULES;
`main` only parses, looks the command up, runs it and turns its declared errors into exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from pytest_opperf import __version__
from pytest_opperf.commands import COMMANDS, Command, CommandError

# The modules that declare commands, in the order `opperf --help` lists their commands.
COMMAND_MODULES = ("pytest_opperf.cli.info", "pytest_opperf.cli.views", "pytest_opperf.cli.results",
                   "pytest_opperf.run.calibration", "pytest_opperf.pipeline.commands")


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command: its exit status, or 2 with one line on stderr when its input is bad."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    command = COMMANDS[args.command]
    try:
        return command.run(args)
    except (CommandError, *command.errors) as exc:
        print(command.error_line(exc), file=sys.stderr)
        return 2


def commands() -> dict[str, Command]:
    """Every command, once the modules that declare them are imported."""
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    return COMMANDS


def build_parser() -> argparse.ArgumentParser:
    """`opperf [--version] COMMAND ...`: a sub-parser per registered command."""
    parser = argparse.ArgumentParser(prog="opperf", description="pytest-opperf: operator performance in pytest. "
                                     "Benchmarks run with `pytest benches/`; this command inspects specs and results.")
    parser.add_argument("--version", action="version", version=f"pytest-opperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands().values():
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        for a in command.args:
            p.add_argument(*a.flags, **a.options)
    return parser
