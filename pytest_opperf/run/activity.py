"""What the running case is doing, for the terminal's progress line (view/progress.py).

A case's PhaseClock (measure/phases.py) tells its Activity each phase as it starts. In one process
the progress line reads the Activity itself; an xdist worker also writes it to a small file in
the directory the controller gave its workers (run/xdist.py), which the controller reads, so its
line can say what a worker's long case is doing. The file is written at phase changes only,
never inside a timed stretch.

>>> a = Activity()
>>> a.listener("t.py::test_gemm[x]")("sampling")
>>> a.nodeid, a.phase
('t.py::test_gemm[x]', 'sampling')
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

SUFFIX = ".phase.json"


class Activity:
    def __init__(self, status_file: Optional[Path] = None):
        self.nodeid: Optional[str] = None
        self.phase: Optional[str] = None
        self.since: Optional[float] = None  # time.time() when the phase began
        self.status_file = status_file

    def listener(self, nodeid: str) -> Callable[[Optional[str]], None]:
        """The PhaseClock listener of the case `nodeid`."""
        def tell(phase: Optional[str]) -> None:
            self.nodeid, self.phase, self.since = nodeid, phase, time.time()
            if self.status_file is not None:
                self._write()
        return tell

    def _write(self) -> None:
        try:  # written aside and renamed: the controller never reads half a file
            part = self.status_file.with_suffix(".part")
            part.write_text(json.dumps({"nodeid": self.nodeid, "phase": self.phase, "since": self.since}))
            os.replace(part, self.status_file)
        except OSError:
            pass  # a progress line without this worker's phase; the case goes on


def read_phases(directory: Optional[Path]) -> dict[str, tuple[Optional[str], float]]:
    """Controller: nodeid -> (phase, since) of what each worker last told."""
    out: dict[str, tuple[Optional[str], float]] = {}
    if directory is None:
        return out
    for path in directory.glob(f"*{SUFFIX}"):
        try:
            told = json.loads(path.read_text())
            out[told["nodeid"]] = (told.get("phase"), float(told.get("since") or 0.0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
