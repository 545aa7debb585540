"""The input rules hold by construction (issue #49), checked on the source with ast: JSON text read from files
is parsed in core/json_lines.py or core/bounded_read.py, text reaches a tokenizer only through
encoding/token_input.py, and YAML is parsed only by the bounded parser (the file rules: test_architecture_files.py).
"""

from __future__ import annotations

import ast

from test_architecture import SRC, module_name
from test_architecture_files import READER_MODULE, _aliases, _dotted, found_in_src

# --- 6. JSON text read from files is parsed in core/json_lines.py or core/bounded_read.py (issue #49) ----------

JSON_PARSERS = {"csekit.core.json_lines", "csekit.core.bounded_read"}
ALLOWED_JSON_PARSES: dict[str, str] = {}
"""Modules that may parse JSON themselves, each with its reason (none: the lock file and a safetensors header
go through json_row too)."""


def json_parses(source: str, module: str) -> list[str]:
    """Every `json.loads` call of `source` (a row parsed outside core/json_lines.py skips its row checks)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    return [f"{module}:{call.lineno}" for call in calls if _dotted(call.func, aliases) == "json.loads"]


def test_json_lines_are_parsed_in_core_json_lines() -> None:
    """A JSON-lines row parsed by hand skipped the row checks (AttributeError on `[1, 2]`, RecursionError on
    nested brackets: issue #49, defect 9): every `json.loads` of src/ is in the two core readers or reviewed."""
    found = {
        module_name(path): json_parses(path.read_text(encoding="utf-8"), module_name(path))
        for path in sorted((SRC / "csekit").rglob("*.py"))
    }
    raw = [
        call
        for module, calls in found.items()
        if module not in JSON_PARSERS | set(ALLOWED_JSON_PARSES)
        for call in calls
    ]
    assert not raw, "parse these rows with csekit.core.json_lines (or review ALLOWED_JSON_PARSES):\n" + "\n".join(raw)
    assert all(found.get(module) for module in ALLOWED_JSON_PARSES), "an ALLOWED_JSON_PARSES entry is stale"
    assert json_parses("import json as j\nfrom json import loads\nj.loads(a)\nloads(b)\n", "example") == [
        "example:3",
        "example:4",
    ]


# --- 7. text reaches a tokenizer only through encoding/token_input.py (issue #49) ----------------------------

TOKENIZER_HOME = "csekit.encoding.token_input"
TOKENIZER_METHODS = {"encode", "encode_plus", "batch_encode_plus", "tokenize", "__call__", "_batch_encode_plus"}


def _names_a_tokenizer(node: ast.expr, exactly: bool) -> bool:
    """`tokenizer`, `self.tokenizer`, `encoder.tokenizer` (and, unless `exactly`, `fast_tokenizer`): a value named
    as a tokenizer (a function such as `check_tokenizer` is called with a tokenizer, not as one)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "tokenizer" or (not exactly and name.endswith("tokenizer"))


def tokenizer_calls(source: str, module: str) -> list[str]:
    """Calls of a tokenizer on anything but literal text (a line of any length would reach it whole)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        direct = _names_a_tokenizer(func, exactly=True)
        method = isinstance(func, ast.Attribute) and func.attr in TOKENIZER_METHODS
        method = method and _names_a_tokenizer(func.value, exactly=False)
        literal = all(isinstance(arg, ast.Constant) for arg in node.args)
        if (direct or method) and not literal:
            found.append(f"{module}:{node.lineno} {ast.unparse(func)}")
    return found


def test_text_reaches_a_tokenizer_only_through_token_input() -> None:
    """A tokenizer given a whole line tokenizes all of it before truncating: a 300 MB line aborted the process in
    Rust (issue #49, defect 8). Every call on text that is not a literal goes through tokenize_texts."""
    raw = found_in_src(tokenizer_calls, outside=TOKENIZER_HOME)
    assert not raw, "cut the text with csekit.encoding.token_input.tokenize_texts:\n" + "\n".join(raw)
    bypasses = (
        "tokenizer(lines)\nself.tokenizer(x, truncation=True)\nfast_tokenizer.encode(s)\nenc.tokenizer.tokenize(t)\n"
    )
    assert len(tokenizer_calls(bypasses, "example")) == 4
    clean = 'tokenizer("a")\nencoder.tokenize(texts)\nmoses.tokenize(s)\ncheck_tokenizer(name, tokenizer)\n'
    assert tokenizer_calls(clean, "example") == []


# --- 8. YAML text is parsed only by core/bounded_read.py's bounded parser (issue #49 defect 3) -----------------

YAML_PARSERS = {
    *(f"yaml.{name}" for name in ("load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all")),
    *(f"yaml.{name}" for name in ("compose", "compose_all", "parse", "scan")),
    *(f"yaml.{name}" for name in ("Loader", "SafeLoader", "FullLoader", "UnsafeLoader", "BaseLoader")),
    *(f"yaml.{name}" for name in ("CLoader", "CSafeLoader", "CFullLoader", "CUnsafeLoader", "CBaseLoader")),
    *(f"omegaconf.OmegaConf.{name}" for name in ("load", "create", "from_dotlist", "from_cli", "from_yaml")),
}
"""Everything that turns YAML text into values (OmegaConf.create parses a string as YAML)."""


def yaml_parses(source: str, module: str) -> list[str]:
    """Each call in `source` that parses YAML text itself (`module:line name`)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    return [
        f"{module}:{node.lineno} {name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (name := _dotted(node.func, aliases)) in YAML_PARSERS
    ]


def test_every_yaml_parse_goes_through_the_bounded_parser() -> None:
    """Issue #49 defect 3: a `--set` value went through yaml.safe_load (an allow-listed "string, not a file"), and
    OmegaConf expanded its aliases: 515 bytes hung `bench`. Text from a file or a flag is YAML all the same:
    `parse_yaml` / `parse_yaml_value` count aliases, nesting and keys before anything is built."""
    raw = found_in_src(yaml_parses, outside=READER_MODULE)
    assert not raw, "parse YAML with csekit.core.bounded_read.parse_yaml or parse_yaml_value:\n" + "\n".join(raw)


def test_the_yaml_check_finds_each_way_to_parse_yaml() -> None:
    source = """
import yaml
from yaml import safe_load as load_it
from omegaconf import OmegaConf

def f(text, stream):
    yaml.safe_load(text)
    load_it(text)
    yaml.compose(text)
    yaml.SafeLoader(stream)
    yaml.load(text, Loader=yaml.SafeLoader)
    OmegaConf.create(text)
    OmegaConf.from_dotlist([text])
    yaml.safe_dump(text)
    OmegaConf.merge(text)
"""
    found = [entry.split(" ", 1)[1] for entry in yaml_parses(source, "m")]
    assert sorted(found) == sorted(
        [
            "yaml.safe_load",
            "yaml.safe_load",
            "yaml.compose",
            "yaml.SafeLoader",
            "yaml.load",
            "omegaconf.OmegaConf.create",
            "omegaconf.OmegaConf.from_dotlist",
        ]
    )
