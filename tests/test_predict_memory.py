"""opperf predict --measure plans its memory: the bytes each way of holding the inputs needs are what
the plan then holds; the replay takes the way that fits the budget (an argument, OPPERF_MEMORY_BUDGET,
the device's free memory), falls back when cuBLAS cannot create its handle, and refuses in one line
what fits in no way; a call the measuring device has no kernel for is refused in one line naming it."""

import dataclasses
import shutil
import sqlite3
from pathlib import Path

import pytest

from pytest_opperf.cli import main
from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.predict import answer, model, price, trace
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay import plan as planning
from pytest_opperf.pipeline.replay import sequence as seq
from test_predict_trace import DENSE, MOE, _config

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CPU = torch.device("cpu")
CUBLAS = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Path:
    """A small Llama's prefill and 2 decode steps, traced on meta and imported: its profile database."""
    where = tmp_path_factory.mktemp("dense")
    built = model.build(str(_config(where, DENSE, "float32")))
    out = trace.record(built, 2, 8, 2, where / "trace", "math")
    answer._import(out.trace, where / "profile.db", None)
    return where / "profile.db"


@pytest.fixture
def db(traced, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the traced profile database, with no budget in the environment."""
    monkeypatch.delenv(seq.BUDGET_ENV, raising=False)
    shutil.copy(traced, tmp_path / "profile.db")
    return tmp_path / "profile.db"


@pytest.fixture
def modes(monkeypatch) -> list:
    """The input modes the replay built a plan in, in order."""
    built = []

    def spy(rows, calls, device, inputs="per-call", seed=0, say=None):
        built.append(inputs)
        return planning.plan(rows, calls, device, inputs, seed, say)

    monkeypatch.setattr(seq, "plan", spy)
    return built


def _held(plan) -> int:
    """Bytes of the distinct storages the plan's calls hold as arguments (tensors and tensor lists)."""
    storages = {}
    for c in plan.calls:
        for a in c.args:
            for t in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(t, torch.Tensor):
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _loaded(db: Path) -> tuple:
    return profile.load(db), planning.load_calls(db)


def _replayed(db: Path) -> int:
    with sqlite3.connect(db) as con:
        n = con.execute("SELECT COUNT(*) FROM signatures WHERE sequence_us IS NOT NULL").fetchone()[0]
    con.close()
    return n


def test_the_estimate_is_what_the_plan_holds_in_each_mode(db):
    rows, calls = _loaded(db)
    needs = planning.needs(rows, calls, CPU)
    plans = {mode: planning.plan(rows, calls, CPU, mode) for mode in planning.INPUTS}
    assert needs.inputs == {mode: _held(p) for mode, p in plans.items()}
    assert needs.inputs["per-call"] > needs.inputs["per-signature"] > 0  # two layers, three steps
    # the outputs kept are those the run keeps, each until the reader the plan names last
    assert {made: last for made, last, _ in needs.kept} == plans["per-call"].last_use
    assert needs.kept and seq.reserve(needs, "per-call") > seq.LIBRARIES_BYTES  # the outputs kept for a reader
    assert seq.budget_of(CPU) == (None, "no memory limit on cpu")
    largest = max(t.untyped_storage().nbytes() // t.element_size() for c in plans["per-call"].calls for a in c.args
                  for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor))
    assert needs.making >= 8 * largest  # drawn in float32 or int64 before the cast


def test_the_reserve_covers_the_kept_outputs_at_their_peak_or_the_making_of_a_set():
    # outputs of calls 0 and 1 are alive together until call 2 read them: 5 GB; call 3's alone: 1 GB
    held = planning.Needs({"per-call": 10e9, "per-signature": 1e9}, [(0, 2, 3e9), (1, 2, 2e9), (3, 4, 1e9)], 4e9)
    assert seq.reserve(held, "per-call") == 5e9 + seq.LIBRARIES_BYTES + 0.1 * (10e9 + 5e9)
    assert seq.reserve(dataclasses.replace(held, making=6e9), "per-signature") == \
        6e9 + seq.LIBRARIES_BYTES + 0.1 * (1e9 + 6e9)


def test_inputs_meta_cannot_make_are_counted_from_the_recorded_shapes(db, monkeypatch):
    from pytest_opperf.catalog.registry import OPS

    aten = OPS["aten"]

    def not_on_meta(params, dtypes, device, gen):
        if device.type == "meta":
            raise NotImplementedError("no meta kernel")
        return aten.inputs(params, dtypes, device, gen)

    rows, calls = _loaded(db)
    exact = planning.needs(rows, calls, CPU)
    monkeypatch.setitem(OPS, "aten", dataclasses.replace(aten, inputs=not_on_meta))
    recorded = planning.needs(rows, calls, CPU)
    # one set a signature: the recorded inputs' bytes, within what views and strides add
    assert 0.8 * exact.inputs["per-signature"] <= recorded.inputs["per-signature"] <= exact.inputs["per-signature"]
    # per call: a set for each call, none shared
    assert recorded.inputs["per-call"] > recorded.inputs["per-signature"]


