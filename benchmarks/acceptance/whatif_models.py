"""What-ifs against real swaps: the model's step predicted with a backend swapped, against the swap made.

One model (WHAT_IF: a Llama with multi-head attention) profiled both ways --whatif-profiles times each
(5), alternating, each phase's kernel time read from the trace: SDPA held to its flash kernel and to
its memory-efficient one at each prompt length (``--prefills``), the flash profile's ``opperf sequence
--backend attention_prefill=sdpa_efficient --backend attention_decode=sdpa_efficient`` predicting the
swap; and the model's eager RMSNorm against its RMSNorm modules computed by the catalogue's Triton
rmsnorm, the eager profile's ``opperf sequence --replace LlamaRMSNorm=rmsnorm:triton`` predicting the
swap. Per phase, what a user reads: the swapped step predicted against the swapped step profiled (the
median of its profiles, their spread beside it), and the predicted change against the changes of
every pair of profiles (one each way): inside their range or not.

    python benchmarks/acceptance/whatif_models.py --prefills 2048,4096 --norm-prefill 2048
    python benchmarks/acceptance/whatif_models.py --prefills 2048 --swaps norm,sdpa

Profiling and the sequence replay are sequence_models.py's. Everything goes to $OUT/<swap>-<prefill>/
and $OUT/whatif_summary.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_models as pm  # noqa: E402  (the chain's steps: cli)

from families import WHAT_IF  # noqa: E402
from sequence_models import furthest, profile, sequence, setup, trace_phases  # noqa: E402


def what_if(top: Path, device, args) -> dict:
    """Two real swaps against their what-ifs: SDPA's flash kernel -> its memory-efficient one at each
    prompt length (--prefills), and the model's eager RMSNorm -> the catalogue's Triton rmsnorm
    (--norm-prefill)."""
    out = {f"sdpa-{n}": _swap(top / f"sdpa-{n}", device, n, args.decode, args.whatif_profiles, WHAT_IF, False,
                              "sdpa", ("flash", dict(kernel="flash")), ("efficient", dict(kernel="efficient")),
                              ("attention_prefill=sdpa_efficient", "attention_decode=sdpa_efficient"))
           for n in (args.prefills if "sdpa" in args.swaps else [])}
    if args.norm_prefill and "norm" in args.swaps:
        n = args.norm_prefill
        out[f"norm-{n}"] = _swap(top / f"norm-{n}", device, n, args.decode, args.whatif_profiles, WHAT_IF, False,
                                 "sdpa", ("eager", {}), ("triton", dict(swap=triton_norms)),
                                 ("LlamaRMSNorm=rmsnorm:triton",))
    return out


def triton_norms(model) -> str:
    """The model's RMSNorm modules computed by the catalogue's Triton rmsnorm (the backend the
    what-if replays): the real swap."""
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS

    load_builtin()
    fn = BACKENDS[("rmsnorm", "triton")].fn
    swapped = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = lambda x, w=module.weight: fn(x.reshape(-1, x.shape[-1]), w).view(x.shape)
            swapped += 1
    return f"{swapped} RMSNorm modules on rmsnorm/triton"


def _swap(top: Path, device, prefill: int, decode: int, repeats: int, spec: tuple, moe: bool, attention: str,
          before: tuple, after: tuple, backends: tuple) -> dict:
    """Profile SPEC both ways REPEATS times, alternating, each phase's kernel time read from the trace;
    import the first profile of the BEFORE way and ask `opperf sequence --backend ...` for the swap.
    Per phase, what a user reads: the swapped step predicted against the swapped step profiled (the
    median of its profiles), and the predicted change against the profiled changes of every pair of
    profiles (one each way), with each way's spread; and the kernels whose time the real swap moved."""
    runs: dict = {before[0]: [], after[0]: []}
    kernels: dict = {}
    for r in range(repeats):
        for name, kw in (before, after):
            out = top / f"{name}-{r}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            profile(spec, out, device, prefill, decode, moe, attention=attention, **kw)
            runs[name].append(trace_phases(out / "trace.json.gz"))
            if r == 0:
                kernels[name] = trace_phases(out / "trace.json.gz", by_kernel=True)
    first = top / f"{before[0]}-0"
    code, text = pm.cli(["import", str(first / "trace.json.gz"), "-o", str(first / "profile.db"), "--force"],
                        first / "import.log", 600)
    if code:
        return {"error": f"import of the {before[0]} profile: {text[-1500:]}"}
    predicted = sequence(first, str(device), backends)
    if "error" in predicted:
        return predicted
    out = {"prefill": prefill, "decode": decode, "profiles_each_way": repeats, "backends": list(backends),
           "left_out": predicted.get("left_out", [])[:5], "furthest_calls": furthest(first / "profile.db", 8),
           "phases": {}}
    for ph in predicted["phases"]:
        name = ph["phase"]
        a = [r.get(name) for r in runs[before[0]] if r.get(name) is not None]
        b = [r.get(name) for r in runs[after[0]] if r.get(name) is not None]
        if not a or not b or runs[before[0]][0].get(name) is None:
            continue
        # calls the sequence did not replay keep their profiled time in both predicted steps
        kept = runs[before[0]][0][name] - ph["profiled_us"]
        step_before, step_after = ph["sequence_us"] + kept, ph["what_if_us"] + kept
        changes = sorted(y - x for x in a for y in b)
        predicted_change = ph["what_if_us"] - ph["sequence_us"]
        profiled_change = statistics.median(b) - statistics.median(a)
        out["phases"][name] = {
            f"profiled_{before[0]}_us": a, f"profiled_{after[0]}_us": b,
            "predicted_before_us": step_before, "predicted_after_us": step_after,
            "before_error": step_before / statistics.median(a) - 1,
            "after_error": step_after / statistics.median(b) - 1,
            "before_spread": max(a) / min(a) - 1, "after_spread": max(b) / min(b) - 1,
            "profiled_change_us": profiled_change, "profiled_changes_us": [changes[0], changes[-1]],
            "predicted_change_us": predicted_change,
            "change_inside_spread": changes[0] <= predicted_change <= changes[-1],
            "change_error": (predicted_change / profiled_change - 1) if profiled_change else None,
            "in_sequence_us": ph["sequence_us"], "what_if_us": ph["what_if_us"],
            "profiled_replayed_us": ph["profiled_us"],
            "kernels_moved_us": moved(kernels[before[0]].get(name, {}), kernels[after[0]].get(name, {}))}
    return out


