"""Config loading and grid expansion: worked cases and every error message."""

import textwrap
import time
from fractions import Fraction

import pytest

from pytest_opperf.config.grid import Range
from pytest_opperf.config.opconfig import ConfigError, load
from conftest import FAST, write_config

GEMM = ("m", "n", "k")


def write(tmp_path, text, name="gemm.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cases(path, columns=GEMM, device="cpu", defaults=None):
    cfg = load(path, columns, defaults or {}, op_name=path.stem)
    return cfg, list(cfg.expand(columns, device))


def test_seed_form_verbatim(tmp_path):
    path = write(tmp_path, """\
        backend: deep_gemm
        backend_version: "2.1.1+c9f8b34"
        dtypes: {'input': 'fp8', 'output': 'bf16'}
        params:
          M: {min: 2, max: 4, step: 2}
          N: [8192]
          K: [1536]
        """)
    cfg, out = cases(path)
    assert [c.id for c in out] == ["deep_gemm-fp8-bf16-m=2-n=8192-k=1536", "deep_gemm-fp8-bf16-m=4-n=8192-k=1536"]
    assert out[0].version_pin == "2.1.1+c9f8b34"
    assert (out[0].dtype_in, out[0].dtype_out) == ("fp8", "bf16")
    assert cfg.count() == 2


def test_backends_dtypes_geometric_and_zip(tmp_path):
    path = write(tmp_path, """\
        backends:
          torch: ">=2.0"
          other: {version: "1.0", knobs: {block: [64, 128]}}
        dtypes: [fp32, bfloat16]
        params:
          M: {min: 1, max: 8, mul: 2}
          N: {min: 16, max: 128, mul: 2}
          K: [7]
        zip: [[M, N]]
        """)
    cfg, out = cases(path)
    # 4 zipped shapes x (torch + other with 2 knob values) x 2 dtypes
    assert cfg.count() == 4 * 3 * 2 == len(out)
    shapes = sorted({(c.param_dict["m"], c.param_dict["n"]) for c in out})
    assert shapes == [(1, 16), (2, 32), (4, 64), (8, 128)]
    assert {c.dtype_in for c in out} == {"fp32", "bf16"}
    ids = {c.id for c in out}
    assert "other-bf16-m=8-n=128-k=7-block=128" in ids
    assert "torch-fp32-m=1-n=16-k=7" in ids


def test_zip_keeps_repeated_values_and_drops_repeated_cases(tmp_path):
    # m repeats inside its zip group: each value pairs with its own n, so nothing is merged
    # before zipping; a shape listed twice in full is one case, as a repeat elsewhere is.
    path = write(tmp_path, """\
        backend: torch
        dtypes: fp32
        params:
          M: [128, 128, 256, 128]
          N: [1, 2, 3, 1]
          K: [7, 7, 8]
        zip: [[M, N]]
        """)
    cfg, out = cases(path)
    shapes = [(c.param_dict["m"], c.param_dict["n"], c.param_dict["k"]) for c in out]
    assert shapes == [(128, 1, 7), (128, 1, 8), (128, 2, 7), (128, 2, 8), (256, 3, 7), (256, 3, 8)]
    assert cfg.params["m"] == [128, 128, 256, 128] and cfg.params["k"] == [7, 8]


def test_step_range_includes_max_and_float_steps(tmp_path):
    path = write(tmp_path, """\
        backend: torch
        dtypes: fp32
        params: {M: {min: 0.5, max: 1.5, step: 0.5}, N: 1, K: 1}
        """)
    cfg = load(path, GEMM, {}, op_name="gemm", op_types={"m": float})
    out = list(cfg.expand(GEMM, "cpu"))
    assert [c.param_dict["m"] for c in out] == [0.5, 1, 1.5]


def test_cases_list_with_fixed_params(tmp_path):
    path = write(tmp_path, """\
        backend: torch
        dtypes: bf16
        params: {K: 4096}
        cases:
          - {M: 1, N: 2}
          - {M: 3, N: 4}
          - {M: 3, N: 4}
        """)
    _, out = cases(path)
    assert [c.param_dict for c in out] == [{"m": 1, "n": 2, "k": 4096}, {"m": 3, "n": 4, "k": 4096}]


def test_a_cases_row_may_name_its_backend_and_dtypes(tmp_path):
    path = write(tmp_path, """\
        backends: {torch: "2.4", other: {knobs: {block: [64, 128]}}}
        dtypes: fp32
        cases:
          - {M: 1, N: 2, K: 3}
          - {M: 4, N: 5, K: 6, backend: other, dtypes: bf16}
          - {M: 7, N: 8, K: 9, backend: [torch], dtypes: [fp16, {input: fp8, output: bf16}]}
        """)
    cfg, out = cases(path)
    got = [(c.param_dict["m"], c.backend, dict(c.knobs).get("block"), c.dtype_in, c.dtype_out) for c in out]
    assert got == [(1, "torch", None, "fp32", "fp32"), (1, "other", 64, "fp32", "fp32"), (1, "other", 128, "fp32", "fp32"),
                   (4, "other", 64, "bf16", "bf16"), (4, "other", 128, "bf16", "bf16"),
                   (7, "torch", None, "fp16", "fp16"), (7, "torch", None, "fp8", "bf16")]
    assert out[-1].version_pin == "2.4"  # the backend's pin and knobs still come from `backends:`
    assert cfg.count() == len(out) and cfg.factors() == [("cases", 7)]


def test_a_sweep_runs_a_row_only_on_the_backend_it_names(project):
    write_config(project, "add", """\
        backends: [torch, torch_compile]
        dtypes: fp32
        cases:
          - {N: 1024, backend: torch_compile}
          - {N: 2048, backend: torch, dtypes: [fp32, bf16]}
          - {N: 4096}
        """)
    result = project.runpytest("benches", "-k", "add", "--collect-only", "-q", *FAST)
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in result.outlines if "test_add[" in line)
    assert ids == ["torch-bf16-n=2048", "torch-fp32-n=2048", "torch-fp32-n=4096",
                   "torch_compile-fp32-n=1024", "torch_compile-fp32-n=4096"], result.outlines


