"""Hostile files V: cases of the rules nobody had named, found by attacking the readers added last (bench's run
results, the paper comparisons, suite_diagnose's reports, counts files, JSON objects). Each test failed before its
fix: a traceback, or a value silently lost or paired with the wrong run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import hostile_examples
from hypothesis import given
from hypothesis import strategies as st

from csekit.bench import load_suite, summarise
from csekit.core.errors import CsekitError

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
MISSING = object()


def _bench_folder(root: Path, seeds: tuple[int, ...] = (1, 2)) -> tuple[Path, Path]:
    """A suite of `base` and `meth` (baseline `base`) over `seeds`, each run finished with a results.json that
    records its own seed; returns (suite file, output folder)."""
    (root / "a.yaml").write_text("name: a\n", encoding="utf-8")
    suite = root / "suite.yaml"
    recipes = "".join(f"  - {{recipe: a.yaml, name: {name}}}\n" for name in ("base", "meth"))
    suite.write_text(f"seeds: {list(seeds)}\nbaseline: base\nrecipes:\n{recipes}", encoding="utf-8")
    out = root / "bench"
    for offset, name in enumerate(("base", "meth")):
        for seed in seeds:
            folder = out / f"{name}-seed{seed}"
            folder.mkdir(parents=True)
            report = {"recipe": name, "seed": seed, "tasks": {"STS12": {"all": 0.5}}, "averages": {"avg": 0.6}}
            report["averages"]["avg"] += 0.01 * seed * (offset + 1)
            (folder / "results.json").write_text(json.dumps(report), encoding="utf-8")
    return suite, out


def _record_seed(path: Path, seed: Any) -> None:
    """Rewrite the results.json at `path` with `seed` as its recorded seed (MISSING: without one)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    if seed is MISSING:
        del report["seed"]
    else:
        report["seed"] = seed
    path.write_text(json.dumps(report), encoding="utf-8")


def _assert_one_line(error: CsekitError, *needles: str) -> None:
    assert "\n" not in str(error), str(error)
    for needle in needles:
        assert needle in str(error), (needle, str(error))


# --- a run's results.json records its own seed -------------------------------------------------------------------


