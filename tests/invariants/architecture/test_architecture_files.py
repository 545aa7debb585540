"""The file rules hold by construction (issue #39): every write, every read and every name joined to a folder in
`src/` goes through its one module in `csekit/core/`, checked on the source with ast.

1. Writing inside a folder csekit owns: `core/atomic.py` (no-follow opens, exclusive temporary names, renames that
   refuse a link). A raw write anywhere else (`open(..., "w")`, `write_text`, `torch.save`, `np.save`,
   `save_file`, `os.replace`, `shutil.move`, `savefig`, ...) fails `test_every_write_goes_through_core_atomic`.
2. A name read from a file becomes a path only through `core/safe_names.py` (`child_path`, `check_name`).
3. Every read of a file csekit did not write in this process: `core/bounded_read.py` (regular files only, opened
   without blocking, bounded in bytes). A raw read elsewhere (`open`, `read_text`, `json.load`, `yaml.safe_load`,
   `np.load`, `torch.load`, `load_file`, ...) fails `test_every_read_goes_through_core_bounded_read`.

A third-party saver or loader may run elsewhere only inside a lambda handed to the module
(`write_file(path, lambda handle: torch.save(state, handle))`, `read_with(path, lambda handle: np.load(handle))`),
and only on the lambda's own argument: the handle or name the module opened and checked. Anything else is in the
reviewed allow-lists below, each entry with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from test_architecture import SRC, module_name

WRITER_MODULE = "csekit.core.atomic"
READER_MODULE = "csekit.core.bounded_read"
WRITE_WRAPPERS = {"write_file", "write_by_name"}
READ_WRAPPERS = {"read_with", "read_by_name"}

WRITE_FUNCTIONS = {
    *(f"os.{name}" for name in ("replace", "rename", "renames", "link", "symlink", "truncate", "mkfifo", "mknod")),
    *(f"shutil.{name}" for name in ("move", "copy", "copy2", "copyfile", "copytree", "copymode")),
    *(f"numpy.{name}" for name in ("save", "savez", "savez_compressed", "savetxt")),
    "torch.save",
    "safetensors.torch.save_file",
    "safetensors.torch.save_model",
    "safetensors.numpy.save_file",
    "urllib.request.urlretrieve",
    "torch.utils.tensorboard.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "mteb.ResultCache",
}
WRITE_METHODS = {"write_text", "write_bytes", "savefig", "save_pretrained", "symlink_to", "hardlink_to", "touch"}
WRITE_METHODS |= {"tofile", "extractall", "rename", "to_csv", "to_json"}
WRITE_METHODS |= {"init_trackers", "save_state", "save_model", "save_vocabulary", "to_json_file", "add_hparams"}
WRITE_METHODS |= {"save_to_cache"}
"""Library calls that write files by themselves (issue #49): accelerate's trackers (TensorBoard's event files and
hparams.yml under logging_dir) and checkpoints, transformers' tokenizer and config savers, mteb's result cache."""
READ_FUNCTIONS = {
    "json.load",
    *(f"yaml.{name}" for name in ("load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all")),
    *(f"numpy.{name}" for name in ("load", "loadtxt", "genfromtxt", "fromfile", "memmap")),
    "torch.load",
    "pickle.load",
    "safetensors.torch.load_file",
    "safetensors.torch.load_model",
    "safetensors.safe_open",
    "safetensors.numpy.load_file",
    "tarfile.open",
    "zipfile.ZipFile",
    "gzip.open",
    "bz2.open",
    "lzma.open",
    "csv.reader",
}
READ_METHODS = {"read_text", "read_bytes"}
OPENERS = {"open", "io.open", "codecs.open", "os.fdopen"}
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")

ALLOWED_WRITES = {
    ("csekit.core.run_lock", "os.open"): "the lock file: opened with O_NOFOLLOW | O_NONBLOCK and fstat-checked to be "
    "a regular file (a flock needs its own descriptor, held for the run)",
    ("csekit.encoding.export", "save_pretrained"): "transformers writes the model's files itself, into the staging "
    "folder atomic_directory made (exclusive mkdir, 0700) and holds open: it gets /proc/self/fd/N, so a link put at "
    "the staging name is never written through; swap_in checks the name's inode before renaming it in",
    ("csekit.training.trackers", "init_trackers"): "accelerate's trackers write (TensorBoard: event files, "
    "hparams.yml) under logging_dir, set just before to the held OUTPUT/logs (core/atomic.hold_folder: no link at "
    "any level, the run's folder logs/<name> held too, the name checked with check_name)",
    ("csekit.evaluation.mteb_run", "mteb.ResultCache"): "mteb's result cache is made (a mkdir) on the staging folder "
    "atomic_directory made and holds (/proc/self/fd/N) for `evaluate --mteb`'s result files",
    ("csekit.evaluation.mteb_run", "save_to_cache"): "mteb writes its result files (TASK.json, model_meta.json, "
    "run_settings.jsonl) itself, under that held staging folder; every entry is checked to be a file or folder there "
    "before swap_in keeps it",
    ("csekit.data.data_dir", "extractall"): "download-data unpacks an archive it downloaded in this process into its "
    "own TemporaryDirectory; zipfile drops absolute and '..' names, tarfile's data filter refuses links leaving it",
}
ALLOWED_READS = {
    ("csekit.core.atomic", "os.open"): "the write module opens the parent folder (O_DIRECTORY) of a file it writes, "
    "and the file itself with its callers' write flags (no-follow, non-blocking)",
    ("csekit.core.run_lock", "os.open"): "check_not_locked opens the lock file (O_NOFOLLOW) only to test its flock",
    ("csekit.evaluation.probes", "read_bytes"): "importlib.resources: the probe set shipped inside csekit's package",
    ("csekit.data.data_dir", "zipfile.ZipFile"): "an archive download-data wrote in this process (its own temp folder)",
    ("csekit.data.data_dir", "tarfile.open"): "an archive download-data wrote in this process (its own temp folder)",
    ("csekit.evaluation.pairs", "csv.reader"): "splits one line of a --pairs .csv file, already read by bounded_lines",
}


@dataclass(frozen=True)
class FileCall:
    module: str
    line: int
    name: str  # canonical: numpy.save, open, write_text (a method), ...
    kind: str  # "write" or "read"

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.name} ({self.kind})"


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted name of what the module imported (`np` -> numpy, `save_file` -> safetensors.torch...)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import numpy as np`: np -> numpy; `import os.path`: os -> os
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """`np.save` -> numpy.save, `save_file` -> safetensors.torch.save_file; None for a method on a value."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    if node.id not in aliases and parts:
        return None  # an attribute of a local value (path.open, handle.write)
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _open_mode(call: ast.Call, name: str) -> str | None:
    """The mode of an open-like call: its literal mode, "" when non-literal, "r" when left out."""
    position = 0 if name.endswith(".open") and name not in OPENERS else 1  # Path.open(mode), open(path, mode)
    mode = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None and len(call.args) > position:
        mode = call.args[position]
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else ""


