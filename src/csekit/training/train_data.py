"""What a run trains on: the corpus (checked line by line), its duplicates, and the batches.

`TrainData.load` reads the corpus before anything is written; `TrainData.loader` gives the DataLoader once
the model's views (which collate each batch) exist; `epoch_batches` runs it epoch after epoch from a run's
data position, skipping the batches a resumed run had already taken.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset, Subset

from csekit.core.errors import CsekitError
from csekit.data.corpus import TrainCollator, open_corpus, sentence_text
from csekit.data.data_dir import optional_data_dir, resolve_data_dir
from csekit.data.duplicates import DuplicateReport, SentenceGroups, SeparatingSampler, check_separable
from csekit.evaluation.task_set import TaskSet
from csekit.training.chunked import check_chunk_size
from csekit.training.dev_selection import dev_task_set
from csekit.training.interrupt import loader_workers_leave_stop_signals
from csekit.training.loading import LoaderOptions, skipping_batches
from csekit.training.recipe import Recipe
from csekit.training.recipe_values import fields_read, recipe_parts
from csekit.training.run_folder import TrainerState


@dataclass
class TrainData:
    """The corpus, which of its rows repeat a sentence, and the dev tasks (`csekit.training.dev_selection`), read
    once from the data folder."""

    recipe: Recipe
    dev: TaskSet
    data_path: Path | None
    corpus: Any
    sentence_groups: SentenceGroups
    duplicates: DuplicateReport

    @classmethod
    def load(cls, recipe: Recipe, data_dir: str | Path | None) -> TrainData:
        """The data folder (required by a dev split), the dev tasks and the corpus, checked line by line."""
        dev = dev_task_set(recipe.train.dev_task)  # checked with the recipe
        data_path = resolve_data_dir(data_dir) if dev.of_kind("dev") else optional_data_dir(data_dir)
        dev.read(data_path)
        data = recipe.data
        fields = [name for _, _, name in fields_read(recipe_parts(recipe))]  # checked: a .jsonl corpus
        corpus = open_corpus(data.corpus, data_path, data.max_chars, data.bad_lines, data.text_column, fields)
        groups, duplicates = _find_duplicates(recipe, corpus)
        return cls(recipe, dev, data_path, corpus, groups, duplicates)

    def loader(self, views: Any, processes: int, chunk_size: Any, options: LoaderOptions) -> DataLoader:
        """Shuffled batches of `batch_size` sentences in all, split evenly over the processes.

        `data.duplicates`: keep shuffles the corpus; drop shuffles its distinct sentences; separate orders
        every row so that no global batch holds two copies of a sentence (`SeparatingSampler`).
        """
        batch_size, seed, data = self.recipe.train.batch_size, self.recipe.train.seed, self.recipe.data
        if batch_size % processes:
            raise CsekitError(
                f"recipe key train.batch_size: {batch_size} is not divisible by the {processes} processes"
            )
        check_chunk_size(chunk_size, batch_size // processes, processes)
        if self.duplicates.training_rows < batch_size:
            distinct = " distinct" if data.duplicates == "drop" else ""
            raise CsekitError(
                f"corpus {data.corpus} has {self.duplicates.training_rows}{distinct} sentences, fewer than "
                f"train.batch_size ({batch_size})"
            )
        rows: Dataset = self.corpus
        sampler = None
        if data.duplicates == "drop":  # the first occurrence of each sentence, shuffled as keep shuffles
            rows = Subset(self.corpus, self.sentence_groups.distinct_rows())
        elif data.duplicates == "separate":
            groups = self.sentence_groups
            check_separable(groups, batch_size, processes, data.corpus, self.duplicates.most_repeated)
            sampler = SeparatingSampler(groups, batch_size, seed)
        return DataLoader(
            rows,
            batch_size=batch_size // processes,
            shuffle=sampler is None,
            sampler=sampler,
            drop_last=True,
            collate_fn=TrainCollator(views, data.text_column),
            num_workers=options.num_workers,
            pin_memory=options.pin_memory,
            persistent_workers=options.persistent_workers,
            worker_init_fn=loader_workers_leave_stop_signals,
            generator=torch.Generator().manual_seed(seed),
        )


def _find_duplicates(recipe: Recipe, corpus: Any) -> tuple[SentenceGroups, DuplicateReport]:
    """Which rows repeat a sentence (reported at the start in every mode; drop and separate act on it)."""
    data = recipe.data
    texts = (sentence_text(corpus[row], data.text_column) for row in range(len(corpus)))
    groups = SentenceGroups.of(texts, normalise=data.duplicates_normalise)
    most_repeated = sentence_text(corpus[groups.most_repeated()[0]], data.text_column)
    report = DuplicateReport.of(
        groups, most_repeated, data.duplicates, data.duplicates_normalise, recipe.train.batch_size
    )
    return groups, report


def epoch_batches(
    accelerator: Accelerator,
    loader: Any,
    state: TrainerState,
    options: LoaderOptions,
    finished: Callable[[], bool],
) -> Iterator[dict[str, Any]]:
    """The batches from `state`'s data position on, epoch after epoch (each epoch shuffled by its seed), until
    `finished()` says so at an epoch's start; a resumed run's first epoch skips the batches it had taken."""
    steps_per_epoch = len(loader)
    for epoch in itertools.count(state.batches // steps_per_epoch):
        if finished():
            return
        loader.set_epoch(epoch)
        skip = state.batches - epoch * steps_per_epoch
        yield from (skipping_batches(accelerator, loader, skip, options) if skip > 0 else loader)
