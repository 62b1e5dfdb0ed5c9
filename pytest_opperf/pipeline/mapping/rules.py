"""Profiled op types -> catalogue ops and their parameters, by rules in YAML.

The built-in rules are ``pipeline/mapping/data/mapping.yaml``; ``--mapping FILE`` puts a user's rules
before them (the first rule that matches wins). A rule::

    - match: [MatMulV2, MatMulV3]          # profiled type names; "re:<regex>" for a pattern
      when: "len(in0) == 2"                 # optional: an expression that must hold
      op: gemm                              # a registered catalogue op
      backend: torch                        # optional (default torch)
      params: {m: "in0[0]", k: "in0[1]", n: "in1[1] if in1[0] == in0[1] else in1[0]"}
      dtype: dt0                            # optional (default dt0: the first input's dtype)
      proxy: false                          # true: the op only stands in for the profiled one
      note: "..."                           # shown in the replay report

Expressions see ``in0, in1, ...`` (an input's dims as a tuple; None for an empty slot, a
scalar or a slot the profile does not have; a list of tuples for a tensor list; a FRACTAL_NZ
input of 4 dims (n1, m1, m0, n0) as its ND shape (m1*m0, n1*n0), of 5 dims with its batch in
front), ``out0, ...`` likewise, ``v0, ...`` (torch.profiler's recorded scalar arguments: a
number, a bool, a text, None where none was recorded), ``dt0, ...`` (input dtypes as catalogue names, None when
unknown or not a tensor dtype), ``floats`` (the floating-point dtype names), ``largest`` (the
input with the most elements), ``mm`` (a matmul's sizes from its inputs and output:
``mm['b']``, ``mm['m']``, ``mm['n']``, ``mm['k']``, see matmul.py), ``world`` (the device count
of the profiled run, see ascend.py), ``comm`` (an Ascend collective's ``message_bytes``, ``ranks``
and ``group`` from communication.json, see hccl.py; None elsewhere), and ``numel``, ``prod``, ``len``, ``min``, ``max``,
``abs``, ``itemsize`` (bytes of a dtype name). A rule whose ``when`` fails on a signature (an
index out of range, an empty slot) does not match it; one that matches but cannot make a case
(its op is not registered, a parameter cannot be read from the shapes or is not a positive
number, the matmul cannot be sized) makes the signature unreplayable, with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pytest_opperf import files

from pytest_opperf import dtypes as dtype_table
from pytest_opperf.pipeline.mapping import generic, matmul
from pytest_opperf.pipeline.reading.signature import ProfileError, parse_shapes
from pytest_opperf.pipeline.reading.slots import profiled_dtype

BUILTIN = Path(__file__).parent / "data" / "mapping.yaml"
RULE_KEYS = {"match", "when", "op", "backend", "params", "dtype", "proxy", "note"}

MAPPED, UNMAPPED, UNREPLAYABLE = "mapped", "unmapped", "unreplayable"
FLOATS = ("fp64", "fp32", "fp16", "bf16")

_SLOT = re.compile(r"(in|out|dt|st|v)\d+")


def _itemsize(name: Optional[str]) -> int:
    """Bytes per element of a catalogue dtype name (as ``dt0`` holds it)."""
    if name is None:
        raise Unreadable("the dtype is not one the catalogue knows, so the message size is unknown")
    return dtype_table.lookup(name).itemsize


class Unreadable(Exception):
    """A value a rule needs that the profile does not hold; the message says which and why."""


class _Env(dict):
    """An expression's names: a slot the signature does not have (``in3`` of a two-input op) is
    None, as an empty one is, so rules read absent inputs the same way everywhere."""

    def __missing__(self, key):
        if _SLOT.fullmatch(key):
            return None
        if key == "world":
            raise Unreadable("the device count of the profiled run is unknown (no profiler_metadata.json with "
                             "distributed_args.world_size beside the CSV): pass --world-size N to opperf import")
        raise NameError(f"name {key!r} is not defined")


class _MatmulSizes:
    """``mm['m']`` and its kin: sized on first use, so only the rules that read it pay for it."""

    def __init__(self, inputs, formats, outputs):
        self._args = (inputs, formats, outputs)
        self._sizes = None

    def __getitem__(self, key: str) -> int:
        if self._sizes is None:
            try:
                self._sizes = matmul.size(*self._args)
            except matmul.Unsized as exc:
                raise Unreadable(f"cannot size the matmul: {exc}") from None
        return getattr(self._sizes, key)


@dataclass(frozen=True)
class Rule:
    where: str  # file and index, for messages
    names: frozenset
    patterns: tuple
    when: Any
    op: str
    backend: str
    params: tuple  # (name, source, code)
    dtype: Any
    proxy: bool
    note: str

    def names_match(self, op_type: str) -> bool:
        return op_type in self.names or any(p.fullmatch(op_type) for p in self.patterns)


@dataclass(frozen=True)
class Resolution:
    status: str  # mapped, unmapped or unreplayable
    op: str = ""
    backend: str = ""
    dtype: str = ""
    params: Optional[dict] = None
    proxy: bool = False
    note: str = ""
    reason: str = ""


class Mapping:
    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self._claimed: dict = {}  # claims' answers: a trace asks of the same (op, inputs) thousands of times

    def claims(self, op_type: str, input_shapes: str, input_dtypes: str, input_strides: str = "",
               input_values: str = "") -> int:
        """How the mapping takes this op: 2 a catalogue rule that is the same computation, 1 a replay
        of the aten op itself (see catalog/replay.py) or a stand-in, 0 not at all."""
        key = (op_type, input_shapes, input_dtypes, input_strides, input_values)
        if key not in self._claimed:
            env = _env(input_shapes, input_dtypes, "", "", strides=input_strides, values=input_values)
            self._claimed[key] = 2 if self._rule(op_type, env, proxy=False) is not None else int(
                generic.claimable(op_type, input_values) or self._rule(op_type, env, proxy=True) is not None)
        return self._claimed[key]

    def resolve(self, sig) -> Resolution:
        """A catalogue rule's case first; else the aten op replayed as itself; else a stand-in."""
        context = getattr(sig, "context", None) or {}
        env = _env(sig.input_shapes, sig.input_dtypes, sig.input_formats, sig.output_shapes, context,
                   strides=getattr(sig, "input_strides", ""), values=getattr(sig, "input_values", ""))
        tried = []
        rule = self._rule(sig.op_type, env, proxy=False)
        if rule is not None:
            tried.append(self._by_rule(rule, env, context))
            if tried[-1].status == MAPPED:
                return tried[-1]
        if generic.claimable(sig.op_type, getattr(sig, "input_values", "")):
            tried.append(Resolution(**generic.resolve(sig, context.get("main_dtype", "float32"))))
            if tried[-1].status == MAPPED:
                return tried[-1]
        rule = self._rule(sig.op_type, env, proxy=True)
        if rule is not None:
            res = self._by_rule(rule, env, context)
            if res.status == MAPPED:
                if tried:  # why the same computation could not be replayed, beside the stand-in
                    res = dataclasses.replace(res, note=f"{res.note}; not replayed as itself: {tried[-1].reason}")
                return res
            tried.append(res)
        return tried[0] if tried else Resolution(UNMAPPED, reason="no mapping rule matches")

    def _by_rule(self, rule: Rule, env: dict, context: dict) -> Resolution:
        note = rule.note
        comm = env.get("comm")
        if comm is not None and "from" in comm and any("comm" in source for _, source, _ in rule.params):
            note = f"{note}; sized from {comm['from']} (group {comm['group']}, {comm['ranks']} ranks)".lstrip("; ")
        elif context.get("world_size_from") and any("world" in source for _, source, _ in rule.params):
            note = f"{note}; num_devices from {context['world_size_from']}".lstrip("; ")
        base = dict(op=rule.op, backend=rule.backend, proxy=rule.proxy, note=note)
        try:
            params = {name: _evaluate(code, env) for name, _, code in rule.params}
            dtype = _evaluate(rule.dtype, env)
        except Unreadable as exc:  # what the profile does not hold, in words: no rule or file to name
            return Resolution(UNREPLAYABLE, **base, reason=str(exc))
        except Exception as exc:  # noqa: BLE001  (a shape the rule cannot read is reported, not raised)
            reason = _why(exc, rule, env)
            if rule.note:
                reason = f"{reason} ({rule.note})"
            return Resolution(UNREPLAYABLE, **base, reason=f"{rule.where}: {reason}")
        reason = _unbuildable(rule, params, dtype)
        if reason:
            if rule.note:
                reason = f"{reason} ({rule.note})"
            return Resolution(UNREPLAYABLE, **base, params=params, dtype=str(dtype), reason=reason)
        from pytest_opperf.catalog.registry import OPS

        full = {**OPS[rule.op].defaults, **params}
        return Resolution(MAPPED, **base, params={p: full[p] for p in OPS[rule.op].params}, dtype=profiled_dtype(dtype))

    def _rule(self, op_type: str, env: dict, proxy: Optional[bool] = None) -> Optional[Rule]:
        """The first rule that takes the op (of the stand-ins only, or of the others only, when asked)."""
        for rule in self.rules:
            if not rule.names_match(op_type) or (proxy is not None and rule.proxy != proxy):
                continue
            if rule.when is None:
                return rule
            try:
                if _evaluate(rule.when, env):
                    return rule
            except Exception:  # noqa: BLE001  (a condition that cannot be read on this shape is false)
                continue
        return None


