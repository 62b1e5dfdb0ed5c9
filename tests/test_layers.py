"""The house rules of DESIGN.md section 4, held for every module of the package: arrows point down
(each layer imports only the layers below it), no import cycle between modules (imports inside
functions count), nothing imports another package's private module, and the lower layers know
nothing of pytest."""

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_opperf import dtypes
from pytest_opperf.catalog.registry import Op, register_op
from pytest_opperf.columns import KEY, MEASURE, RESERVED

PACKAGE = Path(__file__).parent.parent / "pytest_opperf"
NAME = "pytest_opperf"

# What each part of the package may import of the package, besides itself. Leaves (plain data and
# facts) first; every later line may use what lines above it list. `pytest_opperf` is the package's
# __init__: the public API a user imports, which nothing inside the package imports back.
LEAVES = {"columns", "vcs", "version", "case", "record", "hookspec", "commands", "amounts", "files", "dtypes",
          "testid"}
ALLOWED = {
    "columns": set(), "vcs": set(), "version": set(), "case": set(), "hookspec": set(), "commands": {"files"},
    "amounts": set(), "files": set(), "dtypes": set(), "testid": set(),
    "record": {"columns", "testid"},
    # The config language: YAML, grids, expressions, knobs, search. Below everything that reads or
    # writes configs (run, pipeline, view), it is told the op's columns and the timer names.
    "config": LEAVES,
    "catalog": {"columns", "files", "dtypes"},
    "measure": {"columns", "dtypes"},
    "hardware": LEAVES | {"measure"},
    "store": LEAVES | {"hardware"},
    "gate": LEAVES | {"measure", "store", "hardware"},
    "pipeline": LEAVES | {"config", "catalog", "measure", "hardware", "store"},
    "run": LEAVES | {"config", "catalog", "measure", "hardware", "store", "gate"},
    "view": LEAVES | {"config", "catalog", "measure", "hardware", "store", "gate", "pipeline", "run"},
    "fixtures": LEAVES | {"catalog", "measure", "run"},
    "plugin": LEAVES | {"catalog", "measure", "run", "view", "fixtures"},
    "cli": LEAVES | {"config", "catalog", "measure", "hardware", "store", "gate", "pipeline", "run", "view", NAME},
    # bench(fn, *args) for scripts and notebooks: the timers and the check, never pytest.
    "api": LEAVES | {"catalog", "measure", "hardware"},
    NAME: {"catalog", "version", "api"},
}
# Layers that run in any process and must not need pytest (DESIGN.md: measure knows nothing of
# pytest; store and gate neither); catalog ops are imported by users' scripts too.
WITHOUT_PYTEST = {"columns", "vcs", "version", "case", "record", "testid", "commands", "amounts", "files", "dtypes", "config",
                  "catalog", "measure", "hardware", "store", "gate", "pipeline", "api"}


def _modules() -> dict:
    """module name -> path, for every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set:
    """Every module `name` imports, at module level or inside a function, as full names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else NAME


def test_every_part_of_the_package_has_a_place_in_the_layers():
    assert {_layer(m) for m in MODULES} <= set(ALLOWED), {_layer(m) for m in MODULES} - set(ALLOWED)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_arrows_point_down(layer):
    upward = sorted(f"{m} imports {t}" for m in MODULES if _layer(m) == layer
                    for t in IMPORTS[m] if t.startswith(NAME) and _layer(t) not in ALLOWED[layer] | {layer})
    assert not upward, upward


def _cycles() -> list:
    """Strongly connected groups of more than one module (Tarjan), over in-package imports."""
    graph = {m: {t for t in IMPORTS[m] if t in MODULES and t != m} for m in MODULES}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycle_between_modules():
    assert _cycles() == []


def test_the_cycle_check_sees_a_function_level_import(monkeypatch):
    # The check must be able to fail: a lazy import back from the columns leaf closes a cycle.
    monkeypatch.setitem(IMPORTS, "pytest_opperf.columns", IMPORTS["pytest_opperf.columns"] | {"pytest_opperf.record"})
    assert ["pytest_opperf.columns", "pytest_opperf.record"] in _cycles()


def test_no_module_imports_another_packages_private_module():
    private = []
    for module, targets in IMPORTS.items():
        for target in targets:
            parent, _, leaf = target.rpartition(".")
            if target.startswith(NAME) and leaf.startswith("_") and not leaf.startswith("__") \
                    and not (module == parent or module.startswith(parent + ".")):
                private.append(f"{module} imports {target}")
    assert not private, private


@pytest.mark.parametrize("layer", sorted(WITHOUT_PYTEST))
def test_lower_layers_know_nothing_of_pytest(layer):
    users = sorted(m for m in MODULES if _layer(m) == layer
                   for t in IMPORTS[m] if t.split(".")[0] in ("pytest", "_pytest", "xdist"))
    assert not users, users