def test_rows_that_all_name_dtypes_need_no_file_dtypes(tmp_path):
    path = write(tmp_path, """\
        backend: torch
        cases:
          - {M: 1, N: 2, K: 3, dtypes: bf16}
          - {M: 4, N: 5, K: 6, dtypes: {input: fp8, output: bf16}}
        """)
    cfg, out = cases(path)
    assert [(c.dtype_in, c.dtype_out) for c in out] == [("bf16", "bf16"), ("fp8", "bf16")]
    assert cfg.dtypes == [("bf16", "bf16"), ("fp8", "bf16")]


def test_exclusion_expression_sees_params_device_and_dtypes(tmp_path):
    path = write(tmp_path, """\
        backend: torch
        dtypes: [fp32, bf16]
        params: {M: [1, 2, 3], N: 1, K: 1}
        exclude:
          - "m * n > 2 and dtype_in == 'bf16'"
          - "device == 'cpu' and m == 1"
        """)
    _, out = cases(path, device="cpu")
    assert sorted((c.param_dict["m"], c.dtype_in) for c in out) == [(2, "bf16"), (2, "fp32"), (3, "fp32")]
    _, out = cases(path, device="h100")
    assert len(out) == 5


def test_op_defaults_fill_missing_params(tmp_path):
    path = write(tmp_path, "backend: torch\ndtypes: fp32\nparams: {M: 2}\n")
    _, out = cases(path, defaults={"n": 3, "k": 5})
    assert out[0].param_dict == {"m": 2, "n": 3, "k": 5}


