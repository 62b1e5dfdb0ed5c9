"""A model's calls at a configuration, recorded on the meta device: the profile a prediction replays.

One prefill step (batch x prefill tokens) and DECODE decode steps, each against the cache the steps
before it left, run on meta tensors (shapes, dtypes and strides, no data, no device) under
torch.profiler (``record_shapes``: every aten call with its dims, strides and scalar arguments, as
a profile records them) and ``capture(trace, model)`` (reading/capture.py, a TorchDispatchMode: which call
wrote each input, the model's leaf-module calls). The prefill runs in a ``record_function("prefill")``
range and each decode step in a ``"decode"`` one, as ``opperf import`` reads a profile's phases.

A profile taken on a GPU ties each device kernel to the call that launched it; a meta run launches
none, so the trace gets one device event per call that would launch a kernel (launches.py).
``opperf import`` then reads the trace as it reads a GPU profile: the same op tree, the same claims,
signatures, calls, links and modules. Its times are placeholders: a prediction prices the calls, it
never reads them.

What a meta run cannot know, it takes from an assumption that the answer names:

- **attention**: ``scaled_dot_product_attention`` picks its kernel by the device; on meta it would run
  the math path. ``auto`` asks torch's own choice on this machine's CUDA device for the same shapes,
  strides and flags (``torch._fused_sdp_choice``); without one, the rule ``flash`` where flash takes
  the call (fp16/bf16, no mask, equal head dims of at most 256, a multiple of 8), else ``efficient``
  (a multiple of 8), else ``math``. ``flash``, ``efficient``, ``cudnn``, ``math``: that kernel always.
- **experts**: the offsets of ``torch._grouped_mm`` (how many rows each expert got) are the routing's
  values. ``random`` (the default): each token picks k distinct experts uniformly at random, seeded,
  drawn afresh for each layer's routing and each step (the rows per expert and the experts a decode
  step touches, as a router that spreads its tokens does); ``even``: the rows spread evenly over the
  experts (the most experts a step can touch); ``counts`` (a profile's): its shares of the rows per
  expert.
- **logits**: ``generate()`` passes ``logits_to_keep=1`` to a forward that takes it, and so does the
  prefill traced here by default (``last``): the LM head runs on the last position only, as an
  inference engine runs it. ``all``: every position's logits (scoring a prompt).
"""

from __future__ import annotations

import inspect
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.predict.launches import with_launches
from pytest_opperf.pipeline.reading.signature import ProfileError

ATTENTION = ("auto", "flash", "efficient", "cudnn", "math")
LOGITS = ("last", "all")


@dataclass
class Traced:
    trace: Path                 # trace.json.gz, its capture beside it
    calls: int                  # aten calls the dispatcher saw
    seconds: float
    attention: str              # how each attention call's kernel was chosen, and the count per kernel
    experts: str                # the grouped GEMMs' offsets: the assumption and the calls it set
    logits: str = ""            # which positions the prefill's LM head ran on
    notes: list = field(default_factory=list)


class Even:
    """The rows of a grouped GEMM spread evenly over its experts (the first ones get one more)."""

    name = "even"

    def __call__(self, rows: int, experts: int, key=None) -> list:
        base, extra = divmod(rows, experts)
        return _cumulative([base + (1 if e < extra else 0) for e in range(experts)])


class Shares:
    """The rows split by a profile's shares per expert (grouped GEMMs of that many experts), the
    largest remainders rounded up; experts counts no profile call had: even."""

    name = "counts"

    def __init__(self, shares: dict, source: str):
        self.shares = shares  # experts -> [share of rows per expert]
        self.source = source

    def __call__(self, rows: int, experts: int, key=None) -> list:
        shares = self.shares.get(experts)
        if not shares:
            return Even()(rows, experts)
        exact = [rows * s for s in shares]
        counts = [int(x) for x in exact]
        for e in sorted(range(experts), key=lambda e: counts[e] - exact[e])[:rows - sum(counts)]:
            counts[e] += 1
        return _cumulative(counts)


