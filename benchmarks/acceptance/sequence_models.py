"""The model's time in context: ten transformers families replayed call by call in their order.

For each family: build it from transformers' own classes (random weights, bf16, small widths, no
download), profile a prefill and greedy decode steps on the device with record_shapes inside
pytest_opperf.pipeline.capture, the prefill in a ``record_function("prefill")`` range and each decode
step in a ``"decode"`` one; then the chain as a user types it: ``opperf import`` (and the replay
sweeps it prints, in their chosen cache states: the isolated times), ``opperf backfill``,
``opperf sequence`` (the calls in their order: the in-sequence times), ``opperf replay-report``.
Prints a line per family: the failed replay cases, the share of kernel time replayed in sequence,
and over those calls the in-sequence sum and the isolated sum against the profile's.

``--what-if`` checks a what-if against a real swap instead: one model (multi-head attention, a
long prompt) profiled twice, with SDPA held to its flash kernel and to its memory-efficient one; the
flash profile's ``opperf sequence --backend attention_prefill=sdpa_efficient --backend
attention_decode=sdpa_efficient`` predicts the change of each phase's time, which the second
profile measured.

    python benchmarks/acceptance/sequence_models.py                    # every family
    python benchmarks/acceptance/sequence_models.py --family olmoe --family qwen3
    python benchmarks/acceptance/sequence_models.py --what-if --prefill 4096
    python benchmarks/acceptance/sequence_models.py --device cpu --family qwen3 --prefill 32 --decode 2   # a smoke test

Everything goes to $OUT/<family>/ (trace, capture, profile.db, replay configs, results, logs,
reports/) and $OUT/sequence_summary.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_models as pm  # noqa: E402  (the chain's steps: cli, the replay sweeps, figures)

# name -> (config class, model class, fields): small widths (2 layers, hidden 512, vocab 32000), the
# structure of the published family; three with experts (run with transformers' grouped_mm experts).
FAMILIES = {
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, pad_token_id=0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, shared_expert_intermediate_size=512,
        num_experts=16, num_experts_per_tok=4, num_attention_heads=8, num_key_value_heads=2, decoder_sparse_step=1,
        mlp_only_layers=[])),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, moe_num_experts=16, moe_k=4,
        moe_num_shared_experts=1, moe_layer_start_index=0, num_attention_heads=8, num_key_value_heads=2)),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", dict(
        hidden_size=512, intermediate_size=512, num_experts=8, num_experts_per_tok=2, num_attention_heads=8,
        num_key_value_heads=8, pad_token_id=0)),
}
COMMON = dict(num_hidden_layers=2, vocab_size=32000)
MOE = ("qwen2_moe", "ernie4_5_moe", "flex_olmo")
# The what-if's model: multi-head attention (the memory-efficient kernel takes no grouped heads), a
# width where a long prompt's attention is a large part of the step.
WHAT_IF = ("LlamaConfig", "LlamaForCausalLM", dict(
    hidden_size=1024, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
    num_hidden_layers=2, vocab_size=32000, max_position_embeddings=16384))
KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def build(spec: tuple, device, moe: bool):
    import transformers

    config_name, model_name, fields = spec
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        raise pm.Missing(f"transformers {transformers.__version__} has no {config_name if config_cls is None else model_name}")
    config = config_cls(**{**COMMON, **fields})
    config._attn_implementation = "sdpa"
    if moe and device.type == "cuda":
        try:
            config._experts_implementation = "grouped_mm"
        except Exception as exc:  # noqa: BLE001  (a transformers without the setting: its default experts)
            print(f"{model_name}: experts left at the default ({exc})")
    with torch.device(device):
        model = model_cls(config)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return model.to(dtype).eval(), f"transformers {transformers.__version__} {model_name}"


def generate(model, ids, decode: int, ranges: bool) -> None:
    """A prefill, then DECODE greedy steps, each in its record_function range."""
    from torch.profiler import record_function

    def step(name, **kw):
        if not ranges:
            return model(**kw)
        with record_function(name):
            return model(**kw)

    with torch.no_grad():
        out = step("prefill", input_ids=ids, use_cache=True)
        for _ in range(decode):
            nxt = out.logits[:, -1:].argmax(-1)
            out = step("decode", input_ids=nxt, **_cache(model, out), use_cache=True)
    _sync(ids.device)


def _cache(model, out) -> dict:
    """The keyword handing the KV cache on: `cache` in transformers 5 (deprecating `past_key_values`)."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: out.get("cache") if out.get("cache") is not None else out.get("past_key_values")}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile(spec: tuple, out: Path, device, prefill: int, decode: int, moe: bool, kernel: str = "") -> str:
    from pytest_opperf.pipeline.capture import capture

    torch.manual_seed(0)
    model, impl = build(spec, device, moe)
    ids = torch.randint(0, model.config.vocab_size, (1, prefill), device=device)
    held = _sdpa(kernel)
    with held:
        generate(model, ids, 2, ranges=False)  # warm-up: handles, allocator, lazy set-up stay out of the profile
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                        if device.type == "cuda" else [])
        raw = out / "trace.json"
        with torch.profiler.profile(activities=acts, record_shapes=True) as prof, capture(out / "trace.json.gz", model):
            generate(model, ids, decode, ranges=True)
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return impl


def _sdpa(kernel: str):
    import contextlib

    if not kernel:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, KERNELS[kernel])])


def sequence(out: Path, device: str, backends: tuple = ()) -> dict:
    args = ["sequence", str(out / "profile.db"), "--device", device, "--json"]
    for b in backends:
        args += ["--backend", b]
    code, text = pm.cli(args, out / ("whatif.log" if backends else "sequence.log"), 1800)
    if code:
        return {"error": f"opperf sequence exited {code}: {text[-1500:]}"}
    return json.loads(text[text.index("{"):text.rindex("}") + 1])