@pytest.mark.parametrize("text, key, expected", [
    ("backend: torch\ndtypes: fp32\nparams: {M: [1, N: 2\n", "", "invalid YAML at line"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 4, step: 0}, N: 1, K: 1}\n", "params.M.step", "expected a number > 0"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 4, step: -2}, N: 1, K: 1}\n", "params.M.step", "expected a number > 0"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 8, max: 4, step: 1}, N: 1, K: 1}\n", "params.M", "min (8) is greater than max (4)"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 4, mul: 1}, N: 1, K: 1}\n", "params.M.mul", "expected a number > 1"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 0, max: 4, mul: 2}, N: 1, K: 1}\n", "params.M.min", "min > 0"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 4}, N: 1, K: 1}\n", "params.M", "exactly one of 'step'"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: four, step: 1}, N: 1, K: 1}\n", "params.M.max", "expected a number, got str"),
    ("backend: torch\ndtypes: fp17\nparams: {M: 1, N: 1, K: 1}\n", "dtypes", "unknown dtype 'fp17'"),
    ("backend: torch\ndtypes: {input: bf16, outptu: bf16}\nparams: {M: 1, N: 1, K: 1}\n", "dtypes.outptu", "unknown key"),
    ("backend: torch\ndtypes: fp32\nparamz: {M: 1}\n", "paramz", "unknown key"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1, Q: 2}\n", "params.q", "unknown parameter"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1}\n", "params", "missing parameter 'k'"),
    ("backend: torch\ndtypes: fp32\nparams: [1, 2]\n", "params", "expected a mapping"),
    ("backend: torch\ndtypes: fp32\nparams: {M: [], N: 1, K: 1}\n", "params.M", "at least one value"),
    ("backend: torch\ndtypes: fp32\nparams: {M: [[1]], N: 1, K: 1}\n", "params.M[0]", "expected a number or string"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, m: 2, N: 1, K: 1}\n", "params.m", "given twice"),
    ("backend: torch\nbackend: other\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "", "duplicate key 'backend'"),
    ("dtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "backend", "missing"),
    ("backend: [torch]\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "backend", "expected a backend name"),
    ("backend: torch\nbackend_version: ['1']\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "backend_version", "expected a version string"),
    ("backend: torch\nbackend_version: '>=>1'\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "backend_version", "PEP 440"),
    ("backends: {torch: {version: '1', knobz: {}}}\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "backends.torch.knobz", "unknown key"),
    ("backend: torch\ndtypes: fp32\nparams: {M: [1, 2], N: [1], K: 1}\nzip: [[M, N]]\n", "zip[0]", "equally many values"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\nexclude: 'm >'\n", "exclude", "not a valid expression"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\nexclude: '__import__(\"os\")'\n", "exclude", "only min, max and abs"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\nexclude: 'x.y > 1'\n", "exclude", "Attribute is not allowed"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\nexclude: 'q > 1'\n", "exclude", "unknown name 'q'"),
    ("backend: torch\ndtypes: fp32\nparams: {M: [1, 2], N: 1, K: 1}\ncases: [{M: 1}]\n", "params.m", "single values"),
    ("backend: torch\ndtypes: fp32\ncases: [{M: 1, N: 1, K: 1, Z: 1}]\n", "cases[0].Z", "unknown parameter"),
    ("backend: torch\ndtypes: fp32\ncases: [{M: 1, N: 1}]\n", "cases[0]", "missing parameter 'k'"),
    ("backends: [torch, other]\ndtypes: fp32\ncases: [{M: 1, N: 1, K: 1}, {M: 2, N: 1, K: 1, backend: triton}]\n",
     "cases[1].backend", "unknown backend 'triton'; expected one of the file's backends ['torch', 'other']"),
    ("backend: torch\ndtypes: fp32\ncases: [{M: 1, N: 1, K: 1, backend: [torch, 3]}]\n", "cases[0].backend",
     "expected a backend name or a list of them"),
    ("backend: torch\ndtypes: fp32\ncases: [{M: 1, N: 1, K: 1, dtypes: fp17}]\n", "cases[0].dtypes", "unknown dtype 'fp17'"),
    ("backend: torch\ndtypes: fp32\ncases: [{M: 1, N: 1, K: 1, dtypes: [bf16, {input: fp8, output: f16}]}]\n",
     "cases[0].dtypes[1].output", "unknown dtype 'f16'"),
    ("backend: torch\ncases: [{M: 1, N: 1, K: 1, dtypes: bf16}, {M: 2, N: 1, K: 1}]\n", "dtypes", "missing"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\ntolerance: {bf16: -1}\n", "tolerance.bf16", ">= 0"),
    ("- 1\n- 2\n", "", "expected a mapping of config keys"),
    ("op: softmax\nbackend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "op", "read for op 'gemm'"),
])
def test_errors_name_file_key_and_expectation(tmp_path, text, key, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        cases(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": ")
    if key:
        assert f": {key}: " in message, message
    assert expected in message, message


def test_exclusion_failing_at_runtime_names_the_case(tmp_path):
    path = write(tmp_path, "backend: torch\ndtypes: fp32\nparams: {M: [0], N: 1, K: 1}\nexclude: 'n / m > 1'\n")
    with pytest.raises(ConfigError, match=r"exclude: 'n / m > 1' failed on case torch-fp32-m=0-n=1-k=1: division by zero"):
        cases(path)


def test_count_is_computed_without_expanding(tmp_path):
    # 10^6 * 10^6 * 10^6 cases: counting must not enumerate them.
    path = write(tmp_path, """\
        backend: torch
        dtypes: fp32
        params:
          M: {min: 1, max: 1000000, step: 1}
          N: {min: 1, max: 1000000, step: 1}
          K: {min: 1, max: 1000000, step: 1}
        """)
    cfg = load(path, GEMM, {}, op_name="gemm")
    assert cfg.count() == 10**18


@pytest.mark.parametrize("body, factors", [
    ("params: {M: {min: 1, max: 1000000000000, step: 1}, N: 1, K: 1}", "params.M: 1000000000000"),
    ("params: {M: {min: 0.5, max: 1.0e+300, mul: 1.0000001}, N: 1, K: 1}", "params.M: 6914687093"),
    ("params: {M: 1, N: 1, K: 1}\nbackends: {torch: {knobs: {block: {min: 1, max: 1000000000000, step: 1}}}}",
     "backends: 1000000000000"),
    ("params: {M: {min: 1, max: 1000000, step: 1}, N: {min: 1, max: 1000000, step: 1}, K: 7}\nzip: [[M, N]]",
     "zip[0]: 1000000"),
])
def test_a_huge_grid_is_refused_by_its_count_at_once(tmp_path, body, factors):
    backend = "" if "backends:" in body else "backend: torch\n"
    path = write(tmp_path, f"{backend}dtypes: [fp32, bf16]\n{body}\n")
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load(path, GEMM, {}, op_name="gemm", op_types={"m": float}, max_cases=5000)
    elapsed = time.perf_counter() - started
    count = int(factors.split(": ")[1]) * 2
    assert str(info.value) == (f"{path}: the grid has {count} cases, more than --opperf-max-cases=5000 "
                               f"({factors} x dtypes: 2); narrow these or raise the limit")
    assert elapsed < 1.0  # listing 10^7 values took 2.4 s before ranges were counted


def test_a_grid_at_the_limit_loads(tmp_path):
    path = write(tmp_path, "backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 50, step: 1}, N: [1, 2], K: 1}\n")
    assert load(path, GEMM, {}, op_name="gemm", max_cases=100).count() == 100


def _listed(start, stop, step=None, mul=None):
    """The range by its definition, element by element in exact decimals: min + i*step (or min * mul**i) <= max."""
    exact = [Fraction(repr(x)) if isinstance(x, float) else Fraction(x) for x in (start, stop, step or mul)]
    values, i = [], 0
    while True:
        value = exact[0] + i * exact[2] if step is not None else exact[0] * exact[2] ** i
        if value > exact[1]:
            return values
        values.append(value)
        i += 1


@pytest.mark.parametrize("spec, expected", [
    ({"min": 0.1, "max": 0.3, "step": 0.1}, [0.1, 0.2, 0.30000000000000004]),
    ({"min": 0.5, "max": 1.5, "step": 0.5}, [0.5, 1, 1.5]),
    ({"min": 0, "max": 1, "step": 0.3}, [0, 0.3, 0.6, 0.8999999999999999]),
    ({"min": 0.7, "max": 1.0, "step": 0.1}, [0.7, 0.7999999999999999, 0.8999999999999999, 1]),
    ({"min": 2, "max": 9, "step": 3}, [2, 5, 8]),
    ({"min": 1.0, "max": 4.0, "step": 1.0}, [1, 2, 3, 4]),
    ({"min": 5, "max": 5, "step": 1}, [5]),
    ({"min": 1, "max": 8192, "mul": 2}, [2**i for i in range(14)]),
    ({"min": 3, "max": 100, "mul": 3}, [3, 9, 27, 81]),
    ({"min": 1, "max": 1000, "mul": 10}, [1, 10, 100, 1000]),  # log(1000)/log(10) is 2.9999999999999996
    ({"min": 0.1, "max": 0.9, "mul": 3}, [0.1, 0.30000000000000004, 0.9]),
    ({"min": 2.0, "max": 250, "mul": 2.5}, [2, 5, 12.5, 31.25, 78.125, 195.3125]),
    ({"min": 65536, "max": 268435456, "mul": 16}, [65536, 1048576, 16777216, 268435456]),
])
def test_range_lengths_are_exact_and_match_the_values(spec, expected):
    rng = Range.parse("gemm.yaml", "params.M", spec)
    values = list(rng)
    assert values == expected
    assert [type(v) for v in values] == [type(v) for v in expected]
    assert len(rng) == len(values) == len(_listed(spec["min"], spec["max"], spec.get("step"), spec.get("mul")))
    assert (rng[0], rng[-1], rng[len(rng) - 1], rng[1:3]) == (values[0], values[-1], values[-1], values[1:3])
    with pytest.raises(IndexError):
        rng[len(rng)]


@pytest.mark.parametrize("spec", [
    {"min": 1, "max": 10**30, "mul": 7},
    {"min": 3, "max": 3**40, "mul": 3},
    {"min": 3, "max": 3**40 - 1, "mul": 3},
    {"min": 0.001, "max": 1000.0, "mul": 10},
    {"min": 1, "max": 10**15, "step": 10**14},
    {"min": 0.01, "max": 10.0, "step": 0.01},
    {"min": 1.5, "max": 1.0e+6, "mul": 1.5},
])
def test_long_range_boundaries_agree_with_the_definition(spec):
    rng = Range.parse("gemm.yaml", "params.M", spec)
    assert len(rng) == len(_listed(spec["min"], spec["max"], spec.get("step"), spec.get("mul")))


@pytest.mark.parametrize("text, types, key, expected", [
    ("M: {min: 1, max: 2, step: 0.5}", {}, "params.M.step", "an int step, got float 0.5"),
    ("M: {min: 0.5, max: 2, step: 1}", {}, "params.M.min", "an int min, got float 0.5"),
    ("M: {min: 2, max: 100, mul: 1.5}", {}, "params.M.mul", "an int mul, got float 1.5"),
    ("M: {min: 1, max: 2, step: 1}", {"m": str}, "params.M", "expected str values for this parameter, got a range"),
    ("M: {min: 1, max: .inf, step: 1}", {}, "params.M.max", "expected a finite number, got inf"),
])
def test_range_types_are_checked_by_their_ends_and_step(tmp_path, text, types, key, expected):
    path = write(tmp_path, f"backend: torch\ndtypes: fp32\nparams: {{{text}, N: 1, K: 1}}\n")
    with pytest.raises(ConfigError) as info:
        load(path, GEMM, {}, op_name="gemm", op_types=types)
    assert str(info.value).startswith(f"{path}: {key}: ") and expected in str(info.value)


def test_integral_float_ranges_give_an_int_parameter_ints(tmp_path):
    path = write(tmp_path, "backend: torch\ndtypes: fp32\nparams: {M: {min: 2.0, max: 64, mul: 2.0}, N: {min: 4, max: 4, step: 0.5}, K: 1}\n")
    _, out = cases(path)
    assert [c.param_dict["m"] for c in out] == [2, 4, 8, 16, 32, 64]
    assert {type(c.param_dict["m"]) for c in out} == {int} and out[0].param_dict["n"] == 4
