"""opperf predict's trace: a model's calls recorded on the meta device, as a profile of it records them.

The traced calls of a small dense and a small MoE transformers model equal the calls of a CPU profile
of the same model (op, shapes, strides, counts, phases, links); the calls a GPU would launch kernels
for are those two H100 traces launched them for; refusals are one line; the routing assumption is
named in the answer."""

import gzip
import json
import os
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.predict import answer, launches, model, price, trace
from pytest_opperf.pipeline.reading.signature import ProfileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TRACES = Path(__file__).parent / "data" / "traces"
DENSE = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=256, max_position_embeddings=512)
MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
           decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2, vocab_size=256,
           max_position_embeddings=512)


def _config(tmp_path: Path, fields: dict, dtype: str) -> Path:
    path = tmp_path / f"{fields['model_type']}.json"
    path.write_text(json.dumps({**fields, "dtype": dtype}))
    return path


def _calls(db: Path) -> list:
    """(op, shapes, strides, phase, step, links) of each call in order, from a profile database; a
    dim of size 1 has no stride that matters (meta and CPU kernels pick different ones): shown as *."""
    con = sqlite3.connect(db)
    rows = con.execute("SELECT s.op_type, s.input_shapes, s.input_strides, c.phase, c.step, c.links FROM calls c "
                       "JOIN signatures s ON s.id = c.signature ORDER BY c.position").fetchall()
    con.close()
    return [(op, shapes, _strides(shapes, strides), *rest) for op, shapes, strides, *rest in rows]


def _strides(shapes: str, strides) -> str:
    def each(shape: str, stride: str) -> str:
        dims, steps = shape.split(","), stride.split(",")
        if len(dims) != len(steps) or not shape:
            return stride
        return ",".join("*" if d == "1" else s for d, s in zip(dims, steps))

    if not strides:
        return strides
    return ";".join("+".join(each(a, b) for a, b in zip(sh.split("+"), st.split("+")))
                    for sh, st in zip(shapes.split(";"), strides.split(";")))


def _cpu_profile(config: Path, out: Path, batch: int, prefill: int, decode: int) -> Path:
    """The model run for real on the CPU under torch.profiler and capture, the trace's calls that
    launch marked as trace.py marks a meta run's: the profile the trace must equal."""
    from torch.profiler import ProfilerActivity, profile

    from pytest_opperf.pipeline.mapping import profile as profile_db
    from pytest_opperf.pipeline.reading.capture import capture

    real = model.build(str(config), attention="eager", device="cpu")
    torch.manual_seed(0)
    ids = torch.randint(0, real.vocab, (batch, prefill))
    out.mkdir(parents=True, exist_ok=True)
    raw, path = out / "raw.json", out / "trace.json.gz"
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
            capture(path, real.module):
        trace.steps(real.module, {"input_ids": ids}, decode, trace.logits_kept(real.module))
    prof.export_chrome_trace(str(raw))
    launches.with_launches(raw, path)
    profile_db.import_profile(path, out / "profile.db", force=True)
    return out / "profile.db"


def _traced(config: Path, out: Path, batch: int, prefill: int, decode: int, experts=None) -> tuple:
    built = model.build(str(config), attention="eager")
    traced = trace.record(built, batch, prefill, decode, out, "auto", experts)
    rows, _ = answer._import(traced.trace, out / "profile.db", None)
    return out / "profile.db", traced


