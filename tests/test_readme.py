"""README is the user's guide and docs/ the reference: every option, ini key, config key, column
and command is documented on its page, every page is reachable from README, and no link is dead."""

import argparse
import re
from pathlib import Path

import pytest

from pytest_opperf import cli
from pytest_opperf.config import opconfig as config
from pytest_opperf.run import options
from pytest_opperf.store import database as storage

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = sorted(DOCS.glob("*.md"))


def page(name: str) -> str:
    return (DOCS / name).read_text()


def test_every_option_and_its_ini_key_is_documented():
    text = page("options.md")
    missing = [flag for flag, ini, _, _ in options.OPTIONS if f"`{flag}`" not in text or f"`{ini}`" not in text]
    assert not missing, f"docs/options.md lacks options: {missing}"


def test_every_config_key_is_documented():
    text = page("configs.md")
    missing = [key for key in sorted(config.TOP_KEYS | config.ROW_KEYS) if f"`{key}`" not in text]
    assert not missing, f"docs/configs.md lacks config keys: {missing}"


def test_every_database_column_is_documented():
    text = page("database.md")
    missing = [c for c in [*storage.KEY_COLUMNS, *storage.MEASURE_COLUMNS] if f"`{c}`" not in text]
    assert not missing, f"docs/database.md lacks columns: {missing}"


class _Parsed(Exception):
    pass


def opperf_commands(monkeypatch) -> list[str]:
    """The subcommands `opperf` registers, read from its argument parser."""
    found = {}

    def grab(self, *args, **kwargs):
        found["parser"] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    with pytest.raises(_Parsed):
        cli.main([])
    subs = [a for a in found["parser"]._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(name for sub in subs for name in sub.choices)


def test_every_opperf_command_is_documented(monkeypatch):
    commands = opperf_commands(monkeypatch)
    assert {"report", "merge", "compare", "import", "lookup"} <= set(commands)
    text = page("cli.md")
    missing = [c for c in commands if not re.search(rf"^opperf {re.escape(c)}\b", text, re.M)]
    assert not missing, f"docs/cli.md's synopsis lacks commands: {missing}"


def test_every_reference_page_is_linked_from_the_readme():
    linked = {m for m in re.findall(r"\]\((docs/[^)#]+\.md)", README)}
    missing = [p.relative_to(ROOT).as_posix() for p in PAGES if p.relative_to(ROOT).as_posix() not in linked]
    assert not missing, f"README.md links no {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def dead_links(doc: Path) -> list:
    """DOC's relative links whose file is missing, or whose #anchor is no heading of that page (a
    section of docs/benchmarks.md renamed or gone)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            dead.append(target)
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            dead.append(target)
    return dead


@pytest.mark.parametrize("doc", [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *PAGES],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_between_the_docs_resolve(doc):
    dead = dead_links(doc)
    assert not dead, f"{doc.relative_to(ROOT)}: dead links {dead}"


def test_the_link_check_sees_a_section_that_went_and_a_file_that_went(tmp_path):
    (tmp_path / "benchmarks.md").write_text("# Figures\n\n## Timer fidelity\n\n### The sweep on N GPUs\n")
    page = tmp_path / "timing.md"
    page.write_text("[a](benchmarks.md#timer-fidelity), [b](benchmarks.md#the-sweep-on-n-gpus), "
                    "[c](benchmarks.md#once-a-process-costs), [d](gone.md), [e](#here), [f](https://x.org/#y)\n"
                    "## Here\n")
    assert dead_links(page) == ["benchmarks.md#once-a-process-costs", "gone.md"]


def test_the_docs_hold_no_development_history_headings():
    found = [f"{p.relative_to(ROOT)}: {h}" for p in [ROOT / "README.md", *PAGES]
             for h in re.findall(r"^#+ .*\b[Ii]ssues? \d+.*$", p.read_text(), re.M)]
    assert not found, found


def test_readme_stays_a_guide():
    assert len(README.splitlines()) <= 400, "README.md is the user's guide: reference belongs in docs/"


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith("python3 -m venv ") for line in lines)
    assert any(line.startswith(". ") and "/bin/activate" in line for line in lines)
    command = lines[-1]  # the last line, after the venv is active
    # The versions a fresh install resolved are in the log before the tests run.
    assert any(re.match(r"python3 -m pip (list|freeze)", line) for line in lines[:-1]), lines
    assert command.endswith("python3 -m pytest tests/ -q -rfE -n auto --dist worksteal")
    two_commands = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert command in two_commands.splitlines(), command
