"""docs/catalog.md's catalogue table is the registry's: ops, families, parameters, backends, formulas."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from pytest_opperf import cli
from pytest_opperf.catalog import OPS, load_builtin, table
from pytest_opperf.catalog.registry import Op, register_backend, register_op

load_builtin()
README = Path(__file__).parent.parent / "docs" / "catalog.md"
REGENERATE = "regenerate it with `opperf catalog --readme docs/catalog.md` (it rewrites the table between the markers)"


def test_readme_table_is_the_registrys():
    assert table.readme_table(README.read_text()) == table.markdown(), (
        f"docs/catalog.md's catalogue table differs from the registry: {REGENERATE}")


def test_every_builtin_op_module_states_its_formulas():
    missing = [f"{OPS[r['op']].inputs.__module__}: {table.LABELS[key]}"
               for r in table.rows() for key in ("flops", "bytes") if not r[key]]
    assert not missing, f"op modules need a docstring line starting with 'FLOPs:' and one with 'Bytes:': {missing}"


def test_rows_read_the_docstring_and_registry():
    row = next(r for r in table.rows() if r["op"] == "kv_cache_write")
    assert row["family"] == "memory"
    assert row["params"] == ["tokens", "kv_heads", "head_dim", "page_size=16", "pages"]
    assert {"torch", "torch_index_put", "torch_compile"} <= set(row["backends"])
    assert row["flops"] == "0 (data movement only)."
    assert row["bytes"].startswith("4*tokens*kv_heads*head_dim*size + tokens*8")
    assert r"| `transpose` | memory | m, n |" in table.markdown()
    assert r"2\*m\*n\*size" in table.markdown()  # escaped: '*' would start emphasis


def test_the_table_leaves_out_ops_and_backends_a_conftest_registered():
    register_op(Op("table_user_op", ("n",), _inputs, lambda x: x, lambda p, dt: 0, lambda p, dt: 0))
    register_backend("gemm", "table_user_backend")(_inputs)
    try:
        text = table.markdown()
        assert "table_user_op" not in text and "table_user_backend" not in text
    finally:
        OPS.pop("table_user_op")
        from pytest_opperf.catalog.registry import BACKENDS

        for key in [k for k in BACKENDS if k[0] == "table_user_op" or k[1] == "table_user_backend"]:
            BACKENDS.pop(key)


def _inputs(p, dt, device, gen):
    return ()


def test_opperf_catalog_prints_and_rewrites(tmp_path, capsys):
    assert cli.main(["catalog", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == table.markdown()
    assert cli.main(["catalog"]) == 0
    assert "moe_gating" in capsys.readouterr().out

    doc = tmp_path / "README.md"
    doc.write_text("# title\n\n<!-- catalog -->\nold table\n<!-- /catalog -->\n\nafter\n")
    assert cli.main(["catalog", "--readme", str(doc)]) == 0
    assert "updated" in capsys.readouterr().out
    text = doc.read_text()
    assert text.startswith("# title\n\n<!-- catalog -->\n| op |") and text.endswith("<!-- /catalog -->\n\nafter\n")
    assert table.readme_table(text) == table.markdown()
    assert cli.main(["catalog", "--readme", str(doc)]) == 0
    assert "already up to date" in capsys.readouterr().out

    doc.write_text("no markers here\n")
    assert cli.main(["catalog", "--readme", str(doc)]) == 2
    assert "no <!-- catalog --> ... <!-- /catalog --> markers" in capsys.readouterr().err
    assert doc.read_text() == "no markers here\n"


def test_a_missing_readme_is_an_error_not_a_traceback(tmp_path, capsys):
    assert cli.main(["catalog", "--readme", str(tmp_path / "nope.md")]) == 2
    assert "nope.md" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads what the backends run on a machine without an accelerator")
def test_opperf_catalog_op_shows_parameters_formulas_and_backends_here(capsys):
    assert cli.main(["catalog", "rope"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rope (position): rotary embedding")
    assert out[1:3] == ["  parameters: tokens: int, heads_q: int = 32, heads_kv: int = 8, head_dim: int = 128,",
                        "              layout: 'neox' or 'gptj' = 'neox'"]
    flops, nbytes = table.formulas(OPS["rope"]).values()
    assert f"  FLOPs: {flops}" in out and f"  bytes: {nbytes}" in out
    assert "  backends on this machine (cpu):" in out  # this test machine has no accelerator
    lines = {line.split()[0]: line for line in out[out.index("  backends on this machine (cpu):") + 1:]}
    assert re.search(r"torch 2\.\S+  runs: fp64, fp32, tf32, fp16, bf16$", lines["torch"])
    if importlib.util.find_spec("triton") is None:  # why an unavailable one is: its library
        assert lines["triton"].endswith("unavailable: library 'triton' is not installed")
    # where its code is: the op's folder (the op, its library calls, our kernel), then shared modules
    code = out[out.index("  backends on this machine (cpu):") - 3:out.index("  backends on this machine (cpu):")]
    assert code == ["  code: pytest_opperf/catalog/ops/position/rope/__init__.py (the op; liger, torch),",
                    "        pytest_opperf/catalog/ops/position/rope/triton.py (triton),",
                    "        pytest_opperf/catalog/backends/torch_compile.py (torch_compile)"]


def test_catalog_says_why_a_backend_cannot_run_here():
    from pytest_opperf.catalog.registry import Backend

    def cuda_only_fp16(device_type, dt, capability):
        return None if device_type == "cuda" and dt.input.name == dt.output.name == "fp16" else "needs fp16 on CUDA"

    fn = table.availability  # the dtypes it runs, or the reason for bf16 when it runs none
    assert fn(Backend("gemm", "b", _inputs, "torch", None, cuda_only_fp16), "cpu", (0, 0)).endswith(
        "unavailable: needs fp16 on CUDA")
    assert fn(Backend("gemm", "b", _inputs, "torch", None, cuda_only_fp16), "cuda", (9, 0)).endswith("runs: fp16")
    assert fn(Backend("gemm", "b", _inputs, "torch", frozenset({"npu"})), "cpu", (0, 0)) == \
        "unavailable: runs on npu, not cpu"
    assert fn(Backend("gemm", "b", _inputs, "no-such-library-x"), "cpu", (0, 0)) == \
        "unavailable: library 'no-such-library-x' is not installed"

    def by_shape(device_type, dt, capability, p):  # reads a parameter: the answer depends on the case
        return None if p["k"] % 16 == 0 else "k must divide by 16"

    assert re.search(r"runs: fp64\*, fp32\*, .*int64\*$", fn(Backend("gemm", "b", _inputs, "torch", None, by_shape),
                                                             "cpu", (0, 0)))


def test_catalog_of_an_unknown_op_is_one_line_and_exit_2(capsys):
    assert cli.main(["catalog", "gemmm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opperf catalog: unknown op 'gemmm'; the built-in ops: ") and "gemm," in err
    assert "\n" not in err
    assert cli.main(["catalog", "gemm", "--markdown"]) == 2
    assert "leave out --markdown and --readme" in capsys.readouterr().err


def test_plain_catalog_stays_short_and_points_at_the_detail(capsys):
    assert cli.main(["catalog"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("opperf catalog OP: its parameters, FLOP and byte formulas")
    assert max(len(line) for line in out) <= 100