def test_a_results_json_copied_from_another_seeds_folder_is_refused_not_paired_with_itself(tmp_path: Path) -> None:
    """meth-seed2/results.json holding seed 1 (copied from meth-seed1) was paired with base's seed 1 twice: the
    paired table said "Paired seeds 1, 1" and a t-test over one seed counted twice."""
    suite, out = _bench_folder(tmp_path)
    copied = json.loads((out / "meth-seed1" / "results.json").read_text(encoding="utf-8"))
    (out / "meth-seed2" / "results.json").write_text(json.dumps(copied), encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        summarise(out, load_suite(suite))
    _assert_one_line(caught.value, "meth-seed2/results.json", '"seed" is', "2, the seed of its run folder")


@pytest.mark.parametrize(
    "seed", [MISSING, "x", [1], None, True, 1.0], ids=["missing", "text", "list", "null", "true", "float"]
)
def test_a_results_json_whose_seed_is_missing_or_not_a_seed_is_one_line(tmp_path: Path, seed: Any) -> None:
    """A results.json without `seed`, or with one of text or a list, was a KeyError, ValueError or TypeError
    traceback in the paired table (`int(report["seed"])`)."""
    suite, out = _bench_folder(tmp_path)
    _record_seed(out / "meth-seed1" / "results.json", seed)
    with pytest.raises(CsekitError) as caught:
        summarise(out, load_suite(suite))
    _assert_one_line(caught.value, "meth-seed1/results.json", '"seed"')


@hostile_examples(25)
@given(seed=JSON_VALUES | st.just(MISSING))
def test_any_recorded_seed_is_its_folders_or_one_line(seed: Any) -> None:
    """Whatever a results.json gives as its seed, the summary pairs each run by its folder's seed or refuses it
    in one line naming the file."""
    root = Path(tempfile.mkdtemp())
    try:
        suite, out = _bench_folder(root)
        _record_seed(out / "meth-seed2" / "results.json", seed)
        try:
            summarise(out, load_suite(suite))
        except CsekitError as error:
            assert not (type(seed) is int and seed == 2)
            _assert_one_line(error, "meth-seed2/results.json")
        else:
            assert type(seed) is int and seed == 2
            assert "| meth | 1, 2 |" in (out / "results.md").read_text(encoding="utf-8")
    finally:
        shutil.rmtree(root)


# --- an evaluation record of metrics.jsonl has a step that is a count ---------------------------------------------


@pytest.mark.parametrize("step", [MISSING, 10**400, -5], ids=["no-step", "step-10^400", "step-negative"])
def test_an_evaluation_record_without_a_step_that_is_a_count_is_one_line(tmp_path: Path, step: Any) -> None:
    """`{"align": ...}` without a step was a KeyError traceback in the summary's dev curves; a step of 10^400 an
    OverflowError in the plot; a negative one was plotted."""
    suite, out = _bench_folder(tmp_path)
    record: dict[str, Any] = {"align": 0.1, "uniform": -1.0, "stsb-dev": 0.5}
    if step is not MISSING:
        record["step"] = step
    (out / "base-seed1" / "metrics.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        summarise(out, load_suite(suite))
    _assert_one_line(caught.value, "base-seed1/metrics.jsonl:1")


@hostile_examples(25)
@given(step=JSON_VALUES | st.just(MISSING))
def test_any_step_of_an_evaluation_record_is_plotted_or_one_line(step: Any) -> None:
    root = Path(tempfile.mkdtemp())
    try:
        suite, out = _bench_folder(root)
        record: dict[str, Any] = {"align": 0.1, "uniform": -1.0, "stsb-dev": 0.5}
        if step is not MISSING:
            record["step"] = step
        (out / "base-seed1" / "metrics.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
        counts = type(step) is int and 0 <= step <= 2**62
        try:
            summarise(out, load_suite(suite))
        except CsekitError as error:
            assert not counts
            _assert_one_line(error, "base-seed1/metrics.jsonl:1")
        else:
            assert counts
    finally:
        shutil.rmtree(root)


# --- a key given twice in a JSON object is refused, as in YAML -----------------------------------------------------

JSON_KEYS = st.text(max_size=3)


@st.composite
def _json_with_a_repeated_key(draw: st.DrawFn) -> tuple[str, str]:
    """(JSON text of an object holding, at some depth, an object that gives one key twice; that key)."""
    key = draw(JSON_KEYS)
    inner = draw(st.dictionaries(JSON_KEYS.filter(lambda other: other != key), JSON_VALUES, max_size=3))
    items = [json.dumps(key) + ": " + json.dumps(draw(JSON_VALUES)) for _ in range(2)]
    items += [json.dumps(name) + ": " + json.dumps(value) for name, value in inner.items()]
    text = "{" + ", ".join(draw(st.permutations(items))) + "}"
    for name in draw(st.lists(JSON_KEYS, max_size=3)):
        text = "{" + json.dumps(name) + ": " + text + "}"
    return text, key


@hostile_examples(40)
@given(case=_json_with_a_repeated_key())
def test_a_key_given_twice_in_any_json_object_is_one_line(case: tuple[str, str]) -> None:
    """Python's JSON parser keeps the last value of a repeated key without a word (a counts file giving a token
    twice, a results.json giving an average twice, a metrics record giving stsb-dev twice: one value silently
    lost); YAML files were already refused for it. Both JSON readers now refuse it: whole files and JSON lines."""
    from csekit.core.bounded_read import read_json_file
    from csekit.core.json_lines import RowProblem, json_row

    text, key = case
    root = Path(tempfile.mkdtemp())
    try:
        path = root / "file.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(CsekitError) as caught:
            read_json_file(path, "metadata")
        _assert_one_line(caught.value, str(path), "is given twice in one object")
        if key.isalnum():  # a control character in the key is written as its escape
            assert f'key "{key}"' in str(caught.value)
        with pytest.raises(RowProblem, match="is given twice in one object"):
            json_row(text.encode("utf-8"))
    finally:
        shutil.rmtree(root)


@hostile_examples(40)
@given(value=st.dictionaries(JSON_KEYS, JSON_VALUES, max_size=4))
def test_json_without_a_repeated_key_reads_as_before(value: dict[str, Any]) -> None:
    from csekit.core.bounded_read import read_json_file
    from csekit.core.json_lines import json_row

    root = Path(tempfile.mkdtemp())
    try:
        path = root / "file.json"
        path.write_text(json.dumps(value), encoding="utf-8")
        expected = json.loads(json.dumps(value))
        assert _same(read_json_file(path, "metadata"), expected)
        assert _same(json_row(json.dumps(value)), expected)
    finally:
        shutil.rmtree(root)


def _same(read: Any, expected: Any) -> bool:
    """Equal, NaN equal to NaN (json.dumps writes NaN, which both readers read back)."""
    return json.dumps(read, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_a_counts_file_or_results_json_giving_a_key_twice_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: `csekit bench --summary-only` with a results.json that gives `avg` twice (the second won) and a
    counts file that gives a token twice (read_counts kept the last count)."""
    from conftest import assert_one_line_error, run_main

    from csekit.prep.frequency import read_counts

    suite, out = _bench_folder(tmp_path)
    path = out / "meth-seed1" / "results.json"
    path.write_text('{"seed": 1, "tasks": {}, "averages": {"avg": 0.61, "avg": 0.99}}', encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "bench", str(suite), "--output", str(out), "--summary-only")
    assert_one_line_error(code, err, "meth-seed1/results.json", 'key "avg" is given twice')
    counts = tmp_path / "counts.json"
    counts.write_text('{"the": 5, "cat": 2, "the": 1}', encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        read_counts(counts)
    _assert_one_line(caught.value, "counts.json", 'key "the" is given twice')


# --- a counts list gives each token once, as text -------------------------------------------------------------------

COUNTS = st.integers(min_value=0, max_value=2**62)


@hostile_examples(40)
@given(pairs=st.lists(st.tuples(st.sampled_from(["the", "cat", "##s"]) | JSON_VALUES, COUNTS), max_size=5))
def test_a_counts_list_is_read_as_its_pairs_or_one_line(pairs: list[tuple[Any, int]]) -> None:
    """labels_sort.json's layout ([[token, count], ...]): a token given twice kept its last count without a word,
    and a token of null, 1 or ["a"] was counted as the text "None", "1" or "['a']"."""
    from csekit.prep.frequency import read_counts

    root = Path(tempfile.mkdtemp())
    try:
        path = root / "labels_sort.json"
        path.write_text(json.dumps([list(pair) for pair in pairs]), encoding="utf-8")
        tokens = [token for token, _ in pairs]
        readable = all(isinstance(token, str) for token in tokens) and len(set(tokens)) == len(tokens)
        try:
            counts = read_counts(path)
        except CsekitError as error:
            assert not readable
            _assert_one_line(error, "labels_sort.json")
        else:
            assert readable and counts == dict(pairs)
    finally:
        shutil.rmtree(root)


# --- YAML keys are compared as YAML reads them ------------------------------------------------------------------------

ONE_KEY_TO_YAML = (
    ("~", "null", "Null", "NULL"),
    ("yes", "true", "on", "True", "Yes", "ON"),
    ("no", "false", "off", "False"),
    ("1", "0x1", "+1", "1.0", "01", "0b1", "1_0.0e-1"),
    ("2026-01-02", "2026-1-2"),
)


@hostile_examples(40)
@given(group=st.sampled_from(ONE_KEY_TO_YAML), data=st.data())
def test_two_spellings_of_one_key_in_a_yaml_mapping_are_refused_naming_both_lines(
    group: tuple[str, ...], data: Any
) -> None:
    """`~` and `null`, `yes` and `true`, `1` and `0x1` are one key once YAML has read them: the duplicate-key check
    compared the text, so the mapping kept the last value without a word (a published file with entries `~:` and
    `null:`, or `1:` and `1.0:`, lost one)."""
    from csekit.core.bounded_read import parse_yaml

    first, second = data.draw(st.lists(st.sampled_from(group), min_size=2, max_size=2, unique=True))
    if group[0].startswith("2026") and "2026-1-2" in (first, second):
        second = first  # an unpadded date is text to YAML, not a date: the same spelling twice instead
    text = f"other: 0\n{first}: 1\n{second}: 2\n"
    with pytest.raises(CsekitError) as caught:
        parse_yaml(text, "pub.yaml", "published-numbers file")
    _assert_one_line(caught.value, "pub.yaml:3:", "is given twice", "(lines 2 and 3")


def test_keys_different_as_written_and_as_read_are_kept() -> None:
    from csekit.core.bounded_read import parse_yaml

    value, _ = parse_yaml('"x": a\ny: b\n2: c\nfalse: d\n~: e\n2026-01-02: f\n', "x.yaml", "file")
    assert list(value.values()) == ["a", "b", "c", "d", "e", "f"]


@pytest.mark.parametrize(("first", "second"), [("~", '"None"'), ("true", '"True"'), ("1.5", '"1.5"'), ("null", "None")])
def test_two_published_entries_that_name_one_recipe_are_refused(tmp_path: Path, first: str, second: str) -> None:
    """A published file's entries are looked up by the recipe name as text: `~:` and `"None":` (or `true:` and
    `"True":`) both became the entry "None", and the second replaced the first without a word."""
    from csekit.evaluation.published import load_published

    path = tmp_path / "pub.yaml"
    path.write_text(f"{first}: {{reason: one}}\n{second}: {{reason: two}}\n", encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        load_published(path)
    _assert_one_line(caught.value, "pub.yaml:2:")


# --- a file task's `columns` list: each item is one column --------------------------------------------------------


@hostile_examples(40)
@given(
    items=st.lists(st.sampled_from(["s1", "s2", "score", "s1,s2", "s2, score", " s1", 1, 2, 3]), min_size=1, max_size=4)
)
def test_each_item_of_a_columns_list_is_one_column_or_the_list_is_refused(items: list[str | int]) -> None:
    """`{pairs: PATH, columns: ["s1,s2", score]}` was joined with commas and split again: two items read as three
    columns. Whatever the list, the columns read are its items, one each, or it is one line."""
    from csekit.evaluation.file_tasks import entry_columns

    try:
        columns = entry_columns(items)
    except CsekitError as error:
        _assert_one_line(error, "columns")
        return
    assert columns is not None and len(columns) == len(items) == 3
    for read, item in zip(columns, items, strict=True):
        assert str(read) == str(item).strip()


# --- a column bench reads from results.json is a score in its range ------------------------------------------------


@hostile_examples(40)
@given(
    column=st.sampled_from([("averages", "avg"), ("tasks", "STS12", "all"), ("tasks", "stsb-dev")]),
    value=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**300), 10**300),
)
def test_a_score_bench_reads_is_in_its_range_or_one_line(column: tuple[str, ...], value: float) -> None:
    """A results.json average of 1e308 passed the finite-number check, became infinite x 100, and the paper
    comparison's sums raised `ValueError: -inf + inf in fsum`, a traceback. Every column is a score in its range
    (a correlation, an accuracy, a retrieval score: [-1, 1]; alignment [0, 4], uniformity [-8, 0]) or one line."""
    root = Path(tempfile.mkdtemp())
    try:
        suite, out = _bench_folder(root)
        published = root / "pub.yaml"
        published.write_text("base: {source: S, scores: {STS Avg.: 50}}\nmeth: {source: M, scores: {STS Avg.: 52}}\n")
        suite.write_text(suite.read_text(encoding="utf-8") + "published: pub.yaml\n", encoding="utf-8")
        for seed, sign in ((1, 1), (2, -1)):
            path = out / f"meth-seed{seed}" / "results.json"
            report = json.loads(path.read_text(encoding="utf-8"))
            target = report
            for key in column[:-1]:
                target = target.setdefault(key, {})
            target[column[-1]] = sign * value
            path.write_text(json.dumps(report), encoding="utf-8")
        try:
            summarise(out, load_suite(suite))
        except CsekitError as error:
            assert abs(value) > 1
            _assert_one_line(error, "meth-seed1/results.json", "not a score in [-1, 1]")
        else:
            assert abs(value) <= 1
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize(
    ("file", "content", "needle"),
    [
        ("cosines.npy", [0.5, 1.5], "cosines.npy: holds values that are no cosines"),
        ("cosines.npy", [-1e308, 1e308], "cosines.npy: holds values that are no cosines"),
        ("metrics.jsonl", {"step": 1, "align": 0.1, "uniform": -1.0, "stsb-dev": 1e308}, "stsb-dev is '1e+308'"),
        ("metrics.jsonl", {"step": 1, "align": -3.0, "uniform": -1.0}, "align is '-3.0', not a number in [0, 4]"),
        ("results.json", {"train": -1e308, "evaluate": 1.0}, '"wall_seconds" must give'),
    ],
    ids=["cosine-1.5", "cosine-1e308", "dev-score-1e308", "align-negative", "wall-negative"],
)
def test_a_run_value_out_of_its_range_is_one_line(tmp_path: Path, file: str, content: Any, needle: str) -> None:
    """The same ranges for the run's other files: cosines of 1e308 were plotted, dev scores of 1e308 averaged to
    `inf`, a negative wall time tabulated."""
    import numpy as np

    suite, out = _bench_folder(tmp_path)
    folder = out / "base-seed1"
    if file == "cosines.npy":
        np.save(folder / file, np.array(content, dtype=np.float64))
    elif file == "metrics.jsonl":
        (folder / file).write_text(json.dumps(content) + "\n", encoding="utf-8")
    else:
        report = json.loads((folder / file).read_text(encoding="utf-8"))
        (folder / file).write_text(json.dumps({**report, "wall_seconds": content}), encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        summarise(out, load_suite(suite))
    _assert_one_line(caught.value, f"base-seed1/{file}", needle)


def test_a_bom_still_names_itself_in_both_json_readers(tmp_path: Path) -> None:
    """Guard: the shared decoder keeps json.loads' own word for a UTF-8 BOM (the decoder object skips that check)."""
    from csekit.core.bounded_read import read_json_file
    from csekit.core.json_lines import RowProblem, json_row

    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}')
    with pytest.raises(CsekitError, match="Unexpected UTF-8 BOM"):
        read_json_file(path, "metadata")
    with pytest.raises(RowProblem, match="Unexpected UTF-8 BOM"):
        json_row(path.read_bytes())


# --- a suite's names are text: any YAML value in a name field loads as its text or is one line ------------------

NAME_FIELDS = {
    "name": "name: {value}\nseeds: [1]\nrecipes:\n  - {{recipe: a.yaml, name: a}}\n  - {{recipe: a.yaml, name: b}}\n",
    "recipe name": "seeds: [1]\nrecipes:\n  - recipe: a.yaml\n    name: {value}\n",
    "baseline": "seeds: [1]\nbaseline: {value}\nrecipes:\n  - {{recipe: a.yaml, name: a}}\n",
    "control": "seeds: [1]\nrecipes:\n  - {{recipe: a.yaml, name: a}}\n"
    "  - {{recipe: a.yaml, name: b, control: {value}}}\n",
}


@hostile_examples(25)
@given(field=st.sampled_from(sorted(NAME_FIELDS)), value=JSON_VALUES)
def test_any_value_in_a_suite_name_field_is_its_text_or_one_line(field: str, value: Any) -> None:
    """A suite named `[x]` or `{a: 1}` was written into results.md as Python's spelling of a list or a dict; the
    rule for every name a suite gives (suite, recipe, baseline, control): text or a number, else one line."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "a.yaml").write_text("name: a\n", encoding="utf-8")
        suite = root / "suite.yaml"
        suite.write_text(NAME_FIELDS[field].format(value=json.dumps(value)), encoding="utf-8")
        try:
            loaded = load_suite(suite)
        except CsekitError as error:
            assert "\n" not in str(error) and str(suite) in str(error)
            return
    read = yaml.safe_load(json.dumps(value))  # the value as YAML reads what was written
    assert not isinstance(read, bool | list | dict), f"{field}: {read!r} loaded"
    names = {"name": loaded.name, "recipe name": loaded.recipes[0].name}
    names |= {"baseline": loaded.baseline, "control": loaded.recipes[-1].control}
    defaults = {"name": "suite", "recipe name": "a", "baseline": None, "control": None}  # a file's stem, or none
    assert names[field] == (defaults[field] if read in (None, "") else str(read))


def test_a_set_item_written_as_a_mapping_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """`- train.lr: 1e-4` (a YAML mapping) became the text "{'train.lr': 0.0001}" and was refused as an override."""
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    suite = tmp_path / "suite.yaml"
    suite.write_text("seeds: [1]\nrecipes:\n  - recipe: a.yaml\n    set:\n      - train.lr: 1.0e-4\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"suite\.yaml:4: set must be a list of key=value strings .*- train\.lr=1e-4"):
        load_suite(suite)
