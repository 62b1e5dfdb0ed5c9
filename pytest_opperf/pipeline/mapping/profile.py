"""The profile database: imported signatures, their mapping, and (after backfill) replayed times.

``opperf import PATH -o profile.db`` writes a SQLite file of its own, apart from the results
databases, whose op tables it never touches. Its tables:

- ``signatures``: one row per signature (see ``COLUMNS``);
- ``imports``: one row per import (what was read, when, with which mapping files);
- ``modules``: one row per call of a leaf module of the captured model (``MODULE_COLUMNS``), which a
  what-if replaces as a whole (``opperf sequence --replace``);
- ``calls``: one row per profiled call, in the order they ran (see ``CALL_COLUMNS`` and calls.py;
  ``sequence_us``, each call's time in the replayed sequence, once ``opperf sequence`` ran),
  which ``opperf sequence`` replays in that order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.version import __version__
from pytest_opperf.pipeline.reading import ascend, trace
from pytest_opperf.pipeline.mapping import cachestate, configs, tag
from pytest_opperf.pipeline.mapping import rules as mapping_mod
from pytest_opperf.pipeline.reading.signature import ProfileError, Signature

# name -> SQLite type; the replayed_* columns stay NULL until `opperf backfill`.
COLUMNS = {
    "id": "INTEGER PRIMARY KEY",
    "source": "TEXT",            # torch.profiler or ascend
    "time_source": "TEXT",       # kernel (device kernel durations) or cpu_op (CPU self time)
    "op_type": "TEXT",
    "input_shapes": "TEXT",
    "input_dtypes": "TEXT",
    "input_formats": "TEXT",
    "output_shapes": "TEXT",
    "output_dtypes": "TEXT",
    "input_strides": "TEXT",     # torch.profiler >= 2.1: Input Strides (the shapes' text form)
    "input_values": "TEXT",      # torch.profiler >= 2.1: Concrete Inputs (JSON)
    "input_sources": "TEXT",     # a capture's: where each input came from (p, o, r, e; see cachestate.py)
    "count": "INTEGER",
    "profiled_us_mean": "REAL",
    "profiled_us_median": "REAL",
    "profiled_us_std": "REAL",
    "profiled_total_us": "REAL",
    "share": "REAL",             # profiled_total_us / the profile's total
    "kernels": "TEXT",           # JSON {kernel name: times seen}
    "status": "TEXT",            # mapped, unmapped, unreplayable
    "op": "TEXT",
    "backend": "TEXT",
    "dtype": "TEXT",
    "params": "TEXT",            # JSON {param: value} in the op's order
    "proxy": "INTEGER",
    "note": "TEXT",
    "reason": "TEXT",
    "cache": "TEXT",             # the cache state the replay runs in (cachestate.py): hot, cold or resident
    "cache_reason": "TEXT",
    "residency": "TEXT",         # per input slot: resident, cold or empty (cachestate.residency)
    "residency_reason": "TEXT",  # JSON: why, per slot
    "resident_inputs": "TEXT",   # JSON: the resident slots as positions among the case's input tensors
    "replayed_us": "REAL",
    "replayed_backend": "TEXT",
    "replayed_timer": "TEXT",
    "replayed_kernels": "TEXT",
    "replayed_run_id": "TEXT",
    "replayed_db": "TEXT",
    "replayed_at": "TEXT",
    # from `opperf sequence` (sequence.py): one call's time in the replayed sequence, and over replayed_us
    "sequence_us": "REAL",
    "sequence_kernels": "TEXT",  # JSON {kernel name: times seen}, over the signature's calls in one repetition
    "context_factor": "REAL",
    "sequence_device": "TEXT",
    "sequence_at": "TEXT",
}
# The calls table: position in time order, the signature's id, the step and phase (record_function
# ranges), the call's profiled time, and per input slot the position of the call that wrote it (JSON).
CALL_COLUMNS = {"position": "INTEGER PRIMARY KEY", "signature": "INTEGER", "step": "INTEGER", "phase": "TEXT",
                "profiled_us": "REAL", "links": "TEXT"}
# Written by `opperf sequence` (NULL until then): the call's mean time in the replayed sequence.
SEQUENCE_CALL_COLUMNS = {"sequence_us": "REAL"}
# The modules table: each call of a leaf module of the captured model (capture.py, calls.module_calls):
# its calls' positions (JSON), the position that wrote its input and the one that wrote its output.
MODULE_COLUMNS = {"name": "TEXT", "class": "TEXT", "step": "INTEGER", "phase": "TEXT", "positions": "TEXT",
                  "input_position": "INTEGER", "input_shape": "TEXT", "input_dtype": "TEXT",
                  "output_position": "INTEGER"}
IMPORT_COLUMNS = ("path", "source", "time_source", "imported_at", "mapping", "signatures", "total_us", "plugin_version",
                  "token")


def detect_source(path: Path) -> str:
    if path.is_dir() or path.suffix.lower() == ".csv":
        return "ascend"
    return "torch.profiler"


def read(path: Path, mapping: mapping_mod.Mapping, source: str = "auto",
         world_size: Optional[int] = None, l2_bytes: Optional[int] = None, l2_of_trace: bool = False,
         extras: Optional[dict] = None) -> list[Signature]:
    source = detect_source(path) if source == "auto" else source
    if source == "ascend":
        return ascend.read(path, world_size)
    if source == "torch.profiler":
        return trace.read(path, mapping.claims, l2_bytes, l2_of_trace, extras)
    raise ProfileError(f"--source={source}: expected auto, ascend or torch.profiler")


def import_profile(path: Path, out: Path, mapping_files: Optional[list[Path]] = None, source: str = "auto",
                   force: bool = False, world_size: Optional[int] = None, l2_mb: Optional[float] = None,
                   cache_rule: str = "signature") -> list[dict]:
    """Read PATH, map every signature, choose its cache state (L2_MB, else the trace's device's) by
    CACHE_RULE (one state per signature, or per input: cachestate.py), write OUT; returns the rows written."""
    if cache_rule not in cachestate.RULES:
        raise ProfileError(f"--cache-rule={cache_rule}: expected one of {', '.join(cachestate.RULES)}")
    if out.exists() and not force:
        raise ProfileError(f"{out}: exists (it may hold backfilled times); pass --force to replace it")
    mapping = mapping_mod.load(mapping_files)
    l2 = int(l2_mb * 2**20) if l2_mb else (cachestate.l2_bytes_of_trace(path) if path.is_file() else None)
    extras: dict = {}
    signatures = read(path, mapping, source, world_size, l2, l2_of_trace=not l2_mb, extras=extras)
    if not signatures:
        raise ProfileError(f"{path}: no op with a duration in it")
    if not l2_mb and signatures[0].time_source == "cpu_op":
        l2 = None  # a CPU profile: the GPU its host names did not run its calls (trace.read)
    compute = compute_dtype(signatures)
    if compute:
        for sig in signatures:
            sig.context.setdefault("main_dtype", compute)
    total = sum(s.total_us for s in signatures) or 1.0
    rows, calls = [], []
    for i, sig in enumerate(sorted(signatures, key=lambda s: -s.total_us), start=1):
        calls.extend((p, i, step, phase, us, json.dumps(links) if links else None)
                     for p, step, phase, links, us in sig.calls)
        res = _resolved(mapping, sig)
        cache, cache_reason = cachestate.choose(sig.op_type, sig.input_shapes, sig.input_dtypes, l2)
        inputs = _residency(sig, res, l2)
        positions = _positions(res, sig, inputs)
        # Only a mix of states needs to know which of the case's inputs are the resident ones.
        if cache_rule == "inputs" and (inputs.cache != cachestate.RESIDENT or positions is not None):
            cache, cache_reason = inputs.cache, f"per input: {inputs.summary()}"
        elif cache_rule == "inputs" and res.status == mapping_mod.MAPPED:
            cache_reason = (f"{cache_reason} (per input: {inputs.summary()}, but which of {res.op}'s inputs these "
                            f"are is not known: one state for the signature)")
        rows.append({
            "id": i, "source": sig.source, "time_source": sig.time_source, "op_type": sig.op_type,
            "input_shapes": sig.input_shapes, "input_dtypes": sig.input_dtypes, "input_formats": sig.input_formats,
            "output_shapes": sig.output_shapes, "output_dtypes": sig.output_dtypes,
            "input_strides": sig.input_strides or None, "input_values": sig.input_values or None,
            "input_sources": sig.input_sources or None, "count": sig.count,
            "profiled_us_mean": sig.mean_us, "profiled_us_median": sig.median_us, "profiled_us_std": sig.std_us,
            "profiled_total_us": sig.total_us, "share": sig.total_us / total,
            "kernels": json.dumps(sig.kernels) if sig.kernels else None,
            "status": res.status, "op": res.op or None, "backend": res.backend or None, "dtype": res.dtype or None,
            "params": json.dumps(res.params) if res.params is not None else None, "proxy": int(res.proxy),
            "note": res.note or None, "reason": res.reason or None, "cache": cache, "cache_reason": cache_reason,
            "residency": ";".join(inputs.slots), "residency_reason": cachestate.reasons_text(inputs),
            "resident_inputs": json.dumps(list(positions)) if positions is not None else None,
        })
    record = {"path": str(path), "source": rows[0]["source"], "time_source": rows[0]["time_source"],
              "imported_at": _now(), "mapping": json.dumps([str(p) for p in mapping_files or []]),
              "signatures": len(rows), "total_us": total, "plugin_version": __version__,
              "token": uuid.uuid4().hex}
    _write(out, rows, record, sorted(calls), extras.get("modules") or [])
    return rows


def _residency(sig: Signature, res: mapping_mod.Resolution, l2: Optional[int]) -> cachestate.Residency:
    """Each input slot's state; an aten replay's out= tensors are outputs, not inputs."""
    outputs = frozenset()
    if res.status == mapping_mod.MAPPED and res.op == "aten":
        from pytest_opperf.catalog.replay import out_arguments

        outputs = out_arguments(res.params["call"])
    return cachestate.residency(sig.op_type, sig.input_shapes, sig.input_dtypes, l2, outputs, sig.input_sources)


def _positions(res: mapping_mod.Resolution, sig: Signature, inputs: cachestate.Residency) -> Optional[tuple]:
    """The resident slots as positions among the case's input tensors; None when not mapped or not known."""
    if res.status != mapping_mod.MAPPED:
        return None
    return cachestate.tensor_positions(res.op, res.params, res.dtype, sig.input_shapes, inputs.resident_slots)


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::baddbmm",
           "aten::_grouped_mm")


