"""The expressions a config may hold (exclude, max_regression, a backend's constraints): vetted, then run.

An expression is arithmetic, comparisons, and/or/not and min/max/abs over the names of a case
(its parameters and knobs, backend, dtype_in, dtype_out, device); anything else (attributes,
subscripts, other calls) is refused when the config loads, so `eval` only ever sees those.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pytest_opperf.files import short
from pytest_opperf.config.yamlfile import ConfigError, describe

FUNCTIONS = {"min": min, "max": max, "abs": abs}
CASE_FIELDS = ("backend", "dtype_in", "dtype_out", "device")
_SAFE_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load,
    ast.Constant, ast.Tuple, ast.List, ast.And, ast.Or, ast.Not, ast.Add, ast.Sub, ast.Mult,
    ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt,
    ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Call, ast.IfExp,
)


def names(columns, knobs, fields: tuple = CASE_FIELDS) -> set[str]:
    """Names an expression may use: parameters, knobs, the case's fields, the functions."""
    return set(columns) | set(knobs) | set(fields) | set(FUNCTIONS)


def compile_expression(path: Path, key: str, source: Any, allowed: set[str]) -> Any:
    """Parse and vet an expression: arithmetic, comparisons, and/or/not, min/max/abs over known names."""
    if not isinstance(source, str):
        raise ConfigError(path, key, f"expected an expression string such as 'm * k > 2**28', got {describe(source)}")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(path, key, f"{short(source)} is not a valid expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            raise ConfigError(path, key, f"{short(source)}: {type(node).__name__} is not allowed; use arithmetic, comparisons, and/or/not, min/max/abs")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            raise ConfigError(path, key, f"{short(source)}: only min, max and abs may be called")
        if isinstance(node, ast.Name) and node.id not in allowed:
            raise ConfigError(path, key, f"{short(source)}: unknown name {short(node.id)}; expected one of {sorted(allowed)}")
    return compile(tree, f"{path}:{key}", "eval")


def evaluate(code: Any, names: dict) -> Any:
    """Run a compiled expression on one case's names, with only min, max and abs to call."""
    return eval(code, {"__builtins__": FUNCTIONS}, names)