def _unbuildable(rule: Rule, params: dict, dtype) -> str:
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS, OPS

    load_builtin()
    if rule.op not in OPS:
        return f"op {rule.op!r} is not registered (known: {', '.join(sorted(OPS))})"
    op = OPS[rule.op]
    if (rule.op, rule.backend) not in BACKENDS:
        return f"backend {rule.backend!r} is not registered for op {rule.op!r}"
    unknown = sorted(set(params) - set(op.params))
    if unknown:
        return f"op {rule.op!r} has no parameter(s) {unknown} (it has {list(op.params)})"
    missing = [p for p in op.params if p not in params and p not in op.defaults]
    if missing:
        return f"parameter(s) {missing} of op {rule.op!r} not given"
    for name, value in params.items():
        kind = op.types.get(name, int)
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            return f"parameter {name}={value!r}: expected a positive int"
    if not isinstance(dtype, str) or profiled_dtype(dtype) is None:
        return f"dtype {dtype!r} is not a catalogue dtype"
    return ""


def _why(exc: Exception, rule: Rule, env: dict) -> str:
    """What a rule could not read, in words: an absent input by name, else the error."""
    if isinstance(exc, Unreadable):
        return str(exc)
    absent = sorted({name for _, source, _ in rule.params for name in re.findall(r"\b(?:in\d+|out\d+|largest)\b", source)
                     if env[name] is None})
    if absent and isinstance(exc, TypeError):
        return (f"{', '.join(absent)} has no shape in the profile (an empty, scalar or N/A slot), which the rule "
                f"reads: profile with record_shapes (torch) or profiler_level Level1 or above (Ascend)")
    return f"the rule cannot read this signature's shapes ({exc})"


