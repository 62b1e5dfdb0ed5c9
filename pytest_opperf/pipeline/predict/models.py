"""Public model configs: the Hugging Face ``config.json`` fields the shape generator needs.

One YAML file per model under ``pipeline/predict/data/models/``: ``name`` (what ``--target-models``
takes), ``title``, ``source`` (the config.json it was copied from), optional ``aliases``, and
``config`` (the fields, spelled as in config.json; its ``model_type`` is a family ``opperf
predict`` takes a config.json of). ``--models-dir DIR`` adds files of your own in the same form
(a name already known is replaced).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf import files

from pytest_opperf.pipeline.reading.signature import ProfileError

BUILTIN = Path(__file__).parent / "data" / "models"
REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")


@dataclass(frozen=True)
class Model:
    name: str
    title: str
    source: str
    config: dict

    def get(self, key: str, default=None):
        return self.config.get(key, default)

    @property
    def heads(self) -> int:
        return self.config["num_attention_heads"]

    @property
    def kv_heads(self) -> int:
        return self.config.get("num_key_value_heads", self.heads)

    @property
    def head_dim(self) -> int:
        return self.config.get("head_dim") or self.config["hidden_size"] // self.heads

    @property
    def experts(self) -> int:
        """Routed experts (0 for a dense model)."""
        return self.config.get("n_routed_experts") or self.config.get("num_local_experts") or 0

    @property
    def expert_intermediate(self) -> int:
        return self.config.get("moe_intermediate_size") or self.config["intermediate_size"]

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: all of a dense model, the first k of DeepSeek's."""
        if not self.experts:
            return self.config["num_hidden_layers"]
        return self.config.get("first_k_dense_replace", 0)

    @property
    def mla(self) -> bool:
        return bool(self.config.get("kv_lora_rank"))

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises each head of q and k before RoPE."""
        return any(a.startswith("Qwen3") for a in self.config.get("architectures", []))


def load(extra_dir: Optional[Path] = None) -> dict[str, Model]:
    """Every known model by name and alias."""
    models: dict[str, Model] = {}
    dirs = [BUILTIN] + ([extra_dir] if extra_dir else [])
    for directory in dirs:
        if not directory.is_dir():
            raise ProfileError(f"{directory}: no such directory of model configs")
        for path in sorted(directory.glob("*.yaml")):
            model, aliases = _read(path)
            for key in (model.name, *aliases):
                models[key] = model
    return models


def _read(path: Path) -> tuple[Model, list]:
    try:
        raw = files.load_yaml(path)
    except files.FileError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
        raise ProfileError(f"{path}: expected keys name, source and config (the config.json fields)")
    for key in ("name", "source"):
        if not isinstance(raw.get(key), str):
            raise ProfileError(f"{path}: {key}: expected a string")
    missing = [k for k in REQUIRED if not isinstance(raw["config"].get(k), int)]
    if missing:
        raise ProfileError(f"{path}: config: missing or not an int: {missing}")
    model = Model(raw["name"], raw.get("title", raw["name"]), raw["source"], raw["config"])
    return model, list(raw.get("aliases") or [])


def select(names: list[str], known: dict[str, Model]) -> list[Model]:
    out = []
    for name in names:
        if name not in known:
            raise ProfileError(f"--target-models: unknown model {name!r}; known: {', '.join(sorted(known))}")
        if known[name] not in out:
            out.append(known[name])
    return out


def read_json(path: Path) -> dict:
    """A Hugging Face config.json, read: a dict, or a ProfileError naming the file and what is wrong."""
    import json

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the model's config.json: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not a JSON config.json (the transformers format): {exc}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a JSON object of the model's fields, got {type(raw).__name__}")
    return raw
