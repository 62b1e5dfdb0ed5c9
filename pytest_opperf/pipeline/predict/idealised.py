"""A model's step time before anyone profiles it: its op calls at a configuration, each priced.

One prefill step (batch x prefill tokens) and one decode step (batch tokens, against a cache of
prefill + decode / 2 tokens: the middle of the decode steps) of a model are the catalogue cases
`opperf shapes` derives for one layer of each kind (pipeline/shapes.py), counted as the model
runs them: the attention block and its norms once a layer (two residual norms), the dense MLP
once a dense layer, the MoE block once an MoE layer, the embedding, the final norm, the LM head
and sampling once a step, and the new K and V written into a paged cache (16 slots a page) once a
layer. Each case is priced by pipeline/lookup.py (measured, interpolated, or the roofline's
bound) from a results database: the step time is the sum, and every part says where its time
came from.

`measure` writes the calls the database has no row of as configs (one file an op) and runs them
through pytest, as README's sweep runs cases, into the same database; the prediction after it
prices them as measured.

Not here yet (issue 55): `--from PROFILE_DB` (a profile's calls and context factors), and the
comparison with a profiled model on a GPU.
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.mapping.configs import PlannedCase
from pytest_opperf.pipeline.predict import models, shapes
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay import lookup

PAGE_SIZE = 16  # vLLM's paged KV cache: slots a page


@dataclass(frozen=True)
class Call:
    case: PlannedCase
    count: int  # calls of it in one step
    part: str  # where it runs: shapes.STEP, LAYER, DENSE or MOE


@dataclass(frozen=True)
class Priced:
    call: Call
    answer: lookup.Answer

    @property
    def total_us(self) -> float:
        return self.answer.time_us * self.call.count


def load_model(spec: str, models_dir: Optional[Path] = None) -> models.Model:
    """A built-in model's name (or alias), or a path to a Hugging Face config.json."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        raw = models.read_json(path)
        missing = [k for k in models.REQUIRED if not isinstance(raw.get(k), int) or isinstance(raw.get(k), bool)]
        if missing:
            raise ProfileError(f"{path}: missing or not an int: {missing} (a transformers config.json has them)")
        _check_family(raw, path, models_dir)
        model = models.Model(str(raw.get("_name_or_path") or path.parent.name or path.stem),
                             str(raw.get("model_type", "")), str(path), raw)
        _check_structure(model, path)
        return model
    known = models.load(models_dir)
    if spec not in known:
        raise ProfileError(f"MODEL: unknown model {spec!r}; known: {', '.join(sorted(known))}, or a config.json path")
    return known[spec]


def _check_family(raw: dict, where: Path, models_dir: Optional[Path]) -> None:
    """A model_type of the built-in models (and --models-dir's): the families whose layers the
    shapes were written from. Another family's fields go unread without a word: Qwen3-MoE counts
    its experts in `num_experts`, and its MoE layers would be priced as dense ones."""
    families = sorted({m.get("model_type") for m in models.load(models_dir).values()} - {None})
    if raw.get("model_type") not in families:
        said = f"model_type {raw['model_type']!r}" if "model_type" in raw else "no model_type"
        raise ProfileError(f"{where}: {said}: expected one of {', '.join(families)} (the built-in models' "
                           f"families; --models-dir adds more)")


def _check_structure(model: models.Model, where: Path) -> None:
    """Fields that change the model's layers beyond what the shapes know: refused, not guessed."""
    if model.experts and not isinstance(model.get("num_experts_per_tok"), int):
        raise ProfileError(f"{where}: an MoE config ({model.experts} experts) without num_experts_per_tok")
    for key in ("num_key_value_heads", "head_dim", "moe_intermediate_size", "first_k_dense_replace"):
        value = model.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ProfileError(f"{where}: {key}: expected a non-negative int, got {value!r}")
    if model.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ProfileError(f"{where}: hidden_act {model.get('hidden_act')!r}: the shapes model SwiGLU MLPs "
                           f"(silu) only")


