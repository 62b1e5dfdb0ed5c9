"""The README is the user's manual: every option, ini key, config key and column is in it."""

from pathlib import Path

from pytest_opperf.run import config, options
from pytest_opperf.store import database as storage

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_option_and_its_ini_key_is_documented():
    missing = [flag for flag, ini, _, _ in options.OPTIONS if f"`{flag}" not in README or ini not in README]
    assert not missing, f"README.md lacks options: {missing}"


def test_every_config_key_is_documented():
    missing = [key for key in sorted(config.TOP_KEYS) if f"`{key}`" not in README]
    assert not missing, f"README.md lacks config keys: {missing}"


def test_every_database_column_is_documented():
    columns = [*storage.KEY_COLUMNS, *storage.MEASURE_COLUMNS]
    missing = [c for c in columns if f"`{c}`" not in README]
    assert not missing, f"README.md lacks columns: {missing}"


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    lines = (Path(__file__).parent.parent / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith("python3 -m venv ") for line in lines)
    assert any(line.startswith(". ") and "/bin/activate" in line for line in lines)
    command = lines[-1]  # the last line, after the venv is active
    assert command.endswith("python3 -m pytest tests/ -q")
    two_commands = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert command in two_commands.splitlines(), command
