"""Every name written into a report is escaped by one renderer (core/report_cells.py): results.md's and a model
card's Markdown rows, results.csv's text cells. A name from a file csekit did not write (a run's results.json
naming a task, a published file's source) stays one cell of one row, and no CSV cell runs as a formula."""

from __future__ import annotations

import ast
import csv
import io
import re

from conftest import hostile_examples
from hypothesis import given
from hypothesis import strategies as st
from test_architecture import SRC, module_name

from csekit.bench.tables import format_csv, format_markdown, format_paired_markdown, table_rows
from csekit.core.report_cells import csv_text, markdown_cell
from csekit.encoding.model_card import before_after_lines
from csekit.evaluation.table import score_table

RENDERER = "csekit.core.report_cells"
HOSTILE_TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.sampled_from("|\n\r\\<>=+-@\t\u2028\x00`*_")), min_size=1, max_size=16
)
"""Names drawn with every Unicode character, and more often the ones that break a Markdown row or a CSV cell."""
_CELL_SEPARATOR = re.compile(r"(?<!\\)((?:\\\\)*)\|")


def _cells(row: str) -> list[str]:
    """The cells of a Markdown table row, split where GitHub's tables split it (a `|` not backslash-escaped)."""
    assert row.startswith("| ") and row.endswith(" |"), row
    marked = _CELL_SEPARATOR.sub(lambda match: match.group(1) + "\x00", row[2:-2])
    return [cell.strip() for cell in marked.split(" \x00 ")]


def _one_row_per_line(markdown: str, rows: int) -> list[list[str]]:
    lines = markdown.rstrip("\n").split("\n")
    assert len(lines) == rows + 2, markdown
    split = [_cells(line) for line in (lines[0], *lines[2:])]
    assert len({len(cells) for cells in split}) == 1, markdown
    assert all(char.isprintable() for line in lines for char in line), markdown
    return split


@hostile_examples(30)
@given(st.lists(HOSTILE_TEXT, min_size=1, max_size=3, unique=True), HOSTILE_TEXT)
def test_any_method_or_task_name_is_one_cell_of_one_row_in_results_md_and_csv(methods: list[str], task: str) -> None:
    """Task names come from the runs' results.json (a file anyone could have left in the output folder)."""
    runs = {method: [{"tasks": {f"pairs:{task}": {"spearman": 0.5}, "stsb-dev": 0.8}}] for method in methods}
    labels, rows = table_rows(runs)
    table = _one_row_per_line(format_markdown(labels, rows), len(methods))
    assert table[0][2:] == [markdown_cell(label).strip() for label in labels]
    assert [row[0] for row in table[1:]] == [markdown_cell(method).strip() for method in methods]
    read = list(csv.reader(io.StringIO(format_csv(labels, rows))))
    assert len(read) == len(methods) + 1 and [row[0] for row in read[1:]] == [csv_text(m) for m in methods]
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in [*read[0], *(row[0] for row in read[1:])])


@hostile_examples(30)
@given(HOSTILE_TEXT, HOSTILE_TEXT)
def test_the_paired_table_the_model_card_and_the_score_table_keep_a_name_in_its_cell(method: str, task: str) -> None:
    from csekit.bench.tables import PairedDifference

    paired = {method: {"STS Avg.": PairedDifference(seeds=[1, 2], mean=1.0, p_value=0.5, higher=1)}}
    _one_row_per_line(format_paired_markdown(task, paired), 1)
    _one_row_per_line("\n".join(before_after_lines({task: 0.5}, {task: 0.6}, 3)), 1)
    _one_row_per_line(score_table([task, "Avg."], [0.5, None]), 1)


def test_a_name_is_escaped_not_dropped() -> None:
    assert markdown_cell("a|b\nc\\d<e>") == "a\\|b\\nc\\\\d<e>"
    assert csv_text("=1+1") == "'=1+1" and csv_text("-x") == "'-x" and csv_text("@SUM(A1)") == "'@SUM(A1)"
    assert csv_text("plain name") == "plain name" and csv_text("a\nb") == "a\\nb"


# --- the rule's one place: no Markdown row is built by hand ------------------------------------------------------


def hand_built_rows(source: str, module: str) -> list[str]:
    """Markdown rows built with values interpolated outside the renderer: an f-string starting with `|` that holds
    a value, or `"| " + ...` (a literal row without values, a header or a rule, is fine)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        starts_with_bar = False
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            first = node.values[0]
            starts_with_bar = isinstance(first, ast.Constant) and str(first.value).lstrip().startswith("|")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = node.left
            starts_with_bar = isinstance(left, ast.Constant) and str(left.value).startswith("| ")
        if starts_with_bar:
            found.append(f"{module}:{node.lineno} {ast.unparse(node)[:60]}")
    return found


def test_every_markdown_row_goes_through_the_renderer() -> None:
    offenders = [
        row
        for path in sorted((SRC / "csekit").rglob("*.py"))
        if module_name(path) != RENDERER
        for row in hand_built_rows(path.read_text(encoding="utf-8"), module_name(path))
    ]
    assert not offenders, "build these rows with csekit.core.report_cells.markdown_row:\n" + "\n".join(offenders)


def test_the_row_check_finds_a_row_built_by_hand() -> None:
    source = 'a = f"| {name} | {score} |"\nb = "| " + " | ".join(cells) + " |"\nc = "| Method | Seeds |"\n'
    source += 'd = markdown_row([name])\ne = f"{x} | y"\n'
    assert [entry.split(" ")[0] for entry in hand_built_rows(source, "m")] == ["m:1", "m:2"]