def _classify(call: ast.Call, aliases: dict[str, str]) -> tuple[str, str] | None:
    """(canonical name, "write" or "read") of a call that writes or reads a file by name, else None."""
    dotted = _dotted(call.func, aliases)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    if dotted == "os.open":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        return dotted, "write" if any(flag in flags for flag in WRITE_FLAGS) else "read"
    if dotted in OPENERS or (dotted is None and method == "open") or (dotted or "").endswith(".open"):
        name = dotted if dotted in OPENERS else f"{dotted or 'value'}.open"
        if dotted in READ_FUNCTIONS:
            return dotted, "read"
        mode = _open_mode(call, name)
        return name, "write" if mode == "" or set(mode) & set("wax+") else "read"
    if dotted in WRITE_FUNCTIONS:
        return dotted, "write"
    if dotted in READ_FUNCTIONS:
        return dotted, "read"
    if dotted is None and method in WRITE_METHODS:
        return method, "write"
    if dotted is None and method == "replace" and len(call.args) == 1 and not call.keywords:
        return "replace", "write"  # Path.replace(target); str.replace takes two arguments
    if dotted is None and method in READ_METHODS:
        return method, "read"
    return None


def _uses_parameter(call: ast.Call, parameters: set[str]) -> bool:
    arguments = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(node, ast.Name) and node.id in parameters for arg in arguments for node in ast.walk(arg))