def step_calls(model: models.Model, tp: int, batch: int, prefill: int, decode: int, phase: str,
               dtype: str = "bf16") -> list[Call]:
    """The op calls of one step of `phase` at this configuration, each with its count."""
    if phase not in shapes.PHASES:
        raise ProfileError(f"unknown phase {phase!r}; expected {' or '.join(shapes.PHASES)}")
    problem = shapes.split_problem(model, tp)
    if problem:
        raise ProfileError(f"--tp={tp}: {problem}")
    seq = prefill if phase == "prefill" else prefill + decode // 2
    layers = model.get("num_hidden_layers")
    counts = {shapes.STEP: 1, shapes.LAYER: layers, shapes.DENSE: model.dense_layers,
              shapes.MOE: layers - model.dense_layers if model.experts else 0}
    calls = [Call(case, per * counts[part], part)
             for case, part, per in shapes.layer_calls(model, tp, batch, seq, phase, dtype) if counts[part]]
    tokens = batch * seq if phase == "prefill" else batch
    pages = math.ceil(batch * (prefill + decode) / PAGE_SIZE)
    where = f"{model.name} tp{tp} {phase} b{batch} s{seq}"
    cache = PlannedCase("kv_cache_write", "torch", dtype,
                        (("tokens", tokens), ("kv_heads", max(1, model.kv_heads // tp)), ("head_dim", model.head_dim),
                         ("page_size", PAGE_SIZE), ("pages", pages)),
                        f"{where}: the new K and V into the paged cache")
    if not model.mla:
        calls.append(Call(cache, layers, shapes.LAYER))
    return calls


def price(calls: list[Call], db: Path, device: Optional[str] = None, hardware: Optional[Path] = None,
          backend: Optional[str] = None) -> list[Priced]:
    """Each call's answer from the results database (lookup.lookup: measured, interpolated, roofline)."""
    return [Priced(call, lookup.lookup(db, call.case.op, dict(call.case.params), _input_dtype(call.case), backend,
                                       device, hardware)) for call in calls]


def _input_dtype(case: PlannedCase) -> str:
    """The dtype lookup asks for (a row's dtype_in): a config's label is "in" or "in-out"."""
    return case.dtype.split("-", 1)[0]


def summary(priced: list[Priced]) -> dict:
    """The step's time, its share by kind of answer, and its calls, costliest first."""
    total = sum(p.total_us for p in priced)
    by_kind = {kind: sum(p.total_us for p in priced if p.answer.kind == kind)
               for kind in (lookup.MEASURED, lookup.INTERPOLATED, lookup.ROOFLINE)}
    calls = sorted(priced, key=lambda p: -p.total_us)
    return {"step_us": total,
            "share": {kind: (us / total if total else 0.0) for kind, us in by_kind.items()},
            "calls": [{"op": p.call.case.op, "params": dict(p.call.case.params), "dtype": p.call.case.dtype,
                       "what": p.call.case.comment.split(": ", 1)[-1], "part": p.call.part, "count": p.call.count,
                       "time_us": p.answer.time_us, "total_us": p.total_us, "kind": p.answer.kind,
                       "backend": p.answer.backend, "detail": p.answer.detail} for p in calls]}


def measuring_device(name: Optional[str], hardware: Optional[Path] = None) -> str:
    """The device --measure measures on, as `pytest benches/` resolves it: --device's spec if
    given (it must run on this machine), else this machine's; its rows go to results/<device>.db."""
    from pytest_opperf.hardware.specs import SpecError, resolve_device

    try:
        return resolve_device(name, hardware, hardware_flag="--hardware FILE")[0].name
    except SpecError as exc:
        raise ProfileError(str(exc)) from None


def check_device(db: Path, device: Optional[str], measure: bool = False) -> Optional[str]:
    """The database's device; a --device naming another is refused (its rows are another device's times).
    With `measure` (the device measured on), a missing database is the one the run creates."""
    from pytest_opperf.store.results import ResultsError, open_results

    if not db.exists():
        if device is None and not measure:
            raise ProfileError(f"--db {db}: no such results database; run the cases first, or pass --device NAME "
                               f"for roofline answers only")
        return None
    try:
        with open_results(db) as results:
            found = results.device
    except ResultsError as exc:
        raise ProfileError(str(exc)) from None
    if measure and found != device:
        raise ProfileError(f"--db {db} holds {found}'s rows; --measure measures on {device}: pass "
                           f"results/{device}.db")
    if device is not None and found is not None and found != device:
        raise ProfileError(f"--db {db} holds {found}'s rows, not --device={device}'s: pass results/{device}.db, "
                           f"or leave --device out")
    return found


def unmeasured(calls: list[Call], db: Path, device: Optional[str] = None, hardware: Optional[Path] = None,
               backend: Optional[str] = None) -> list[PlannedCase]:
    """The cases of the calls the database has no row of (answered otherwise, or not at all: a spec
    without the peaks of a roofline), once each."""
    out: dict[tuple, PlannedCase] = {}
    for call in calls:
        case = call.case
        try:
            kind = lookup.lookup(db, case.op, dict(case.params), _input_dtype(case), backend, device, hardware).kind
        except ProfileError:
            kind = None
        if kind != lookup.MEASURED:
            out.setdefault((case.op, case.dtype, case.params), case)
    return list(out.values())


def measure(cases: list[PlannedCase], db: Path, device: str, directory: Path, benches: Path,
            pytest_args: str = "", header: str = "") -> tuple[int, list[str]]:
    """Write the cases as configs into `directory` and run them through pytest into `db` (its folder
    and the device it is named for); (pytest's exit code, the command). Nothing to run: (0, [])."""
    from pytest_opperf.pipeline.mapping import configs

    if not cases:
        return 0, []
    if not benches.is_dir():
        raise ProfileError(f"--benches {benches}: no such directory of bench tests (the project's benches/)")
    if db.suffix != ".db" or db.stem != device:
        raise ProfileError(f"--db {db}: --measure writes rows to <results>/<device>.db; name it {device}.db")
    written = configs.write(cases, directory, header or "written by opperf predict --measure")
    ops = sorted({case.op for case in cases})
    command = [sys.executable, "-m", "pytest", str(benches), "-p", "no:cacheprovider", "-q",
               f"--device={device}", f"--opperf-results={db.parent.resolve()}", "-m", " or ".join(ops),
               *[f"--opperf-config={path.resolve()}" for path in written], *shlex.split(pytest_args)]
    # pytest's own output to stderr: stdout stays the prediction's (--json is read by tools)
    return subprocess.run(command, stdout=stderr_fd()).returncode, command


def stderr_fd() -> Optional[int]:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file (captured): inherit stdout
        return None
