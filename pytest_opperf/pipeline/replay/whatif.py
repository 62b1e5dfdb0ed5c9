"""What-if arrangements of the sequence replay: transforms of a built plan (plan.py) before it runs
(sequence.py), the options that ask for them and the checks they pass first.

- ``--backend OP=BACKEND``: every call of a signature mapped to catalogue op OP runs on BACKEND
  (``swap_backends``);
- ``--replace CLASS=OP:BACKEND``: every call of a leaf module of CLASS (the capture's ``modules``,
  import's modules table) gives way to one call of OP on BACKEND, at the position of the call that
  wrote the module's output, fed what wrote the module's input (``stand_ins``);
- ``--register MODULE``: the user's own backends, imported first.

Each swapped backend and each stand-in is checked against its op's reference before anything is
timed (``check_swapped``): one wrong by 1% fails the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay.plan import Call, Link, Plan, case_of, prod, read_table, short


class StandIn(NamedTuple):
    """What a --replace stand-in runs, and for which module: its check reads it."""

    op: str
    dtypes: object
    params: dict
    module: str
    backend: str


def register(modules: Optional[list]) -> None:
    """Import each --register MODULE (a module name, or a path to a .py file): the backends it registers."""
    import importlib
    import importlib.util

    for name in modules or ():
        try:
            if name.endswith(".py"):
                path = Path(name)
                if not path.is_file():
                    raise ProfileError(f"--register {name}: no such file")
                spec = importlib.util.spec_from_file_location(f"opperf_registered_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except ProfileError:
            raise
        except Exception as exc:  # noqa: BLE001  (the user's module: its failure, named)
            raise ProfileError(f"--register {name}: importing it failed ({type(exc).__name__}: {short(exc)})") from None


def parse_backends(texts: list) -> dict:
    """--backend OP=BACKEND options -> {op: backend}; a ProfileError naming the option when wrong."""
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS, OPS, backends_of

    load_builtin()
    out = {}
    for text in texts or ():
        op, sep, backend = text.partition("=")
        if not sep or not op or not backend:
            raise ProfileError(f"--backend {text}: expected OP=BACKEND (attention_prefill=sdpa_efficient)")
        if op not in OPS:
            raise ProfileError(f"--backend {text}: no catalogue op {op!r}")
        if (op, backend) not in BACKENDS:
            raise ProfileError(f"--backend {text}: {op} has no backend {backend!r} (it has "
                               f"{', '.join(backends_of(op))})")
        out[op] = backend
    return out


def swap_backends(out: Plan, rows: list[dict], overrides: dict, device) -> None:
    """Give each call of the plan OUT whose signature is mapped to an op that OVERRIDES (--backend
    OP=BACKEND, parse_backends) names on another backend that backend's callable, to run in the
    what-if (Call.alt); a ProfileError where it cannot run a signature here."""
    import torch

    from pytest_opperf.catalog.registry import BACKENDS

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    by_id = {r["id"]: r for r in rows}
    alts: dict = {}  # signature id -> the what-if's callable, or None
    for c in out.calls:
        if c.signature not in alts:
            sig = by_id[c.signature]
            alts[c.signature] = None
            if overrides.get(sig["op"], sig["backend"]) != sig["backend"]:
                other = BACKENDS[(sig["op"], overrides[sig["op"]])]
                _, dtypes, params = case_of(sig)
                why = other.cannot_run(device.type, dtypes, capability, params)
                if why:
                    raise ProfileError(f"--backend {sig['op']}={other.name}: cannot run signature {sig['id']} "
                                       f"({sig['op_type']} [{sig['input_shapes']}]) here: {why}")
                alts[c.signature] = other.fn
                out.swapped[sig["id"]] = (sig["op"], sig["backend"], other.name)
        c.alt = alts[c.signature]


def load_modules(path: Path) -> list[dict]:
    """The profile's leaf-module calls (the modules table; none for a profile without a capture's)."""
    return read_table(path, "modules")


def parse_replacements(texts: list) -> dict:
    """--replace CLASS=OP:BACKEND options -> {class pattern: (op, backend)}; a ProfileError naming
    the option when wrong. OP must take a row count and a row length (m, n): a module's input gives
    no more."""
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS, OPS, backends_of

    load_builtin()
    out = {}
    for text in texts or ():
        cls, sep, target = text.partition("=")
        op, colon, backend = target.partition(":")
        if not sep or not cls or not colon or not op or not backend:
            raise ProfileError(f"--replace {text}: expected CLASS=OP:BACKEND (LlamaRMSNorm=rmsnorm:triton)")
        if op not in OPS:
            raise ProfileError(f"--replace {text}: no catalogue op {op!r}")
        if tuple(OPS[op].params) != ("m", "n"):
            raise ProfileError(f"--replace {text}: {op} takes ({', '.join(OPS[op].params)}); a module is replaced "
                               f"by an op of rows and a row length (m, n), read from its input: rmsnorm, "
                               f"layernorm, softmax")
        if (op, backend) not in BACKENDS:
            raise ProfileError(f"--replace {text}: {op} has no backend {backend!r} (it has "
                               f"{', '.join(backends_of(op))})")
        out[cls] = (op, backend)
    return out


def stand_ins(out: Plan, replace: dict, modules: list, device, seed: int = 0) -> None:
    """Add to the plan OUT, for each call of a module whose class REPLACE names (fnmatch patterns,
    -> (op, backend)): one call of the op on the backend, at the position of the call that wrote the
    module's output, fed what wrote the module's input; the module's own calls stand aside in the
    what-if. MODULES: the profile's module calls (load_modules)."""
    import fnmatch

    import torch

    from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes
    from pytest_opperf.dtypes import lookup

    planned = {c.position for c in out.calls}
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    made: dict = {}
    for pattern, (op_name, backend_name) in replace.items():
        mine = [m for m in modules if fnmatch.fnmatchcase(m["class"], pattern)]
        if not mine:
            known = sorted({m["class"] for m in modules})
            said = (f"its classes: {', '.join(known[:12])}" if known else
                    "the profile has no module calls: profile inside capture(trace, model) and import again")
            raise ProfileError(f"--replace {pattern}=...: no module of that class in the profile's capture ({said})")
        op, backend = OPS[op_name], BACKENDS[(op_name, backend_name)]
        count = 0
        for m in mine:
            positions = [p for p in json.loads(m["positions"]) if p in planned]
            at = m["output_position"]
            if at not in positions or m["input_position"] is None:
                continue  # its output's writer is not replayed, or its input came from outside the block
            shape = json.loads(m["input_shape"])
            try:
                dtype = lookup(m["input_dtype"])
            except KeyError:
                raise ProfileError(f"--replace {pattern}=...: {m['name']}'s input is {m['input_dtype']}, not a dtype "
                                   f"of the catalogue") from None
            params = {**op.defaults, "m": prod(shape[:-1]), "n": shape[-1]}
            dtypes = DTypes(dtype, dtype)
            why = backend.cannot_run(device.type, dtypes, capability, params)
            if why:
                raise ProfileError(f"--replace {pattern}={op_name}:{backend_name}: cannot run {m['name']} "
                                   f"[{', '.join(map(str, shape))}] here: {why}")
            key = (m["name"], tuple(shape))
            if key not in made:
                gen = torch.Generator(device=device).manual_seed(seed + at)
                with torch.inference_mode():
                    made[key] = list(op.inputs(params, dtypes, device, gen))
            args = made[key]
            x = args[0]
            link = Link(0, None, m["input_position"], x.dtype, tuple(x.shape), tuple(x.stride()))
            links = [link] if link.producer in planned else []  # else its own input
            out.replacements[at] = Call(at, -1, m["step"], m["phase"] or "", backend.fn, args, links,
                                        stands_for=StandIn(op_name, dtypes, params, m["name"], backend_name))
            out.skipped.update(positions)
            for link in links:
                out.last_use[link.producer] = max(out.last_use.get(link.producer, -1), at)
            count += 1
        out.replaced[pattern] = (op_name, backend_name, count)


