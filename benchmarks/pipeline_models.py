"""The seed-001 pipeline on model families built from transformers' own classes, through the CLI.

For each family: build the model from its transformers config class (random weights, bf16, no
download), profile a prefill and greedy decode steps on CUDA with record_shapes, then run the
chain as a user does, each step a command: `opperf import` (its printed pytest line is what
the replay runs), the replay sweep, `opperf backfill`, `opperf replay-report`. Prints per family
the share of kernel time mapped, replayed as the same computation, and the median |gap| over
signatures of 20 us or more; writes summary.json.

    python benchmarks/pipeline_models.py                       # every family
    python benchmarks/pipeline_models.py --family mixtral --family gpt2 --profile-only

Everything goes to $OUT/<family>/: trace.json.gz, profile.db, replay/*.yaml, results/, import.log,
replay.log, reports/replay_report.md, reports/duration_gap.csv; $OUT/summary.json.
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

ROOT = Path(__file__).resolve().parent.parent

# Small depths keep the replay short; widths as the published configs (or near them).
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
}


MOE = ("mixtral", "qwen3_moe", "deepseek_v3")


def build(family: str, device):
    import transformers

    config_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, config_cls)(**fields)
    settings = [("_attn_implementation", "sdpa")]
    if family in MOE:
        settings.append(("_experts_implementation", "grouped_mm"))
    for key, value in settings:
        try:
            setattr(config, key, value)
        except Exception as exc:  # noqa: BLE001  (a transformers without this setting: its default)
            print(f"{family}: {key} left at the default ({exc})")
    with torch.device(device):
        model = getattr(transformers, model_cls)(config)
    return model.to(torch.bfloat16).eval(), f"transformers {transformers.__version__} {model_cls}"


def run_model(model, ids, decode_steps: int) -> None:
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        past, logits = out.past_key_values, out.logits
        for _ in range(decode_steps):
            nxt = logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits
    torch.cuda.synchronize()


def profile_family(family: str, out: Path, prefill: int, decode: int) -> dict:
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model, impl = build(family, device)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prefill), device=device)
    run_model(model, ids, 2)  # warm-up: handles, allocator and lazy initialisation stay out of the profile
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run_model(model, ids, decode)
    raw = out / "trace.json"
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


def replay(family: str, out: Path, budget: str, timeout: int) -> dict:
    t0 = time.monotonic()
    code, text = cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--configs",
                      str(out / "replay"), "--force"], out / "import.log", 600)
    t_import = time.monotonic() - t0
    line = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("pytest ")), None)
    if code or line is None:
        return {"error": f"opperf import exited {code} without a replay command: see {out / 'import.log'}"}
    results = out / "results"
    cmd = shlex.split(line)[1:] + [f"--opperf-results={results}", f"--opperf-budget={budget}", "--opperf-target=2%",
                                   "--opperf-summary=0", "-q", "-p", "no:cacheprovider", "-rfE"]
    t1 = time.monotonic()
    with open(out / "replay.log", "w") as log:
        log.write(f"$ {line} ...\n")
        log.flush()
        try:
            subprocess.run([sys.executable, "-m", "pytest", *cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout)
            status = "finished"
        except subprocess.TimeoutExpired:
            status = f"stopped after {timeout} s (checkpointed rows kept)"
    t_replay = time.monotonic() - t1
    dbs = sorted(results.glob("*.db"))
    if not dbs:
        return {"error": f"no results database: see {out / 'replay.log'}"}
    cli(["backfill", str(out / "profile.db"), str(dbs[0])], out / "backfill.log", 120)
    cli(["replay-report", str(out / "profile.db"), "-o", str(out / "reports")], out / "report.log", 120)
    return {"replay": status, "seconds": {"import": round(t_import, 1), "replay": round(t_replay, 1)},
            **figures(out / "profile.db")}


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
    return {
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
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--budget", default="0.15", help="--opperf-budget of each replay sweep (seconds per case)")
    ap.add_argument("--replay-timeout", type=int, default=240)
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
            entry = profile_family(family, out, args.prefill, args.decode)
        except Exception as exc:  # noqa: BLE001  (one family that cannot be built does not stop the others)
            entry = {"error": f"{type(exc).__name__}: {exc}"}
        entry["seconds_profile"] = round(time.monotonic() - t0, 1)
        if "error" not in entry:
            if args.profile_only:
                code, text = cli(["import", str(out / "trace.json.gz"), "-o", str(out / "profile.db"), "--force"],
                                 out / "import.log", 600)
                entry.update(figures(out / "profile.db") if code == 0 else {"error": text[-2000:]})
            else:
                entry.update(replay(family, out, args.budget, args.replay_timeout))
        summary["families"][family] = entry
        print(json.dumps({family: entry}, indent=1), flush=True)
        (top / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
