"""Reading the files a user hands us (configs, baselines, tuned tables, hardware specs, profiles).

Whatever is wrong with such a file - unreadable, not UTF-8, larger than the limit, nested
deeper than any real one, YAML aliases that multiply it - is a FileError whose message is one
line naming the file; the reader that called us phrases it as its own error. `short` is how
every message quotes a value from a user's file: at most 80 characters, however large the value.

    >>> short(list(range(10**6)))
    '[0, 1, 2, 3, ...]'
"""

from __future__ import annotations

import gzip
import json
import os
import reprlib
import tempfile
from pathlib import Path
from typing import Any, Optional

DEFAULT_MAX_MB = 64.0
ENV = "OPPERF_MAX_FILE_MB"
# Deeper than any config, baseline or spec we read; far below what makes the YAML composer
# (C recursion) crash or json raise RecursionError.
MAX_DEPTH = 100
# YAML aliases may repeat a part of a file (a shared block of cases), not multiply it: the nodes
# after expansion may be at most this many times those written, or this floor, whichever is more.
ALIAS_FACTOR = 10
ALIAS_FLOOR = 1_000_000


_PACKAGE = Path(__file__).resolve().parent


class FileError(ValueError):
    """A file that cannot be read as what it should be: 'PATH: what is wrong', one line."""

    def __init__(self, path: Any, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


_limit_mb: Optional[float] = None  # set by the session's option or the command's flag; None: env, else default


def set_max_mb(mb: Optional[float]) -> None:
    """The size limit of this process (None: env OPPERF_MAX_FILE_MB, else 64 MiB)."""
    global _limit_mb
    _limit_mb = mb


def parse_max_mb(text: str, where: str) -> Optional[float]:
    """'auto' or '' -> None; a number of MiB > 0 -> it; else a ValueError naming `where` and the text."""
    t = str(text).strip().lower()
    if t in ("", "auto"):
        return None
    try:
        value = float(t)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{where}={text}: expected a number of MiB > 0 (or auto)")
    return value


def max_bytes() -> int:
    """The size limit now in force, in bytes."""
    mb = _limit_mb
    if mb is None:
        mb = parse_max_mb(os.environ.get(ENV, ""), f"env {ENV}") or DEFAULT_MAX_MB
    return int(mb * 2**20)


RAISE_IT = f"raise it with --opperf-max-file-mb (pytest), --max-file-mb (opperf) or env {ENV}"


def _too_big(size: int) -> str:
    return f"is {size / 2**20:.3g} MiB, more than the limit of {max_bytes() / 2**20:g} MiB ({RAISE_IT})"


def read_bytes(path: Path) -> bytes:
    """The file's bytes, refused over the size limit (a .gz file: its uncompressed bytes); the
    package's own data files are not limited."""
    path = Path(path)
    limit = max_bytes() if _PACKAGE not in path.resolve().parents else 2**63
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read(limit + 1)
        else:
            size = path.stat().st_size
            if size > limit:
                raise FileError(path, _too_big(size))
            data = path.read_bytes()
    except (OSError, EOFError) as exc:
        raise FileError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > limit:
        raise FileError(path, _too_big(len(data)) if path.suffix != ".gz" else
                        f"uncompresses to more than the limit of {limit / 2**20:g} MiB ({RAISE_IT})")
    return data


def read_text(path: Path) -> str:
    """The file as UTF-8 text (a leading byte-order mark dropped), within the size limit."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileError(path, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} "
                              f"(offset {exc.start}); save it as UTF-8") from None


def load_json(path: Path, text: Optional[str] = None) -> Any:
    """The file's JSON (or `text`, read from it); FileError for bad JSON or too deep nesting."""
    text = read_text(path) if text is None else text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileError(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise FileError(path, f"nested more than {MAX_DEPTH} levels deep: not a file we write or read") from None


def load_yaml(path: Path, loader: Optional[type] = None, text: Optional[str] = None) -> Any:
    """The file's YAML with `loader` (default: libyaml's safe loader), after its shape is checked;
    FileError for bad YAML (where and what), too deep nesting or an alias bomb."""
    import yaml

    loader = loader or getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = read_text(path) if text is None else text
    try:
        check_yaml_shape(path, text, loader)
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise FileError(path, f"invalid YAML{where}: {problem}") from None
    except RecursionError:  # a loader whose checks above missed a way to nest
        raise FileError(path, f"nested more than {MAX_DEPTH} levels deep") from None


def check_yaml_shape(path: Path, text: str, loader: type) -> None:
    """Walk the YAML's events (no recursion, no expansion): refuse nesting deeper than MAX_DEPTH
    and aliases that expand the document's nodes beyond ALIAS_FACTOR times (ALIAS_FLOOR)."""
    import yaml
    from yaml import events as ev

    opened: list[list] = []  # per open collection: [anchor, its expanded node count]
    sizes: dict[str, int] = {}  # anchor -> the expanded node count of what it names
    written = expanded = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (ev.SequenceStartEvent, ev.MappingStartEvent)):
            if len(opened) >= MAX_DEPTH:
                raise FileError(path, f"nested more than {MAX_DEPTH} levels deep (line {event.start_mark.line + 1})")
            opened.append([event.anchor, 1])
            written += 1
            expanded += 1
        elif isinstance(event, (ev.SequenceEndEvent, ev.MappingEndEvent)):
            anchor, size = opened.pop()
            if anchor:
                sizes[anchor] = size
            if opened:
                opened[-1][1] += size
        elif isinstance(event, (ev.ScalarEvent, ev.AliasEvent)):
            size = 1 if isinstance(event, ev.ScalarEvent) else sizes.get(event.anchor, 1)
            if isinstance(event, ev.ScalarEvent) and event.anchor:
                sizes[event.anchor] = 1
            written += isinstance(event, ev.ScalarEvent)
            if opened:
                opened[-1][1] += size
            expanded += size
            if size > 1 and expanded > max(ALIAS_FACTOR * written, ALIAS_FLOOR):
                raise FileError(path, f"YAML aliases expand its {written} nodes to more than {expanded} (line "
                                      f"{event.start_mark.line + 1}): aliases may repeat a part, not multiply the file")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 78, 78, 40


def short(value: Any, limit: int = 80) -> str:
    """repr(value) for a message, at most `limit` characters, computed in bounded time however
    large or deep the value (an alias bomb's list, a megabyte string)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def unwritable(path: Path, directory: bool = False) -> Optional[str]:
    """Why `path` (a file, or with `directory` a folder to write into) cannot be written, or None.

    The folder that would hold it (or the nearest one that exists, where the rest would be made)
    must take a new file, tried with a probe file it removes at once, so a read-only mount or a
    full disk shows for root too; an existing file must open for writing. Changes nothing.

    >>> unwritable(Path("/etc/hostname/report.html"))
    '/etc/hostname is not a directory'
    """
    if path.exists() and path.is_dir() != directory:
        return f"{path} is a directory" if path.is_dir() else f"{path} is not a directory"
    folder = path if directory else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".opperf-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot create files in {folder}: {exc.strerror or exc}"
    if path.is_file():
        try:
            with path.open("r+b"):
                pass
        except OSError as exc:
            return f"cannot open it for writing: {exc.strerror or exc}"
    return None

