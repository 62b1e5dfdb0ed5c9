"""pytest-opperf: operator performance validation as pytest test cases."""

from pytest_opperf.catalog.registry import BackendUnavailable, DTypes, Op, register_backend, register_op
from pytest_opperf.version import __version__

__all__ = ["Op", "DTypes", "register_op", "register_backend", "BackendUnavailable", "__version__"]
