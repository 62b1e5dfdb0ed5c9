"""The `opperf` command: one parser built from the registry of commands (pytest_opperf/commands.py).

Benchmarks run with `pytest benches/`; `opperf` looks at what the plugin knows and what it
stored. Each command is declared once, next to the code it runs, in one of COMMAND_MODULES;
`main` only parses, looks the command up, checks that its outputs can be written, runs it, and
turns its declared errors and any OSError (a file it could not read or write) into one line and
exit 2.

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sqlite3
import sys
from typing import Optional

from pytest_opperf import __version__, files
from pytest_opperf.commands import COMMANDS, Command, CommandError, arg

# The modules that declare commands, in the order `opperf --help` lists their commands.
COMMAND_MODULES = ("pytest_opperf.cli.info", "pytest_opperf.cli.views", "pytest_opperf.cli.results",
                   "pytest_opperf.run.calibration", "pytest_opperf.pipeline.commands",
                   "pytest_opperf.pipeline.predict.command")


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command: its exit status, or 2 with one line on stderr when its input is bad."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    command = COMMANDS[args.command]
    try:
        files.set_max_mb(_max_file_mb(args))
        command.check_outputs(args)
        return command.run(args)
    except (CommandError, files.FileError, *command.errors) as exc:
        print(command.error_line(exc), file=sys.stderr)
        return 2
    except OSError as exc:  # a file it could not read or write, found out while at work
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(command.error_line(CommandError(f"{where}{exc.strerror or exc}")), file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # a database that would not take the write (a full disk, a lock held too long)
        print(command.error_line(CommandError(f"SQLite: {exc}")), file=sys.stderr)
        return 2
    finally:
        files.set_max_mb(None)


def _max_file_mb(args: argparse.Namespace) -> Optional[float]:
    try:
        value = files.parse_max_mb(getattr(args, "max_file_mb", "auto"), "--max-file-mb")
        return value if value is not None else files.parse_max_mb(os.environ.get(files.ENV, ""), f"env {files.ENV}")
    except ValueError as exc:
        raise CommandError(str(exc)) from None


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
    parser.add_argument(*MAX_FILE.flags, **MAX_FILE.options)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands().values():
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        for a in command.args:
            p.add_argument(*a.flags, **a.options)
        # SUPPRESS: given after the command's name it wins, else the one before it (or auto) holds.
        p.add_argument(*MAX_FILE.flags, **{**MAX_FILE.options, "default": argparse.SUPPRESS})
    return parser


# Any command, before or after its name: the size limit on the YAML/JSON/CSV files it reads.
MAX_FILE = arg("--max-file-mb", metavar="MIB", default="auto",
               help=f"refuse YAML/JSON/CSV input files larger than this (default auto: env {files.ENV}, "
                    f"else {files.DEFAULT_MAX_MB:g})")