def loaded_after(code: str) -> set:
    """The package's modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return {m for m in out.stdout.split() if m.startswith("pytest_opperf")}


def test_the_catalogue_registers_every_op_without_the_store():
    loaded = loaded_after("from pytest_opperf.catalog import load_builtin\nload_builtin()")
    assert "pytest_opperf.catalog.ops.matmul.gemm" in loaded  # the ops did register
    assert not {m for m in loaded if m.startswith(("pytest_opperf.store", "pytest_opperf.run"))}, loaded


def test_the_store_needs_nothing_of_the_run_layer():
    loaded = loaded_after("import pathlib, pytest_opperf.store.database\nfrom pytest_opperf.store import benchjson\n"
                          "benchjson.commit_info({'git_commit': 'abc'}, pathlib.Path('.'))")
    assert "pytest_opperf.vcs" in loaded and "pytest_opperf.columns" in loaded
    assert not {m for m in loaded if m.startswith(("pytest_opperf.run", "pytest_opperf.view"))}, loaded


@pytest.mark.parametrize("leaf", ["columns.py", "vcs.py", "case.py", "version.py", "amounts.py"])
def test_shared_leaves_import_nothing_of_the_package(leaf):
    name = f"{NAME}.{leaf[:-3]}"
    assert not [m for m in IMPORTS[name] if m.startswith(NAME)]


@pytest.mark.parametrize("column", ["time_us", "backend", "throttled", "clock_warmup_s", "rowid"])
def test_an_op_parameter_may_not_take_a_column_of_the_table(column):
    with pytest.raises(ValueError, match=f"parameter '{column}' must be .* not one of the table's own columns"):
        register_op(Op("reserved_probe", (column,), lambda p, dt, d, g: (), lambda: None,
                       lambda p, dt: 0, lambda p, dt: 0))
    assert column in RESERVED and ("rowid" == column or column in {**KEY, **MEASURE})


def test_no_function_over_80_lines_and_no_module_over_600():
    long = []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 600:
            long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


def test_the_layer_map_catches_an_upward_import(monkeypatch):
    # As the cycle check: the rule must be able to fail.
    monkeypatch.setitem(IMPORTS, "pytest_opperf.store.writer", {"pytest_opperf.view.terminal"})
    with pytest.raises(AssertionError, match="store.writer imports pytest_opperf.view.terminal"):
        test_arrows_point_down("store")


# The run's parts travel as typed, narrow objects (run/session.py): the Session is opened and taken
# apart by the pytest face alone; every function below it receives the part it needs.
SESSION_HOLDERS = {"pytest_opperf.plugin", "pytest_opperf.fixtures", "pytest_opperf.run.session"}


def _untyped_state(source: str) -> list:
    """Functions of `source` that take a parameter named `state`, or one without a type where it
    is a whole session (`session`, `ctx`, `env`): the hidden god object the layers must not pass."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                if a.arg == "state" or (a.arg in ("session", "env") and a.annotation is None):
                    found.append(f"{node.name}({a.arg})")
    return found


def _session_users(name: str, path: Path) -> list:
    """Where a module outside the pytest face reaches for the whole Session."""
    text = path.read_text(encoding="utf-8")
    return re.findall(r"\bsession_of\(|:\s*Session\b|\bimport [\w, ]*\bSession\b", text)


def test_no_function_takes_an_untyped_state():
    found = {name: hits for name, path in MODULES.items()
             if (hits := _untyped_state(path.read_text(encoding="utf-8")))}
    assert not found, found


def test_only_the_pytest_face_takes_the_whole_session():
    found = {name: hits for name, path in MODULES.items()
             if name not in SESSION_HOLDERS and (hits := _session_users(name, path))}
    assert not found, found


def test_the_state_rule_sees_an_untyped_state():
    assert _untyped_state("def f(item, case, state):\n    return state.gate\n") == ["f(state)"]
    assert _untyped_state("def g(env):\n    pass\n") == ["g(env)"]
    assert _untyped_state("def h(env: RunEnv, gate: GateSession):\n    pass\n") == []


# --- one module maps dtype names ----------------------------------------------------------------

# The spellings a second map would be keyed by or map to: the replay text's short forms, torch's names.
DTYPE_SPELLINGS = {d.short for d in dtypes.TABLE if d.short} | {d.torch_name for d in dtypes.TABLE}