class Random:
    """Each token picks ``k`` distinct experts uniformly at random (seeded): a router's spread. The
    tokens of a step are the input ids the model was called with (``tokens``, set by ``record``), so
    ``k`` is the grouped GEMM's rows over them. One draw a routing: the grouped GEMMs that share one
    offsets tensor (a layer's gate/up and down projections) share its counts."""

    name = "random"

    def __init__(self, seed: int = 0):
        import torch

        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.tokens = 0
        self._last: tuple = (None, None)   # (the offsets tensor drawn for, its offsets); held: no id reuse

    def restart(self) -> None:
        """Back to the seed's first draw: each trace routes as if it were the first, so a configuration's
        answer does not hang on which others were traced before it (or in which process)."""
        self.generator.manual_seed(self.seed)
        self._last = (None, None)

    def __call__(self, rows: int, experts: int, key=None) -> list:
        if key is not None and self._last[0] is key:
            return self._last[1]
        k = rows // self.tokens if self.tokens and rows % self.tokens == 0 else 0
        offsets = _cumulative(counts(self.tokens, experts, k, self.generator)) if 0 < k <= experts \
            else Even()(rows, experts)
        self._last = (key, offsets)
        return offsets


def counts(tokens: int, experts: int, k: int, generator) -> list:
    """Rows per expert when each of TOKENS picks K distinct of EXPERTS uniformly at random."""
    import torch

    picks = torch.rand(tokens, experts, generator=generator).topk(k, dim=1).indices
    return torch.bincount(picks.flatten(), minlength=experts).tolist()


ROUTING = {"random": Random, "even": Even}


def _cumulative(counts: list) -> list:
    out, total = [], 0
    for c in counts:
        total += c
        out.append(total)
    return out


def record(built, batch: int, prefill: int, decode: int, out: Path, attention: str = "auto", experts=None,
           say=None, logits: str = "last", ask_gpu: bool = True) -> Traced:
    """Trace BUILT (model.Built) into OUT/trace.json.gz and its capture; see the module doc."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pytest_opperf.pipeline.reading.capture import capture

    check_choices(attention=attention, logits=logits)
    experts = experts or Random()
    if hasattr(experts, "restart"):
        experts.restart()
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    raw, path = out / "trace.raw.json", out / "trace.json.gz"
    model = built.module
    t0 = time.monotonic()
    where = _Where(model)
    attend = _Attention(attention, ask_gpu)
    offsets = _Offsets(experts)
    counting = model.register_forward_pre_hook(_tokens(experts), with_kwargs=True)
    kept = logits_kept(model, logits)
    with torch.no_grad(), where:
        if built.inputs is not None:
            kwargs = built.inputs(batch, prefill)
        else:
            kwargs = {"input_ids": torch.randint(0, built.vocab, (batch, prefill), device="meta")}
        try:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
                    capture(path, model, offsets) as cap, attend:
                steps(model, kwargs, decode, kept)
        except Exception as exc:  # noqa: BLE001  (the model's own failure, said in one line)
            if made:  # nothing written: the capture's file of the failed run goes with its folder
                shutil.rmtree(out, ignore_errors=True)
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"MODEL={built.source}: {where.said()}: {type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}") from None
        finally:
            counting.remove()
    prof.export_chrome_trace(str(raw))
    launches = with_launches(raw, path)
    raw.unlink()
    if say:
        say(f"opperf predict: traced {built.name}: batch {batch}, prefill {prefill}, {decode} decode steps: "
            f"{cap.sources.calls} aten calls, {launches} would launch kernels ({time.monotonic() - t0:.1f} s)")
    return Traced(path, cap.sources.calls, time.monotonic() - t0, attend.said(), offsets.said(),
                  logits_said(logits, kept))


def check_choices(**chosen: str) -> None:
    """Each of --attention, --logits and --routing CHOSEN is one this trace knows; else a one-line
    ProfileError naming the option."""
    for option, value in chosen.items():
        allowed = {"attention": ATTENTION, "logits": LOGITS, "routing": tuple(ROUTING)}[option]
        if value not in allowed:
            raise ProfileError(f"--{option}={value}: expected one of {', '.join(allowed)}")


def logits_kept(model, logits: str = "last") -> Optional[int]:
    """What the prefill passes as ``logits_to_keep``: 1 where LOGITS is ``last`` and the model's
    forward takes it (as ``generate()`` passes it); None: every position's logits."""
    takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    return 1 if logits == "last" and takes else None


