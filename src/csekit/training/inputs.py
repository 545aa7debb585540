"""A recipe's input files, checked without training: what `csekit bench` verifies for a whole suite first.

A suite of many runs must not stop after hours because its ninth recipe's token counts were never made,
so every recipe's corpus, token-count files and data folder are looked up before the first training,
and a missing one is named with the command that makes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from csekit.core.errors import CsekitError
from csekit.data.corpus import HUB_PREFIX, resolve_corpus_path
from csekit.data.corpus_download import CORPORA
from csekit.data.data_dir import resolve_data_dir
from csekit.prep.frequency import resolve_counts_path
from csekit.training.recipe import Recipe


def _corpus_hint(corpus: str, data_dir: Path | None) -> str:
    """How a missing corpus is made: `csekit download-data` for the papers' corpus (SimCSE's wiki1m),
    `csekit augment` for the augmented JSONL corpora of OssCSE's and SNCSE's recipes."""
    downloadable = [source for source in CORPORA.values() if Path(corpus).name == source.file_name]
    if downloadable:
        folder = data_dir if data_dir is not None else "DATA_DIR"
        return f"; make it with: csekit download-data {folder} --corpus {downloadable[0].name}"
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
            raise CsekitError(f"{error}{_corpus_hint(corpus, root)}") from None
        if not os.path.isfile(location):
            raise CsekitError(f"corpus {corpus} not found (looked for {location}){_corpus_hint(corpus, root)}")
    for spec in recipe.objectives:
        if isinstance(spec.get("counts"), str):
            resolve_counts_path(spec["counts"], root)
