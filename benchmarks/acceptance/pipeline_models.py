"""The seed-001 pipeline on model families built from transformers' own classes, through the CLI.

For each family: build the model from its transformers config class (random weights, bf16, no
download), profile a prefill and greedy decode steps on CUDA with record_shapes inside
pytest_opperf.pipeline.reading.capture (the experts' routing is saved beside the trace), then run the chain
as a user does, each step a command: `opperf import` (its printed pytest lines, one per cache
state, are what the replay runs), the replay sweeps, `opperf backfill`, `opperf replay-report`.
Prints per family one line: the share of kernel time mapped, the failed replay cases, the sum
ratio (replayed x count over profiled x count, over the replayed signatures) and the
time-weighted |error|; with --states both (the default) every sweep runs again in the cold and hot
states it was not written for, and a second line gives the sum ratio / weighted |error| of the
chosen states, of all cold and of all hot (summary.json: "states"; the replay report shows the
same bounds). Every sweep runs to its end unless --replay-timeout sets a limit. A family whose
classes this transformers lacks is a `skipped` line, not a failure.

    python benchmarks/acceptance/pipeline_models.py                       # every family, small widths, both states
    python benchmarks/acceptance/pipeline_models.py --states chosen       # the chosen state only: half the replay time
    python benchmarks/acceptance/pipeline_models.py --cache-rule inputs   # a cache state per input (opperf import --cache-rule)
    python benchmarks/acceptance/pipeline_models.py --family gemma2 --family mamba --size published

Everything goes to $OUT/<family>/: trace.json.gz, trace.capture.json, profile.db, replay/*.yaml,
results/, import.log, replay.log, reports/replay_report.md, reports/duration_gap.csv; $OUT/summary.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# name -> (config class, model class, the published widths at a small depth). Last round's five
# first; then the families of issue 37: soft-capped logits (Gemma2), attention sinks and experts
# with biases (GPT-OSS), fused qkv and gate_up projections (Phi-3), a state-space model (Mamba),
# and Qwen2 (biases on q/k/v).
FAMILIES = {
    # Llama-3.2-1B's widths (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json), 2 layers.
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        num_hidden_layers=2, vocab_size=128256, tie_word_embeddings=False)),
    # GPT-2 small (https://huggingface.co/openai-community/gpt2/blob/main/config.json): its LM head is wte, tied.
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=768, n_layer=4, n_head=12, vocab_size=50257,
                                                  n_positions=2048, tie_word_embeddings=True)),
    # Mixtral-8x7B's routing (8 experts, top-2) at a quarter of its widths, 2 layers.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=1024, intermediate_size=3584, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    # Qwen3-30B-A3B's experts (128, top-8, 768 wide) and attention, 2 layers.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_hidden_layers=2, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, decoder_sparse_step=1, mlp_only_layers=[])),
    # DeepSeek-V3's MLA (q/kv LoRA ranks, rope/nope split) and routing (256 experts, top-8, groups) at
    # half its width, 1 dense layer + 1 MoE layer.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        hidden_size=3584, intermediate_size=9216, moe_intermediate_size=1024, num_attention_heads=64,
        num_key_value_heads=64, q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4, vocab_size=32000)),
    # Gemma-2-2B (https://huggingface.co/google/gemma-2-2b/blob/main/config.json): logits soft-capped at
    # 30 (logits / 30, tanh, * 30), attention logits at 50; eager attention keeps the cap. 2 layers.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        num_hidden_layers=2, vocab_size=256000, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
        sliding_window=4096, pad_token_id=0)),
    # gpt-oss-20b (https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json): attention sinks,
    # 32 experts top-4 with biases, alternating sliding/full attention; 2 layers, bf16 (no MXFP4).
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_hidden_layers=2, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0)),
    # Phi-3-mini (https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json): one fused
    # qkv_proj and one fused gate_up_proj per layer; 2 layers.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
        num_hidden_layers=2, vocab_size=32064, pad_token_id=0)),
    # Mamba-130m (https://huggingface.co/state-spaces/mamba-130m-hf/blob/main/config.json): a selective
    # state-space model, no attention; 2 layers.
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(
        hidden_size=768, state_size=16, expand=2, conv_kernel=4, num_hidden_layers=2, vocab_size=50280,
        pad_token_id=0)),
    # Qwen2.5-0.5B (https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json): biases on q, k, v; 2 layers.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=151936, tie_word_embeddings=True)),
}
# --size small (the default): the same structure at widths that let a family profile, import, replay
# and report in a few minutes (run families one call each where a call is time-limited); the routing
# (experts, top-k) as published.
SMALL = {
    "llama": dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2,
                  vocab_size=32000),
    "gpt2": dict(n_embd=384, n_layer=2, n_head=6, vocab_size=32000),
    "mixtral": dict(hidden_size=512, intermediate_size=1024),
    "qwen3_moe": dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, num_attention_heads=8,
                      head_dim=64, num_experts=32, vocab_size=32000),
    "deepseek_v3": dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, num_attention_heads=8,
                        num_key_value_heads=8, q_lora_rank=192, kv_lora_rank=128, n_routed_experts=32),
    "gemma2": dict(hidden_size=512, intermediate_size=2048, head_dim=64, vocab_size=32000),
    "gpt_oss": dict(hidden_size=512, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                    vocab_size=32000),
    "phi3": dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8),
    "mamba": dict(hidden_size=512, vocab_size=32000),
    "qwen2": dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2,
                  vocab_size=32000),
}
MOE = ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss")
ATTENTION = {"gemma2": "eager", "gpt_oss": "eager"}  # sdpa drops Gemma-2's soft-cap; GPT-OSS (sinks) has no sdpa path
STATE_SPACE = ("mamba",)


class Missing(Exception):
    """This transformers has no such class: the family is skipped, not failed."""


def build(family: str, device, size: str):
    import transformers

    config_name, model_name, fields = FAMILIES[family]
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        raise Missing(f"transformers {transformers.__version__} has no {config_name if config_cls is None else model_name}")
    config = config_cls(**{**fields, **(SMALL[family] if size == "small" else {})})
    settings = [] if family in STATE_SPACE else [("_attn_implementation", ATTENTION.get(family, "sdpa"))]
    if family in MOE:
        settings.append(("_experts_implementation", "grouped_mm"))
    for key, value in settings:
        try:
            setattr(config, key, value)
        except Exception as exc:  # noqa: BLE001  (a transformers without this setting: its default)
            print(f"{family}: {key} left at the default ({exc})")
    with torch.device(device):
        model = model_cls(config)
    return model.to(torch.bfloat16).eval(), f"transformers {transformers.__version__} {model_name}"


def run_model(model, ids, decode_steps: int) -> None:
    if getattr(model.config, "model_type", "") in STATE_SPACE:
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=decode_steps, min_new_tokens=decode_steps, do_sample=False,
                           pad_token_id=0)
        torch.cuda.synchronize()
        return
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        past, logits = out.past_key_values, out.logits
        for _ in range(decode_steps):
            nxt = logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits
    torch.cuda.synchronize()


def profile_family(family: str, out: Path, prefill: int, decode: int, size: str) -> dict:
    from pytest_opperf.pipeline.reading.capture import capture

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model, impl = build(family, device, size)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prefill), device=device)
    run_model(model, ids, 2)  # warm-up: handles, allocator and lazy initialisation stay out of the profile
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    raw = out / "trace.json"
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof, capture(out / "trace.json.gz", model):
        run_model(model, ids, decode)
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    del model
    torch.cuda.empty_cache()
    return {"model": impl}


def cli(args: list, log: Path, timeout: int) -> tuple[int, str]:
    """One opperf command as a user types it (python -m pytest_opperf.cli ...); output to log."""
    cmd = [sys.executable, "-m", "pytest_opperf.cli", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    log.write_text(f"$ opperf {shlex.join(args)}\n{done.stdout}{done.stderr}")
    return done.returncode, done.stdout + done.stderr


def replay(family: str, out: Path, budget: str, timeout: int, states: str, cache_rule: str = "signature") -> dict:
    t0 = time.monotonic()
    code, text = cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--configs",
                      str(out / "replay"), "--cache-rule", cache_rule, "--force"], out / "import.log", 600)
    t_import = time.monotonic() - t0
    sweeps = _sweeps(text)
    if code or not sweeps:
        return {"error": f"opperf import exited {code} without a replay command: see {out / 'import.log'}"}
    chosen = len(sweeps)
    if states == "both":  # each sweep again in the states it was not written for: what all cold and all hot give
        sweeps += [(line, other) for line, first in sweeps for other in ("cold", "hot") if other != first]
    results = out / "results"
    t1 = time.monotonic()
    status, failed, failed_other = "finished", 0, 0
    started = t1
    with open(out / "replay.log", "w") as log:
        for k, (line, state) in enumerate(sweeps):
            if k == chosen:  # the other state's sweeps get a budget of their own
                started = time.monotonic()
            cmd = shlex.split(line)[1:] + [f"--opperf-results={results}", f"--opperf-budget={budget}",
                                           f"--opperf-cache={state}", "--opperf-target=2%", "--opperf-summary=0", "-q",
                                           "-p", "no:cacheprovider", "-rfE"]
            log.write(f"$ {line} --opperf-cache={state} ...\n")
            log.flush()
            left = max(10.0, timeout - (time.monotonic() - started)) if timeout else None  # 0: to the end
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", *cmd], cwd=ROOT, capture_output=True,
                                      text=True, timeout=left)
                log.write(done.stdout + done.stderr)
                found = re.search(r"(\d+) failed", done.stdout.splitlines()[-1] if done.stdout.strip() else "")
                if k < chosen:
                    failed += int(found.group(1)) if found else 0
                else:
                    failed_other += int(found.group(1)) if found else 0
            except subprocess.TimeoutExpired as exc:
                log.write(str(exc.stdout or ""))
                status = f"a {state} sweep stopped after {timeout} s (checkpointed rows kept)"
    t_replay = time.monotonic() - t1
    dbs = sorted(results.glob("*.db"))
    if not dbs:
        return {"error": f"no results database: see {out / 'replay.log'}"}
    cli(["backfill", str(out / "profile.db"), str(dbs[0])], out / "backfill.log", 120)
    cli(["replay-report", str(out / "profile.db"), "-o", str(out / "reports"), "--results", str(dbs[0])],
        out / "report.log", 120)
    return {"replay": status, "failed_cases": failed, "failed_cases_other_state": failed_other,
            "seconds": {"import": round(t_import, 1), "replay": round(t_replay, 1)}, **figures(out / "profile.db"),
            "states": state_figures(out / "profile.db", dbs[0])}


def _sweeps(text: str) -> list:
    """(pytest line, the cache state its configs name) for each sweep opperf import printed."""
    out, state = [], "cold"
    for ln in text.splitlines():
        found = re.search(r"replay configs \((\w+) cache\)", ln)
        if found:
            state = found.group(1)
        elif ln.strip().startswith("pytest "):
            out.append((ln.strip(), state))
    return out


def state_figures(db: Path, results_db: Path) -> dict:
    """Over the signatures replayed in every state they need: the sum ratio and weighted |error| of
    the chosen states, of all cold and of all hot (which cache rule lands the model's sum)."""
    from pytest_opperf.pipeline.replay.backfill import replayed_by_state
    from pytest_opperf.pipeline.mapping.profile import load
    from pytest_opperf.pipeline.replay.report import bounds

    b = bounds(load(db), replayed_by_state(db, results_db))
    if b is None:
        return {"signatures": 0, "share": 0.0}
    return {"signatures": b.signatures, "share": b.covered,
            **{name: {"sum_ratio": m.ratio, "weighted_error": m.weighted_error}
               for name, m in (("chosen", b.chosen), ("cold", b.cold), ("hot", b.hot))}}


def figures(db: Path) -> dict:
    with sqlite3.connect(db) as con:
        con.row_factory = sqlite3.Row
        rows = [dict(r) for r in con.execute("SELECT * FROM signatures")]
    total = sum(r["profiled_total_us"] for r in rows) or 1.0
    mapped = sum(r["profiled_total_us"] for r in rows if r["status"] == "mapped")
    same = sum(r["profiled_total_us"] for r in rows if r["status"] == "mapped" and not r["proxy"]
               and r["replayed_us"] is not None)
    big = [r for r in rows if r["replayed_us"] is not None and r["profiled_us_median"] >= 20]
    gaps = [abs(r["replayed_us"] / r["profiled_us_median"] - 1) for r in big]
    unmapped: dict[str, float] = {}
    for r in rows:
        if r["status"] != "mapped":
            unmapped[f"{r['status']}: {r['op_type']}"] = unmapped.get(f"{r['status']}: {r['op_type']}", 0) + \
                r["profiled_total_us"] / total
    worst = sorted(big, key=lambda r: -abs(r["replayed_us"] / r["profiled_us_median"] - 1))[:5]
    from pytest_opperf.pipeline.replay.report import model_figures

    model = model_figures(rows)
    return {
        "sum_ratio": model.ratio, "weighted_error": model.weighted_error, "replayed_share": model.covered,
        "hot_share": sum(r["profiled_total_us"] for r in rows if r.get("cache") == "hot") / total,
        "signatures": len(rows), "kernel_time_us": round(total, 1), "mapped_share": mapped / total,
        "same_computation_replayed_share": same / total, "signatures_20us": len(big),
        "median_abs_gap_20us": statistics.median(gaps) if gaps else None,
        "beyond_25pct_20us": sum(g > 0.25 for g in gaps),
        "not_mapped": dict(sorted(unmapped.items(), key=lambda kv: -kv[1])[:8]),
        "worst_gaps": [f"{r['op_type']} [{r['input_shapes']}] {r['profiled_us_median']:.1f} -> {r['replayed_us']:.1f} us"
                       for r in worst],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="repeatable; default: all")
    ap.add_argument("--size", choices=("small", "published"), default="small",
                    help="small: widths a family replays in minutes; published: the widths of FAMILIES")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--budget", default="0.05", help="--opperf-budget of each replay sweep (seconds per case)")
    ap.add_argument("--replay-timeout", type=int, default=0,
                    help="seconds for one family's replay sweeps in its chosen states, and again for the others "
                         "(default 0: every sweep runs to its end)")
    ap.add_argument("--states", choices=("both", "chosen"), default="both",
                    help="both: every sweep also in the cold and hot states it was not written for (all-cold and "
                         "all-hot sums beside the chosen one's); chosen: each signature in its chosen state only")
    ap.add_argument("--cache-rule", choices=("signature", "inputs"), default="signature",
                    help="opperf import --cache-rule: one cache state per signature, or one per input")
    ap.add_argument("--profile-only", action="store_true", help="profile and import; no replay")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    top = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="pipeline-models-"))
    summary = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "prefill": args.prefill,
               "decode": args.decode, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "families": {}}
    for family in args.family or list(FAMILIES):
        out = top / family
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        t0 = time.monotonic()
        try:
            entry = profile_family(family, out, args.prefill, args.decode, args.size)
        except Missing as exc:
            entry = {"skipped": str(exc)}
        except Exception as exc:  # noqa: BLE001  (one family that cannot be built does not stop the others)
            entry = {"error": f"{type(exc).__name__}: {exc}"}
        entry["seconds_profile"] = round(time.monotonic() - t0, 1)
        if "error" not in entry and "skipped" not in entry:
            if args.profile_only:
                code, text = cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--force"],
                                 out / "import.log", 600)
                entry.update(figures(out / "profile.db") if code == 0 else {"error": text[-2000:]})
            else:
                entry.update(replay(family, out, args.budget, args.replay_timeout, args.states, args.cache_rule))
        summary["families"][family] = entry
        print(_line(family, entry), flush=True)
        (top / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


def _line(family: str, entry: dict) -> str:
    """One family's figures: mapped %, failed replay cases, sum ratio, weighted |error|; and a second
    line with the sums under the chosen states, all cold and all hot where both were replayed."""
    if "skipped" in entry or "error" in entry:
        return f"{family:12s} {'skipped' if 'skipped' in entry else 'ERROR'}: {entry.get('skipped') or entry['error']}"
    ratio, error = entry.get("sum_ratio"), entry.get("weighted_error")
    text = (f"{family:12s} mapped {100 * entry['mapped_share']:5.1f}%  failed cases {entry.get('failed_cases', '-')}  "
            f"sum ratio {_ratio(ratio)}  weighted |error| {_pct(error)}  (replayed "
            f"{100 * entry.get('replayed_share', 0):.1f}% of the kernel time, hot {100 * entry.get('hot_share', 0):.1f}%; "
            f"{entry.get('replay', 'profile only')})")
    states = entry.get("states")
    if states and states.get("signatures"):
        text += f"\n{'':12s} over the {100 * states['share']:.1f}% of the time replayed in both states: " + ", ".join(
            f"{name} {_ratio(states[name]['sum_ratio'])} / {_pct(states[name]['weighted_error'])}"
            for name in ("chosen", "cold", "hot")) + " (sum ratio / weighted |error|)"
    return text


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