def _env(input_shapes: str, input_dtypes: str, input_formats: str, output_shapes: str,
         context: Optional[dict] = None, strides: str = "", values: str = "") -> dict:
    env = _Env(numel=_numel, prod=math.prod, len=len, min=min, max=max, abs=abs, itemsize=_itemsize,
               floats=FLOATS, contiguous=_contiguous, transposed=_transposed)
    formats = [f.strip().upper().removeprefix("FORMAT_") for f in (input_formats or "").split(";")]
    inputs = parse_shapes(input_shapes)
    outputs = parse_shapes(output_shapes)
    for i, slot in enumerate(inputs):
        fmt = formats[i] if i < len(formats) else ""
        if fmt == "FRACTAL_NZ" and isinstance(slot, tuple) and len(slot) in (4, 5):
            *batch, n1, m1, m0, n0 = slot
            slot = (*batch, m1 * m0, n1 * n0)
        env[f"in{i}"] = slot
    for i, slot in enumerate(outputs):
        env[f"out{i}"] = slot
    for i, slot in enumerate(parse_shapes(strides)):
        env[f"st{i}"] = slot
    for i, text in enumerate((input_dtypes or "").split(";")):
        env[f"dt{i}"] = profiled_dtype(text)
    for i, value in enumerate(_values(values)):
        env[f"v{i}"] = value
    env["comm"] = _comm(values)
    tensors = [s for s in (env[f"in{i}"] for i in range(len(inputs))) if isinstance(s, tuple)]
    env["largest"] = max(tensors, key=_numel) if tensors else None
    env["mm"] = _MatmulSizes(inputs, formats, outputs)
    if (context or {}).get("world_size"):
        env["world"] = context["world_size"]
    return env


class _Sized(dict):
    """An Ascend collective's size and group (ascend.py, hccl.py); a key it lacks is what the
    profile does not hold, said in words (its "why")."""

    def __missing__(self, key):
        raise Unreadable(self.get("why") or f"the communication files do not give {key}")


def _comm(text: str):
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    return _Sized(raw) if isinstance(raw, dict) else None


def _values(text: str) -> list:
    """The recorded scalar arguments (Concrete Inputs, JSON): None where none was recorded.

    >>> _values('["", "-1", "6", "False", "1e-05"]')
    [None, -1, 6, False, 1e-05]
    """
    try:
        raw = json.loads(text) if text else []
    except ValueError:
        return []
    out = []
    for value in raw if isinstance(raw, list) else []:
        value = str(value).strip()
        if value in ("True", "False"):
            out.append(value == "True")
            continue
        for kind in (int, float):
            try:
                out.append(kind(value))
                break
            except ValueError:
                continue
        else:
            out.append(value or None)
    return out if isinstance(raw, list) else []


def _contiguous(shape, stride) -> bool:
    """Is a tensor of these dims and strides row-major and dense? True when the strides are not
    recorded (a trace before torch 2.1, an Ascend file): the rules read those as they always have.

    >>> _contiguous((64, 256), (256, 1)), _contiguous((256, 512), (1, 256)), _contiguous((4, 8), None)
    (True, False, True)
    """
    if stride is None or shape is None or isinstance(shape, list):
        return True
    expected, step = [], 1
    for d in reversed(shape):
        expected.append(step)
        step *= max(d, 1)
    return all(d == 1 or s == e for d, s, e in zip(shape, stride, reversed(expected)))


