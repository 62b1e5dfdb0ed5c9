"""A Chrome trace JSON read one event at a time, so that a trace of several hundred MB never sits in memory.

``{"traceEvents": [...], ...}`` or a bare ``[...]`` of events, plain or gzip-compressed (told by
its first bytes, not its name). The text is read in chunks and each event decoded on its own with
``json.JSONDecoder.raw_decode``: the caller keeps what it needs of an event and drops the rest.
Whatever cannot be read is one ``ProfileError`` line naming the file, the event's index and line::

    trace.json: event 1041 (line 1043) is not valid JSON (line 1043: Expecting ',' delimiter)
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Iterator, Optional, TextIO

from pytest_opperf.pipeline.reading.signature import ProfileError

CHUNK_CHARS = 1 << 20
_TOKEN_CHARS = 64  # longer than any number, true/false/null, or white space the decoder skips in one go
_SPACE = re.compile(r"[ \t\n\r]*")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


class Events:
    """Iterate a trace's events as ``(index, event)``; ``line()`` is the line the last one started on.

    >>> events = Events(Path("trace.json"))      # doctest: +SKIP
    >>> for i, event in events: ...              # doctest: +SKIP
    """

    def __init__(self, path: Path):
        self.path = path
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._lines_before = 0   # newlines in the text already dropped from the buffer
        self._start = 0          # where the last event began in the buffer
        self._fh: Optional[TextIO] = None

    def line(self) -> int:
        return self._lines_before + self._buf.count("\n", 0, self._start) + 1

    def where(self, index: int) -> str:
        return f"{self.path}: event {index} (line {self.line()})"

    def __iter__(self) -> Iterator[tuple[int, object]]:
        try:
            self._fh = _open(self.path)
            with self._fh:
                yield from self._top()
        except FileNotFoundError:
            raise ProfileError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise ProfileError(f"{self.path}: a directory, not a trace file") from None
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise ProfileError(f"{self.path}: cannot be read as a Chrome trace JSON file ({exc})") from None
        except RecursionError:
            # A trace's events nest a few levels; thousands of brackets are not a trace (and would
            # end the process's JSON decoder in a traceback).
            raise ProfileError(f"{self.path}: line {self.line()}: the JSON nests deeper than a Chrome trace does: "
                               f"not a trace file") from None

    def _top(self) -> Iterator[tuple[int, object]]:
        first = self._peek()
        if first == "[":
            yield from self._array()
            return
        if first != "{":
            found = f"it starts with {first!r}" if first else "it is empty"
            raise ProfileError(f"{self.path}: not a Chrome trace JSON file ({found}, expected {{'traceEvents': [...]}} "
                               f"or a list of events)")
        self._pos += 1
        while True:
            char = self._peek()
            if char == "}" or char == "":
                raise ProfileError(f"{self.path}: expected a Chrome trace ({{'traceEvents': [...]}} or a list "
                                   f"of events): no 'traceEvents' key")
            key = self._value(None)
            if self._peek() != ":":
                raise ProfileError(f"{self.path}: line {self._line_at(self._pos)}: not valid JSON "
                                   f"(expected ':' after the key {key!r})")
            self._pos += 1
            if key == "traceEvents":
                if self._peek() != "[":
                    raise ProfileError(f"{self.path}: 'traceEvents' is not a list of events")
                yield from self._array()
                return
            self._value(None)  # metadata beside the events (deviceProperties, schemaVersion, ...)
            if self._peek() == ",":
                self._pos += 1

    def _array(self) -> Iterator[tuple[int, object]]:
        self._pos += 1  # the '['
        index = 0
        if self._peek() == "]":
            return
        decode, buf_len = self._decoder.raw_decode, len(self._buf)
        while True:
            self._start = self._pos
            try:  # the common case first: a whole event, then its separator, inside the buffer
                value, end = decode(self._buf, self._pos)
                sep = _SEPARATOR.match(self._buf, end)
                if sep is None or sep.end() >= buf_len:
                    raise ValueError
            except ValueError:
                self._pos = self._start
                value = self._value(index)
                char = self._peek()
                if char not in (",", "]"):
                    self._start = self._pos
                    found = f"found {char!r}" if char else "the file ends"
                    raise ProfileError(f"{self.path}: after event {index} (line {self.line()}): not valid JSON "
                                       f"(expected ',' or ']', {found})")
                self._pos += 1
                if char == ",":
                    self._peek()
                buf_len = len(self._buf)
            else:
                char = sep.group(1)
                self._pos = sep.end()
            yield index, value
            if char == "]":
                return
            index += 1

    def _value(self, index: Optional[int]):
        """Decode the value at the read position, reading on while it is cut off by the buffer's end."""
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                # A value cut off by the buffer's end fails within a token of that end (or in its last,
                # unterminated string): read on. Anywhere else the text itself is wrong.
                cut = exc.pos >= len(self._buf) - _TOKEN_CHARS or exc.msg.startswith("Unterminated string")
                if self._eof or not cut:
                    self._start = self._pos
                    what = f"event {index} (line {self.line()})" if index is not None else f"line {self.line()}"
                    if self._eof and (exc.pos >= len(self._buf.rstrip()) - 8 or exc.msg.startswith("Unterminated")):
                        raise ProfileError(f"{self.path}: {what} is cut off: the file ends inside it") from None
                    msg = exc.msg.removesuffix(" starting at")
                    raise ProfileError(f"{self.path}: {what} is not valid JSON (line {self._line_at(exc.pos)}: "
                                       f"{msg})") from None
                self._fill()
                continue
            if end == len(self._buf) and not self._eof:  # a number may go on in the next chunk
                self._fill()
                continue
            self._pos = end
            return value

    def _peek(self) -> str:
        """The next character that is not white space ('' at the end of the file)."""
        while True:
            self._pos = _SPACE.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if self._eof:
                return ""
            self._fill()

    def _fill(self) -> None:
        chunk = self._fh.read(CHUNK_CHARS)
        if not chunk:
            self._eof = True
            return
        # Drop what was read; positions are kept relative to the read position.
        keep = min(self._pos, self._start)
        self._lines_before += self._buf.count("\n", 0, keep)
        self._buf = self._buf[keep:] + chunk
        self._pos -= keep
        self._start -= keep

    def _line_at(self, pos: int) -> int:
        return self._lines_before + self._buf.count("\n", 0, pos) + 1


def _open(path: Path) -> TextIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, "rt", encoding="utf-8-sig")
