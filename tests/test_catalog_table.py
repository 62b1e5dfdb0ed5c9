"""docs/catalog.md's catalogue table is the registry's: ops, families, parameters, backends, formulas."""

from pathlib import Path

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