def compute_dtype(signatures: list) -> Optional[str]:
    """The dtype (torch's name) of most of the profile's matrix products' first inputs, by time: the
    model's compute dtype, which a tensor list the trace does not type is taken to hold. None when
    the profile has no matrix product.

    >>> class S: pass
    >>> a, b = S(), S()
    >>> a.op_type, a.input_dtypes, a.total_us = "aten::mm", "c10::BFloat16;c10::BFloat16", 90.0
    >>> b.op_type, b.input_dtypes, b.total_us = "aten::mm", "float;float", 10.0
    >>> compute_dtype([a, b])
    'bfloat16'
    """
    from pytest_opperf.pipeline.reading.slots import torch_dtype_name

    time_of: dict = {}
    for sig in signatures:
        if sig.op_type in MATMULS:
            name = torch_dtype_name((sig.input_dtypes or "").split(";")[0])
            if name and name.startswith(("float", "bfloat")):
                time_of[name] = time_of.get(name, 0.0) + sig.total_us
    return max(time_of, key=time_of.get) if time_of else None


def _resolved(mapping: mapping_mod.Mapping, sig: Signature) -> mapping_mod.Resolution:
    """The signature's mapping. A record this opperf cannot build a call from (a case its binder
    does not know) makes that signature unreplayable with the reason, never ends the import."""
    try:
        return mapping.resolve(sig)
    except Exception as exc:  # noqa: BLE001  (one signature's surprise must not cost the others)
        said = " ".join(str(exc).split())[:300] or "no detail"
        return mapping_mod.Resolution(mapping_mod.UNREPLAYABLE, reason=f"opperf cannot build a replay of this call "
                                      f"from its record ({said}): report it with the op and its shapes")