@pytest.mark.parametrize("fields,dtype", [(DENSE, "float32"), (MOE, "bfloat16")], ids=["dense", "moe"])
def test_the_traced_calls_equal_the_calls_of_a_cpu_profile_of_the_model(tmp_path, fields, dtype):
    config = _config(tmp_path, fields, dtype)
    profiled = _calls(_cpu_profile(config, tmp_path / "profile", 2, 12, 3))
    traced_db, traced = _traced(config, tmp_path / "trace", 2, 12, 3, trace.Even())
    got = _calls(traced_db)
    assert [c[:5] for c in got] == [c[:5] for c in profiled]
    assert [c[5] for c in got] == [c[5] for c in profiled]  # every call reads what the same call wrote
    assert sum(1 for c in got if c[5]) > len(got) // 2
    assert {c[3] for c in got} == {"prefill", "decode", ""} and len({c[4] for c in got if c[3] == "decode"}) == 3
    names = Counter(c[0] for c in got)
    if fields is MOE:  # the routing's calls are there, and the grouped GEMMs took the assumption's offsets
        assert names["aten::_grouped_mm"] == 2 * 2 * 4 and names["aten::topk"] and names["aten::histc"]
        capture = json.loads((tmp_path / "trace" / "trace.capture.json").read_text())
        # prefill: 2 x 12 tokens, top 2 -> 48 rows over 8 experts, 6 each; decode: 4 rows, one each for 4
        assert capture["grouped_mm_offsets"][0] == [6, 12, 18, 24, 30, 36, 42, 48]
        assert capture["grouped_mm_offsets"][-1] == [1, 2, 3, 4, 4, 4, 4, 4]
        assert traced.experts.startswith("even: rows spread evenly over the experts (16 calls of 8 experts; 4-8 "
                                         "experts touched a call)")
    with sqlite3.connect(traced_db) as con:  # the leaf modules, for --replace: each norm's calls
        classes = {r[0] for r in con.execute("SELECT class FROM modules")}
    con.close()
    assert any(c.endswith("RMSNorm") for c in classes)


@pytest.mark.parametrize("name", ["h100_gemma2_tf517.json.gz", "h100_deepseek_v3_tf517.json.gz"])
def test_the_calls_marked_to_launch_are_the_calls_that_launched_kernels_on_an_h100(name):
    data = json.loads(gzip.open(TRACES / name, "rt").read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"),
                 key=lambda e: (e.get("pid"), e.get("tid"), e["ts"], -e["dur"]))
    parents = launches._parents(ops)

    def top(i):
        while parents[i] is not None:
            i = parents[i]
        return i

    index = {e["args"].get("External id"): i for i, e in enumerate(ops)}
    launched = {top(index[e["args"]["External id"]]) for e in events
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("External id") in index}
    marked = {top(i) for i in launches.launchers(ops)}
    assert len(launched) > 1500
    assert launched <= marked  # every call that launched a kernel is marked
    extra = Counter(ops[i]["name"] for i in marked - launched)
    assert sum(extra.values()) <= 5 and set(extra) <= {"aten::to"}, extra  # a few host-to-device copies


def test_a_gelu_decomposed_on_meta_launches_as_one_call():
    ops = [{"name": "aten::gelu", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
           {"name": "aten::mul", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},
           {"name": "aten::tanh", "pid": 1, "tid": 1, "ts": 3.0, "dur": 1.0},
           {"name": "aten::_to_copy", "pid": 1, "tid": 1, "ts": 20.0, "dur": 5.0},
           {"name": "aten::empty_strided", "pid": 1, "tid": 1, "ts": 21.0, "dur": 1.0},
           {"name": "aten::copy_", "pid": 1, "tid": 1, "ts": 23.0, "dur": 1.0},
           {"name": "aten::view", "pid": 1, "tid": 1, "ts": 30.0, "dur": 1.0}]
    assert [ops[i]["name"] for i in launches.launchers(ops)] == ["aten::gelu", "aten::copy_"]


def test_even_and_profile_shares_of_the_rows():
    assert trace.Even()(10, 4) == [3, 6, 8, 10]  # 3, 3, 2, 2
    assert trace.Even()(2, 4) == [1, 2, 2, 2]
    shares = trace.Shares({4: [0.5, 0.25, 0.25, 0.0]}, "p.db")
    assert shares(8, 4) == [4, 6, 8, 8]
    assert shares(3, 4) == [2, 3, 3, 3] or shares(3, 4) == [1, 2, 3, 3]  # 1.5, .75, .75: one rounds up
    assert shares(6, 2) == [3, 6]  # no profile call of 2 experts: even


def test_a_model_that_cannot_run_on_meta_is_one_line_naming_module_and_call(tmp_path, capsys, monkeypatch):
    (tmp_path / "datadep.py").write_text(
        "import torch\n"
        "class Gate(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x[x > 0]\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(16, 8)\n"
        "        self.gate = Gate()\n"
        "    def forward(self, input_ids, use_cache=True, past_key_values=None):\n"
        "        return self.gate(self.emb(input_ids))\n"
        "def build():\n"
        "    return Net()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert main(["predict", "datadep:build", "--measure", "--measure-device", "cpu", "--prefill", "4", "-o",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "module gate (Gate)" in err[0] and "call aten::" in err[0], err
    assert not list(out.rglob("profile.db"))  # nothing written


def test_refusals_are_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "no_such_family", "hidden_size": 8}))
    (tmp_path / "r.db").write_bytes(b"")
    assert main(["predict", str(bad), "--db", str(tmp_path / "r.db")]) == 2
    assert "model_type 'no_such_family'" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing.json"), "--measure", "--measure-device", "cpu"]) == 2
    assert "missing.json" in capsys.readouterr().err
    good = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(good)]) == 2
    assert "nothing to price the calls with: --measure" in capsys.readouterr().err
    assert main(["predict", str(good), "--measure", "--measure-device", "cpu", "--layers", "9"]) == 2
    assert "--layers=9" in capsys.readouterr().err
    assert main(["predict", str(good), "--measure", "--measure-device", "cpu", "--batch", "1,x"]) == 2
    assert "--batch=1,x" in capsys.readouterr().err
    assert main(["predict", str(good), "--measure", "--measure-device", "cpu", "--attention", "fastest"]) == 2
    assert "--attention=fastest" in capsys.readouterr().err


