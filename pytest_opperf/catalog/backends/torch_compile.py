"""torch_compile: every op's eager `torch` backend through torch.compile (inductor, default mode).

Registered for every op that has a `torch` backend, including ops registered after this module
(another built-in module, a user's conftest): registry.derive_backend does that as each `torch`
backend appears. A backend registered by hand as `torch_compile` for an op replaces this one.

One compiled callable per op, dynamic=False: each new shape or dtype compiles anew, so the
recompile limits are raised for the sweep. The first call of a case pays the compilation
(the `bench` fixture's check runs it, then the warm-up): the row's `first_call_ms` records it
and no sample contains it; what every process pays once (Inductor's start) is paid before its
first case (warm_inductor). A failure of dynamo or inductor skips the case with its message.
It inherits the eager backend's `supports`; on a CPU, inductor needs a C++ compiler.
"""

from __future__ import annotations

import os
import shutil

from pytest_opperf.catalog.registry import Backend, BackendUnavailable, derive_backend

# More shapes than a config sweeps per op; torch's defaults (8 per function) would fall back to eager.
RECOMPILE_LIMIT = 1024


def compiled(eager: Backend) -> Backend:
    """The torch_compile backend of the op whose eager backend is `eager`."""
    state: dict = {}

    def torch_compile(*args, **kwargs):
        import torch

        if "fn" not in state:
            _raise_limits(torch)
            state["fn"] = torch.compile(eager.fn, dynamic=False)
        try:
            return state["fn"](*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            message = str(exc).strip().splitlines()
            raise BackendUnavailable(f"torch.compile failed: {type(exc).__name__}: "
                                     f"{message[0] if message else ''}") from exc

    def supports(device_type, dtypes, capability, params):
        reason = eager.unsupported(device_type, dtypes, capability, params)
        if reason is None and device_type == "cpu" and not _cxx_compiler():
            reason = "torch.compile on a CPU needs a C++ compiler (inductor); none found (set CXX)"
        return reason

    torch_compile.__qualname__ = f"torch_compile[{eager.op}]"
    return Backend(eager.op, "torch_compile", torch_compile, "torch", eager.devices, supports, warm_inductor)


def warm_inductor(device) -> None:
    """Inductor's once-a-process start paid apart from any case: its modules, its pool of compile
    workers, Triton's driver and launcher, by compiling a two-op function of its own on DEVICE. A
    case's first call then pays for its own graph alone (the rest is the same in every process of a
    sweep: under -n, each worker's first compiled case paid it again)."""
    import torch

    _raise_limits(torch)
    torch.compile(_scale_shift, dynamic=False)(torch.arange(64, dtype=torch.float32, device=device))


# Imported by the thread that starts the warm-up, before it: two threads importing one package at once
# can each get the other's modules half-initialised (seen on an H200: a case's compile then failed with
# "cannot import name 'IndentedBuffer' from partially initialized module 'torch._inductor.utils'").
warm_inductor.imports = ("torch._dynamo", "torch._inductor.compile_fx")


def _scale_shift(x):
    return x * 2.0 + 1.0


def _raise_limits(torch) -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # before torch 2.7
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 16 * RECOMPILE_LIMIT)


def _cxx_compiler() -> bool:
    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name)


derive_backend("torch_compile", "torch", compiled)
