"""The `opperf` command: one registry of commands, every one listed and with a working --help."""

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_opperf import cli
from pytest_opperf.commands import COMMANDS, CommandError, arg, command

NAMES = list(cli.commands())


def test_help_lists_every_registered_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    listing = capsys.readouterr().out.split("COMMAND\n", 1)[1].split("\noptions:")[0]
    listed = [line.split()[0] for line in listing.splitlines() if line[4:5].strip()]
    assert listed == NAMES
    assert {"version", "report", "merge", "compare", "calibrate", "import", "lookup"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_command_has_a_working_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: opperf {name} ")
    for a in COMMANDS[name].args:
        shown = a.flags[-1] if a.flags[-1].startswith("-") else a.options.get("metavar") or a.flags[-1]
        assert shown in out


def test_no_command_prints_the_help_and_exits_0(capsys):
    assert cli.main([]) == 0
    assert "COMMAND" in capsys.readouterr().out


@pytest.fixture
def probes():
    """Commands declared by a test, gone after it."""
    saved = dict(COMMANDS)
    yield
    COMMANDS.clear()
    COMMANDS.update(saved)


def test_bad_input_is_one_line_naming_it_and_exit_2(probes, capsys):
    @command("probe-fail", help="refuses its argument", args=[arg("--why", default="bad")], prefix="opperf")
    def _fail(args):
        raise CommandError(f"--why={args.why}: expected good")

    @command("probe-key", help="raises a declared error", errors=(KeyError,))
    def _key(args):
        raise KeyError("nope")

    assert cli.main(["probe-fail"]) == 2
    assert capsys.readouterr().err == "opperf: --why=bad: expected good\n"
    assert cli.main(["probe-key"]) == 2
    assert capsys.readouterr().err == "opperf probe-key: 'nope'\n"


def test_a_command_is_declared_once(probes):
    with pytest.raises(ValueError, match="'version' is declared twice"):
        command("version", help="again")(lambda args: 0)


def test_the_console_script_runs_main():
    assert 'opperf = "pytest_opperf.cli:main"' in (Path(__file__).parent.parent / "pyproject.toml").read_text()
    out = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == cli.__version__