def dtype_maps(source: str) -> list:
    """Line numbers of the dict and set literals in `source` that hold two or more dtype spellings."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Dict, ast.Set)):
            items = [*node.keys, *node.values] if isinstance(node, ast.Dict) else node.elts
            if len({i.value for i in items if isinstance(i, ast.Constant) and i.value in DTYPE_SPELLINGS}) >= 2:
                lines.append(node.lineno)
    return lines


def test_one_module_maps_dtype_names():
    maps = [f"{m}:{line}" for m, path in MODULES.items() if m != f"{NAME}.dtypes"
            for line in dtype_maps(path.read_text(encoding="utf-8"))]
    assert not maps, f"dtype names mapped outside pytest_opperf/dtypes.py (look them up there): {maps}"


def test_the_dtype_map_rule_sees_a_map():
    # As the other rules: it must be able to fail, on a dict of names and on a set of short forms.
    assert dtype_maps('SHORT = {"float16": "fp16"}\nINTS = {"i8", "i64"}\nSIZES = {"bf16": 2}\n') == [1, 2]
    assert dtype_maps('FILES = {"all_reduce": "a.csv", "gemm": "fp16"}\n') == []


def test_the_config_language_needs_neither_pytest_nor_the_run_layer():
    loaded = loaded_after("from pytest_opperf import config")
    assert "pytest_opperf.config.opconfig" in loaded
    # (the package's __init__ brings the registry: `import pytest_opperf` is the public API)
    assert not {m for m in loaded if m.startswith(("pytest_opperf.run", "pytest_opperf.measure"))}, loaded
    assert "pytest" not in subprocess.run([sys.executable, "-c", "import sys, pytest_opperf.config; print(*sys.modules)"],
                                          capture_output=True, text=True, check=True).stdout.split()


def test_the_pipeline_and_the_config_language_import_nothing_of_the_run_layer():
    # The arrows above already forbid it; this keeps anyone from adding run to their lines.
    assert "run" not in ALLOWED["pipeline"] and "run" not in ALLOWED["config"] and "config" in WITHOUT_PYTEST
    loaded = loaded_after("from pytest_opperf.pipeline import commands\n"
                          "from pytest_opperf.pipeline.mapping import bind, configs, profile, rules\n"
                          "from pytest_opperf.pipeline.predict import shapes")
    assert "pytest_opperf.config.opconfig" in loaded  # configs.py checks what it writes with the users' loader
    assert not {m for m in loaded if m.startswith("pytest_opperf.run")}, loaded


# --- pipeline/: one subpackage per stage of seed 001's flow ------------------------------------

PIPELINE = f"{NAME}.pipeline"
# The stages in the order of the flow (DESIGN.md section 4): a profile is read, its calls mapped to
# catalogue cases, replayed (alone, in sequence, what-if) and reported; predict prices a model's calls
# with what replay measured. A stage imports the stages before it, never a later one. commands.py, the
# CLI's face, may import every stage; the package's __init__ imports none.
STAGES = ("reading", "mapping", "replay", "predict")


def _stage(module: str) -> str:
    """reading, mapping, replay, predict, commands, or "" for pipeline/__init__ itself."""
    return module[len(PIPELINE) + 1:].split(".")[0] if module != PIPELINE else ""


def test_every_module_of_the_pipeline_belongs_to_a_stage():
    strays = sorted(m for m in MODULES if m.startswith(PIPELINE) and _stage(m) not in (*STAGES, "commands", ""))
    assert not strays, strays


def test_pipeline_stages_import_only_earlier_stages():
    upward = []
    for module, targets in IMPORTS.items():
        if not (module == PIPELINE or module.startswith(PIPELINE + ".")) or _stage(module) == "commands":
            continue
        mine = _stage(module)
        allowed = set(STAGES[:STAGES.index(mine) + 1]) if mine in STAGES else set()
        upward += [f"{module} imports {t}" for t in sorted(targets)
                   if (t == PIPELINE or t.startswith(PIPELINE + ".")) and _stage(t) not in allowed]
    assert not upward, upward


def test_the_stage_check_sees_an_upward_import(monkeypatch):
    # As the other rules: it must be able to fail, on a lazy import back from a reader into mapping
    # (what reading/calls.py did with bind.LIST) and from replay into predict.
    monkeypatch.setitem(IMPORTS, f"{PIPELINE}.reading.calls",
                        IMPORTS[f"{PIPELINE}.reading.calls"] | {f"{PIPELINE}.mapping.bind"})
    monkeypatch.setitem(IMPORTS, f"{PIPELINE}.replay.lookup",
                        IMPORTS[f"{PIPELINE}.replay.lookup"] | {f"{PIPELINE}.predict.models"})
    with pytest.raises(AssertionError) as caught:
        test_pipeline_stages_import_only_earlier_stages()
    assert "reading.calls imports pytest_opperf.pipeline.mapping.bind" in str(caught.value)
    assert "replay.lookup imports pytest_opperf.pipeline.predict.models" in str(caught.value)


def test_the_stage_check_sees_a_function_level_import(monkeypatch, tmp_path):
    # A reader that imports the replay's plan inside a function, read as every module is read.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from pytest_opperf.pipeline.replay.plan import Plan\n    return Plan\n")
    monkeypatch.setitem(IMPORTS, f"{PIPELINE}.reading.probe", _imports(f"{PIPELINE}.reading.probe", probe))
    with pytest.raises(AssertionError, match="reading.probe imports pytest_opperf.pipeline.replay.plan"):
        test_pipeline_stages_import_only_earlier_stages()


def test_no_file_of_the_pipeline_over_450_lines():
    long = [f"{m}: {n}" for m, path in MODULES.items() if m.startswith(PIPELINE)
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 450]
    assert not long, long
