"""Text handed to a tokenizer is cut to what its token bound can use: never a whole line of any length.

A fast tokenizer tokenizes the whole text before truncating, and on a line of some hundred megabytes (a
sentence file of one line, an evaluation input, a corpus line under a large `data.max_chars`) it aborts the
process inside Rust (exit 134, no message). A tokenizer never reads more than `CHARS_PER_TOKEN` characters
for one token (WordPiece makes a word of more than 100 characters one [UNK]; BPE and sentencepiece tokens are
shorter), so cutting a text at `CHARS_PER_TOKEN * max_tokens` characters keeps every token the truncated
result holds. A text with no token bound (token counts of whole lines, a prompt template) is cut at
`TEXT_CHAR_LIMIT`. Every call of a tokenizer on text in `src/` goes through `tokenize_texts`
(`tests/invariants/architecture/test_architecture_files.py` finds any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 128
"""The most characters one token is read from (WordPiece's longest word is 100 characters, and a space)."""

TEXT_CHAR_LIMIT = 2**20
"""The most characters of one text a tokenizer gets without a token bound (the longest line csekit counts)."""


def text_bound(max_tokens: int | None) -> int:
    """The characters of a text that `max_tokens` tokens can come from (None: no token bound)."""
    return TEXT_CHAR_LIMIT if max_tokens is None else min(TEXT_CHAR_LIMIT, CHARS_PER_TOKEN * max(1, max_tokens))


def bounded_texts(texts: Sequence[str], max_tokens: int | None) -> list[str]:
    """`texts`, each cut at `text_bound(max_tokens)` characters."""
    bound = text_bound(max_tokens)
    return [text[:bound] for text in texts]


def tokenize_texts(tokenizer: Any, texts: Sequence[str], max_tokens: int | None, **options: Any) -> Any:
    """`tokenizer(texts, **options)` with each text cut at `text_bound(max_tokens)` characters.

    `max_tokens` is the most tokens of a text the caller keeps (the truncation length, or the token budget it
    cuts the ids to); None when it keeps every token (bounded by TEXT_CHAR_LIMIT characters then).
    """
    return tokenizer(bounded_texts(texts, max_tokens), **options)


def token_ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Every token id of each text, without special tokens (token counts, diagnostics): at most
    TEXT_CHAR_LIMIT characters of a text are read."""
    options = {"add_special_tokens": False, "return_attention_mask": False, "return_token_type_ids": False}
    return list(tokenize_texts(tokenizer, texts, None, **options)["input_ids"])
