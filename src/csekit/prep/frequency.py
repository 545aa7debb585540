"""Token frequencies and SLT-FAI's frequency labels.

SLT-FAI labels each token type of the backbone's vocabulary by how often the tokenizer produces it
over a pre-training-like corpus: roughly the fraction `low_fraction` (lambda, 0.5 in the paper) of
least frequent types is "low-frequency" (label 1), the rest 0. Counts files are JSON objects mapping
each token string to its count, the format of the authors' BookCorpus `labels.json`; the authors'
`labels_sort.json` (a list of [token, count] pairs) is read too. `count_tokens` makes such counts
from any corpus with any tokenizer (`csekit freq`).

Labelling rule: the authors' `get_label` (wangbing1416/SLT-FAI,
sentence_transformers/losses/AdvCLSoftmaxLoss.py, lines 132-149), tested against their files in
tests/methods/test_slt_fai.py:
* the split is taken over the word pieces that occur (count > 0) only: the threshold is the count
  at rank floor(lambda * m) of the m occurring pieces sorted by count, ascending. Pieces that never
  occur (2,994 of bert-base-uncased's 30,522 in BookCorpus: [unused*], rare scripts) do not shift it;
* a piece is low-frequency iff its count is below the threshold, so every piece tied at the
  threshold is high-frequency (slightly fewer than lambda * m occurring pieces get label 1) and every
  piece that never occurs, or is missing from the counts (count 0), is low-frequency;
* special tokens (`tokenizer.all_special_ids`) take part in the ranking with their counts as in
  the authors' code ([UNK] occurs; [CLS], [SEP], [PAD], [MASK] do not), but their label here is 0:
  csekit leaves them out of both losses (the authors' code labels [CLS]/[SEP]/padding 1 and trains
  the discriminator on them too), so the table never sends a special token into a loss.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.bounded_read import bounded_lines, open_regular, read_json_file
from csekit.core.errors import CsekitError, absolute
from csekit.core.progress import amount_progress
from csekit.encoding.model_folder import load_model
from csekit.encoding.token_input import token_ids

FREQUENCY_LINE_LIMIT = 2**20
"""The longest corpus line `csekit freq` tokenises (1 MiB; a sentence corpus's lines are under 1 KiB)."""

COUNTS_LIMIT = 2**26
"""The largest token counts file read (a 250,000-token vocabulary's counts take about 8 MiB)."""

LARGEST_TOKEN_COUNT = 2**62
"""The largest count a counts file may give a token: far above any corpus, and within the int64 table the labels
are computed in (a count of 2^63 was an overflow traceback in `diagnose`)."""


def load_counting_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer `csekit freq` counts with, from a model folder (any layout `SentenceEncoder.load` reads), a hub
    name or an alias: loaded and checked as every model is (`model_folder.load_model`), the weights left unread.
    Only the unknown token is required: the counts are of the words' pieces, never of a sentence's wrapping."""
    return load_model(name, None, special_tokens=("unk_token",)).tokenizer


def table_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """Length of an id-indexed table that covers every id the tokenizer can produce."""
    vocab = tokenizer.get_vocab()
    return max(len(tokenizer), max(vocab.values(), default=-1) + 1)


def count_tokens(
    path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    chunk_lines: int = 10_000,
    show_progress: bool = True,
) -> np.ndarray:
    """Count, per token id, how often `tokenizer` produces it over the lines of `path`.

    The file is streamed in chunks of `chunk_lines` lines and each chunk is tokenised in one batched
    call (fast tokenizers parallelise it), so memory stays flat for a corpus of any size. Special
    tokens are not added; each line is tokenised as in the authors' `tokenizer.tokenize(line)`.
    """
    path = Path(path)
    if not os.path.isfile(path):
        raise CsekitError(f"corpus {absolute(path)} does not exist")
    if chunk_lines < 1:
        raise CsekitError("--chunk-lines must be at least 1")
    totals = np.zeros(table_size(tokenizer), dtype=np.int64)
    line_number = 0
    with (
        open_regular(path) as handle,
        amount_progress(path.stat().st_size, "counting tokens", "B", show_progress) as advance,
    ):
        while raw := list(itertools.islice(bounded_lines(handle, FREQUENCY_LINE_LIMIT), chunk_lines)):
            lines = []
            for offset, (line, size) in enumerate(raw):
                if line is None:
                    raise CsekitError(
                        f"{path}:{line_number + offset + 1}: a line of {size:,} bytes, more than the "
                        f"{FREQUENCY_LINE_LIMIT:,} csekit freq counts in one line"
                    )
                try:
                    text = line.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise CsekitError(f"{path}:{line_number + offset + 1}: not valid UTF-8") from None
                if text:
                    lines.append(text)
            line_number += len(raw)
            if lines:
                ids = token_ids(tokenizer, lines)
                flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64)
                totals += np.bincount(flat, minlength=len(totals))[: len(totals)]
            advance(sum(size for _, size in raw))
    if not totals.any():
        raise CsekitError(f"corpus {path}: no tokens to count ({line_number:,} lines, none with text)")
    return totals


def counts_by_token(counts: np.ndarray, tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """Id-indexed counts as {token: count} in id order (the authors' `labels.json` format)."""
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    return {by_id[i]: int(counts[i]) for i in sorted(by_id)}


def resolve_counts_path(counts: str | Path, data_dir: str | Path | None = None) -> Path:
    """A counts file, absolute: as given (absolute or relative to the current folder), else under the data folder;
    a missing one is refused naming every path tried."""
    from csekit.data.data_dir import resolve_data_dir

    path = Path(counts).expanduser()
    here = Path(absolute(path))
    if os.path.isfile(here):
        return here
    places = [str(here)]
    if not path.is_absolute():
        try:
            root = resolve_data_dir(data_dir)
        except CsekitError:
            root = None
        if root is not None:
            candidate = Path(absolute(root / path))
            if os.path.isfile(candidate):
                return candidate
            places.append(str(candidate))
    raise CsekitError(
        f"token counts file {counts} not found (looked for {' and '.join(places)}); "
        f"make it with: csekit freq --corpus CORPUS --tokenizer MODEL --output {counts}"
    )


@functools.lru_cache(maxsize=4)
def _read_counts_cached(path: str, modified: float) -> dict[str, int]:
    loaded = read_json_file(path, "token counts file", COUNTS_LIMIT)
    if isinstance(loaded, list):  # labels_sort.json: [[token, count], ...]
        loaded = _counts_of_pairs(path, loaded)
    if not isinstance(loaded, dict):
        raise CsekitError(f"{path}: token counts must be a JSON object {{token: count}}")
    for token, count in loaded.items():
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= LARGEST_TOKEN_COUNT:
            shown = f"{count!r}"[:40] if not isinstance(count, int) else f"{count:.3g}"
            raise CsekitError(
                f'{path}: the count of token "{token[:50]}" must be a non-negative integer of at most 2^62, not {shown}'
            )
    return loaded


def _counts_of_pairs(path: str, pairs: list[Any]) -> dict[str, Any]:
    """{token: count} of a counts list: each item a [token, count] pair whose token is text, given once (a
    token given twice kept its last count, and a token of null was counted as the text "None")."""
    counts: dict[str, Any] = {}
    for number, pair in enumerate(pairs, start=1):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise CsekitError(
                f"{path}: item {number} of the counts list is {str(pair)[:40]!r}, not a [token, count] pair"
            )
        if pair[0] in counts:
            raise CsekitError(
                f'{path}: token "{pair[0][:50]}" is given twice in the counts list (item {number}); keep one'
            )
        counts[pair[0]] = pair[1]
    return counts


def read_counts(path: str | Path) -> dict[str, int]:
    """Read {token: count} from a counts file (`labels.json`, `labels_sort.json`, `csekit freq` output)."""
    path = Path(path)
    try:
        modified = path.stat().st_mtime
    except OSError:
        raise CsekitError(f"token counts file {absolute(path)} does not exist") from None
    return dict(_read_counts_cached(str(path.resolve()), modified))


def frequency_labels(
    counts: Mapping[str, int], tokenizer: PreTrainedTokenizerBase, low_fraction: float = 0.5, source: str = "counts"
) -> Tensor:
    """Label per token id [table_size]: 1 for low-frequency pieces, else 0 (the authors' rule).

    See the module docstring: the threshold is set among the pieces that occur, ties at it are
    high-frequency, pieces that never occur are low-frequency, special tokens are 0. `source`
    names the counts in errors.
    """
    if not 0 < low_fraction < 1:
        raise ValueError(f"low_fraction must be in (0, 1), got {low_fraction}")
    vocab = tokenizer.get_vocab()
    known = sum(1 for token in vocab if token in counts)
    if known < len(vocab) / 2:
        raise CsekitError(
            f"{source}: only {known} of the tokenizer's {len(vocab)} tokens have a count; "
            "were the counts made with another tokenizer? (make them with csekit freq)"
        )
    ids = torch.tensor(list(vocab.values()), dtype=torch.long)
    by_id = torch.tensor([counts.get(token, 0) for token in vocab], dtype=torch.long)
    occurring = by_id[by_id > 0].sort().values
    if len(occurring) == 0:
        raise CsekitError(f"{source}: no token of the tokenizer has a count above 0")
    threshold = occurring[int(len(occurring) * low_fraction)]
    labels = torch.zeros(table_size(tokenizer), dtype=torch.long)
    labels[ids] = (by_id < threshold).long()
    labels[torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)] = 0
    return labels


def special_token_table(tokenizer: PreTrainedTokenizerBase) -> Tensor:
    """Bool per token id [table_size]: whether the id is a special token."""
    table = torch.zeros(table_size(tokenizer), dtype=torch.bool)
    table[torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)] = True
    return table


class FrequencyLabels(nn.Module):
    """Id-indexed label and special-token tables as buffers: look-up is one indexing op on the device.

    The buffers are not persistent: they are derived from the counts file named by the recipe, so
    checkpoints do not carry them and resuming re-reads the counts.
    """

    def __init__(self, labels: Tensor, special: Tensor) -> None:
        super().__init__()
        self.register_buffer("labels", labels, persistent=False)
        self.register_buffer("special", special, persistent=False)

    @classmethod
    def from_counts(
        cls, counts: str | Path, tokenizer: PreTrainedTokenizerBase, low_fraction: float = 0.5
    ) -> FrequencyLabels:
        path = resolve_counts_path(counts)
        labels = frequency_labels(read_counts(path), tokenizer, low_fraction, source=str(path))
        return cls(labels, special_token_table(tokenizer))

    def forward(self, input_ids: Tensor) -> Tensor:
        """Labels of `input_ids` (any shape), 0 for special tokens."""
        return self.labels[input_ids]

    def is_special(self, input_ids: Tensor) -> Tensor:
        return self.special[input_ids]
