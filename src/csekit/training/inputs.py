"""A recipe's input files, checked without training: what `csekit bench` verifies for a whole suite first.

A suite of many runs must not stop after hours because its ninth recipe's token counts were never made,
so every recipe's corpus, token-count files and data folder are looked up before the first training,
and a missing one is named with the command that makes it.
"""

from __future__ import annotations

from pathlib import Path

from csekit.core.errors import CsekitError
from csekit.data.corpus import HUB_PREFIX, resolve_corpus_path
from csekit.data.data_dir import resolve_data_dir
from csekit.prep.frequency import resolve_counts_path
from csekit.training.recipe import Recipe


def _corpus_hint(corpus: str) -> str:
    """How a missing corpus is made: `csekit augment` for the augmented JSONL corpora of OssCSE's recipes."""
    if corpus.endswith(".jsonl"):
        return f"; make it with: csekit augment --corpus SENTENCES.txt --output {corpus} (see the recipe's header)"
    return "; give data.corpus a text file with one sentence per line"


def check_recipe_inputs(recipe: Recipe, data_dir: str | Path | None, needs_data_dir: bool = True) -> None:
    """Raise a CsekitError naming the first missing input of `recipe`: data folder, corpus, token counts."""
    root: Path | None
    try:
        root = resolve_data_dir(data_dir)
    except CsekitError:
        if needs_data_dir or data_dir is not None:
            raise
        root = None
    corpus = recipe.data.corpus
    if not corpus.startswith(HUB_PREFIX):
        try:
            location = resolve_corpus_path(corpus, root)
        except CsekitError as error:
            raise CsekitError(f"{error}{_corpus_hint(corpus)}") from None
        if not Path(location).is_file():
            raise CsekitError(f"corpus {corpus} not found{_corpus_hint(corpus)}")
    for spec in recipe.objectives:
        if isinstance(spec.get("counts"), str):
            resolve_counts_path(spec["counts"], root)