def moved(before: dict, after: dict, top: int = 8) -> list:
    """The kernels whose time (us, a phase of one profile each way) the real swap moved most."""
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*before, *after}}
    return [[k[:90], round(v, 1)] for k, v in sorted(deltas.items(), key=lambda kv: -abs(kv[1]))[:top]]


def whatif_lines(result: dict) -> list:
    """One line per swap and phase: the swapped step predicted against profiled, the change in its spread."""
    lines = []
    for swap, r in result.items():
        if "error" in r:
            lines.append(f"{swap}: ERROR {r['error'][:300]}")
            continue
        for phase, v in r["phases"].items():
            lo, hi = v["profiled_changes_us"]
            lines.append(
                f"{swap} {phase}: swapped step predicted / profiled {1 + v['after_error']:.4f} (its {r['profiles_each_way']} "
                f"profiles spread {100 * v['after_spread']:.1f}%; unswapped {1 + v['before_error']:.4f}); change predicted "
                f"{v['predicted_change_us']:+.1f} us, profiled {v['profiled_change_us']:+.1f} (pairs {lo:+.1f} .. {hi:+.1f}): "
                f"{'inside' if v['change_inside_spread'] else 'OUTSIDE'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefills", type=lambda t: [int(x) for x in t.split(",")], default=[2048],
                    help="prompt lengths of the SDPA swap, comma-separated (default 2048)")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--whatif-profiles", type=int, default=5,
                    help="profiles each way (default 5: their spread below the error claimed)")
    ap.add_argument("--swaps", type=lambda t: t.split(","), default=["sdpa", "norm"],
                    help="which real swaps, comma-separated (default sdpa,norm)")
    ap.add_argument("--norm-prefill", type=int, default=2048,
                    help="the norm swap's prompt length (default 2048; 0: no norm swap)")
    args = ap.parse_args()
    device, top, head = setup(args.device, "whatif-models-")
    if device is None:
        return 1
    summary = {**head, "decode": args.decode}
    summary["what_if"] = what_if(top, device, args)
    summary["what_if_lines"] = whatif_lines(summary["what_if"])
    (top / "whatif_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["what_if"], indent=1))
    print("\n".join(summary["what_if_lines"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