def test_the_budget_picks_the_inputs_and_refuses_what_fits_in_no_way(db, modes):
    rows, calls = _loaded(db)
    needs = planning.needs(rows, calls, CPU)
    per_call, per_sig = (needs.inputs[m] + seq.reserve(needs, m) for m in planning.INPUTS)

    with pytest.raises(ProfileError) as refused:
        price.sequence(db, "cpu", 1, budget=per_sig - 1)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{db}: the replay needs ")
    assert seq.gigabytes(needs.inputs["per-signature"]) in line and seq.gigabytes(per_sig - 1) in line
    assert modes == [] and _replayed(db) == 0  # refused before anything was made or run

    phases, how = price.sequence(db, "cpu", 1, budget=(per_call + per_sig) // 2)
    assert modes == ["per-signature"] and phases and _replayed(db)
    assert "one input set a signature (per-call inputs need " in how and " allowed on cpu (budget=" in how

    modes.clear()
    phases, how = price.sequence(db, "cpu", 1)
    assert modes == ["per-call"] and "per-call inputs (" in how and "no memory limit on cpu" in how


@pytest.mark.parametrize("text,expected", [("123456", 123456), ("40GB", 40 * 10**9), ("512MiB", 512 * 2**20),
                                           (" 1.5 gib ", 3 * 2**29), ("2kb", 2000)])
def test_the_budget_from_the_environment(monkeypatch, text, expected):
    monkeypatch.setenv(seq.BUDGET_ENV, text)
    budget, said = seq.budget_of(CPU)
    assert budget == expected and f"{seq.BUDGET_ENV}={text.strip()}" in said
    assert seq.budget_of(CPU, 7)[0] == 7  # the argument wins


@pytest.mark.parametrize("text", ["lots", "40 GBs", "-5GB", "0", "1e9", "0.5"])
def test_a_budget_in_the_environment_that_is_no_size_is_refused_naming_it(monkeypatch, text):
    monkeypatch.setenv(seq.BUDGET_ENV, text)
    with pytest.raises(ProfileError, match=rf"^{seq.BUDGET_ENV}=.*: expected a number of bytes.*40GB, 512MiB"):
        seq.budget_of(CPU)


def test_the_environments_budget_refuses_before_the_replay(db, monkeypatch, modes):
    monkeypatch.setenv(seq.BUDGET_ENV, "1MB")
    with pytest.raises(ProfileError, match=rf"0.001 GB allowed on cpu \({seq.BUDGET_ENV}=1MB\): a smaller"):
        price.sequence(db, "cpu", 1)
    assert modes == []


def test_what_runs_out_of_memory():
    assert seq._out_of_memory(RuntimeError(CUBLAS))
    assert seq._out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert seq._out_of_memory(RuntimeError("CUDNN_STATUS_ALLOC_FAILED"))
    assert seq._out_of_memory(torch.AcceleratorError("CUBLAS_STATUS_NOT_INITIALIZED"))
    assert not seq._out_of_memory(NotImplementedError('"histogram_cpu" not implemented for \'Int\''))
    assert not seq._out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def _failing(monkeypatch, times: int) -> list:
    """The aten backend raising cuBLAS's handle failure on its first TIMES calls; the calls it failed."""
    from pytest_opperf.catalog.registry import BACKENDS

    key = ("aten", "torch")
    real = BACKENDS[key]
    failed = []

    def fn(*args):
        if len(failed) < times:
            failed.append(args[0])
            raise RuntimeError(CUBLAS)
        return real.fn(*args)

    monkeypatch.setitem(BACKENDS, key, dataclasses.replace(real, fn=fn))
    return failed


def test_a_cublas_handle_failure_falls_back_to_one_set_a_signature(db, monkeypatch, modes):
    failed = _failing(monkeypatch, 1)
    phases, how = price.sequence(db, "cpu", 1)
    assert modes == ["per-call", "per-signature"] and len(failed) == 1 and phases
    assert f"one input set a signature (per-call inputs ran out of memory ({CUBLAS}); they need " in how


def test_a_second_failure_is_one_line(db, monkeypatch, modes):
    _failing(monkeypatch, 2)
    with pytest.raises(ProfileError) as refused:
        price.sequence(db, "cpu", 1)
    line = str(refused.value)
    assert modes == ["per-call", "per-signature"] and "\n" not in line
    assert line.startswith(f"{db}: the replay ran out of memory ({CUBLAS}); it needs ")
    assert _replayed(db) == 0


def test_a_call_the_device_has_no_kernel_for_is_refused_naming_it(tmp_path):
    """Qwen3-MoE counts its experts' rows with aten::histc of an int tensor, which torch has no CPU kernel for."""
    ask = answer.Ask(str(_config(tmp_path, MOE, "bfloat16")), 1, measure=True, measure_device="cpu", output=tmp_path,
                     layers=None)
    with pytest.raises(ProfileError) as refused:
        answer.predict(ask, [1], [4], [1])
    line = str(refused.value)
    assert "\n" not in line and line.startswith("aten::histc [") and " cannot run on cpu: " in line


def test_the_command_refuses_it_in_one_line_and_exits_2(tmp_path, capsys):
    assert main(["predict", str(_config(tmp_path, MOE, "bfloat16")), "--measure", "--measure-device", "cpu",
                 "--batch", "1", "--prefill", "4", "--decode", "1", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    refusals = [line for line in err.splitlines() if "histc" in line]  # the others: its progress
    assert refusals == [err.strip().splitlines()[-1]] and "Traceback" not in err
    assert refusals[0].startswith("opperf predict: aten::histc [") and " cannot run on cpu: " in refusals[0]
