"""The environment a run was measured in: one row of the `runs` table."""

from __future__ import annotations

import json
import platform
import socket
import sys
from pathlib import Path
from typing import Optional

from pytest_opperf.version import __version__
from pytest_opperf.vcs import git


def describe(rootpath: Path, spec, accelerator, libraries: dict, command: list[str]) -> dict:
    import torch

    commit = git(rootpath, "rev-parse", "HEAD")
    dirty = git(rootpath, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "device": spec.name,
        "device_title": spec.title,
        "device_reported": accelerator.reported_name,
        "accelerator": accelerator.type,
        "device_count": accelerator.count,
        "spec_source": spec.source,
        "driver": _driver_version(accelerator.type),
        "cuda": _str(torch.version.cuda),
        "hip": _str(getattr(torch.version, "hip", None)),
        "torch": str(torch.__version__),
        "libraries": json.dumps(libraries, sort_keys=True),
        "python": platform.python_version(),
        "plugin_version": __version__,
        "git_commit": commit,
        "git_dirty": None if dirty is None else int(bool(dirty)),
        "host": socket.gethostname(),
        "command": " ".join([Path(sys.argv[0]).name, *command]),
    }


def _driver_version(accelerator_type: str) -> Optional[str]:
    if accelerator_type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # NVML missing or unusable (ROCm, containers): not worth failing a run over
        return None


def _str(value) -> Optional[str]:
    return None if value is None else str(value)
