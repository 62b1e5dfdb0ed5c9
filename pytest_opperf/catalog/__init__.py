"""The catalogue: the registry of ops and backends, the built-in ops with their
backends (`catalog/ops/<family>/<op>.py`, or a folder `<op>/` where the op has a kernel of its own),
and what backends of several ops share (`catalog/backends/`).

An op or a backend is code that registers itself on import; nothing else needs an edit:

    >>> load_builtin()                       # doctest: +SKIP
    >>> sorted(OPS)[:3]                      # doctest: +SKIP
    ['add', 'gelu', 'gemm']

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""

from __future__ import annotations

import importlib
import pkgutil

from pytest_opperf.catalog.registry import BACKENDS, OPS  # noqa: F401  (the catalogue's public view)


_walked = False  # the packages walked once: a walk lists ~200 folders (ms), and lookups call this per call


def load_builtin() -> None:
    """Import every module of catalog.ops and catalog.backends (registering what they hold),
    the modules inside an op's folder included; once a process.

    Modules and folders whose name starts with '_' are helpers, imported only by their users.
    """
    global _walked
    if _walked:
        return
    from pytest_opperf.catalog import backends, ops

    for package in (ops, backends):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.rsplit(".", 1)[-1].startswith("_"):
                importlib.import_module(info.name)
    _walked = True