@dataclass(frozen=True)
class OpTypeShare:
    op_type: str
    share: float      # of the profile's time
    calls: int
    signatures: int


def unmapped_types(rows: list[dict]) -> list[OpTypeShare]:
    """The unmapped signatures grouped by op type, largest share first: what a new mapping rule would win.

    >>> unmapped_types([{"status": "unmapped", "op_type": "aten::cumsum", "share": 0.25, "count": 3}])
    [OpTypeShare(op_type='aten::cumsum', share=0.25, calls=3, signatures=1)]
    """
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == mapping_mod.UNMAPPED:
            groups.setdefault(r["op_type"], []).append(r)
    out = [OpTypeShare(t, sum(r["share"] for r in g), sum(r["count"] for r in g), len(g)) for t, g in groups.items()]
    return sorted(out, key=lambda u: (-u.share, u.op_type))


def _write(out: Path, rows: list[dict], record: dict, calls: tuple = (), modules: list = ()) -> None:
    # Written beside, then moved into place: a failed import leaves no half-written file behind.
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        _create(tmp, rows, record, calls, modules)
        tmp.replace(out)
    except (OSError, sqlite3.Error) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ProfileError(f"{out}: cannot write the profile database ({exc})") from None


def _create(tmp: Path, rows: list[dict], record: dict, calls: tuple = (), modules: list = ()) -> None:
    with sqlite3.connect(tmp) as db:
        db.execute(f"CREATE TABLE calls ({', '.join(f'[{c}] {t}' for c, t in CALL_COLUMNS.items())})")
        db.executemany(f"INSERT INTO calls VALUES ({', '.join('?' * len(CALL_COLUMNS))})", calls)
        db.execute(f"CREATE TABLE modules ({', '.join(f'[{c}] {t}' for c, t in MODULE_COLUMNS.items())})")
        db.executemany(f"INSERT INTO modules VALUES ({', '.join('?' * len(MODULE_COLUMNS))})",
                       [(name, cls, step, phase, json.dumps(positions), source, json.dumps(shape), dtype, output)
                        for name, cls, step, phase, positions, source, shape, dtype, output in modules])
        db.execute(f"CREATE TABLE signatures ({', '.join(f'[{c}] {t}' for c, t in COLUMNS.items())})")
        db.execute(f"CREATE TABLE imports ({', '.join(f'[{c}]' for c in IMPORT_COLUMNS)})")
        db.executemany(f"INSERT INTO signatures ({', '.join(f'[{c}]' for c in rows[0])}) "
                       f"VALUES ({', '.join('?' * len(rows[0]))})", [tuple(r.values()) for r in rows])
        db.execute(f"INSERT INTO imports VALUES ({', '.join('?' * len(IMPORT_COLUMNS))})",
                   tuple(record[c] for c in IMPORT_COLUMNS))
    db.close()