def _wrapped_calls(tree: ast.AST, wrappers: set[str]) -> set[int]:
    """ids of the calls inside a lambda handed to one of `wrappers` that use the lambda's own argument."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in wrappers):
            continue
        for argument in node.args:
            if isinstance(argument, ast.Lambda):
                parameters = {a.arg for a in argument.args.args}
                calls = (c for c in ast.walk(argument.body) if isinstance(c, ast.Call))
                inside |= {id(c) for c in calls if _uses_parameter(c, parameters)}
    return inside


def file_calls(source: str, module: str) -> Iterator[FileCall]:
    """Every call in `source` that writes or reads a file other than through the core modules."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    wrapped = {"write": _wrapped_calls(tree, WRITE_WRAPPERS), "read": _wrapped_calls(tree, READ_WRAPPERS)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (found := _classify(node, aliases)) is not None:
            name, kind = found
            if id(node) not in wrapped[kind]:
                yield FileCall(module, node.lineno, name, kind)


Found = TypeVar("Found")


def found_in_src(find: Callable[[str, str], Iterable[Found]], outside: str | None = None) -> list[Found]:
    """What `find(source, module)` reports over every module of src/csekit (but the module `outside`)."""
    return [
        found
        for path in sorted((SRC / "csekit").rglob("*.py"))
        if module_name(path) != outside
        for found in find(path.read_text(encoding="utf-8"), module_name(path))
    ]


def _src_calls() -> list[FileCall]:
    return found_in_src(file_calls)


def test_every_write_goes_through_core_atomic() -> None:
    raw = [
        str(call)
        for call in _src_calls()
        if call.kind == "write" and call.module != WRITER_MODULE and (call.module, call.name) not in ALLOWED_WRITES
    ]
    assert not raw, "write these through csekit.core.atomic (or review an ALLOWED_WRITES entry):\n" + "\n".join(raw)


def test_every_read_goes_through_core_bounded_read() -> None:
    raw = [
        str(call)
        for call in _src_calls()
        if call.kind == "read" and call.module != READER_MODULE and (call.module, call.name) not in ALLOWED_READS
    ]
    assert not raw, "read these through csekit.core.bounded_read (or review ALLOWED_READS):\n" + "\n".join(raw)


def test_every_allow_list_entry_is_still_needed() -> None:
    """An entry whose call is gone must go too (an allow-list that only grows stops being reviewed)."""
    found = {(call.module, call.name) for call in _src_calls()}
    stale = [entry for entry in (*ALLOWED_WRITES, *ALLOWED_READS) if entry not in found]
    assert not stale, stale


BYPASSES = """
import json, os, shutil, yaml
import numpy as np
import torch
from pathlib import Path
from safetensors.torch import save_file, load_file as load_weights

def f(path, folder, state, fig, model, handle):
    open(path, "a")
    open(path, mode="wb")
    Path(path).open("w")
    path.write_text("x")
    path.write_bytes(b"x")
    torch.save(state, path)
    np.save(path, state)
    save_file(state, str(path))
    os.replace(path, folder)
    path.rename(folder)
    path.replace(folder)
    shutil.move(path, folder)
    fig.savefig(path)
    model.save_pretrained(folder)
    accelerator.init_trackers(name)
    os.open(path, os.O_WRONLY | os.O_CREAT)
    write_file(path, lambda h: torch.save(state, path))
    open(path)
    path.read_text()
    json.load(handle)
    yaml.safe_load(handle)
    np.load(path)
    torch.load(path)
    load_weights(path)
    os.open(path, os.O_RDONLY)
    read_with(path, lambda h: np.load(path))
"""