def context_figures(db: Path) -> dict:
    """Over the signatures replayed in sequence: profile, in-sequence and isolated sums, the factors."""
    from pytest_opperf.pipeline import profile as profile_db
    from pytest_opperf.pipeline.replay_report import in_context

    rows = profile_db.load(db)
    c = in_context(rows, top=5)
    if c is None:
        return {"error": "no signature replayed in sequence"}
    return {"sequence_share": c.covered, "sequence_ratio": c.sequence_us / c.profiled_us,
            "both": c.isolated,
            "both_sequence_ratio": c.isolated_sequence_us / c.isolated_profiled_us if c.isolated_profiled_us else None,
            "both_isolated_ratio": c.isolated_us / c.isolated_profiled_us if c.isolated_profiled_us else None,
            "furthest": [f"{r['op_type']} [{r['input_shapes']}] x{r['count']}: {r['context_factor']:.3f}"
                         for r in c.furthest]}


def family(name: str, top: Path, device, args) -> dict:
    out = top / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        entry = {"model": profile(FAMILIES[name], out, device, args.prefill, args.decode, name in MOE)}
    except pm.Missing as exc:
        return {"skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001  (a family that cannot be built does not stop the others)
        return {"error": f"{type(exc).__name__}: {exc}"}
    entry["seconds_profile"] = round(time.monotonic() - t0, 1)
    if args.skip_isolated:
        code, text = pm.cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--force"],
                            out / "import.log", 600)
        if code:
            return {**entry, "error": text[-1500:]}
    else:
        entry.update(pm.replay(name, out, args.budget, 0, "chosen"))
        if "error" in entry:
            return entry
    t1 = time.monotonic()
    entry["sequence"] = sequence(out, str(device))
    entry["seconds_sequence"] = round(time.monotonic() - t1, 1)
    pm.cli(["replay-report", str(out / "profile.db"), "-o", str(out / "reports")], out / "report.log", 300)
    entry.update(context_figures(out / "profile.db"))
    return entry


def what_if(top: Path, device, args) -> dict:
    """Flash and memory-efficient profiles of one model; the flash one's what-if against the change."""
    runs = {}
    for kernel in ("flash", "efficient"):
        out = top / f"whatif-{kernel}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        profile(WHAT_IF, out, device, args.prefill, args.decode, False, kernel)
        code, text = pm.cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--force"],
                            out / "import.log", 600)
        if code:
            return {"error": f"import of the {kernel} profile: {text[-1500:]}"}
        runs[kernel] = _phase_totals(out / "profile.db")
    predicted = sequence(top / "whatif-flash", str(device), ("attention_prefill=sdpa_efficient",
                                                            "attention_decode=sdpa_efficient"))
    if "error" in predicted:
        return predicted
    out = {"prefill": args.prefill, "decode": args.decode, "phases": {}}
    for ph in predicted["phases"]:
        name = ph["phase"]
        before, after = runs["flash"].get(name), runs["efficient"].get(name)
        if before is None or after is None:
            continue
        profiled_change = after - before
        predicted_change = ph["what_if_us"] - ph["sequence_us"]
        out["phases"][name] = {"profiled_flash_us": before, "profiled_efficient_us": after,
                               "profiled_change_us": profiled_change, "predicted_change_us": predicted_change,
                               "in_sequence_us": ph["sequence_us"], "what_if_us": ph["what_if_us"],
                               "change_error": (predicted_change / profiled_change - 1) if profiled_change else None}
    return out


def _phase_totals(db: Path) -> dict:
    with sqlite3.connect(db) as con:
        got = dict(con.execute("SELECT COALESCE(phase, ''), SUM(profiled_us) FROM calls GROUP BY phase"))
    con.close()
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="repeatable; default: all")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--budget", default="0.03", help="--opperf-budget of each isolated replay sweep (s a case)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-isolated", action="store_true", help="no replay sweep: import, then sequence only")
    ap.add_argument("--what-if", action="store_true", help="the what-if against a real swap (see the module doc)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("needs CUDA (or --device cpu)")
        return 1
    top = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="sequence-models-"))
    top.mkdir(parents=True, exist_ok=True)
    summary = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "prefill": args.prefill, "decode": args.decode,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "families": {}}
    path = top / ("whatif_summary.json" if args.what_if else "sequence_summary.json")
    if args.what_if:
        summary["what_if"] = what_if(top, device, args)
        path.write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["what_if"], indent=1))
        return 0
    for name in args.family or list(FAMILIES):
        entry = family(name, top, device, args)
        summary["families"][name] = entry
        print(_line(name, entry), flush=True)
        path.write_text(json.dumps(summary, indent=1))
    return 0


def _line(name: str, e: dict) -> str:
    if "skipped" in e or "error" in e:
        return f"{name:13s} {'skipped' if 'skipped' in e else 'ERROR'}: {e.get('skipped') or e['error']}"
    iso = (f"isolated {e['both_isolated_ratio']:.4f} / in sequence {e['both_sequence_ratio']:.4f} over "
           f"{e['both']} signatures replayed both ways" if e.get("both") else "no isolated replay")
    return (f"{name:13s} failed cases {e.get('failed_cases', '-')}  in sequence {100 * e['sequence_share']:.1f}% of "
            f"the kernel time, sum ratio {e['sequence_ratio']:.4f}; {iso}; furthest: "
            f"{'; '.join(e['furthest'][:2])}")


if __name__ == "__main__":
    sys.exit(main())
