"""Tables for people: one Section (a title, a table, notes) rendered as aligned text, markdown,
a rich table in a terminal, or HTML.

rich is optional: a terminal gets its tables when it is installed, plain aligned text otherwise
(and whenever the output is not a terminal, so pipes and files get text that diffs well).

>>> print(render_text([Section("gemm", ["case", "time_us"], [["torch-m=8", "1.5"]])]))
gemm
case       time_us
---------  -------
torch-m=8      1.5
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from pytest_opperf import testid
from pytest_opperf.view import fit

_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*(e[-+]?\d+)?|\.\d+)(%|x| us)?$")


@dataclass
class Section:
    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # lines after the table
    level: int = 3  # markdown/HTML heading level
    columns: Optional[list] = None  # fit.Column per header (priorities, shrinking); None: by position
    colours: dict = field(default_factory=dict)  # (row index, column name) -> colour, on a terminal
    hint: str = ""  # how to get back the columns a narrow terminal left out

    def table(self) -> fit.Table:
        """The table to fit a terminal: its own columns, or the leftmost kept longest, text columns cut
        from the right (an explanation gives up room before the names it explains), a case's name
        first losing what every row shares."""
        right = _right(self)
        last = len(self.headers)
        columns = self.columns or [fit.Column(str(i), h, right=r, keep=-i, shrink=0 if r else last - i, min_width=12,
                                              shorten=testid.distinct if h == "case" else None)
                                   for i, (h, r) in enumerate(zip(self.headers, right))]
        rows = [dict(zip([c.name for c in columns], row)) for row in self.rows]
        return fit.Table(columns, rows, self.colours, rule=True, hint=self.hint)


def numeric(cell: str) -> bool:
    return bool(_NUMBER.match(cell.strip()))


def _right(section: Section) -> list[bool]:
    """Columns whose every non-empty cell is a number are right-aligned."""
    out = []
    for i in range(len(section.headers)):
        cells = [r[i] for r in section.rows if r[i] not in ("", "-")]
        out.append(bool(cells) and all(numeric(c) for c in cells))
    return out


def render_text(sections: list[Section], width: Optional[int] = None, markup: Optional[Callable] = None) -> str:
    """Aligned text; within `width` columns when given (view/fit.py: columns cut, then left out,
    notes wrapped); colours through `markup(text, colour)` when given."""
    out: list[str] = []
    for s in sections:
        if out:
            out.append("")
        out += fit.wrap(s.title, width)
        if s.headers and s.rows:
            table = s.table()
            out += [fit.paint(line, markup) if markup else fit.plain(line).rstrip() for line in table.lines(width)]
        out += [line for n in s.notes for line in fit.wrap(n, width, "  ")]
    return "\n".join(out)


def render_markdown(sections: list[Section]) -> str:
    out: list[str] = []
    for s in sections:
        out += [f"{'#' * s.level} {s.title}", ""]
        if s.headers and s.rows:
            right = _right(s)
            out.append("| " + " | ".join(_md(h) for h in s.headers) + " |")
            out.append("| " + " | ".join("---:" if r else "---" for r in right) + " |")
            out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in s.rows]
            out.append("")
        if s.notes:
            out += [f"- {_md(n)}" for n in s.notes] + [""]
    return "\n".join(out).rstrip() + "\n"


def _md(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def render_rich(sections: list[Section], console) -> None:
    """Print the sections to a rich Console (the caller imported rich)."""
    from rich.table import Table

    for s in sections:
        if s.headers and s.rows:
            table = Table(title=s.title, title_justify="left", title_style="bold")
            for header, right in zip(s.headers, _right(s)):
                table.add_column(header, justify="right" if right else "left")
            for row in s.rows:
                table.add_row(*row)
            console.print(table)
        else:
            console.print(f"[bold]{_escape_rich(s.title)}[/bold]")
        for note in s.notes:
            console.print(f"  {_escape_rich(note)}")
        console.print()


def _escape_rich(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def render_html(sections: list[Section], table_class: str = "") -> str:
    out: list[str] = []
    for s in sections:
        out.append(f"<h{s.level}>{html.escape(s.title)}</h{s.level}>")
        if s.headers and s.rows:
            right = _right(s)
            cls = f' class="{table_class}"' if table_class else ""
            out.append(f"<table{cls}><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.headers)
                       + "</tr></thead><tbody>")
            for row in s.rows:
                out.append("<tr>" + "".join(f'<td{" class=num" if r else ""}>{html.escape(c)}</td>'
                                            for c, r in zip(row, right)) + "</tr>")
            out.append("</tbody></table>")
        if s.notes:
            out.append("<ul class=notes>" + "".join(f"<li>{html.escape(n)}</li>" for n in s.notes) + "</ul>")
    return "\n".join(out)


def print_sections(sections: list[Section], markdown: bool = False, stream=None, width: Optional[int] = 0) -> None:
    """Markdown, a rich table on a terminal with rich installed, or plain text fitted to `width`
    (amounts.parse_width's value: 0 decides from the stream, None is no limit), coloured on a terminal."""
    import sys

    stream = stream or sys.stdout
    if markdown:
        stream.write(render_markdown(sections))
        return
    width = fit.stream_width(stream, width)
    if stream.isatty():
        try:
            from rich.console import Console
        except ImportError:
            pass
        else:
            render_rich(sections, Console(file=stream, width=width))
            return
    markup = fit.ansi if fit.colour_wanted(stream) else None
    stream.write(render_text(sections, width, markup) + "\n")


# --- cells ------------------------------------------------------------------------------------


def fmt(value, digits: int = 4) -> str:
    """A cell: '-' for nothing, floats to `digits` significant figures with thousands separated
    (one spelling in a column: 1,248 above 10,850, not 1248), the rest as str.

    >>> fmt(1248.3), fmt(10850.2), fmt(0.01234), fmt(None)
    ('1,248', '10,850', '0.01234', '-')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        # Large times and rates read better whole (41,910 rather than 4.191e+04).
        return f"{value:,.0f}" if abs(value) >= 10 ** digits else f"{value:,.{digits}g}"
    return str(value)


def fmt_pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"


CEILING_NOTE = ("*: above 100% of the measured ceiling, shown as 100%*: the ceiling was measured low (a calibration "
                "on a busy machine, or a stale one), not a fact about the row; rerun `opperf calibrate` on an idle "
                "machine")


def fmt_of_ceiling(value: Optional[float]) -> str:
    """A fraction of a measured ceiling (attainable MFU/MBU): above 1 it is clamped and marked, since
    nothing runs faster than its ceiling: the ceiling was wrong (CEILING_NOTE).

    >>> fmt_of_ceiling(0.931), fmt_of_ceiling(9.31), fmt_of_ceiling(None)
    ('93.1%', '100%*', '-')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "100%*" if value > 1.0 else f"{value:.1%}"