CLEAN = """
import numpy as np
import torch

def f(path, state, fig, text):
    write_file(path, lambda handle: torch.save(state, handle))
    write_file(path, lambda handle: fig.savefig(handle, format="png"))
    read_with(path, lambda handle: np.load(handle, allow_pickle=False), "x", 10)
    text.replace("a", "b")
    handle.write(b"x")
"""


def test_the_file_checks_find_each_bypass_and_accept_the_wrapped_savers() -> None:
    found = list(file_calls(BYPASSES, "example"))
    writes = [call.name for call in found if call.kind == "write"]
    reads = [call.name for call in found if call.kind == "read"]
    assert writes == [
        "open",
        "open",
        "value.open",
        "write_text",
        "write_bytes",
        "torch.save",
        "numpy.save",
        "safetensors.torch.save_file",
        "os.replace",
        "rename",
        "replace",
        "shutil.move",
        "savefig",
        "save_pretrained",
        "init_trackers",
        "os.open",
        "torch.save",  # inside write_file's lambda, but on another path than the lambda's handle
    ]
    assert reads == [
        "open",
        "read_text",
        "json.load",
        "yaml.safe_load",
        "numpy.load",
        "torch.load",
        "safetensors.torch.load_file",
        "os.open",
        "numpy.load",
    ]
    assert list(file_calls(CLEAN, "example")) == []


# --- 2. names read from files become paths only through core/safe_names.py -----------------------------

NAME_JOINS = {
    "csekit.bench.suite": "run_dir",
    "csekit.encoding.model_folder": "_inside",
    "csekit.encoding.folder_pooling": "module_folder",
}
"""Where a name read from a file (a suite's recipe name; modules.json's and csekit.json's paths) is joined to its
folder: each such function must call child_path, and every use of the name goes through that function."""