def test_a_table_of_configurations_priced_in_sequence_names_its_assumptions(tmp_path, capsys):
    config = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(config), "--batch", "1,2", "--prefill", "8", "--decode", "2", "--measure",
                 "--measure-device", "cpu", "--attention", "math", "--repeats", "1", "-o", str(tmp_path / "p"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = got["configurations"]
    assert [(r["batch"], r["prefill"]) for r in rows] == [(1, 8), (2, 8)]
    for r in rows:
        assert r["assumptions"]["attention"].startswith("math (--attention)")
        assert r["assumptions"]["dtype"] == "float32"
        phases = {p["phase"]: p for p in r["priced"]["sequence"]["phases"]}
        assert phases["prefill"]["step_us"] > 0 and phases["decode"]["step_us"] > 0 and phases["decode"]["steps"] == 2
        assert phases["prefill"]["share"]["unpriced"] == 0.0
        assert Path(r["profile"]).is_file() and r["replay_sweeps"]
    # the same profile database reads as a profile: the replay report reads it, and the sequence
    # replay takes it for a GPU profile (its calls launch kernels), which a CPU cannot replay
    assert main(["replay-report", rows[0]["profile"], "-o", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report").is_dir()
    capsys.readouterr()
    assert main(["sequence", rows[0]["profile"], "--device", "cpu"]) == 2
    assert "holds device kernel times" in capsys.readouterr().err


def test_priced_from_rows_uses_a_measured_row_and_names_each_kind(tmp_path):
    from pytest_opperf.store import database

    config = _config(tmp_path, DENSE, "float32")
    traced = trace.record(model.build(str(config)), 1, 8, 1, tmp_path / "t", "math")
    db = tmp_path / "t" / "profile.db"
    answer._import(traced.trace, db, None)
    with sqlite3.connect(db) as con:
        con.row_factory = sqlite3.Row
        head = dict(con.execute("SELECT * FROM signatures WHERE op = 'aten' AND op_type = 'aten::linear' "
                                "AND input_shapes LIKE '1,1,64;256,64;' ").fetchone())  # the LM head, on the last position
    con.close()
    params = json.loads(head["params"])
    results = tmp_path / "h100.db"
    database.write(results, {"run_id": "r0", "device": "h100", "started_at": "2026-11-28T00:00:00+00:00"},
                   [{"op": "aten", "_params": ["call", "args"], **params, "dtype_in": head["dtype"],
                     "dtype_out": head["dtype"], "backend": "torch", "backend_version": "1", "knobs": "",
                     "timer": "profiler", "cache": "cold", "time_us": 7.0, "run_id": "r0",
                     "created_at": "2026-11-28T00:00:00+00:00"}])
    phases, how, _ = price.rows(db, results)
    prefill = {p.phase: p for p in phases}["prefill"]
    head_row = next(t for t in prefill.top if t["shapes"] == head["input_shapes"])
    assert (head_row["kind"], head_row["us"]) == ("measured", 7.0)
    assert "measured" in prefill.share and "from " in how
    # the rest: a roofline answer where the op has formulas for one, else named as unpriced
    assert set(prefill.share) <= {"measured", "roofline", "unpriced"}
    assert prefill.share["unpriced"] == pytest.approx(len(prefill.unpriced and [1] or []) and prefill.share["unpriced"])
    assert all(u["why"] for u in prefill.unpriced)
    with pytest.raises(ProfileError, match="no such results database"):
        price.rows(db, tmp_path / "none.db")


def test_one_rank_traced_under_the_tp_plan_runs_the_collectives_of_a_real_two_rank_run(tmp_path):
    """transformers' tp_plan="auto" on 2 CPU ranks (gloo, under torchrun) against the trace of one rank
    at --tp 2: the same collectives, each of the same message."""
    import shutil
    import subprocess
    import sys

    pytest.importorskip("accelerate")  # transformers loads a tp_plan through it
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("no torchrun")
    ckpt = tmp_path / "ckpt"
    config = transformers.AutoConfig.for_model(**{k: v for k, v in DENSE.items()})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    torchrun = str(Path(sys.executable).parent / "torchrun") if (Path(sys.executable).parent / "torchrun").exists() \
        else "torchrun"
    done = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", "0", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", "localhost:0", str(Path(__file__).parent / "tp_rank_run.py"), str(ckpt),
                           "8"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    real = json.loads(done.stdout.strip().splitlines()[-1])
    built = model.build(str(ckpt / "config.json"), dtype="fp32")
    from pytest_opperf.pipeline.predict import tp

    tp.shard(built.module, 2)
    traced = trace.record(built, 1, 8, 0, tmp_path / "t", "math", logits="all")  # as the ranks' plain forward
    answer._import(traced.trace, tmp_path / "t" / "profile.db", None)
    mine = [(op, shapes) for op, shapes, *_ in _calls(tmp_path / "t" / "profile.db") if op.startswith("opperf::")]
    names = {"c10d::allreduce_": "opperf::all_reduce", "c10d::allgather_into_tensor_coalesced_": "opperf::all_gather"}
    # o_proj and down_proj a layer, the embedding where this transformers' plan splits it (5.24 does,
    # 5.17 keeps it whole: 4 all-reduces there, on both sides), the LM head's vocabulary gathered
    embedding = any(style.startswith("embedding") for style in tp.plan_of(built.module).values())
    assert Counter(op for op, _ in mine) == Counter(names[n] for n, _ in real) == {
        "opperf::all_reduce": 2 * 2 + embedding, "opperf::all_gather": 1}
    # each rank's message: the hidden states it reduces, and its half of the logits' vocabulary
    assert sorted(set(mine)) == [("opperf::all_gather", "1,8,128;;"), ("opperf::all_reduce", "1,8,64;")]


def test_a_profiles_expert_shares_and_context_factors(tmp_path):
    """--from: the shares of the rows per expert of a profile's grouped GEMMs (their offsets), and its
    context factors per op and backend, worked by hand."""
    db = tmp_path / "p.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE signatures (id INTEGER, op_type TEXT, params TEXT, count INTEGER, op TEXT, backend TEXT, "
                "sequence_us REAL, replayed_us REAL, profiled_total_us REAL)")
    args = json.dumps(["T:bf16[8,16]", "T:bf16[4,16,8]", "T:i32[4]=4,6,8,8"])
    con.executemany("INSERT INTO signatures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        (1, "aten::_grouped_mm", json.dumps({"call": "aten::_grouped_mm.default", "args": args}), 2, "aten", "torch",
         12.0, 10.0, 20.0),
        (2, "aten::mm", json.dumps({}), 3, "gemm", "torch", 5.0, 4.0, 12.0)])
    con.commit()
    con.close()
    assert price.expert_shares(db) == {4: [0.5, 0.25, 0.25, 0.0]}  # rows 4, 2, 2, 0 of 8
    factors = price.Factors(db)
    assert factors.of({"op": "gemm", "backend": "torch"}) == pytest.approx(5.0 / 4.0)
    # an op the profile did not run: the whole profile's factor, (2 x 12 + 3 x 5) / (2 x 10 + 3 x 4)
    assert factors.of({"op": "rmsnorm", "backend": "triton"}) == pytest.approx(39.0 / 32.0)


