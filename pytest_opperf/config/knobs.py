"""Which knobs a backend takes: a config naming another is refused before anything runs.

A backend's knobs are the keyword parameters of its callable that have a default
(`def rmsnorm_triton(x, w, block_size=None, num_warps=None)` takes `block_size` and
`num_warps`); one with `**kwargs` takes any.
"""

from __future__ import annotations

import inspect
from typing import Callable, Mapping, Optional

from pytest_opperf.config.opconfig import ConfigError, OpConfig


def accepted(fn: Callable) -> Optional[set[str]]:
    """The knob names fn takes, or None when it takes any (**kwargs, or no signature to read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.default is not p.empty and p.kind is not p.POSITIONAL_ONLY}


def check(cfg: OpConfig, op: str, callables: Mapping[str, Callable]) -> None:
    """Every knob of every backend of the config is one its callable takes (names are lower-case).

    `callables`: backend name -> the op's callable for it (the registry's); a backend without one
    is the caller's to report.
    """
    for backend in cfg.backends:
        fn = callables.get(backend.name)
        if fn is None or not backend.knobs:
            continue
        names = accepted(fn)
        if names is None:
            continue
        for knob, _ in backend.knobs:
            if knob not in names:
                takes = f"its knobs are {sorted(names)}" if names else "it takes no knobs"
                raise ConfigError(cfg.path, f"backends.{backend.name}.knobs.{knob}",
                                  f"backend {backend.name!r} of op {op!r} takes no knob {knob!r}; {takes}")

