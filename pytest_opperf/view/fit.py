"""Tables and lines that fit a terminal: how wide it is, which columns fit, cells cut to fit, notes
wrapped, and colour only where a person is looking.

Width. On a terminal, its width (COLUMNS first, as pytest and shutil read it). Piped or written
to a file, no limit: a log keeps every column and whole lines, unless the user asked for a width
(--opperf-width=N, `opperf report --width N`). `full` asks for no limit on a terminal too. A
word longer than the width (a long path) is not cut.

Fitting. A table first shortens its headers, then cuts the cells of its shrinkable columns (a
case's name, flags) down to their minimum, then leaves out columns, the least important first,
and says which in a line under the table; what room is left goes back to the cut columns.

>>> cols = [Column("case", "case", shrink=1, right=False, min_width=8), Column("time_us", "time_us")]
>>> table = Table(cols, [{"case": "gemm[torch-fp16-m=1024-n=1024-k=1024]", "time_us": "12.50"}])
>>> for line in table.lines(30): print(plain(line))
case                   time_us
gemm[torch-f...=1024]    12.50
"""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

GAP = "  "  # between two columns
ELLIPSIS = "..."
LISTED = 8  # names of left-out columns listed before "and N more"
# Colours by what a flag means; a cell takes its most severe flag's colour.
FLAG_COLOURS = {"regressed": "red", "contended": "purple", "unstable": "yellow", "throttled": "yellow",
                "inconclusive": "yellow", "above-ceiling": "yellow", "above-peak": "yellow", "check-floor": "yellow",
                "target-missed": None,
                "improved": "green"}
SEVERITY = ("red", "purple", "yellow", "green")

Segment = tuple[str, Optional[str]]  # text, colour (None: plain)
Line = list[Segment]


def terminal_width(requested: Optional[int], is_terminal: bool, terminal_columns: Callable[[], int]) -> Optional[int]:
    """The width to fit, or None for no limit.

    requested: amounts.parse_width's value (0: auto, None: full). Auto: the terminal's width on a
    terminal (terminal_columns: COLUMNS first, as pytest and shutil read it), else no limit: a
    pipe or a file keeps whole lines.

    >>> terminal_width(0, False, lambda: 80), terminal_width(0, True, lambda: 100), terminal_width(None, True, lambda: 80)
    (None, 100, None)
    """
    if requested != 0:
        return requested
    return terminal_columns() if is_terminal else None


def stream_width(stream, requested: Optional[int] = 0) -> Optional[int]:
    """terminal_width for a stream (the CLI's standard output)."""
    tty = hasattr(stream, "isatty") and stream.isatty()
    return terminal_width(requested, tty, lambda: shutil.get_terminal_size().columns)


def colour_wanted(stream, environ: Optional[dict] = None) -> bool:
    """Colour on a terminal, never with NO_COLOR or TERM=dumb (pytest's rule, for the CLI)."""
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR") or environ.get("TERM") == "dumb":
        return False
    if environ.get("FORCE_COLOR") or environ.get("PY_COLORS") == "1":
        return True
    return hasattr(stream, "isatty") and stream.isatty() and environ.get("PY_COLORS") != "0"


ANSI = {"red": 31, "green": 32, "yellow": 33, "purple": 35, "bold": 1}


def ansi(text: str, colour: Optional[str]) -> str:
    return f"\x1b[{ANSI[colour]}m{text}\x1b[0m" if colour else text


def plain(line: Line) -> str:
    return "".join(text for text, _ in line)


def paint(line: Line, markup: Callable[[str, str], str] = ansi) -> str:
    """The line with its colours, through `markup(text, colour)` (pytest's TerminalWriter or ANSI)."""
    return "".join(markup(text, colour) if colour else text for text, colour in line)


def flag_colour(flags: Sequence[str]) -> Optional[str]:
    """The colour of a cell of flags: its most severe flag's (flags like 'throttled(...)' count by their word)."""
    colours = {FLAG_COLOURS.get(f.split("(")[0]) for f in flags}
    return next((c for c in SEVERITY if c in colours), None)


def cut(text: str, width: int, middle: bool = True) -> str:
    """text in at most `width` characters: the middle (two thirds of the room before it) or the end
    replaced by '...'.

    >>> cut("gemm[torch-bf16-m=4096-n=4096]", 20), cut("unstable target-missed", 12, middle=False)
    ('gemm[torch-b...4096]', 'unstable ...')
    """
    if len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    room = width - len(ELLIPSIS)
    if not middle:
        return text[:room] + ELLIPSIS
    head = (2 * room + 2) // 3  # the head names the op, backend and dtype; the tail the last parameters
    return text[:head] + ELLIPSIS + text[len(text) - (room - head):]


def wrap(text: str, width: Optional[int], indent: str = "", more: str = "    ") -> list[str]:
    """One line, or several within `width` (continuations indented by `more` past `indent`)."""
    if width is None or len(indent) + len(text) <= width:
        return [indent + text]
    # A word longer than the width (a long path) stays whole: cut, it could not be copied.
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + more,
                         break_on_hyphens=False, break_long_words=False) or [indent]