def check_swapped(p: Plan, rows: list[dict], say=None) -> list[str]:
    """Each swapped signature's what-if output against its op's reference, on its first call's
    inputs, and each --replace stand-in's on its own; the failures, one line each (none: all matched)."""
    import torch

    from pytest_opperf.catalog.registry import OPS
    from pytest_opperf.measure import check

    say = say or (lambda text: None)
    by_id = {r["id"]: r for r in rows}
    failed, seen = [], set()
    for c in p.calls:
        if c.alt is None or c.signature in seen:
            continue
        seen.add(c.signature)
        sig = by_id[c.signature]
        op, dtypes, params = case_of(sig)
        with torch.inference_mode():
            wrong = check.compare(c.alt(*c.args), op.reference(*c.args), dtypes.output,
                                  op.check_bound(params, dtypes))
        if wrong:
            failed.append(f"signature {sig['id']} ({sig['op']} on {p.swapped[c.signature][2]}): {wrong}")
    stand_ins = {}  # one check per op, backend and shape
    for c in p.replacements.values():
        stand_ins.setdefault((c.stands_for.op, c.stands_for.backend, tuple(c.args[0].shape)), c)
    for (name, backend, shape), c in stand_ins.items():
        s, op = c.stands_for, OPS[name]
        with torch.inference_mode():
            wrong = check.compare(c.fn(*c.args), op.reference(*c.args), s.dtypes.output,
                                  op.check_bound(s.params, s.dtypes))
        if wrong:
            failed.append(f"--replace {s.module} by {name} on {backend} [{', '.join(map(str, shape))}]: {wrong}")
    say(f"  what-if backends checked on {len(seen)} signatures and {len(stand_ins)} stand-ins: "
        f"{len(seen) + len(stand_ins) - len(failed)} matched")
    return failed