def _module_file(tmp_path: Path, monkeypatch, text: str) -> None:
    (tmp_path / "mymodels.py").write_text("import torch\n" + text)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("spec,args,said", [
    ("mymodels:nothing", [], "MODEL=mymodels:nothing: cannot import 'nothing' from 'mymodels'"),
    ("mymodels:number", [], "MODEL=mymodels:number: returned int, expected a torch.nn.Module or (module, inputs)"),
    ("mymodels:broken", [], "MODEL=mymodels:broken: the callable failed on meta: RuntimeError: no weights"),
    ("mymodels:plain", ["--layers", "1"], "--layers: mymodels:plain builds its own model; cut its layers there"),
    ("mymodels:plain", ["--tp", "2"], "--tp=2: the model has no tensor-parallel plan"),
], ids=["import", "not-a-module", "raises", "layers", "no-plan"])
def test_a_callable_model_refused_in_one_line(tmp_path, monkeypatch, capsys, spec, args, said):
    _module_file(tmp_path, monkeypatch, "def number():\n    return 3\n"
                                        "def broken():\n    raise RuntimeError('no weights')\n"
                                        "def plain():\n    return torch.nn.Linear(4, 4)\n")
    assert main(["predict", spec, "--measure", "--measure-device", "cpu", "-o", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_a_plan_that_cannot_split_is_refused_naming_module_and_style(tmp_path, capsys):
    from pytest_opperf.pipeline.predict import tp

    built = model.build(str(_config(tmp_path, DENSE, "float32")))
    with pytest.raises(ProfileError, match=r"--tp=3: model.layers.0.self_attn.q_proj.weight \(64, 64\): dim 0 does "
                                           r"not split over 3 ranks"):
        tp.shard(built.module, 3)
    built.module.model._tp_plan = None
    built.module.config.base_model_tp_plan = {"layers.*.mlp": "sequence_parallel"}
    with pytest.raises(ProfileError, match="model.layers.0.mlp: style 'sequence_parallel' on a LlamaMLP"):
        tp.shard(built.module, 2)
    assert main(["predict", str(_config(tmp_path, DENSE, "float32")), "--dtype", "fp7", "--measure"]) == 2
    assert "--dtype=fp7: not a dtype" in capsys.readouterr().err


def test_each_tp_degree_traces_its_own_rank_whatever_the_order_asked(tmp_path, capsys):
    config = _config(tmp_path, DENSE, "float32")
    assert main(["predict", str(config), "--tp", "2,1", "--prefill", "4", "--decode", "1", "--measure",
                 "--measure-device", "cpu", "--attention", "math", "--repeats", "1", "-o", str(tmp_path / "p"),
                 "--json"]) == 0
    rows = {r["tp"]: r for r in json.loads(capsys.readouterr().out)["configurations"]}
    collectives = {t: sum(1 for op, *_ in _calls(Path(r["profile"])) if op.startswith("opperf::"))
                   for t, r in rows.items()}
    assert collectives[1] == 0 and collectives[2] > 0
    assert "tensor_parallel" in rows[2]["assumptions"] and "tensor_parallel" not in rows[1]["assumptions"]
    # the split weights: one rank's k_proj (2 KV heads of 16) holds one head, its LM head half the vocabulary
    shapes = {t: {s for op, s, *_ in _calls(Path(r["profile"])) if op == "aten::linear" and s.startswith("1,")}
              for t, r in rows.items()}
    assert "1,4,64;16,64;" in shapes[2] and "1,4,64;16,64;" not in shapes[1]
    # the LM head on the prefill's last position (generate's logits_to_keep=1)
    assert "1,1,64;256,64;" in shapes[1] and "1,1,64;256,64;" not in shapes[2] and "1,1,64;128,64;" in shapes[2]