@dataclass
class Column:
    """A column of a Table. name: what --opperf-columns calls it; header: its heading (short: when
    room is short); keep: the higher, the later it is left out; shrink: 0, or the order in which
    shrinkable columns are cut (1 first) down to min_width; cut_middle: cut a name in its middle."""

    name: str
    header: str
    short: Optional[str] = None
    right: bool = True
    keep: int = 0
    shrink: int = 0
    min_width: int = 0
    cut_middle: bool = True
    # Names (a case's): when room is short, first what every row shares is left out (the cells
    # through `shorten`), and the column keeps the room its shortened names need, up to half the
    # width, while the other shrinkable columns are cut: a name cut short names no case.
    shorten: Optional[Callable[[list[str]], list[str]]] = None


@dataclass
class Table:
    """Rows of cells by column name, each cell a str; colours by (row index, column name)."""

    columns: list[Column]
    rows: list[dict]
    colours: dict = field(default_factory=dict)
    rule: bool = False  # a line of dashes under the header
    hint: str = "--opperf-columns picks the columns"  # after the names of the columns left out
    dropped: list[str] = field(default_factory=list)  # what the last lines() left out

    def lines(self, width: Optional[int]) -> list[Line]:
        """The header, the rows, and (when columns were left out) a line that names them."""
        columns, headers, widths, rows = self._fit(width)
        out: list[Line] = [self._line(headers, columns, widths, None)]
        if self.rule:
            out.append([(GAP.join("-" * widths[c.name] for c in columns), None)])
        for i, row in enumerate(rows):
            cells = {c.name: cut(row.get(c.name, ""), widths[c.name], c.cut_middle) for c in columns}
            out.append(self._line(cells, columns, widths, i))
        if self.dropped:
            names = ", ".join(self.dropped[:LISTED]) + (f" and {len(self.dropped) - LISTED} more"
                                                        if len(self.dropped) > LISTED else "")
            note = f"(left out to fit {width} columns: {names}{'; ' + self.hint if self.hint else ''})"
            out += [[(text, None)] for text in wrap(note, width)]
        return out

    def _line(self, cells: dict, columns: list[Column], widths: dict, row: Optional[int]) -> Line:
        line: Line = []
        for n, c in enumerate(columns):
            text = cells[c.name]
            last = n == len(columns) - 1
            padded = text.rjust(widths[c.name]) if c.right else (text if last else text.ljust(widths[c.name]))
            line.append((padded, self.colours.get((row, c.name)) if row is not None else None))
            if not last:
                line.append((GAP, None))
        while line and not line[-1][0].strip():  # an empty last cell leaves no padding behind
            line.pop()
        if line:
            line[-1] = (line[-1][0].rstrip(), line[-1][1])
        return line

    def _fit(self, width: Optional[int]) -> tuple[list[Column], dict, dict, list[dict]]:
        columns, rows = list(self.columns), self.rows
        headers = {c.name: c.header for c in columns}
        self.dropped = []

        def natural() -> dict:
            return {c.name: max([len(r.get(c.name, "")) for r in rows], default=0) for c in columns}

        def widths() -> dict:
            longest = natural()
            return {c.name: max(len(headers[c.name]), longest[c.name]) for c in columns}

        def total(w: dict) -> int:
            return sum(w[c.name] for c in columns) + len(GAP) * (len(columns) - 1)

        if width is None or total(widths()) <= width:
            return columns, headers, widths(), rows
        rows = _shortened(rows, columns)
        headers = {c.name: c.short or c.header for c in columns}
        names = {c.name: min(natural()[c.name], width // 2) for c in columns if c.shorten}
        floors = {c.name: max(len(headers[c.name]), c.min_width, names.get(c.name, 0)) if c.shrink
                  else widths()[c.name] for c in columns}
        while len(columns) > 1 and total(floors) > width:
            victim = min(columns, key=lambda c: (c.keep, -columns.index(c)))
            columns.remove(victim)
            self.dropped.append(victim.header if victim.name.isdigit() else victim.name)
        w = widths()
        excess = total(w) - width
        for c in sorted((c for c in columns if c.shrink), key=lambda c: c.shrink):
            give = max(min(excess, w[c.name] - floors[c.name]), 0)
            w[c.name] -= give
            excess -= give
        return columns, headers, w, rows


def _shortened(rows: list[dict], columns: list[Column]) -> list[dict]:
    """The rows with the cells of each column that has a `shorten` shortened (copies)."""
    if not any(c.shorten for c in columns):
        return rows
    rows = [dict(r) for r in rows]
    for c in columns:
        if c.shorten:
            for row, text in zip(rows, c.shorten([r.get(c.name, "") for r in rows])):
                row[c.name] = text
    return rows


def pick(available: Sequence[str], text: str, flag: str, what: str = "columns") -> list[str]:
    """The columns named in `text` ('a,b,c'), in that order; a ValueError naming the unknown ones
    and the valid names.

    >>> pick(["case", "time_us", "cv"], "case, cv", "--columns")
    ['case', 'cv']
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        problem = f"unknown column {', '.join(unknown)}" if unknown else "no column named"
        raise ValueError(f"{flag}={text}: {problem}; {what}: {', '.join(available)}")
    return names