def test_names_read_from_files_are_joined_through_child_path() -> None:
    for module, function in NAME_JOINS.items():
        path = SRC / Path(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        definition = next(
            node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function
        )
        calls = {ast.unparse(n.func) for n in ast.walk(definition) if isinstance(n, ast.Call)}
        assert "child_path" in calls, f"{module}.{function} does not join its name with child_path"


def test_no_suite_name_or_model_path_is_joined_by_hand() -> None:
    """`output / f"{recipe.name}..."` or `folder / module["path"]` outside the joining functions bypasses them."""
    offenders = []
    for path in sorted((SRC / "csekit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                right = ast.unparse(node.right)
                if any(needle in right for needle in (".name}", "['path']", '["path"]', "get('path'", 'get("path"')):
                    offenders.append(f"{module_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


# --- 4. every command that writes a result holds its lock (issue #49 defect 10) --------------------------------

RESULT_WRITERS = {"atomic_write_text", "write_file", "write_by_name", "augment_corpus", "run_suite", "summarise"}
RESULT_WRITERS |= {"download_corpus", "download_senteval_data"}
"""Calls by which a CLI command writes its result (a report, embeddings, augment's .jsonl, a suite's folder, data)."""
LOCKED_ELSEWHERE = {"train": "the Trainer holds OUTPUT/.lock for the whole run (core/run_lock.hold_run_lock)"}


def unlocked_writing_commands(source: str) -> list[str]:
    """The `@app.command` functions that write a result (an output parameter, or a call that writes) without
    `@locks_output`."""
    unlocked = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.startswith("app.command") for d in decorators) or node.name in LOCKED_ELSEWHERE:
            continue
        parameters = {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
        calls = {ast.unparse(c.func).split(".")[-1] for c in ast.walk(node) if isinstance(c, ast.Call)}
        if (parameters & {"output", "dest"} or calls & RESULT_WRITERS) and not any(
            d.startswith("locks_output(") for d in decorators
        ):
            unlocked.append(node.name)
    return unlocked


def test_every_command_that_writes_a_result_holds_its_lock() -> None:
    assert unlocked_writing_commands((SRC / "csekit" / "cli.py").read_text(encoding="utf-8")) == []
    trainer = ast.parse((SRC / "csekit" / "training" / "trainer.py").read_text(encoding="utf-8"))
    assert "hold_run_lock" in {ast.unparse(c.func) for c in ast.walk(trainer) if isinstance(c, ast.Call)}


def test_the_lock_check_finds_an_unlocked_writing_command() -> None:
    source = """
@app.command()
def report(model: str, output: Path) -> None:
    pass

@app.command()
def export(model: str) -> None:
    atomic_write_text(Path("x.json"), "{}")

@app.command()
@locks_output("output")
def fine(output: Path) -> None:
    atomic_write_text(output, "{}")

@app.command()
def show(model: str) -> None:
    print(model)
"""
    assert unlocked_writing_commands(source) == ["report", "export"]


# --- 5. a library that writes by itself writes only into a held folder (issue #49) -----------------------------

LIBRARY_WRITERS = {"save_pretrained", "init_trackers", "save_state", "save_model", "save_vocabulary", "add_hparams"}
LIBRARY_WRITERS |= {"ResultCache", "save_to_cache"}
HELD_WRITERS = {
    ("csekit.evaluation.mteb_run", "ResultCache"): ("_save_results", "atomic_directory"),
    ("csekit.evaluation.mteb_run", "save_to_cache"): ("_save_results", "atomic_directory"),
    ("csekit.encoding.export", "save_pretrained"): ("_write", "atomic_directory"),
    ("csekit.training.trackers", "init_trackers"): ("start_trackers", "HeldFolder"),
}
"""(module, library call) -> (the one function that may make it, what gives that function its folder): `_write` is
called only on `atomic_directory`'s held staging folder; `start_trackers` takes the `HeldFolder` of logs/."""


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    yield from (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def library_writes_outside_held_folders(source: str, module: str) -> list[str]:
    """Library writer calls in `source` outside their HELD_WRITERS function, or whose function is reached otherwise
    than through its held folder."""
    tree = ast.parse(source)
    problems = []
    for function in _functions(tree):
        for call in (c for c in ast.walk(function) if isinstance(c, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else None
            if name not in LIBRARY_WRITERS:
                continue
            allowed = HELD_WRITERS.get((module, name))
            if allowed is None or function.name != allowed[0]:
                problems.append(f"{module}:{call.lineno} {name} in {function.name}")
    for (owner, _), (function_name, source_of_folder) in HELD_WRITERS.items():
        if owner != module:
            continue
        if source_of_folder == "HeldFolder":
            (definition,) = (f for f in _functions(tree) if f.name == function_name)
            if "HeldFolder" not in {ast.unparse(a.annotation) for a in definition.args.args if a.annotation}:
                problems.append(f"{module}.{function_name} does not take a HeldFolder")
            continue
        held = {  # the names bound by `with atomic_directory(...) as NAME`
            item.optional_vars.id
            for node in ast.walk(tree)
            if isinstance(node, ast.With)
            for item in node.items
            if isinstance(item.optional_vars, ast.Name) and ast.unparse(item.context_expr).startswith(source_of_folder)
        }
        for call in (c for c in ast.walk(tree) if isinstance(c, ast.Call)):
            if ast.unparse(call.func).split(".")[-1] == function_name and not (
                call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in held
            ):
                problems.append(f"{module}:{call.lineno} {function_name} on a folder that is not held")
    return problems


def test_library_writers_write_only_into_held_folders() -> None:
    problems = found_in_src(library_writes_outside_held_folders)
    assert not problems, "\n".join(problems)


def test_the_held_folder_check_finds_a_library_writer_elsewhere() -> None:
    source = """
def _write(self, out):
    self.backbone.save_pretrained(out)

def save(self, path):
    with atomic_directory(path) as tmp:
        self._write(tmp)
    self._write(path)

def export(self, folder):
    self.tokenizer.save_pretrained(folder)
"""
    assert library_writes_outside_held_folders(source, "csekit.encoding.export") == [
        "csekit.encoding.export:11 save_pretrained in export",
        "csekit.encoding.export:8 _write on a folder that is not held",
    ]
