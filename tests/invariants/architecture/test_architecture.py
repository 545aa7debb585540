"""The layout's rules, checked on the source: layers without upward imports, no import cycles, short functions.

Layers, bottom to top (a module may import from its own layer and those below):

    0  csekit.core (errors, files, locks, precision, processes, the generic registry, the version), csekit.methods
       (the method list and each recipe's status: data only)
    1  csekit.encoding (encoder, poolers), csekit.data (corpora, the data folder)
    2  csekit.prep (frequency counts, augmentation, the match error rate)
    3  csekit.parts (views, heads, negatives, weighting, objectives), csekit.evaluation
    4  csekit.training (recipe, model, trainer)
    5  csekit.bench (a package: suite, run, results, tables, papers, plots, summary), csekit.cli and
       csekit.commands (the command line and its helpers), csekit.registries (every kind's registry), and the
       package root `csekit`
       (the public API, loaded on first use)

Imports under `if TYPE_CHECKING:` are annotations only (never run), so the layer check leaves them out,
except in csekit.core: the bottom layer names nothing above it, not even for type checking. The cycle
check counts them (a type-only circle is still two modules that cannot be read apart) and covers the
benchmark scripts too, which import each other by plain name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from csekit.core.errors import CsekitError
from csekit.core.registry import Registry
from csekit.registries import REGISTRIES

SRC = Path(__file__).resolve().parents[3] / "src"
BENCHMARKS = SRC.parent / "benchmarks"
LAYERS = {
    "csekit": 5,
    "csekit.core": 0,
    "csekit.methods": 0,
    "csekit.encoding": 1,
    "csekit.data": 1,
    "csekit.prep": 2,
    "csekit.parts": 3,
    "csekit.evaluation": 3,
    "csekit.training": 4,
    "csekit.bench": 5,
    "csekit.cli": 5,
    "csekit.commands": 5,
    "csekit.registries": 5,
}
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    for depth in range(module.count(".") + 1, 0, -1):  # the longest listed prefix decides
        prefix = ".".join(module.split(".")[:depth])
        if prefix in LAYERS and (prefix != "csekit" or module == "csekit"):
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(path: Path, type_only: bool = False) -> set[str]:
    """The csekit modules `path` imports at run time, at any depth (function-level imports included).

    With `type_only`, those it imports under `if TYPE_CHECKING:` too.
    """
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if type_only else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("csekit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("csekit"):
            for alias in node.names:  # `from csekit.parts import views` imports the module csekit.parts.views
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
    return found


def _is_module(name: str) -> bool:
    path = SRC / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def source_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SRC / "csekit").rglob("*.py"))}


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, path in source_modules().items()
        for target in sorted(imports(path))
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def script_imports(path: Path, scripts: Iterable[str]) -> set[str]:
    """The sibling scripts `path` imports by plain name (a script puts its folder on the path), at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found & set(scripts)


def import_graph(modules: dict[str, Path], scripts: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, type-only imports included: csekit's and the benchmark scripts'."""
    graph = {
        module: {t for t in imports(path, type_only=True) if t in modules and t != module}
        for module, path in modules.items()
    }
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    graph = {
        m: {t for t in targets if not (t.startswith(m + ".") and modules[m].name == "__init__.py")}
        for m, targets in graph.items()
    }
    for script, path in scripts.items():
        graph[script] = {t for t in script_imports(path, scripts) if t != script}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of `graph` closes (each as the modules along it, the first repeated)."""
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def benchmark_scripts(folder: Path = BENCHMARKS) -> dict[str, Path]:
    return {path.stem: path for path in sorted(folder.glob("*.py"))}


def test_there_are_no_import_cycles_not_even_type_only_ones_nor_among_the_benchmarks() -> None:
    cycles = import_cycles(import_graph(source_modules(), benchmark_scripts()))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_a_type_only_cycle_and_one_between_benchmark_scripts(tmp_path: Path) -> None:
    """The circle tasks.py <-> sts_data.py once was (type-only on one side), and two scripts importing each other."""
    tasks = tmp_path / "tasks.py"
    tasks.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from csekit.evaluation.sts_data import read_split\n",
        encoding="utf-8",
    )
    modules = source_modules() | {"csekit.evaluation.tasks": tasks}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "one.py").write_text("def f():\n    from two import g\n", encoding="utf-8")
    (tmp_path / "bench" / "two.py").write_text("import one as first\n", encoding="utf-8")
    (tmp_path / "bench" / "three.py").write_text("import one\nimport os\n", encoding="utf-8")
    cycles = import_cycles(import_graph(modules, benchmark_scripts(tmp_path / "bench")))
    assert {frozenset(cycle) for cycle in cycles} == {
        frozenset({"csekit.evaluation.sts_data", "csekit.evaluation.tasks"}),
        frozenset({"one", "two"}),
    }