def upgrade(db: sqlite3.Connection) -> None:
    """Add the signature columns a profile database imported by an older opperf lacks (NULL)."""
    have = {r[1] for r in db.execute("PRAGMA table_info(signatures)")}
    for name, kind in COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE signatures ADD COLUMN [{name}] {kind}")
    calls = {r[1] for r in db.execute("PRAGMA table_info(calls)")}
    for name, kind in SEQUENCE_CALL_COLUMNS.items():
        if calls and name not in calls:
            db.execute(f"ALTER TABLE calls ADD COLUMN [{name}] {kind}")


def load(path: Path) -> list[dict]:
    """The signature rows of a profile database, largest share first."""
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile database (make one with `opperf import PATH -o {path}`)")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            rows = [dict(r) for r in db.execute("SELECT * FROM signatures ORDER BY profiled_total_us DESC, id")]
        db.close()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: not a profile database ({exc})") from None
    return rows


def write_replay_configs(rows: list[dict], directory: Path, origin: str, token: str) -> dict[str, list[Path]]:
    """The mapped signatures as one ``cases:`` config per op: DIRECTORY/<op>.yaml for the cold
    cases, DIRECTORY/hot/<op>.yaml (``cache: hot``) for the hot ones, DIRECTORY/resident/<op>.yaml
    (``cache: resident``, each case with its ``resident:`` inputs) for those with some inputs in the
    L2, and DIRECTORY/signatures.json, which tells the replay run (``-p pytest_opperf.pipeline.mapping.tag``)
    each case's signature ids. Returns the config files by cache state."""
    planned: dict[str, list] = {}
    for r in rows:
        if r["status"] != mapping_mod.MAPPED:
            continue
        params = json.loads(r["params"])
        comment = f"{r['op_type']} [{r['input_shapes']}] x{r['count']}, {100 * r['share']:.2f}% of the profile"
        cache = r.get("cache") or cachestate.COLD
        resident = tuple(json.loads(r["resident_inputs"])) if cache == cachestate.RESIDENT else ()
        case = configs.PlannedCase(r["op"], r["backend"], r["dtype"], tuple(params.items()), comment, resident)
        planned.setdefault(cache, []).append((case, r["id"]))
    files = {}
    for cache, cases in sorted(planned.items()):
        where = directory / cache if cache in (cachestate.HOT, cachestate.RESIDENT) else directory
        header = f"replay of {origin} (written by opperf import; cases: mapped signatures, cache {cache})"
        # The state the model ran these in (see cachestate.py), whatever the default.
        files[cache] = configs.write([c for c, _ in cases], where, header, {"cache": cache})
    if files:
        tag.write_table(directory / tag.TABLE, [(c, i) for cs in planned.values() for c, i in cs], token)
    return files


def import_token(path: Path) -> str:
    """The token of the profile database's import, which the replayed rows carry (see tag.py)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            names = [r[1] for r in db.execute("PRAGMA table_info(imports)")]
            row = db.execute("SELECT token FROM imports ORDER BY rowid DESC LIMIT 1").fetchone() \
                if "token" in names else None
        db.close()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: not a profile database ({exc})") from None
    if not row or not row[0]:
        raise ProfileError(f"{path}: imported by an older opperf, without a token that ties replayed rows to its "
                           f"signatures: import the profile again (opperf import ... --force)")
    return row[0]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