def logits_said(logits: str, kept: Optional[int]) -> str:
    if kept == 1:
        return "last: the prefill's LM head on the last position only (logits_to_keep=1, as generate() runs it)"
    if logits == "all":
        return "all: the prefill's LM head on every prompt position (--logits all: scoring a prompt)"
    return "all: the model's forward takes no logits_to_keep, so its prefill computes every position's logits"


def steps(model, kwargs: dict, decode: int, logits_to_keep: Optional[int] = None) -> None:
    """A prefill step on KWARGS in a ``record_function("prefill")`` range, then DECODE greedy decode
    steps, each against the cache the step before left, each in a ``"decode"`` range: the steps
    ``opperf import`` reads as phases (under no_grad; the model's own device). LOGITS_TO_KEEP: passed
    to the prefill where given (1: the LM head on the last position, as generate() runs it)."""
    from torch.profiler import record_function

    params = inspect.signature(model.forward).parameters
    keyword = "cache" if "cache" in params else "past_key_values"  # transformers 5.2x: cache
    keep = {"logits_to_keep": logits_to_keep} if logits_to_keep is not None else {}
    with record_function("prefill"):
        result = model(**kwargs, **keep, use_cache=True)
    for _ in range(decode):
        logits = result["logits"] if hasattr(result, "keys") else result[0]
        token = logits[:, -1:].argmax(-1)
        with record_function("decode"):
            result = model(input_ids=token, use_cache=True, **{keyword: _cache(result)})


def _cache(result):
    for key in ("cache", "past_key_values"):
        value = result.get(key) if hasattr(result, "get") else None
        if value is not None:
            return value
    raise ProfileError("the model's prefill returned no cache (cache or past_key_values): a decode step needs one")


def _tokens(experts):
    """A forward pre-hook on the model that tells a Random router the step's token count."""
    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if hasattr(experts, "tokens") and hasattr(ids, "numel"):
            experts.tokens = int(ids.numel())
    return hook


class _Offsets:
    """The capture's OFFSETS callable: EXPERTS' answer, counted (calls, and the experts each touched)."""

    RULES = {"even": "rows spread evenly over the experts",
             "random": "each token picks its top-k experts uniformly at random (seed 0)"}

    def __init__(self, experts):
        self.experts = experts
        self.calls = Counter()
        self.touched: list = []  # experts with rows, per call

    def __call__(self, rows: int, experts: int, key=None) -> list:
        self.calls[experts] += 1
        offsets = self.experts(rows, experts, key)
        self.touched.append(sum(1 for a, b in zip([0, *offsets[:-1]], offsets) if b > a))
        return offsets

    def said(self) -> str:
        if not self.calls:
            return "no grouped GEMM: nothing depended on the routing"
        where = f" of {self.experts.source}" if getattr(self.experts, "source", None) else ""
        kinds = ", ".join(f"{n} calls of {e} experts" for e, n in sorted(self.calls.items()))
        rule = self.RULES.get(self.experts.name, f"rows split by the profile{where}'s shares per expert")
        least, most = min(self.touched), max(self.touched)
        touched = f"{least}" if least == most else f"{least}-{most}"
        return f"{self.experts.name}: {rule} ({kinds}; {touched} experts touched a call)"


class _Where:
    """Which module and which aten call a failure of the traced model happened in."""

    def __init__(self, model):
        self.names = {id(m): (n or "model", type(m).__name__) for n, m in model.named_modules()}
        self.stack: list = []
        self.call = None      # the last aten call dispatched
        self.failed = None    # the aten call that raised, where one did
        self._handles: list = []
        self._mode = None

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        def pre(module, args):
            owner.stack.append(id(module))

        def post(module, args, output):
            if owner.stack and owner.stack[-1] == id(module):
                owner.stack.pop()

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                owner.call = func
                try:
                    return func(*args, **(kwargs or {}))
                except Exception:
                    owner.failed = owner.failed or func
                    raise

        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
                         torch.nn.modules.module.register_module_forward_hook(post)]
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def said(self) -> str:
        module = next((self.names[m] for m in reversed(self.stack) if m in self.names), None)
        at = f"module {module[0]} ({module[1]})" if module else "outside the model's modules"
        if self.failed is not None:
            return f"{at}, call {_op_name(self.failed)}"
        last = f" (the last aten call before it: {_op_name(self.call)})" if self.call is not None else ""
        return f"{at}, in the model's own code{last}"