def test_the_checks_above_can_fail(tmp_path: Path) -> None:
    """The import reader sees function-level imports and skips TYPE_CHECKING ones."""
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from csekit.cli import app\n"
        "def f():\n    from csekit.training.trainer import train\n",
        encoding="utf-8",
    )
    assert imports(path) == {"csekit.training.trainer"}
    assert layer("csekit.training.trainer") > layer("csekit.core.errors")


def every_import(path: Path) -> set[str]:
    """The csekit modules `path` names in any import, those under `if TYPE_CHECKING:` included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("csekit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("csekit"):
            found.add(node.module)
    return found


def test_the_core_names_nothing_above_it_not_even_for_type_checking() -> None:
    upward = [
        f"{module} imports {target} (layer {layer(target)})"
        for module, path in source_modules().items()
        if layer(module) == 0
        for target in sorted(every_import(path))
        if layer(target) > 0
    ]
    assert not upward, "\n".join(upward)


def test_the_check_of_the_core_sees_imports_under_type_checking(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from csekit.parts import views\n")
    assert every_import(path) == {"csekit.parts"} and imports(path) == set()


REGISTRY_HOMES = {
    "pooler": "csekit.encoding.pooling",
    "views": "csekit.parts.views",
    "head": "csekit.parts.heads",
    "negatives": "csekit.parts.negatives",
    "weighting": "csekit.parts.weighting",
    "objective": "csekit.parts.objectives",
    "engine": "csekit.prep.paraphrase",
    "task": "csekit.evaluation.tasks",
}
"""Where each kind's registry lives: with its kind and its built-in table."""


def test_each_registry_lives_with_its_kind_and_its_built_in_table() -> None:
    import importlib

    assert set(REGISTRIES) == set(REGISTRY_HOMES)
    for kind, home in REGISTRY_HOMES.items():
        module = importlib.import_module(home)
        owned = [value for value in vars(module).values() if value is REGISTRIES[kind]]
        assert owned, f"the {kind} registry is not defined in {home}"
        assert REGISTRIES[kind].names()[: len(module.BUILTIN)] == list(module.BUILTIN), kind
    core = (SRC / "csekit" / "core" / "registry.py").read_text(encoding="utf-8")
    assert not any(f'Registry("{kind}"' in core for kind in REGISTRY_HOMES), "core/registry.py defines no kind"


def test_every_registry_resolves_its_built_in_table() -> None:
    """Each kind's built-in table is well formed: distinct names, each entry callable (a task is an EvalTask)."""
    for kind, registry in REGISTRIES.items():
        assert isinstance(registry, Registry) and registry.kind == kind
        names = registry.names()
        assert names and len(names) == len(set(names)), kind
        for name in names:
            entry = registry.get(name)
            assert callable(entry) or kind == "task", (kind, name)


def test_an_unknown_name_names_the_key_and_the_choices() -> None:
    from csekit.parts.heads import HEADS

    with pytest.raises(CsekitError, match=r'^model.head: unknown head "mpl" \(did you mean "mlp"\?\)'):
        HEADS.get("mpl", "model.head")


