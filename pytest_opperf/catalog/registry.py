"""Ops and backends register here; the plugin only ever looks them up.

An op is data plus four small functions (see ``ops/gemm.py``); a backend is one
decorated callable::

    @register_backend("gemm", "torch")
    def gemm_torch(a, b):
        return a @ b

A user's repository registers its own in a module its ``conftest.py`` imports.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pytest_opperf.catalog.precision import elementwise_tolerance
from pytest_opperf.dtypes import DType
from pytest_opperf.columns import RESERVED

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class DTypes:
    """The dtype combination of one case."""

    input: DType
    output: DType

    @property
    def label(self) -> str:
        if self.input.name == self.output.name:
            return self.input.name
        return f"{self.input.name}-{self.output.name}"


@dataclass(frozen=True)
class Op:
    """What the plugin needs to know about an operator.

    inputs(params, dtypes, device, generator) -> tuple of call arguments
    reference(*inputs) -> the exact answer (computed in higher precision)
    flops(params, dtypes) -> floating-point operations of one call
    bytes(params, dtypes) -> fewest bytes one call must move (inputs read once, outputs written once)
    memory(params, dtypes) -> optional: device bytes a case holds at its peak (inputs, outputs, the
        reference's copies, workspace), for the memory budget; default: see budget.case_bytes
    tolerance(params, dtypes) -> optional: the check's bound on the normwise relative error
        (default: an elementwise op's, see check_bound)
    """

    name: str
    params: tuple[str, ...]
    inputs: Callable[..., tuple]
    reference: Callable[..., Any]
    flops: Callable[[dict, DTypes], float]
    bytes: Callable[[dict, DTypes], float]
    # Which peak table MFU is taken against: "matrix" (tensor cores) or "vector".
    peak: str = "matrix"
    defaults: dict = field(default_factory=dict)
    # Type of each parameter (int, float or str); a parameter not named here is an int.
    types: dict = field(default_factory=dict)
    description: str = ""
    memory: Optional[Callable[[dict, DTypes], float]] = None
    # tolerance(params, dtypes) -> the largest normwise relative error the check accepts for this
    # case (it grows with the reduction length and the dtype's rounding: catalog/precision.py);
    # default: an elementwise op's, 2 units of the output's roundoff. A config's `tolerance:` still wins.
    tolerance: Optional[Callable[[dict, DTypes], float]] = None

    def check_bound(self, params: dict, dtypes: DTypes) -> float:
        """The functional check's bound on the normwise relative error of one case: the op's own
        `tolerance`, else that of an op whose outputs are each a short formula of a few inputs
        (softmax, norms and attention too: their fp32 sums add far less than the output's rounding).

        >>> from pytest_opperf.dtypes import lookup
        >>> Op("x", (), None, None, None, None).check_bound({}, DTypes(lookup("bf16"), lookup("bf16")))
        0.0078125
        """
        if self.tolerance is not None:
            return float(self.tolerance(params, dtypes))
        return elementwise_tolerance(dtypes)


@dataclass(frozen=True)
class Backend:
    op: str
    name: str
    fn: Callable
    library: str  # distribution whose installed version is the row's backend_version
    devices: Optional[frozenset] = None  # torch device types it runs on; None: any
    # supports(device_type, dtypes, capability[, params]) -> None if it can run, else the reason it can't
    supports: Optional[Callable[..., Optional[str]]] = None
    # warm(torch_device): what the backend's first call would pay once a process, not once a case (its
    # compiler's own start), paid before the process's first case beside the rest of its start-up
    warm: Optional[Callable[[Any], None]] = None

    def unsupported(self, device_type: str, dtypes: DTypes, capability, params: dict) -> Optional[str]:
        """Why this backend cannot run a case (None: it can), from its `supports`.

        A `supports` with a fourth parameter also gets the case's parameters, for limits that
        depend on the shape (a kernel's largest head_dim, a GEMM's alignment).
        """
        if self.supports is None:
            return None
        if _takes_params(self.supports):
            return self.supports(device_type, dtypes, capability, params)
        return self.supports(device_type, dtypes, capability)

    def cannot_run(self, device_type: str, dtypes: DTypes, capability, params: dict) -> Optional[str]:
        """Why this backend cannot run a case here (None: it can): its library not installed, a
        device type it does not run on, or its `supports`."""
        if library_version(self.library) is None:
            return f"library {self.library!r} is not installed"
        if self.devices is not None and device_type not in self.devices:
            return f"it runs on {', '.join(sorted(self.devices))}, not {device_type}"
        return self.unsupported(device_type, dtypes, capability, params)


OPS: dict[str, Op] = {}
BACKENDS: dict[tuple[str, str], Backend] = {}
# Backends made from another backend of every op (torch_compile wraps each op's `torch`):
# derived name -> (source backend name, make(source Backend) -> Backend); and the keys so made.
_DERIVATIONS: dict[str, tuple[str, Callable[[Backend], Backend]]] = {}
_DERIVED: set[tuple[str, str]] = set()


class BackendUnavailable(Exception):
    """Raised by a backend's call when it cannot run the case here for a reason outside the op
    (its compiler failed): the `bench` fixture skips the case with this message instead of failing it."""


def register_op(op: Op) -> Op:
    if not _IDENT.match(op.name):
        raise ValueError(f"op name {op.name!r}: expected lower-case letters, digits and '_' (it names a table)")
    for column in op.params:
        if not _IDENT.match(column) or column in RESERVED:
            raise ValueError(f"op {op.name!r}: parameter {column!r} must be a lower-case identifier and not one of "
                             f"the table's own columns {sorted(RESERVED)}")
    if op.name in OPS and not _same_origin(OPS[op.name].inputs, op.inputs):
        raise ValueError(f"op {op.name!r} is already registered by {OPS[op.name].inputs.__module__}")
    OPS[op.name] = op
    return op


def register_backend(
    op: str,
    name: str,
    *,
    library: str = "torch",
    devices: Optional[set] = None,
    supports: Optional[Callable[..., Optional[str]]] = None,
    warm: Optional[Callable[[Any], None]] = None,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` as backend ``name`` of ``op``; returns ``fn`` unchanged. WARM: see Backend.warm."""

    def wrap(fn: Callable) -> Callable:
        key = (op, name)
        if key in BACKENDS and key not in _DERIVED and not _same_origin(BACKENDS[key].fn, fn):
            raise ValueError(f"backend {name!r} of op {op!r} is already registered by {BACKENDS[key].fn.__module__}")
        _DERIVED.discard(key)  # one registered by hand replaces a derived one
        BACKENDS[key] = Backend(op, name, fn, library, frozenset(devices) if devices else None, supports, warm)
        for derived, (source, _) in _DERIVATIONS.items():
            if source == name:
                _derive(derived, BACKENDS[key])
        return fn

    return wrap


def _takes_params(supports: Callable) -> bool:
    # Asked once per case at collection: inspect.signature was a quarter of collecting a 20k grid.
    try:
        return _takes_params_of(supports)
    except TypeError:  # an unhashable callable object: read its signature every time
        return _takes_params_of.__wrapped__(supports)


@functools.lru_cache(maxsize=None)
def _takes_params_of(supports: Callable) -> bool:
    try:
        parameters = inspect.signature(supports).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the three-argument form
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 4 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def derive_backend(name: str, source: str, make: Callable[[Backend], Backend]) -> None:
    """Give every op that has backend `source` a backend `name` made by ``make(source_backend)``.

    Ops whose `source` backend is registered later (a module imported after this one, a user's
    conftest) get theirs at that moment; a backend registered by hand under `name` wins::

        derive_backend("torch_compile", "torch", compiled)   # every op's torch backend, compiled
    """
    _DERIVATIONS[name] = (source, make)
    for (_, backend_name), backend in list(BACKENDS.items()):
        if backend_name == source:
            _derive(name, backend)


def _derive(name: str, source: Backend) -> None:
    key = (source.op, name)
    if key in BACKENDS and key not in _DERIVED:
        return
    BACKENDS[key] = _DERIVATIONS[name][1](source)
    _DERIVED.add(key)


def _same_origin(old: Callable, new: Callable) -> bool:
    """A module imported again (a conftest in a new session) may register its own names again."""
    return (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) == (
        getattr(new, "__module__", None), getattr(new, "__qualname__", None))


def choice(*values: str) -> type:
    """A str parameter type (for Op.types) that accepts only these values: a config giving
    another is a collection error that lists them.

    >>> layout = choice("neox", "gptj")
    >>> isinstance("gptj", layout), isinstance("llama", layout), layout.__name__
    (True, False, "'neox' or 'gptj'")
    """

    class _OneOf(type):
        def __instancecheck__(cls, value) -> bool:
            return isinstance(value, str) and value in values

    return _OneOf(" or ".join(map(repr, values)), (str,), {})


def backends_of(op: str) -> list[str]:
    return sorted(name for (o, name) in BACKENDS if o == op)


@functools.lru_cache(maxsize=None)
def library_version(library: str) -> Optional[str]:
    """Installed version of a distribution, or None when it is not installed.

    Read once per library and process: importlib.metadata scans every path entry on each call
    (milliseconds; collection asks once per backend of every config, the record once per case),
    and a process's libraries stay put."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        module = __import__(library)
    except ImportError:
        return None
    return getattr(module, "__version__", None)


def installed_version(op: str, backend: str) -> str:
    """The installed version of the library behind a registered backend ("unknown" when unreadable)."""
    return str(library_version(BACKENDS[(op, backend)].library) or "unknown")


def version_matches(pin: str, installed: str) -> bool:
    """Does the installed version satisfy a config pin?

    A pin is an exact version ("2.1.1+c9f8b34"; "2.13.0" also accepts "2.13.0+cpu")
    or a PEP 440 specifier (">=2.4,<3").

    >>> version_matches("2.13.0", "2.13.0+cpu"), version_matches(">=2.4", "2.13.0")
    (True, True)
    """
    pin = pin.strip()
    if pin[:1] in "<>=!~":
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            return Version(installed) in SpecifierSet(pin)
        except InvalidVersion:
            return False
    return installed == pin or installed.split("+", 1)[0] == pin