def _op_name(func) -> str:
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else str(func)


class _Attention:
    """A TorchFunctionMode that runs each scaled_dot_product_attention as the kernel chosen for it."""

    KERNELS = {1: "flash", 2: "efficient", 3: "cudnn", 0: "math"}

    def __init__(self, backend: str, ask_gpu: bool = True):
        self.backend = backend
        self.ask_gpu = ask_gpu  # auto: torch's choice on this machine's GPU; else (or without one) the rule
        self.chosen: Counter = Counter()
        self.how = "" if backend != "auto" else None
        self._cache: dict = {}
        self._mode = None

    def __enter__(self):
        import torch
        from torch.overrides import TorchFunctionMode

        owner = self
        target = torch.nn.functional.scaled_dot_product_attention

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func is target:
                    return owner.run(*args, **(kwargs or {}))
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)

    def said(self) -> str:
        if not self.chosen:
            return "no scaled_dot_product_attention call"
        counts = ", ".join(f"{k} {n} calls" for k, n in sorted(self.chosen.items()))
        if self.backend != "auto":
            return f"{self.backend} (--attention): {counts}"
        return f"auto, {self.how}: {counts}"

    def run(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        kernel = self.backend if self.backend != "auto" else self._choose(q, k, v, attn_mask, dropout_p, is_causal,
                                                                          scale, enable_gqa)
        self.chosen[kernel] += 1
        aten = torch.ops.aten
        if kernel == "math":
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                enable_gqa=enable_gqa)
        # the fused kernels take grouped heads as they are (torch repeats them for the math path only)
        scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
        if kernel == "efficient":
            return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, False, dropout_p, is_causal,
                                                                scale=scale)[0]
        return aten._scaled_dot_product_cudnn_attention(q, k, v, attn_mask, False, dropout_p, is_causal, False,
                                                        scale=scale)[0]

    def _choose(self, q, k, v, mask, dropout_p, is_causal, scale, gqa) -> str:
        key = tuple((tuple(t.shape), tuple(t.stride()), t.dtype) if t is not None else None for t in (q, k, v, mask))
        key += (dropout_p, is_causal, scale, gqa)
        if key not in self._cache:
            asked = self._torch_choice(q, k, v, mask, dropout_p, is_causal, scale, gqa) if self.ask_gpu else None
            self._cache[key] = asked or self._rule(q, k, v, mask)
        return self._cache[key]

    def _torch_choice(self, q, k, v, mask, dropout_p, is_causal, scale, gqa) -> Optional[str]:
        """torch's own choice on this machine's CUDA device, for tensors of the same layout (empty)."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        if not torch.cuda.is_available():
            return None
        try:
            with _disable_current_modes():  # the question is no call of the model's: the capture sees none of it
                return self._ask_cuda(q, k, v, mask, dropout_p, is_causal, scale, gqa)
        except (RuntimeError, TypeError):  # out of memory, or a torch without this signature: the rule
            return None

    def _ask_cuda(self, q, k, v, mask, dropout_p, is_causal, scale, gqa) -> str:
        import torch

        real = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") if t is not None else None
                for t in (q, k, v, mask)]
        code = torch._fused_sdp_choice(*real, dropout_p, is_causal, scale=scale, enable_gqa=gqa)
        del real
        self.how = f"torch's choice on {torch.cuda.get_device_name()}"
        return self.KERNELS.get(int(code), "math")

    def _rule(self, q, k, v, mask) -> str:
        import torch

        self.how = self.how or ("the rule flash where it takes the call (fp16/bf16, no mask, equal head dims "
                                "<= 256, a multiple of 8), else efficient, else math")
        dims = {q.size(-1), k.size(-1), v.size(-1)}
        if (mask is None and q.dtype in (torch.float16, torch.bfloat16) and len(dims) == 1 and q.size(-1) <= 256
                and q.size(-1) % 8 == 0):
            return "flash"
        if q.size(-1) % 8 == 0 and v.size(-1) % 8 == 0:
            return "efficient"
        return "math"
