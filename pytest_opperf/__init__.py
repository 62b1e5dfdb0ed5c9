"""pytest-opperf: operator performance validation as pytest test cases."""

__version__ = "0.1.0"

from pytest_opperf.catalog.registry import BackendUnavailable, DTypes, Op, register_backend, register_op  # noqa: E402

__all__ = ["Op", "DTypes", "register_op", "register_backend", "BackendUnavailable", "__version__"]