def _transposed(shape, stride) -> bool:
    """Is a 2-dim tensor the transpose of a dense row-major one (a weight passed as W.t())?

    >>> _transposed((256, 512), (1, 256)), _transposed((64, 256), (256, 1))
    (True, False)
    """
    return (stride is not None and shape is not None and len(shape) == 2 and len(stride) == 2
            and stride[0] == 1 and stride[1] == max(shape[0], 1))


def _numel(shape) -> int:
    """Elements of a tensor, or of all the tensors of a tensor-list slot."""
    if isinstance(shape, list):
        return sum(math.prod(s) for s in shape)
    return math.prod(shape)


CALLABLE = ("numel", "prod", "len", "min", "max", "abs", "itemsize", "contiguous", "transposed")
_SAFE = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load, ast.Constant,
         ast.Tuple, ast.List, ast.And, ast.Or, ast.Not, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod,
         ast.Pow, ast.USub, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot, ast.In,
         ast.NotIn, ast.Call, ast.IfExp, ast.Subscript, ast.Slice)


def _compile(where: str, key: str, source: Any):
    if not isinstance(source, (str, int)):
        raise ProfileError(f"{where}.{key}: expected an expression string, got {type(source).__name__}")
    source = str(source)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ProfileError(f"{where}.{key}: {source!r} is not a valid expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE):
            raise ProfileError(f"{where}.{key}: {source!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Name):
            raise ProfileError(f"{where}.{key}: {source!r}: only {', '.join(CALLABLE)} may be called")
    return compile(tree, f"{where}.{key}", "eval")


def _evaluate(code, env: dict):
    return eval(code, {"__builtins__": {}}, env)  # noqa: S307  (vetted by _compile: no attributes, no imports)


def _first_match(body) -> str:
    names = body.get("match") if isinstance(body, dict) else None
    return str(names[0] if isinstance(names, list) and names else names or "?")


def load(extra: Optional[list[Path]] = None) -> Mapping:
    """The user's rule files (in order) before the built-in ones; one Mapping a process while the files
    are unchanged (predict imports one trace a configuration)."""
    paths = [Path(path) for path in [*(extra or []), BUILTIN]]
    key = tuple((str(path), path.stat().st_mtime_ns if path.is_file() else None) for path in paths)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = Mapping([rule for path in paths for rule in _read(path)])
    return _LOADED[key]


_LOADED: dict = {}  # ((path, mtime), ...) -> the Mapping read from those files


def _read(path: Path) -> list[Rule]:
    if not path.exists():
        raise ProfileError(f"{path}: no such mapping file")
    try:
        raw = files.load_yaml(path)
    except files.FileError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        raise ProfileError(f"{path}: expected a mapping with a list under 'rules:'")
    out = []
    for i, body in enumerate(raw["rules"]):
        # A built-in rule is named by what it matches: its file is inside the package, not the user's.
        where = f"{path}: rules[{i}]" if path != BUILTIN else f"the built-in rule for {_first_match(body)}"
        if not isinstance(body, dict):
            raise ProfileError(f"{where}: expected a mapping with keys {sorted(RULE_KEYS)}")
        unknown = sorted(set(body) - RULE_KEYS)
        if unknown:
            raise ProfileError(f"{where}.{unknown[0]}: unknown key; expected one of {sorted(RULE_KEYS)}")
        for key in ("match", "op"):
            if key not in body:
                raise ProfileError(f"{where}: missing key {key!r}")
        names = body["match"] if isinstance(body["match"], list) else [body["match"]]
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ProfileError(f"{where}.match: expected a type name or a list of them")
        try:
            patterns = tuple(re.compile(n[3:]) for n in names if n.startswith("re:"))
        except re.error as exc:
            raise ProfileError(f"{where}.match: bad pattern ({exc})") from None
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise ProfileError(f"{where}.params: expected a mapping of parameter -> expression")
        when = body.get("when")
        dtype = str(body.get("dtype", "dt0"))
        out.append(Rule(
            where=where,
            names=frozenset(n for n in names if not n.startswith("re:")),
            patterns=patterns,
            when=_compile(where, "when", when) if when is not None else None,
            op=str(body["op"]),
            backend=str(body.get("backend", "torch")),
            params=tuple((str(k).lower(), str(v), _compile(where, f"params.{k}", v)) for k, v in params.items()),
            # a dtype name is a constant; anything else (dt0, a conditional) an expression
            dtype=_compile(where, "dtype", repr(dtype) if profiled_dtype(dtype) else dtype),
            proxy=bool(body.get("proxy", False)),
            note=str(body.get("note", "")),
        ))
    return out
