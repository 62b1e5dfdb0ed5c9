"""The model a prediction traces, built on the meta device: no weights are read or allocated.

MODEL is one of:

- a Hugging Face ``config.json``, or a directory holding one: any architecture
  ``transformers.AutoModelForCausalLM.from_config`` builds (its ``model_type`` picks the code);
- the name of a built-in model (``llama3.1-8b``, ``dsv3``: the ``config`` of its YAML file under
  ``pipeline/predict/data/models/``, or ``--models-dir``'s);
- ``package.module:callable``: a function of no argument returning a ``torch.nn.Module`` whose
  ``forward`` takes ``input_ids`` and ``use_cache`` (and the cache) as a causal LM's does, or a
  pair ``(module, inputs)`` with ``inputs(batch, prefill) -> dict`` the prefill's keyword
  arguments on the meta device.

The dtype is the config's (``dtype``, or ``torch_dtype`` in files written before transformers 4.56)
unless DTYPE says otherwise; a config that names none is built in float32, transformers' default,
and the answer says so. ``layers`` cuts the decoder to its first N layers (and every per-layer list
of the config with it), as the acceptance runs cut published widths to fit one GPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pytest_opperf.pipeline.reading.signature import ProfileError

# transformers' names of the number of decoder layers, of which a config has one
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")


@dataclass
class Built:
    """A model on the meta device, ready to trace."""

    module: object                 # torch.nn.Module, every parameter and buffer on meta
    name: str                      # what the answer calls it
    source: str                    # where it came from (a path, a built-in's source, module:callable)
    dtype: str                     # torch dtype name, "bfloat16"
    vocab: int                     # token ids are drawn below this
    inputs: Optional[Callable] = None  # (batch, prefill) -> the prefill's keyword arguments, else input_ids
    config: object = None          # the transformers config, where there is one
    notes: list = field(default_factory=list)  # what the answer must say about how it was built


def build(spec: str, dtype: Optional[str] = None, layers: Optional[int] = None, models_dir: Optional[Path] = None,
          experts: str = "grouped_mm", attention: Optional[str] = None, device: str = "meta") -> Built:
    """SPEC built on meta (see the module doc). EXPERTS: transformers' experts implementation for a
    model that has one (``grouped_mm``: the kernels a GPU runs); ATTENTION: its attention
    implementation (default: what transformers picks, SDPA where the family supports it). DEVICE:
    another device builds the same model with random weights there (the run a prediction is
    checked against)."""
    if ":" in spec and not Path(spec).exists():
        return _from_callable(spec, dtype, layers)
    raw, source, name = _config_dict(spec, models_dir)
    return _from_config(raw, source, name, dtype, layers, experts, attention, device)


def _config_dict(spec: str, models_dir: Optional[Path]) -> tuple[dict, str, str]:
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ProfileError(f"MODEL={spec}: a directory without a config.json")
    from pytest_opperf.pipeline.predict import models

    if path.is_file() or spec.endswith(".json"):
        raw = models.read_json(path)
        name = str(raw.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem))
        return raw, str(path), name
    known = models.load(models_dir)
    if spec not in known:
        raise ProfileError(f"MODEL={spec}: not a config.json, a directory holding one, module:callable, or a "
                           f"built-in model (known: {', '.join(sorted(known))})")
    return dict(known[spec].config), known[spec].source, known[spec].name


def _from_config(raw: dict, source: str, name: str, dtype: Optional[str], layers: Optional[int], experts: str,
                 attention: Optional[str], device: str = "meta") -> Built:
    transformers = _transformers()
    import torch

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "transformers_version", "_name_or_path",
                                                         "quantization_config")}
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ProfileError(f"{source}: no model_type: transformers cannot tell which model's code to build")
    notes = []
    if "quantization_config" in raw:
        notes.append("the config's quantization_config is left out: the model is traced unquantized")
    if layers is not None:
        _cut(fields, layers, source)
    chosen, said = _dtype(dtype, raw, source)
    if said:
        notes.append(said)
    module = None
    for with_experts in ((True, False) if experts else (False,)):
        config = _config(transformers, model_type, fields, source)
        if attention:
            config._attn_implementation = attention
        if with_experts:
            _experts(config, experts, notes)
        try:
            with torch.device(device):
                module = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, chosen))
            break
        except ValueError as exc:
            if with_experts and "experts implementation" in str(exc):
                continue  # a model without experts refuses the setting: build it without
            raise _unbuilt(transformers, source, model_type, exc) from None
        except Exception as exc:  # noqa: BLE001  (any failure of the model's own code is the user's answer)
            raise _unbuilt(transformers, source, model_type, exc) from None
    module.eval()
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab <= 0:
        raise ProfileError(f"{source}: no vocab_size: the token ids of the traced steps need one")
    return Built(module, name, source, chosen, vocab, None, config, notes)


def _config(transformers, model_type: str, fields: dict, source: str):
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{source}: model_type {model_type!r}: transformers {transformers.__version__} cannot "
                           f"make its config ({_one_line(exc)})") from None


def _unbuilt(transformers, source: str, model_type: str, exc: Exception) -> ProfileError:
    return ProfileError(f"{source}: transformers {transformers.__version__} could not build model_type "
                        f"{model_type!r} on meta: {type(exc).__name__}: {_one_line(exc)}")


def _cut(fields: dict, layers: int, source: str) -> None:
    """The first LAYERS layers: the layer count and every list of one entry per layer cut with it."""
    key = next((k for k in LAYER_FIELDS if isinstance(fields.get(k), int)), None)
    if key is None:
        raise ProfileError(f"--layers={layers}: {source} names no layer count ({', '.join(LAYER_FIELDS)})")
    was = fields[key]
    if layers > was:
        raise ProfileError(f"--layers={layers}: {source} has {was} layers")
    fields[key] = layers
    for k, v in list(fields.items()):
        if isinstance(v, list) and len(v) == was:
            fields[k] = v[:layers]
        elif k in ("mlp_only_layers",) and isinstance(v, list):
            fields[k] = [i for i in v if isinstance(i, int) and i < layers]


def _dtype(asked: Optional[str], raw: dict, source: str) -> tuple[str, str]:
    """The torch dtype name to build in, and a note when it is not the config's own."""
    import torch

    if asked:
        return checked_dtype(asked), ""
    given = raw.get("dtype") or raw.get("torch_dtype")
    if given is None:
        return "float32", "the config names no dtype: built in float32 (transformers' default); --dtype sets one"
    name = str(given).removeprefix("torch.")
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise ProfileError(f"{source}: dtype {given!r}: not a torch dtype")
    return name, ""


