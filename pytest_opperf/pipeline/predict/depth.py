"""The whole model from a trace of its first layers: each distinct layer priced once, counted per layer.

A decoder's layers repeat a few patterns (every layer alike in Llama; sliding and full attention
alternating in Gemma-2; dense layers before the experts' in DeepSeek-V3). ``patterns`` reads the
model built on meta at its own depth and gives each layer a key: its modules' classes and parameter
shapes, the per-layer attributes that change its calls (attention type, sliding window), and the
config's per-layer list entries. The trace then cuts the model to the shortest prefix that holds
every pattern, and at least two layers: each pattern's stand-in is its last layer in the prefix, so a
layer that follows another (as all but the first do) stands for the rest.

``weights`` then gives each traced call the number of the model's layers it stands for: a call of a
stand-in layer counts once per layer of its pattern, a call of another traced layer not at all, a
call outside the layers (embedding, rotary tables, final norm, LM head) once. A call belongs to the
layer of the last leaf module that started at or before it (a residual add after a layer's MLP is that
layer's), which the profile database's ``modules`` table records per step.

Priced this way, a step's calls are those of the full trace, call for call by op and shapes (tested on
a CPU: tests/test_predict_depth.py); what the cut cannot carry is the context of the layers it leaves
out, which the stand-in's (a layer after a layer) is.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# Attributes of a layer's modules that change its calls without changing its parameters.
LAYER_ATTRIBUTES = ("attention_type", "layer_type", "sliding_window", "is_sliding", "use_rope", "is_causal",
                    "use_sliding_window", "window_size")


@dataclass(frozen=True)
class Depth:
    """The model's layers and the prefix that stands for them."""

    layers: int            # the model's own depth
    traced: int            # the prefix traced
    prefix: str            # the layers' ModuleList, "model.layers"
    pattern: tuple         # per layer of the model, its pattern's index
    stand_in: dict         # pattern index -> the traced layer that stands for it

    @property
    def cut(self) -> bool:
        return self.traced < self.layers

    def counts(self) -> dict:
        """traced layer -> the model's layers it stands for (0 for a traced layer that stands for none)."""
        out = {i: 0 for i in range(self.traced)}
        for p in self.pattern:
            out[self.stand_in[p]] += 1
        return out

    def said(self) -> str:
        if not self.cut:
            return f"all {self.layers} layers traced"
        kinds = len(self.stand_in)
        each = ", ".join(f"layer {layer} for {n}" for layer, n in sorted(self.counts().items()) if n)
        return (f"{self.layers} layers priced from a trace of the first {self.traced} ({kinds} distinct layer "
                f"pattern{'s' if kinds > 1 else ''}: {each})")


def layer_list(module) -> tuple[str, list]:
    """The decoder's layers: the name and members of the longest ModuleList of the model."""
    import torch

    best = ("", [])
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > len(best[1]):
            best = (name, list(m))
    return best


def patterns(module, config=None) -> Optional[Depth]:
    """The model's layer patterns and the prefix to trace (see the module doc); None for a model
    without a list of layers."""
    prefix, layers = layer_list(module)
    if len(layers) < 1:
        return None
    keys = [_key(layer, i, len(layers), config) for i, layer in enumerate(layers)]
    index: dict = {}
    pattern = tuple(index.setdefault(k, len(index)) for k in keys)
    traced = max(len(index) and 1 + max(pattern.index(p) for p in range(len(index))), min(2, len(layers)))
    stand_in = {p: max(i for i in range(traced) if pattern[i] == p) for p in range(len(index))}
    return Depth(len(layers), traced, prefix, pattern, stand_in)


def _key(layer, i: int, n: int, config) -> tuple:
    parts = []
    for name, m in layer.named_modules():
        shapes = tuple((p, tuple(t.shape), str(t.dtype)) for p, t in m.named_parameters(recurse=False))
        attrs = tuple((a, _plain(getattr(m, a))) for a in LAYER_ATTRIBUTES if hasattr(m, a))
        parts.append((name, type(m).__name__, shapes, attrs))
    if config is not None:  # per-layer lists of the config (layer_types, ...): entry i
        fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        parts.append(tuple((k, _plain(v[i])) for k, v in sorted(fields.items()) if isinstance(v, list) and len(v) == n))
    return tuple(parts)


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def weights(profile_db: Path, depth: Depth) -> dict:
    """position -> the model's calls it stands for (see the module doc), from the database's modules."""
    with sqlite3.connect(f"file:{profile_db}?mode=ro", uri=True) as db:
        modules = db.execute("SELECT name, step, positions FROM modules").fetchall()
        calls = db.execute("SELECT position, step FROM calls ORDER BY position").fetchall()
    db.close()
    if not modules:
        return {}
    at = re.compile(rf"^{re.escape(depth.prefix)}\.(\d+)\.")
    starts: dict = {}  # step -> [(first position, layer or None)]
    for name, step, positions in modules:
        first = min(json.loads(positions))
        m = at.match(name)
        starts.setdefault(step, []).append((first, int(m.group(1)) if m else None))
    for entries in starts.values():
        entries.sort(key=lambda e: e[0])
    count = depth.counts()
    out = {}
    for position, step in calls:  # a call outside every step (between them) is the model's once
        entries = starts.get(step)
        if entries is None:
            out[position] = 1
            continue
        k = _last_at_or_before(entries, position)
        layer = entries[k][1] if k >= 0 else None
        out[position] = 1 if layer is None else count.get(layer, 1)
    return out


def _last_at_or_before(entries: list, position: int) -> int:
    """The index of the last (first position, layer) entry that starts at or before POSITION, else -1."""
    import bisect

    return bisect.bisect_right(entries, position, key=lambda e: e[0]) - 1