def test_the_worked_example_adds_a_negative_source_with_one_file_and_one_recipe_line(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    """docs/architecture.md's example: examples/queue_negatives.py plus `negatives: [{name: queue}]` trains.

    Same seed: the first step (empty queue) equals plain SimCSE's, the second contrasts the queue and differs.
    """
    import importlib.util

    from conftest import read_metrics, tiny_recipe

    from csekit import train
    from csekit.parts.negatives import NEGATIVES

    path = Path(__file__).resolve().parents[3] / "examples" / "queue_negatives.py"
    spec = importlib.util.spec_from_file_location("queue_negatives", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    try:
        losses = {}
        for name, extra in (("plain", []), ("queue", ["negatives=[{name: queue, size: 24}]"])):
            recipe = tiny_recipe(tiny_model_dir, corpus, "train.max_steps=2", *extra)
            train(recipe, tmp_path / name, show_progress=False)
            losses[name] = [r["loss"] for r in read_metrics(tmp_path / name) if "loss" in r]
    finally:
        NEGATIVES.unregister("queue")
    assert losses["queue"][0] == pytest.approx(losses["plain"][0], rel=1e-6)
    assert losses["queue"][1] > losses["plain"][1] + 1e-3  # 24 more negatives in the denominator


def test_no_function_in_src_is_longer_than_80_lines() -> None:
    long = [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((SRC / "csekit").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


# --- mechanism 4 (issue #39): every save goes through core/save_guard.py ---------------------------------

SAVE_CALLS = {
    "save",  # torch.save, np.save, SentenceEncoder.save
    "savetxt",
    "save_file",  # safetensors
    "save_model",
    "save_pretrained",
    "write_text",
    "write_bytes",
    "atomic_write_text",
    "atomic_directory",
    "swap_in",
}
"""Calls that write a file or folder: a full disk makes each raise its own exception type."""
WRITE_MODES = set("wax+")


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_raw_save(call: ast.Call) -> bool:
    name = _call_name(call)
    if name in ("open", "fdopen"):  # open(path, "w"), os.fdopen(fd, "wb"), path.open("a")
        modes = [arg for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        modes += [k.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
        return any(isinstance(m.value, str) and WRITE_MODES & set(m.value) for m in modes)
    return name in SAVE_CALLS


def _guard_names(trees: dict[str, ast.AST]) -> set[str]:
    """`guarded_save` and the helpers that return it (`Trainer._saving`)."""
    names = {"guarded_save"}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)]
                if any(_call_name(r.value) == "guarded_save" for r in returns):  # type: ignore[arg-type]
                    names.add(node.name)
    return names


def _calls_by_function(tree: ast.AST, guards: set[str]) -> Iterator[tuple[str | None, ast.Call, bool]]:
    """(enclosing function's name, call, whether a `with GUARD(...)` encloses it) for every call."""

    def visit(node: ast.AST, function: str | None, guarded: bool) -> Iterator[tuple[str | None, ast.Call, bool]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function, guarded = node.name, False
        if isinstance(node, ast.With | ast.AsyncWith):
            items = [item.context_expr for item in node.items]
            is_guard = [isinstance(item, ast.Call) and _call_name(item) in guards for item in items]
            if any(is_guard):  # `with guarded_save(...), open(...)`: the guard is entered first
                for index, item in enumerate(items):
                    yield from visit(item, function, guarded or any(is_guard[:index]))
                for statement in node.body:
                    yield from visit(statement, function, True)
                return
        if isinstance(node, ast.Call):
            yield function, node, guarded
        for child in ast.iter_child_nodes(node):
            yield from visit(child, function, guarded)

    yield from visit(tree, None, False)


def _commands(trees: dict[str, ast.AST]) -> set[str]:
    """Functions decorated `@app.command(...)`: called by typer, whatever else shares their name."""
    return {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any("command" in ast.unparse(decorator) for decorator in node.decorator_list)
    }


def unguarded_saves(sources: dict[str, str]) -> list[str]:
    """Save calls that no guard encloses, lexically or through every caller (by function name), in `sources`.

    A function with an unguarded save is fine when every call of it is guarded (the trainer guards
    `save_shared_state`); it is reported when nothing in `sources` calls it (a public method, a command:
    those typer calls) or when a reported caller calls it.
    """
    trees = {label: ast.parse(text) for label, text in sources.items()}
    guards = _guard_names(trees)
    calls = [(label, *found) for label, tree in trees.items() for found in _calls_by_function(tree, guards)]
    called = {_call_name(call) for _, _, call, _ in calls} - _commands(trees)
    where: dict[str, str] = {}
    for label, function, call, guarded in calls:
        if _is_raw_save(call) and not guarded:
            where.setdefault(function or "<module>", f"{label}:{call.lineno} {ast.unparse(call.func)}")
    changed = True
    while changed:  # a function that calls an unguarded saver unguarded is an unguarded saver too
        changed = False
        for label, function, call, guarded in calls:
            name = _call_name(call)
            if name in where and not guarded and (function or "<module>") not in where:
                where[function or "<module>"] = f"{label}:{call.lineno} {name} -> {where[name]}"
                changed = True
    return sorted(f"{function}: {trace}" for function, trace in where.items() if function not in called)


def test_every_save_in_src_goes_through_the_save_guard() -> None:
    """A save outside `guarded_save` lets a full disk (RuntimeError, SafetensorError, OSError) end in a traceback."""
    sources = {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted((SRC / "csekit").rglob("*.py"))}
    unguarded = unguarded_saves(sources)
    assert not unguarded, "saves outside core/save_guard.py's guarded_save:\n" + "\n".join(unguarded)


def test_the_save_guard_check_can_fail() -> None:
    source = (
        "def write_state(folder):\n    torch.save({}, folder / 'x.pt')\n"
        "def guarded(folder):\n    with guarded_save('x', folder, 'kept'):\n        write_state(folder)\n"
        "def write_report(path):\n    with open(path, 'w') as handle:\n        handle.write('x')\n"
        "def indirect(folder):\n    write_state(folder)\n"
        "def reader(path):\n    with open(path, 'rb') as handle:\n        return handle.read()\n"
        "@app.command()\ndef encode(path):\n    np.save(path, 1)\n"
        "def other(path):\n    with guarded_save('x', path, 'kept'):\n        encode(path)\n"
    )
    found = unguarded_saves({"m.py": source})
    assert [line.split(":")[0] for line in found] == ["encode", "indirect", "write_report"], found


# --- mechanism 5 (issue #39): every model-folder load goes through encoding/model_folder.py -------------------

MODEL_FOLDER_MODULE = "csekit/encoding/model_folder.py"


def model_loads_elsewhere(sources: dict[str, str]) -> list[str]:
    """Calls of transformers' `X.from_pretrained(...)` outside `model_folder.from_pretrained` (which checks the
    folder first: a vocabulary, sane config sizes, embeddings that match)."""
    found = []
    for label, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            is_load = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_pretrained"
            if is_load and label != MODEL_FOLDER_MODULE:
                found.append(f"{label}:{node.lineno} {ast.unparse(node.func)}")  # type: ignore[attr-defined]
    return found


def test_every_model_folder_load_goes_through_the_model_folder_check() -> None:
    """A load that bypasses it gives a model without a vocabulary a 5-token tokenizer (exit 0, wrong embeddings)."""
    sources = {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted((SRC / "csekit").rglob("*.py"))}
    assert not model_loads_elsewhere(sources), "\n".join(model_loads_elsewhere(sources))
    checked = ast.parse(sources[MODEL_FOLDER_MODULE])
    calls = [
        n for n in ast.walk(checked) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "from_pretrained"
    ]
    assert len(calls) == 1  # the one call, after check_model_folder, with trust_remote_code=False
    keywords = {k.arg: k.value for k in calls[0].keywords}
    assert isinstance(keywords.get("trust_remote_code"), ast.Constant) and keywords["trust_remote_code"].value is False


def test_the_model_load_check_can_fail() -> None:
    source = "def load(name):\n    return FSMTTokenizer.from_pretrained(name)\n"
    assert model_loads_elsewhere({"csekit/prep/paraphrase.py": source}) == [
        "csekit/prep/paraphrase.py:2 FSMTTokenizer.from_pretrained"
    ]


MAX_FILE_LINES = 600
"""No file of the project's code (src, tests, benchmarks, examples) is longer: a room read in one sitting."""


def files_over(paths: Iterable[Path], limit: int = MAX_FILE_LINES) -> list[str]:
    """`path: lines` of each file longer than `limit` lines."""
    counts = ((path, len(path.read_text(encoding="utf-8").splitlines())) for path in paths)
    return [f"{path}: {count}" for path, count in counts if count > limit]


def test_no_python_file_is_longer_than_600_lines() -> None:
    root = SRC.parent
    paths = [path for folder in ("src", "tests", "benchmarks", "examples") for path in (root / folder).rglob("*.py")]
    assert len(paths) > 100
    assert files_over(paths) == []


def test_the_file_length_check_can_fail(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_FILE_LINES + 1), encoding="utf-8")
    assert files_over([long]) == [f"{long}: {MAX_FILE_LINES + 1}"]
    assert files_over([long], limit=MAX_FILE_LINES + 1) == []
