"""The inventory of readers (issue "Hostile files IV"): every call of a core reader (core/bounded_read.py,
core/json_lines.py) in src/ is attacked by an entry of test_fuzz_files.py's READERS (or another test of hostile
input, named), or listed as reading a file csekit wrote itself; a new reader fails here until it joins a table."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from test_architecture import SRC, module_name

READ_CALLS = {"read_json_file", "read_yaml_file", "read_bounded_text", "read_bounded_bytes", "read_with"}
READ_CALLS |= {"read_by_name", "bounded_lines", "open_regular", "json_row", "json_rows", "parse_yaml"}
READ_CALLS |= {"parse_yaml_value", "read_json", "numbered_lines"}
CORE_READERS = {"csekit.core.bounded_read", "csekit.core.json_lines"}
COVERED = {
    ("csekit.bench.results", "read_results"): "bench results.json",
    ("csekit.bench.suite", "load_suite"): "suite",
    ("csekit.evaluation.published", "load_published"): "published numbers",
    ("csekit.training.recipe", "load_recipe"): "recipe",
    ("csekit.training.recipe", "_parse_override"): "test_any_set_value_for_any_recipe_key_loads_or_is_one_line",
    ("csekit.training.recipe_paths", "older_run_hint"): "recipe (a run folder's saved recipe.yaml, the same reader)",
    ("csekit.training.run_folder", "read_trainer_state"): "checkpoint trainer_state.json",
    ("csekit.evaluation.pairs", "read_pairs"): "pairs .tsv, .csv",
    ("csekit.evaluation.pairs", "_json_values"): "pairs .jsonl",
    ("csekit.evaluation.retrieval_data", "_rows"): "retrieval corpus.jsonl, queries.jsonl",
    ("csekit.evaluation.retrieval_data", "read_qrels"): "retrieval qrels",
    ("csekit.encoding.model_folder", "check_model_folder"): "model config.json",
    ("csekit.encoding.model_folder", "read_json"): "csekit.json",
    ("csekit.encoding.model_folder", "_csekit_layout"): "csekit.json",
    ("csekit.encoding.model_folder", "refuse_own_code"): "model config.json, tokenizer_config.json",
    ("csekit.encoding.model_config", "check_tokenizer_config"): "tokenizer_config.json",
    ("csekit.encoding.model_files", "_check_shards"): "weights index",
    ("csekit.encoding.model_files", "check_library_file"): "every file above (each is opened bounded first)",
    ("csekit.encoding.folder_pooling", "read_modules"): "sentence-transformers modules.json",
    ("csekit.encoding.folder_pooling", "_read_object"): "sentence-transformers Pooling, Transformer, ST configs",
    ("csekit.evaluation.mteb_meta", "read_training_facts"): "csekit.json training facts",
    ("csekit.prep.frequency", "_read_counts_cached"): "freq counts",
    ("csekit.data.corpus", "_scan"): "test_fuzz_readers.py (corpus bytes, JSON lines), test_hostile_iv.py (.gz)",
    ("csekit.data.corpus", "__getitem__"): "test_fuzz_readers.py (the corpus reader)",
    ("csekit.data.corpus", "_json_text"): "test_fuzz_readers.py (JSON-lines rows)",
    ("csekit.prep.augment", "_resume_point"): "test_fuzz_readers.py (augment-restart)",
    ("csekit.prep.augment", "_sentences"): "test_fuzz_readers.py (the corpus bytes, the same line reader)",
    ("csekit.prep.paraphrase", "__init__"): "test_fuzz_readers.py (paraphrases)",
    ("csekit.evaluation.probes", "load_transformation_probe"): "test_fuzz_readers.py (probe-transformations)",
    ("csekit.training.run_folder", "metrics_record"): "test_fuzz_readers.py (metrics-resume)",
    ("csekit.training.run_folder", "truncate_after"): "test_fuzz_readers.py (metrics-resume)",
    ("csekit.training.run_folder", "_copy_records"): "test_fuzz_readers.py (metrics-resume)",
    ("csekit.bench.results", "_evaluation_points"): "test_hostile_files.py (a bad run file in a bench summary)",
    ("csekit.evaluation.files", "read_text"): "test_fuzz_readers.py (STS and transfer files)",
    ("csekit.core.run_lock", "_holder"): "test_fuzz_readers.py (a lock file's JSON)",
    ("csekit.encoding.weight_files", "read_safetensors_header"): "test_hostile_models.py, test_fuzz_readers.py",
    ("csekit.encoding.weight_files", "_bin_dtypes"): "test_hostile_vi.py (weight files: dtypes, any bytes)",
    ("csekit.commands.encode", "read_sentences"): "test_input_lines.py (encode --input)",
    ("csekit.core.lines", "read_lines"): "test_input_lines.py",
    ("csekit.prep.frequency", "count_tokens"): "test_fuzz_readers.py (the corpus bytes, the same line reader)",
    ("csekit.bench.results", "read_cosines"): "test_hostile_files.py (a bad run file in a bench summary)",
    ("csekit.encoding.model_files", "_check_fast_tokenizer_files"): "test_hostile_models.py (tokenizer files)",
    ("csekit.encoding.model_folder", "load_kept_head"): "test_model_loading.py (a kept head's weights)",
    ("csekit.training.checkpoint", "_load_tensors"): "test_hostile.py (crafted checkpoint values)",
    ("csekit.training.checkpoint", "_load_model_and_optimizer"): "test_hostile.py (crafted checkpoint values)",
    ("csekit.evaluation.instructions", "read_instruction_set"): "mteb instruction set",
    ("csekit.commands.recipes", "_backbone"): "csekit recipes' list",
    ("csekit.evaluation.diagnose", "read_diagnose_report"): "test_hostile_v.py (a diagnose report read back)",
}
"""(module, function) reading a file from elsewhere -> the READERS entry (or the test) that attacks it."""
OWN_FILES = {
    ("csekit.core.atomic", "current_umask"): "/proc/self/status",
    ("csekit.core.precision", "cpu_model_and_flags"): "/proc/cpuinfo",
    ("csekit.data.corpus_download", "__init__"): "a download csekit is writing (checked against its checksum)",
    ("csekit.data.corpus_download", "_check_complete"): "a download csekit wrote (checked against its checksum)",
    ("csekit.data.corpus_download", "count_lines"): "a download csekit wrote (checked against its checksum)",
    ("csekit.data.data_dir", "_rewrite_columns"): "a SentEval file download-data unpacked after its checksum",
    ("csekit.data.data_dir", "_verify"): "download-data's archive, read to check its checksum",
    ("csekit.data.data_dir", "download_senteval_data"): "a SentEval file download-data unpacked after its checksum",
    ("csekit.encoding.export", "_append_eos_when_tokenizing"): "the tokenizer.json csekit just saved",
    ("csekit.encoding.export", "_write_pooling"): "the config.json csekit just saved",
}
"""Reads of files csekit wrote in this process, or the system's: not attacked here."""


def _reader_calls(source: str, module: str) -> Iterator[tuple[str, str]]:
    """(module, innermost function) for each call of a core reader in `source`."""

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in READ_CALLS:
                    yield module, function
            yield from visit(child, inner)

    yield from visit(ast.parse(source), "<module>")


def test_every_reader_of_src_is_in_the_table() -> None:
    found = {
        call
        for path in sorted((SRC / "csekit").rglob("*.py"))
        if module_name(path) not in CORE_READERS
        for call in _reader_calls(path.read_text(encoding="utf-8"), module_name(path))
    }
    listed = set(COVERED) | set(OWN_FILES)
    assert not found - listed, f"readers not attacked by any table: add them to READERS and COVERED: {found - listed}"
    assert not listed - found, f"gone from the source: {listed - found}"
    assert not set(COVERED) & set(OWN_FILES)


def test_the_reader_check_finds_a_new_reader() -> None:
    source = "def load(path):\n    return read_json_file(path, 'x')\nclass A:\n    def f(self):\n        json_row(b)\n"
    assert list(_reader_calls(source, "m")) == [("m", "load"), ("m", "f")]
