"""The checkout a run measured, asked of git: used by the run's environment row and by the
exports that name the commit. A leaf, so the store and the run layer may both call it.

>>> git(Path("."), "rev-parse", "HEAD")        # doctest: +SKIP
'f63d8c9...'
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional


def git(rootpath: Path, *args: str) -> Optional[str]:
    """`git -C rootpath ARGS`'s output, stripped; None outside a checkout, without git, or after 5 s."""
    try:
        out = subprocess.run(["git", "-C", str(rootpath), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