def checked_dtype(asked: str) -> str:
    """--dtype's torch dtype name; a one-line refusal for a name this tool does not know."""
    from pytest_opperf.dtypes import lookup

    try:
        return lookup(asked).torch_name
    except (KeyError, ValueError, AttributeError):
        raise ProfileError(f"--dtype={asked}: not a dtype this tool knows (bf16, fp16, fp32, ...)") from None


def _experts(config, experts: str, notes: list) -> None:
    """transformers' experts implementation (5.x), where the config carries one."""
    if not experts or not hasattr(config, "_experts_implementation"):
        return
    try:
        config._experts_implementation = experts
    except (ValueError, AttributeError) as exc:
        notes.append(f"experts implementation left at transformers' default ({_one_line(exc)})")


def _from_callable(spec: str, dtype: Optional[str], layers: Optional[int]) -> Built:
    import torch

    if layers is not None:
        raise ProfileError(f"--layers: {spec} builds its own model; cut its layers there")
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ProfileError(f"MODEL={spec}: cannot import {attr!r} from {module_name!r} ({_one_line(exc)})") from None
    try:
        with torch.device("meta"):
            made = fn()
    except Exception as exc:  # noqa: BLE001
        raise ProfileError(f"MODEL={spec}: the callable failed on meta: {type(exc).__name__}: {_one_line(exc)}") from None
    inputs = None
    if isinstance(made, tuple) and len(made) == 2:
        made, inputs = made
    if not isinstance(made, torch.nn.Module):
        raise ProfileError(f"MODEL={spec}: returned {type(made).__name__}, expected a torch.nn.Module or "
                           f"(module, inputs)")
    config = getattr(made, "config", None)
    if dtype:
        from pytest_opperf.dtypes import lookup

        made = made.to(getattr(torch, lookup(dtype).torch_name))
    first = next(made.parameters(), None)
    chosen = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
    vocab = int(getattr(config, "vocab_size", 0) or 0) or 2
    return Built(made.eval(), spec, spec, chosen, vocab, inputs, config, [])


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ProfileError("opperf predict builds the model with transformers: pip install transformers") from None
    return transformers


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
