"""One tensor-parallel rank of a model on meta: its weights split as the model's own plan splits them,
and the collectives that plan implies, recorded as calls of their own.

transformers' models carry their plan: ``config.base_model_tp_plan`` (the decoder's layers:
``"layers.*.self_attn.q_proj": "colwise"``) and the causal LM's ``_tp_plan`` (``"lm_head":
"colwise_gather_output"``); ``from_pretrained(..., tp_plan="auto")`` follows them. Here each style
splits a weight by the number of ranks on the dimension transformers splits, and a forward hook on
the module adds the collective the style implies:

- ``colwise``: the output features (a Linear's weight and bias rows, an experts tensor's packed
  ``2 x intermediate`` rows with ``packed_colwise``); the output stays split, no collective;
  ``colwise_gather_output`` / ``colwise_rep``: then an all-gather of the output's last dim;
- ``rowwise``: the input features (a Linear's weight columns, an experts tensor's last dim); the
  output is a partial sum: an all-reduce (``rowwise_split_input`` first cuts its whole input);
- ``moe_tp_experts``: the experts' output summed over the ranks: an all-reduce;
- ``embedding_rowwise``: the vocabulary rows, an all-reduce of the lookups;
- ``replicated_with_grad_allreduce``, ``replicate``: nothing at inference.

A style not in this list is refused with its module's name. The collectives are the custom ops
``opperf::all_reduce(x, ranks)`` and ``opperf::all_gather(x, ranks, dim)``: the trace records them
with the message's shape and dtype, and the mapping prices them as the catalogue's all_reduce and
all_gather at that many GPUs (data/mapping.yaml).
"""

from __future__ import annotations

import fnmatch
from collections import Counter

from pytest_opperf.pipeline.reading.signature import ProfileError

NOTHING = ("replicated_with_grad_allreduce", "replicate", "local_params")
GATHER = ("colwise_gather_output", "colwise_rep")
_LIBRARY = []


def register() -> None:
    """The collective ops a traced rank records (defined once a process, on the meta device)."""
    if _LIBRARY:
        return
    import torch

    lib = torch.library.Library("opperf", "DEF")
    lib.define("all_reduce(Tensor x, int ranks) -> Tensor")
    lib.define("all_gather(Tensor x, int ranks, int dim) -> Tensor")

    def all_reduce(x, ranks):
        return torch.empty_like(x)

    def all_gather(x, ranks, dim):
        shape = list(x.shape)
        shape[dim] *= ranks
        return x.new_empty(shape)

    lib.impl("all_reduce", all_reduce, "Meta")
    lib.impl("all_gather", all_gather, "Meta")
    _LIBRARY.append(lib)


def plan_of(module) -> dict:
    """The model's plan, as full module or parameter name patterns -> style."""
    out = {}
    base = getattr(module, "base_model_prefix", "model")
    config = getattr(module, "config", None)
    for pattern, style in (getattr(config, "base_model_tp_plan", None) or {}).items():
        out[f"{base}.{pattern}"] = style
    for pattern, style in (getattr(module, "_tp_plan", None) or {}).items():
        out[pattern] = style
    return out


def shard(module, ranks: int) -> dict:
    """Split MODULE's weights for one of RANKS ranks and hook its collectives; returns the styles
    applied (style -> how many modules or tensors) for the answer. ProfileError: no plan, a style
    not traced, a dimension that does not split evenly."""
    import torch

    register()
    plan = plan_of(module)
    if not plan:
        raise ProfileError(f"--tp={ranks}: the model has no tensor-parallel plan (config.base_model_tp_plan)")
    applied: Counter = Counter()
    modules = dict(module.named_modules())
    params = dict(module.named_parameters())
    for pattern, style in plan.items():
        hits = [n for n in modules if fnmatch.fnmatchcase(n, pattern)]
        hits += [n for n in params if fnmatch.fnmatchcase(n, pattern) and n not in modules]
        for name in hits:
            target = modules.get(name)
            if target is None:
                _split_tensor(module, name, style, ranks)
            else:
                _split_module(target, name, style, ranks, torch)
            applied[style] += 1
    return dict(applied)


def _split_module(target, name: str, style: str, ranks: int, torch) -> None:
    if style in NOTHING:
        return
    if style == "moe_tp_experts":
        target.register_forward_hook(_reduce(ranks))
        return
    if style.startswith("embedding_rowwise"):
        _cut(target, "weight", 0, ranks, name)
        target.register_forward_hook(_reduce(ranks))
        return
    if not isinstance(target, torch.nn.Linear):
        raise ProfileError(f"--tp={ranks}: {name}: style {style!r} on a {type(target).__name__}, which this tracer "
                           f"does not split (a Linear's colwise and rowwise styles are)")
    if style in ("colwise", "packed_colwise", *GATHER):
        _cut(target, "weight", 0, ranks, name)
        if target.bias is not None:
            _cut(target, "bias", 0, ranks, name)
        target.out_features //= ranks
        if style in GATHER:
            target.register_forward_hook(_gather(ranks))
    elif style in ("rowwise", "rowwise_rep", "rowwise_split_input"):
        _cut(target, "weight", 1, ranks, name)
        target.in_features //= ranks
        if style == "rowwise_split_input":
            target.register_forward_pre_hook(_split_input(ranks))
        target.register_forward_hook(_reduce(ranks))
    else:
        raise ProfileError(f"--tp={ranks}: {name}: style {style!r} is not one this tracer splits "
                           f"(colwise, rowwise and their variants, packed_colwise, moe_tp_experts, embedding_rowwise)")


def _split_tensor(module, name: str, style: str, ranks: int) -> None:
    """An experts tensor named by the plan: packed_colwise cuts its packed rows, rowwise its inputs."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if style in NOTHING:
        return
    if style in ("packed_colwise", "colwise"):
        _cut(owner, attr, -2, ranks, name)
    elif style == "rowwise":
        _cut(owner, attr, -1, ranks, name)
    else:
        raise ProfileError(f"--tp={ranks}: {name}: style {style!r} on a tensor is not one this tracer splits")


def _cut(owner, attr: str, dim: int, ranks: int, name: str) -> None:
    import torch

    old = getattr(owner, attr)
    shape = list(old.shape)
    if shape[dim] % ranks:
        raise ProfileError(f"--tp={ranks}: {name}.{attr} {tuple(shape)}: dim {dim} does not split over {ranks} ranks")
    shape[dim] //= ranks
    setattr(owner, attr, torch.nn.Parameter(torch.empty(shape, dtype=old.dtype, device=old.device),
                                            requires_grad=False))


def _reduce(ranks: int):
    import torch

    def hook(module, args, output):
        if isinstance(output, torch.Tensor):
            return torch.ops.opperf.all_reduce(output, ranks)
        return output
    return hook


def _gather(ranks: int):
    import torch

    def hook(module, args, output):
        return torch.ops.opperf.all_gather(output, ranks, output.dim() - 1)
    return hook


def _split_input(ranks: int):
    def hook(module, args):
        x = args[0]
        return (x.narrow(-1, 0, x.shape[-1] // ranks), *args[1:])
    return hook
