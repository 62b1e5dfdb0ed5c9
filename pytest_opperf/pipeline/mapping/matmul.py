"""Sizing a profiled matrix multiply (b, m, n, k) from its inputs AND its output.

A profiler writes a MatMul's operand shapes as stored, not as multiplied: either operand may be
transposed (``MatMulV3 [4096,1024;4096,3072] -> [1024,3072]`` is A^T @ B: m=1024, n=3072,
k=4096), a weight may be in FRACTAL_NZ (4-D ``(n1, m1, m0, n0)`` for an ND ``(m1*m0, n1*n0)``,
its dims padded up to the 16-element tiles, a 5-D one with a batch in front), and a batched
multiply carries batch dims. The output settles it: of the four readings (A or A^T, B or B^T)
those whose shared k agrees and whose m x n is the output's are kept, and they must agree::

    >>> size([(4096, 1024), (4096, 3072)], ["ND", "ND"], [(1024, 3072)]).mnk
    (1024, 3072, 4096)
    >>> size([(2048, 4352), (272, 72, 16, 16)], ["ND", "FRACTAL_NZ"], [(2048, 1152)]).mnk
    (2048, 1152, 4352)

When no reading fits, or two readings disagree, `size` raises `Unsized` with what it saw: the
signature is then unreplayable with that reason, never replayed at a wrong size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

NZ = "FRACTAL_NZ"
# The tile edges an NZ dim is padded to: 16 rows, and 16 (or 32 for int8, 8 for fp32) columns.
TILES = (8, 16, 32)


class Unsized(Exception):
    """A matmul whose sizes cannot be decided from the profile; the message says what was seen."""


@dataclass(frozen=True)
class Sizes:
    b: int
    m: int
    n: int
    k: int
    how: str  # the reading taken: "A^T @ B", "A @ B (B FRACTAL_NZ)", ...

    @property
    def mnk(self) -> tuple:
        return self.m, self.n, self.k


@dataclass(frozen=True)
class _View:
    """An operand as a (batch, rows, cols) matrix; `tile` set when rows/cols are NZ-padded."""

    batch: tuple
    rows: int
    cols: int
    tile: tuple = ()  # (row tile, col tile) for FRACTAL_NZ

    def axis(self, transposed: bool) -> tuple:
        """(outer, inner, outer tile, inner tile): outer is m (or n), inner is k."""
        r_tile, c_tile = self.tile or (0, 0)
        if transposed:
            return self.cols, self.rows, c_tile, r_tile
        return self.rows, self.cols, r_tile, c_tile


def _view(shape, fmt: str, name: str) -> _View:
    if not isinstance(shape, tuple):
        raise Unsized(f"{name} has no shape in the profile")
    fmt = (fmt or "").strip().upper().removeprefix("FORMAT_")
    if fmt == NZ and len(shape) >= 4:
        n1, m1, m0, n0 = shape[-4:]
        return _View(shape[:-4], m1 * m0, n1 * n0, (m0, n0))
    if len(shape) < 2:
        raise Unsized(f"{name} [{_text(shape)}] is not a matrix")
    return _View(shape[:-2], shape[-2], shape[-1])


def _fits(true: int, stored: int, tile: int) -> bool:
    """Is `stored` the dim `true` as written: equal, or padded up to its NZ tile?"""
    return stored == true or (tile > 0 and stored % tile == 0 and stored - tile < true < stored)


def _k(ka: int, ta: int, kb: int, tb: int) -> Optional[int]:
    """The shared k of A and B, or None when they disagree (an NZ side may be padded)."""
    if ka == kb:
        return ka
    if _fits(kb, ka, ta):
        return kb
    if _fits(ka, kb, tb):
        return ka
    return None


def _output_views(out) -> list:
    """The output as written (ND), and as FRACTAL_NZ when its shape could be one: the output's
    format is not part of a signature, so an NZ output shows as a 4-D shape ending in tiles."""
    views = []
    if isinstance(out, tuple) and len(out) >= 2:
        views.append((out[:-2], out[-2], out[-1], ""))
        if len(out) >= 4 and out[-2] == 16 and out[-1] in TILES:
            n1, m1, m0, n0 = out[-4:]
            views.append((out[:-4], m1 * m0, n1 * n0, " (output read as FRACTAL_NZ)"))
    return views


def size(inputs: list, formats: list, outputs: list) -> Sizes:
    """The (b, m, n, k) of a matmul with these input slots, formats and output slots."""
    fmts = list(formats) + [""] * 2
    a = _view(inputs[0] if inputs else None, fmts[0], "input 0")
    b = _view(inputs[1] if len(inputs) > 1 else None, fmts[1], "input 1")
    out = outputs[0] if outputs else None
    readings = set()
    for ta in (False, True):
        m, ka, m_tile, ka_tile = a.axis(ta)
        for tb in (False, True):
            n, kb, n_tile, kb_tile = b.axis(not tb)  # B is (k, n): its outer axis is n
            k = _k(ka, ka_tile, kb, kb_tile)
            if k is None:
                continue
            how = f"{'A^T' if ta else 'A'} @ {'B^T' if tb else 'B'}{_nz_note(a, b)}"
            if out is None:
                readings.add((_batch(a, b), m, n, k, how))
                continue
            for batch, om, on, note in _output_views(out):
                if _fits(om, m, m_tile) and _fits(on, n, n_tile):
                    readings.add((math.prod(batch), om, on, k, how + note))
    if not readings:
        raise Unsized(f"no reading of [{_text(inputs[0])}] x [{_text(inputs[1])}] "
                      f"({'; '.join(f or 'ND' for f in fmts[:2])}) gives the output [{_text(out)}]: "
                      "k differs between the operands, or m x n is not the output's")
    sizes = {r[:4] for r in readings}
    if len(sizes) > 1:
        shown = ", ".join(f"b={s[0]} m={s[1]} n={s[2]} k={s[3]}" for s in sorted(sizes))
        raise Unsized(f"[{_text(inputs[0])}] x [{_text(inputs[1])}] -> [{_text(out)}] reads as several sizes ({shown})")
    bb, m, n, k = sizes.pop()
    how = sorted(r[4] for r in readings)[0]
    if isinstance(out, tuple) and bb * m * n != math.prod(out):
        raise Unsized(f"b x m x n = {bb * m * n} is not the output's {math.prod(out)} elements [{_text(out)}]")
    return Sizes(bb, m, n, k, how)


def _batch(a: _View, b: _View) -> int:
    return math.prod(a.batch if len(a.batch) >= len(b.batch) else b.batch)


def _nz_note(a: _View, b: _View) -> str:
    nz = [name for name, v in (("A", a), ("B", b)) if v.tile]
    return f" ({' and '.join(nz)} FRACTAL_NZ)" if nz else ""


def _text(shape) -> str:
    if isinstance(shape, tuple):
        return ",".join(map(str, shape))
    return "" if shape is None else str(shape)
