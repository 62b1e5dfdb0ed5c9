"""The seed-001 pipeline on a real model: profile -> import -> replay -> backfill -> report.

Builds a Llama-3.2-1B-shaped model with random weights in bf16 (transformers' LlamaForCausalLM
from a LlamaConfig; a plain-torch Llama when transformers is missing), profiles a prefill of
2048 tokens and 16 decode steps on CUDA with record_shapes, imports the trace, replays the
mapped signatures through `pytest benches/ --opperf-config=...` in a subprocess (a small
precision budget), backfills the replayed times and writes the replay report. Prints the mapped
share of the profiled kernel time (target >= 90%), the gap statistics and the report's top rows.

    python benchmarks/pipeline_llama.py            # files -> $OUT (or a temp dir)
    python benchmarks/pipeline_llama.py --replay-timeout 150 --budget 0.3

Everything it writes goes to $OUT: trace.json.gz, profile.db, replay/*.yaml, results/<device>.db,
replay.log, reports/replay_report.md, reports/duration_gap.csv, summary.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_opperf.pipeline import backfill, configs, profile, replay_report  # noqa: E402

# Llama-3.2-1B (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json)
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                num_hidden_layers=16, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
                tie_word_embeddings=True, max_position_embeddings=131072)


def build_model(device):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        print(f"transformers not importable ({exc}): using the plain-torch Llama")
        return PlainLlama(**LLAMA_1B).to(device=device, dtype=torch.bfloat16).eval(), "plain-torch Llama"
    import transformers

    try:
        config = LlamaConfig(**LLAMA_1B)
        try:
            config._attn_implementation = "sdpa"
        except Exception as exc:  # noqa: BLE001  (a version without the setter: its default is SDPA too)
            print(f"attention implementation left at the default: {exc}")
        with torch.device(device):
            model = LlamaForCausalLM(config)
    except Exception as exc:  # noqa: BLE001  (an API change in a newer transformers: say so, run the plain model)
        print(f"transformers {transformers.__version__} could not build the model ({exc}): using the plain-torch Llama")
        return PlainLlama(**LLAMA_1B).to(device=device, dtype=torch.bfloat16).eval(), "plain-torch Llama"
    return model.to(torch.bfloat16).eval(), f"transformers {transformers.__version__} LlamaForCausalLM"


def run_model(model, ids, decode_steps: int, hf: bool):
    """Prefill of ids, then greedy decode steps with the KV cache."""
    with torch.no_grad():
        if hf:
            out = model(input_ids=ids, use_cache=True)
            past, logits = out.past_key_values, out.logits
            for _ in range(decode_steps):
                nxt = logits[:, -1:].argmax(-1)
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits
        else:
            logits, cache = model(ids, None)
            for _ in range(decode_steps):
                logits, cache = model(logits[:, -1:].argmax(-1), cache)
    torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--budget", default="0.3", help="--opperf-budget of the replay (seconds per case)")
    ap.add_argument("--target", default="2%", help="--opperf-target of the replay")
    ap.add_argument("--replay-timeout", type=int, default=150, help="seconds the replay sweep may take")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="pipeline-llama-"))
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    t0 = time.monotonic()
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    model, impl = build_model(device)
    hf = not isinstance(model, PlainLlama)
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (1, args.prefill), device=device)
    run_model(model, ids, 2, hf)  # warm-up: cuBLAS handles, allocator, lazy init stay out of the profile
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run_model(model, ids, args.decode, hf)
    raw = out / "trace.json"
    prof.export_chrome_trace(str(raw))
    trace = out / "trace.json.gz"
    with open(raw, "rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    del model
    torch.cuda.empty_cache()
    t_profile = time.monotonic() - t0

    db = out / "profile.db"
    rows = profile.import_profile(trace, db, force=True)
    files = profile.write_replay_configs(rows, out / "replay", str(trace))
    t_import = time.monotonic() - t0 - t_profile

    ops = [f.stem for f in files]
    results_dir = out / "results"
    cmd = [sys.executable, "-m", "pytest", "benches/", *[f"--opperf-config={f}" for f in files], "-m", " or ".join(ops),
           f"--opperf-results={results_dir}", f"--opperf-budget={args.budget}", f"--opperf-target={args.target}",
           "--opperf-flush-interval=10", "--opperf-summary=0", "-q", "-p", "no:cacheprovider", "-rs"]
    print("replay:", configs.pytest_command(files), f"--opperf-results={results_dir} --opperf-budget={args.budget}")
    with open(out / "replay.log", "w") as log:
        try:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.replay_timeout)
            replay_status = "finished"
        except subprocess.TimeoutExpired:
            replay_status = f"stopped after {args.replay_timeout} s (rows checkpointed so far kept)"
    t_replay = time.monotonic() - t0 - t_profile - t_import
    dbs = sorted(results_dir.glob("*.db"))
    if not dbs:
        print(f"no results database under {results_dir}: see {out / 'replay.log'}")
        return 1
    filled = backfill.backfill(db, dbs[0], "all")
    md, csv_path = replay_report.write(db, out / "reports", top=20)

    sigs = profile.load(db)
    t = replay_report.totals(sigs)
    big = [r for r in sigs if replay_report.gap(r) is not None and r["profiled_us_median"] >= replay_report.NOTE_MIN_US]
    gaps = [abs(replay_report.gap(r)) for r in big]
    beyond = [r for r in big if abs(replay_report.gap(r)) > replay_report.NOTE_GAP]
    summary = {
        "model": impl, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "prefill_tokens": args.prefill, "decode_steps": args.decode, "signatures": len(sigs),
        "kernel_time_us": t.total_us, "mapped_share": t.share(t.mapped_us), "exact_replayed_share": t.share(t.exact_us),
        "proxy_replayed_share": t.share(t.proxy_us), "unreplayed_share": t.share(t.unreplayed_us),
        "unreplayable_share": t.share(t.unreplayable_us), "unmapped_share": t.share(t.unmapped_us),
        "backfilled": filled.filled, "not_measured": len(filled.not_measured), "replay": replay_status,
        "signatures_20us_replayed": len(big), "median_abs_gap_20us": statistics.median(gaps) if gaps else None,
        "beyond_25pct_20us": len(beyond),
        "seconds": {"profile": round(t_profile, 1), "import": round(t_import, 1), "replay": round(t_replay, 1),
                    "total": round(time.monotonic() - t0, 1)},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    print(f"\n## Pipeline on {impl}, {summary['device']}, torch {torch.__version__}\n")
    print("| quantity | value |\n| --- | ---: |")
    print(f"| profiled kernel time | {t.total_us / 1000:.2f} ms ({len(sigs)} signatures) |")
    print(f"| mapped share of kernel time (target >= 90%) | {100 * summary['mapped_share']:.1f}% |")
    print(f"| replayed, same computation | {100 * summary['exact_replayed_share']:.1f}% |")
    print(f"| replayed by a stand-in op | {100 * summary['proxy_replayed_share']:.1f}% |")
    print(f"| mapped, not replayed | {100 * summary['unreplayed_share']:.1f}% |")
    print(f"| unreplayable / unmapped | {100 * summary['unreplayable_share']:.1f}% / "
          f"{100 * summary['unmapped_share']:.1f}% |")
    med = summary["median_abs_gap_20us"]
    print(f"| signatures >= 20 us replayed | {len(big)} |")
    print(f"| median abs(gap) of those (target <= 10%) | {'-' if med is None else f'{100 * med:.1f}%'} |")
    print(f"| of those beyond 25% (each in the report's notes) | {len(beyond)} |")
    print(f"| replay sweep | {replay_status}, {summary['backfilled']} backfilled, {summary['not_measured']} not measured |")
    print(f"| seconds: profile / import / replay / total | {t_profile:.0f} / {t_import:.0f} / {t_replay:.0f} / "
          f"{time.monotonic() - t0:.0f} |")
    report = md.read_text()
    print("\n" + report.split("## Unreplayable", 1)[0])
    print(f"files in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


class PlainLlama(torch.nn.Module):
    """A Llama decoder in plain torch, for images without transformers: the same ops as the eager HF model."""

    def __init__(self, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim,
                 num_hidden_layers, vocab_size, rms_norm_eps, rope_theta, **_):
        super().__init__()
        self.h, self.hq, self.hkv, self.d, self.eps = hidden_size, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps
        self.embed = torch.nn.Embedding(vocab_size, hidden_size)
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            q=lin(hidden_size, self.hq * head_dim), k=lin(hidden_size, self.hkv * head_dim),
            v=lin(hidden_size, self.hkv * head_dim), o=lin(self.hq * head_dim, hidden_size),
            gate=lin(hidden_size, intermediate_size), up=lin(hidden_size, intermediate_size),
            down=lin(intermediate_size, hidden_size))) for _ in range(num_hidden_layers))
        self.norm_w = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(hidden_size))
                                             for _ in range(2 * num_hidden_layers + 1))
        self.register_buffer("inv_freq", 1.0 / rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))

    def norm(self, x, i):
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_w[i] * xf.to(x.dtype)

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, ids, cache):
        b, s = ids.shape
        start = 0 if cache is None else cache[0][0].shape[2]
        pos = torch.arange(start, start + s, device=ids.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
        x = self.embed(ids)
        new_cache = []
        for i, layer in enumerate(self.layers):
            y = self.norm(x, 2 * i)
            q = layer["q"](y).view(b, s, self.hq, self.d).transpose(1, 2)
            k = layer["k"](y).view(b, s, self.hkv, self.d).transpose(1, 2)
            v = layer["v"](y).view(b, s, self.hkv, self.d).transpose(1, 2)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            if cache is not None:
                k, v = torch.cat((cache[i][0], k), dim=2), torch.cat((cache[i][1], v), dim=2)
            new_cache.append((k, v))
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache is None, enable_gqa=True)
            x = x + layer["o"](att.transpose(1, 2).reshape(b, s, self.hq * self.d))
            y = self.norm(x, 2 * i + 1)
            x = x + layer["down"](torch.nn.functional.silu(layer["gate"](y)) * layer["up"](y))
        x = self.norm(x, 2 * len(self.layers))
        return x @ self.embed.weight.t(), new_cache


if __name__ == "__main__":
    sys.exit(main())
