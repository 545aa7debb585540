"""Reading files someone else may have written: bounded in size, plain files only, one-line errors.

A run folder, a model folder, a recipe, a suite, a corpus or a data folder may come from anyone. A file
there may be a link to an endless device (`/dev/zero`), a FIFO that blocks the reader forever, a
gigabyte of JSON, a line of gigabytes (decompressed from a few megabytes of `.gz`), or a YAML document
of a few hundred bytes whose nested aliases expand to billions of nodes. Every file csekit did not
write in this process is opened here. `tests/invariants/architecture/test_architecture_files.py`
(`test_every_read_goes_through_core_bounded_read`) finds any other read in `src/`; its allow-list names
the exceptions (the run lock's own file, the probe set shipped in the package, the archives
`download-data` fetched in this process). JSON-lines rows are parsed in `core/json_lines.py`, on these reads.

* `open_regular` opens without blocking (`O_NONBLOCK`) and refuses anything but a regular file after
  opening (`fstat`), so a FIFO, a device or a folder is one line, never a hang;
* whole files are read with a byte limit checked before parsing (`read_bounded_bytes`, `read_bounded_text`,
  `read_json_file`, `read_yaml_file`); a loader that takes a handle or a name (numpy, torch, safetensors)
  gets the checked file through `read_with` or `read_by_name`, with the byte limit its caller gives (a
  checkpoint is as large as its model: none there);
* line by line, `bounded_lines` never holds more than one line's limit, however long the line is
  (a `.gz` line included: the limit applies to the decompressed bytes);
* YAML is composed once with its expanded size and nesting depth counted (aliases included) and
  duplicate keys refused before anything is built; YAML text already read (`parse_yaml`) or given as a
  value (`parse_yaml_value`: a `--set` value, a suite's `set:` string) is bounded the same way.

A refused or damaged file is a `CsekitError` naming the file (and line). The lower-level readers
(`open_regular`, `read_bounded_bytes`) leave a missing or unreadable file as an `OSError` for the caller
to name, and `read_with` / `read_by_name` leave the loader's own exceptions to the caller.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

import yaml

from csekit.core.errors import CsekitError, absolute

METADATA_LIMIT = 16 * 2**20
"""The largest JSON or YAML metadata file read (a tokenizer.json is a few MiB; csekit's own files are KiB)."""

YAML_NODE_LIMIT = 100_000
"""The most nodes a YAML file may expand to, aliases counted each time they are used (a recipe has about 100)."""

YAML_DEPTH_LIMIT = 32
"""The deepest nesting of YAML containers read (a recipe nests 4 deep); deeper ones fail in recursive code later."""

TEXT_FILE_LIMIT = 2**30
"""The largest text file read whole (sentences to encode, an evaluation data set: SentEval's are at most 30 MiB)."""

_READ_CHUNK = 2**20
_T = TypeVar("_T")


class RepeatedKey(ValueError):
    """A JSON object that gives one key twice (`key`): JSON parsers keep the last value silently."""

    def __init__(self, key: str) -> None:
        super().__init__(f'key "{key[:80]}" is given twice in one object')
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, unless a key repeats (one value would be lost without a word)."""
    unique: dict[str, Any] = {}
    for key, value in pairs:
        if key in unique:
            raise RepeatedKey(key)
        unique[key] = value
    return unique


_JSON_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object)


def decode_json(text: str) -> Any:
    """The one JSON parser of files from elsewhere (`read_json_file`, `core/json_lines.py`): `json.loads`, except
    that a key given twice in an object is refused (`RepeatedKey`), as in YAML (`_check_unique_keys`)."""
    if text.startswith("\ufeff"):  # json.loads' own check, which the decoder object skips
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _JSON_DECODER.decode(text)


def open_regular(path: str | Path, limit: int | None = None, buffered: bool = True) -> BinaryIO:
    """`path` opened for binary reading, if it is a regular file (of at most `limit` bytes when given).

    Opened without blocking (a FIFO would wait for a writer forever), then checked with `fstat`, so a
    link to a device, a FIFO or a folder is a CsekitError naming it; a missing or unreadable file is an
    OSError for the caller to name.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, FIFO or socket)"
            raise CsekitError(f"{path} is {kind}; csekit reads only plain files there")
        if limit is not None and info.st_size > limit:
            raise CsekitError(f"{path} is {info.st_size} bytes, more than the {limit} csekit reads for such a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file never blocks; reads after this are ordinary reads
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb") if buffered else os.fdopen(fd, "rb", buffering=0)


def _open_named(path: str | Path, what: str, limit: int | None) -> BinaryIO:
    """`open_regular(path, limit)`, a missing or unreadable file a CsekitError naming it as `what`."""
    try:
        return open_regular(path, limit)
    except FileNotFoundError:
        raise CsekitError(f"{what} {absolute(path)} does not exist") from None
    except OSError as error:
        raise CsekitError(f"{what} {path}: cannot read it ({error.strerror or error})") from None


def read_with(path: str | Path, read: Callable[[BinaryIO], _T], what: str, limit: int | None = None) -> _T:
    """`read(handle)` on the regular file `path` (of at most `limit` bytes): for loaders that take a handle.

    `read_with(p, lambda handle: np.load(handle, allow_pickle=False), "cosines", 2**30)`. A missing or
    unreadable file is a CsekitError naming it; the loader's own exceptions are the caller's to name.
    """
    handle = _open_named(path, what, limit)
    with handle:
        return read(handle)


def read_by_name(path: str | Path, read: Callable[[str], _T], what: str, limit: int | None = None) -> _T:
    """`read(name)` for a loader that only takes a file name (safetensors): the regular file `path`, checked.

    On Linux the loader gets `/proc/self/fd/N` of the descriptor that was checked, so the file it opens is
    the one checked, even if the name is swapped meanwhile.
    """
    handle = _open_named(path, what, limit)
    with handle:
        by_descriptor = Path(f"/proc/self/fd/{handle.fileno()}")
        return read(str(by_descriptor if by_descriptor.exists() else path))


def bounded_lines(handle: IO[bytes], limit: int) -> Iterator[tuple[bytes | None, int]]:
    """Each line of `handle` with its line end, and its size in bytes; a line of more than `limit` bytes (line
    end included) is `(None, size)`: the rest of it is read and counted in chunks, never held whole.

    Only `\n` ends a line; the last line may lack it.
    """
    while chunk := handle.readline(limit + 1):
        size, ended = len(chunk), chunk.endswith(b"\n")
        if size <= limit:
            yield chunk, size
            continue
        while not ended and (more := handle.readline(_READ_CHUNK)):
            size, ended = size + len(more), more.endswith(b"\n")
        yield None, size


def read_bounded_bytes(path: str | Path, limit: int = METADATA_LIMIT) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError for a missing or unreadable file.

    Opened without blocking (a FIFO would wait for a writer forever) and checked to be a regular file
    after opening, so a link to a device or a FIFO is refused, not read.
    """
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise CsekitError(f"{path} grew past {limit} bytes while it was read")
    return data


def read_bounded_text(path: str | Path, what: str, limit: int = METADATA_LIMIT) -> str:
    """A UTF-8 file's text; a missing, unreadable, oversized or undecodable file is a CsekitError naming it."""
    try:
        data = read_bounded_bytes(path, limit)
    except FileNotFoundError:
        raise CsekitError(f"{what} {absolute(path)} does not exist") from None
    except OSError as error:
        raise CsekitError(f"{what} {path}: cannot read it ({error.strerror or error})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CsekitError(f"{path}:{line}: {what} is not valid UTF-8") from None


def read_json_file(path: str | Path, what: str, limit: int = METADATA_LIMIT) -> Any:
    """A JSON file's value (bounded read); damage is one line naming the file and the JSON error's line."""
    text = read_bounded_text(path, what, limit)
    try:
        return decode_json(text)
    except RepeatedKey as error:
        raise CsekitError(f"{path}: {what}: {error}; keep one") from None
    except json.JSONDecodeError as error:
        raise CsekitError(f"{path}:{error.lineno}: {what} is not valid JSON ({error.msg})") from None
    except RecursionError:
        raise CsekitError(f"{path}: {what} is nested too deeply") from None
    except ValueError as error:  # an integer past Python's 4,300 digits (json.loads converts it whole)
        raise CsekitError(f"{path}: {what} holds a number too long to read ({str(error)[:60]})") from None


def read_yaml_file(path: str | Path, what: str, limit: int = 2**20) -> tuple[Any, yaml.Node | None]:
    """A YAML file's value and its composed node (for line numbers): bounded, aliases counted, no duplicate keys.

    Read with PyYAML's SafeLoader (plain values and containers only, never a Python object).
    """
    return parse_yaml(read_bounded_text(path, what, limit), str(path), what)


def parse_yaml(text: str, label: str, what: str) -> tuple[Any, yaml.Node | None]:
    """`read_yaml_file` on text already read; `label` names it in errors."""
    try:
        return _parse_bounded_yaml(text, label, what)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise CsekitError(f"{label}{line}: invalid YAML in the {what} ({problem})") from None


def parse_yaml_value(text: str, label: str) -> Any:
    """A value given as YAML text (a `--set` value, a suite's `set:` string), bounded like a YAML file; text that
    is not valid YAML is that text itself (`--set model.name=a: b` sets the string)."""
    try:
        return _parse_bounded_yaml(text, label, "value")[0]
    except yaml.YAMLError:
        return text


def _parse_bounded_yaml(text: str, label: str, what: str) -> tuple[Any, yaml.Node | None]:
    """Compose `text` once, refuse it if it expands too far, nests too deep or repeats a key, then build it.

    PyYAML's own errors pass through (the callers word them); the bounds are CsekitErrors.
    """
    _check_depth(text, label, what)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_size(node, label, what)
        _check_unique_keys(node, label, what)
        return loader.construct_document(node), node
    except RecursionError:
        raise CsekitError(f"{label}: the {what} nests too deeply; csekit does not read it") from None
    except ValueError as error:  # an integer past Python's 4,300 digits, a date such as 2026-13-45
        raise CsekitError(f"{label}: the {what} holds a value that cannot be read ({str(error)[:80]})") from None
    finally:
        loader.dispose()


def _check_depth(text: str, label: str, what: str) -> None:
    """Refuse containers nested deeper than YAML_DEPTH_LIMIT from the parser's events, before anything is composed:
    PyYAML composes recursively, and 2,000 brackets took 4.5 s to end in a RecursionError (the events stop at the
    limit)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > YAML_DEPTH_LIMIT:
                where = f"{label}:{event.start_mark.line + 1}"
                raise CsekitError(
                    f"{where}: the {what} nests more than {YAML_DEPTH_LIMIT} levels deep; csekit does not read it"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_size(root: yaml.Node, label: str, what: str) -> None:
    """Count the nodes `root` expands to (an alias counts its anchor's nodes each time) and how deep its containers
    nest, without expanding it."""
    measured: dict[int, tuple[int, int]] = {}  # node -> (nodes it expands to, container levels)
    open_nodes: set[int] = set()

    def measure(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in measured:
            return measured[key]
        if key in open_nodes:
            raise CsekitError(f"{label}:{node.start_mark.line + 1}: the {what} refers to itself (a recursive alias)")
        open_nodes.add(key)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes = [measure(child) for child in children]
        total = 1 + sum(size for size, _ in sizes)
        levels = (1 + max((depth for _, depth in sizes), default=0)) if isinstance(node, yaml.CollectionNode) else 0
        open_nodes.discard(key)
        measured[key] = total, levels
        if total > YAML_NODE_LIMIT:
            raise CsekitError(
                f"{label}:{node.start_mark.line + 1}: the {what} expands to more than {YAML_NODE_LIMIT} values "
                "(nested aliases?); csekit does not read it"
            )
        if levels > YAML_DEPTH_LIMIT:
            raise CsekitError(
                f"{label}:{node.start_mark.line + 1}: the {what} nests more than {YAML_DEPTH_LIMIT} levels deep; "
                "csekit does not read it"
            )
        return total, levels

    measure(root)


def _check_unique_keys(root: yaml.Node, label: str, what: str) -> None:
    """A key given twice in one mapping is refused, naming both lines (YAML would keep the last silently). Keys are
    compared as written (`"1"` and `1` would be one name to a reader of names) and as YAML reads them: `~` and
    `null`, `yes` and `true`, `1` and `0x1` are one key."""
    constructor = yaml.constructor.SafeConstructor()
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, tuple[str, int]] = {}
            for key_node, value_node in node.value:
                stack += [key_node, value_node]
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key_node.start_mark.line + 1
                key = constructor.construct_object(key_node)
                repeated = lines.get(key) or lines.get(("text", key_node.value))
                if repeated is not None:
                    first, first_line = repeated
                    spelled = (
                        "" if first == key_node.value else f', as "{first}" and "{key_node.value}", one key to YAML'
                    )
                    raise CsekitError(
                        f'{label}:{line}: key "{key_node.value}" is given twice in the {what} (lines '
                        f"{first_line} and {line}{spelled}); keep one"
                    )
                lines[key] = lines[("text", key_node.value)] = key_node.value, line
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
