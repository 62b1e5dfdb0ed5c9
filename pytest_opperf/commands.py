"""The registry of `opperf` commands: each declared once, next to the code it runs.

A command is a name, its help, its arguments and the function that runs it; the errors that
mean bad input are declared with it, and `opperf` (cli/__init__.py) prints each as one line on
stderr and exits 2::

    @command("backfill", help="write replayed times from a results database into a profile database",
             args=[arg("profile", type=Path, help="the profile database of opperf import"),
                   arg("--mode", default="all", help="all (default) or missing-only")],
             errors=(ProfileError,))
    def _backfill(args: argparse.Namespace) -> int: ...

This module is at the bottom of the package (it imports none of it), so any layer may declare
a command: cli/ its own, pipeline/commands.py the pipeline's, run/calibration.py calibrate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pytest_opperf.files import unwritable

Run = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """Bad input a command names itself: `opperf` prints 'PREFIX: message' and exits 2."""


@dataclass(frozen=True)
class Arg:
    """One argparse argument: the flags (or positional name) and add_argument's keywords."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    """An argument as `parser.add_argument(*flags, **options)` would take it."""
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Run
    args: tuple[Arg, ...] = ()
    description: Optional[str] = None  # the command's --help text, when longer than `help`
    errors: tuple[type[Exception], ...] = ()  # besides CommandError: these mean bad input, exit 2
    prefix: Optional[str] = None  # what an error line starts with; default "opperf NAME"
    message: Callable[[Exception], str] = str  # how an error is said after the prefix
    # The arguments (dest names) that name what the command writes: files, and directories it
    # writes into. Each is checked before the command runs (unwritable: one line, exit 2).
    outputs: tuple[str, ...] = ()
    output_dirs: tuple[str, ...] = ()

    def error_line(self, exc: Exception) -> str:
        return f"{self.prefix or f'opperf {self.name}'}: {self.message(exc)}"

    def check_outputs(self, args: argparse.Namespace) -> None:
        """CommandError naming the first output path that cannot be written."""
        for names, directory in ((self.outputs, False), (self.output_dirs, True)):
            for name in names:
                path = getattr(args, name, None)
                reason = None if path is None else unwritable(Path(path), directory)
                if reason:
                    raise CommandError(f"{path}: cannot write: {reason}")


# name -> Command, in the order they were declared (the order `opperf --help` lists them).
COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, args: list[Arg] = (), **details: Any) -> Callable[[Run], Run]:
    """Declare the decorated function as command `name` (details: Command's other fields)."""

    def declare(run: Run) -> Run:
        known = COMMANDS.get(name)
        # The same function declared again is its module imported again (pytester's in-process
        # sessions drop the modules they imported): it replaces itself.
        if known is not None and _where(known.run) != _where(run):
            raise ValueError(f"opperf command {name!r} is declared twice: by {_where(known.run)} and {_where(run)}")
        COMMANDS[name] = Command(name, help, run, tuple(args), **details)
        return run

    return declare


def _where(run: Run) -> str:
    return f"{run.__module__}.{run.__qualname__}"


# Arguments several commands share.
HARDWARE = arg("--hardware", type=Path, help="extra specs file, as --opperf-hardware")
