"""The plain data every layer passes around: one case of a sweep.

A Case is what collection makes of a config's grid and what every later step keys on: the
fixtures, the record, the gate's baseline key and the reports. It imports nothing of the
package, so any layer may use it.

>>> Case("gemm", "torch", None, "bf16", "bf16", (("m", 64), ("n", 128), ("k", 0.5))).id
'torch-bf16-m=64-n=128-k=0.5'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

CASE_FIXTURE = "opperf_case"  # the parametrized fixture every bench test's case rides on


@dataclass(frozen=True)
class Case:
    """One parametrization: op x backend x dtypes x params (x knobs)."""

    op: str
    backend: str
    version_pin: Optional[str]
    dtype_in: str
    dtype_out: str
    params: tuple  # ((name, value), ...) in the op's column order
    knobs: tuple = ()
    # Positions among the case's input tensors that the cache state "resident" reads into the cache
    # before each timed call (a replay config's `resident:`); not part of what the case is.
    resident: tuple = field(default=(), compare=False)

    @property
    def id(self) -> str:
        parts = [self.backend, self.dtype_in if self.dtype_in == self.dtype_out else f"{self.dtype_in}-{self.dtype_out}"]
        parts += [f"{k}={format_value(v)}" for k, v in self.params + self.knobs]
        return "-".join(parts)

    @property
    def param_dict(self) -> dict:
        return dict(self.params)

    @property
    def inputs_key(self) -> str:
        """What the case's inputs are made from: the op, dtypes and parameters, not the backend or
        knobs. Every backend of a shape gets the same inputs (run/env.py's case_seed), so the
        comparison of backends sees the same data and one reference output serves them all.

        >>> Case("gemm", "torch", None, "bf16", "bf16", (("m", 8), ("n", 16)), (("block", 64),)).inputs_key
        'gemm/bf16-bf16/m=8-n=16'
        """
        return f"{self.op}/{self.dtype_in}-{self.dtype_out}/" + "-".join(f"{k}={format_value(v)}" for k, v in self.params)


def format_value(v) -> str:
    """A parameter's value as it appears in a case id: floats in their shortest form (2.0 -> 2)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def shape_of(item) -> Optional[str]:
    """The shape a collected item's case runs (Case.inputs_key), or None for an item that is no case."""
    case = case_of(item)
    return case.inputs_key if case is not None else None


def case_of(item) -> Optional[Case]:
    """The opperf case a collected pytest item runs, or None."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get(CASE_FIXTURE) if callspec is not None else None
    return case if isinstance(case, Case) else None
