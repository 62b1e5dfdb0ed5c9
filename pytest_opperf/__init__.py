"""pytest-opperf: operator performance validation as pytest test cases."""

from pytest_opperf.catalog.registry import BackendUnavailable, DTypes, Op, register_backend, register_op
from pytest_opperf.version import __version__

__all__ = ["bench", "BenchResult", "BenchError", "Op", "DTypes", "register_op", "register_backend",
           "BackendUnavailable", "__version__"]
_API = ("bench", "BenchResult", "BenchError")


def __getattr__(name: str):
    # bench() loads the timers on first use, so `import pytest_opperf` (every pytest session of the
    # environment does it) costs no more than the registry.
    if name in _API:
        from pytest_opperf import api

        return getattr(api, name)
    raise AttributeError(f"module 'pytest_opperf' has no attribute {name!r}")
