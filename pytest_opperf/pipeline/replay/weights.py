"""The model's weights as the replay makes them: Parameters where a call's kernels depend on it."""

from __future__ import annotations

# Calls whose kernels depend on whether a weight is a Parameter: torch's matmul folds a strided 3-D
# input into one mm where its weight requires grad (a Parameter's does, even under no_grad or
# inference mode) and runs a bmm over the broadcast weight where it does not. The LM head on the
# last position of a batch (generate's logits_to_keep=1, a strided [B, 1, H] view) read its weight
# B times that way: 7.5x the model's time at batch 8 on an H200 (2026-11-29).
FOLDING = ("aten::linear", "aten::matmul")


def as_parameters(sig: dict, args, slots, torch):
    """ARGS with the floating-point inputs the capture saw to be the model's weights (source p)
    as Parameters, as the model's are, for the calls of FOLDING; SLOTS: plan.slot_arguments."""
    if sig["op_type"] not in FOLDING or "p" not in (sig.get("input_sources") or ""):
        return args
    args = list(args)
    where = slots(sig, args, torch)
    for slot, source in enumerate(sig["input_sources"].split(";")):
        k = where[slot] if slot < len(where) else None
        if source == "p" and k is not None and isinstance(args[k], torch.Tensor) and args[k].dtype.is_floating_point:
            args[k] = torch.nn.Parameter(args[k])  # the same storage; a plain tensor requiring grad is not enough
    return args
