"""`opperf predict --measure` against a profile of the same model, family by family (issue 55).

    python3 benchmarks/probes/predict_vs_profile.py [--families llama,qwen2,mixtral] [--batch 1]
        [--prefill 256] [--decode 8] [--device cpu|cuda] [--out DIR]

For each transformers family: a model built from its own classes at small widths (random
weights: nothing is downloaded), its config.json saved; one prefill and one decode step of it
profiled with torch.profiler (the median of the decode steps after the first); then `opperf
predict CONFIG --measure --json` in a copy of this checkout's benches/ and configs/ (its rows in
DIR/results/<device>.db). Prints, per family and phase, the predicted step, the profiled step and
their ratio. The profiled time is the sum of the device kernels' time on a GPU, and of the aten
ops' own CPU time on a CPU (where a small model's steps are mostly per-op overhead that no op's
benchmark holds). Needs transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FAMILIES = {  # small widths; the fields each family's config class takes
    "llama": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 4,
              "num_hidden_layers": 4, "vocab_size": 8192},
    "qwen2": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 4,
              "num_hidden_layers": 4, "vocab_size": 8192},
    "mixtral": {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
                "num_hidden_layers": 4, "vocab_size": 8192, "num_local_experts": 8, "num_experts_per_tok": 2},
}


def profiled(model, ids, decode: int, device: str) -> dict:
    """Milliseconds of one prefill step and of the median decode step, as the profiler saw them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])

    def busy(prof) -> float:
        events = prof.key_averages()
        if device == "cuda":
            return sum(e.self_device_time_total for e in events) / 1e3
        return sum(e.self_cpu_time_total for e in events) / 1e3

    with torch.inference_mode():
        model(ids, use_cache=True, logits_to_keep=1)  # warm
        with profile(activities=activities) as prof:
            out = model(ids, use_cache=True, logits_to_keep=1)
        prefill = busy(prof)
        steps = []
        for _ in range(decode):
            token = out.logits[:, -1:].argmax(-1)
            with profile(activities=activities) as prof:
                out = model(token, use_cache=True, logits_to_keep=1, **_cache_of(model, out))
            steps.append(busy(prof))
    return {"prefill": prefill, "decode": statistics.median(steps[1:] or steps)}


def _cache_of(model, out) -> dict:
    """The keyword that hands a step's KV cache to the next: `cache` in transformers 5, which
    deprecates `past_key_values`, the keyword before it."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: out.get("cache") if out.get("cache") is not None else out.get("past_key_values")}


def _spec_name(device: str) -> str:
    """The hardware spec of this machine's device, as the plugin names it (results/<name>.db)."""
    from pytest_opperf.hardware.specs import detect_accelerator, load_specs, resolve_alias, slug

    if device == "cpu":
        return "cpu"
    reported = detect_accelerator().reported_name
    spec = resolve_alias(load_specs(), reported)
    return spec.name if spec is not None else slug(reported)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--decode", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--spec", help="the hardware spec the rows are for (default: this machine's device)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "predict-vs-profile")))
    args = parser.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    label = "fp32" if args.device == "cpu" else "bf16"
    spec = args.spec or _spec_name(args.device)
    work = args.out / "project"
    for folder in ("benches", "configs"):
        shutil.copytree(ROOT / folder, work / folder, dirs_exist_ok=True)
    (work / "pytest.ini").write_text("[pytest]\n")
    rows = []
    for family in args.families.split(","):
        torch.manual_seed(0)
        config = AutoConfig.for_model(family, hidden_act="silu", **FAMILIES[family])
        config.save_pretrained(args.out / family)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(args.device).eval()
        ids = torch.randint(0, config.vocab_size, (args.batch, args.prefill), device=args.device)
        seen = profiled(model, ids, args.decode, args.device)
        done = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "predict", str(args.out / family / "config.json"),
                               "--batch", str(args.batch), "--prefill", str(args.prefill), "--decode", str(args.decode),
                               "--dtype", label, "--db", f"results/{spec}.db", "--device", spec, "--measure", "--json"],
                              cwd=work, capture_output=True, text=True)
        if done.returncode:
            print(f"{family}: opperf predict exited {done.returncode}: {done.stderr[-1500:]}")
            continue
        predicted = json.loads(done.stdout)["phases"]
        for phase in ("prefill", "decode"):
            ms = predicted[phase]["step_us"] / 1e3
            rows.append({"family": family, "phase": phase, "predicted_ms": ms, "profiled_ms": seen[phase],
                         "ratio": ms / seen[phase], "share": predicted[phase]["share"]})
            print(f"{family:8s} {phase:7s} predicted {ms:8.3f} ms  profiled {seen[phase]:8.3f} ms  "
                  f"ratio {ms / seen[phase]:.3f}", flush=True)
    (args.out / "predict_vs_profile.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
