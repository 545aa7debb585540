"""A retrieval set in BEIR's layout (`csekit evaluate --retrieval DIR`), read as untrusted input.

    DIR/corpus.jsonl     {"_id": "d1", "title": "...", "text": "..."}  one document a line
    DIR/queries.jsonl    {"_id": "q1", "text": "..."}
    DIR/qrels/SPLIT.tsv  query-id <tab> corpus-id <tab> score   (a header line first, as BEIR writes it)

The corpus is streamed (`core/json_lines.py`, 1 MiB a line): its ids are kept, its texts are handed to the
encoder a chunk at a time and never held whole, so a corpus of millions of documents is read in the memory of its
embeddings. As in BEIR's `GenericDataLoader`, the queries evaluated are those the qrels name, a document's text
is its title and text joined by a space, and a relevance is an integer (graded; 0 or less is not relevant).
A duplicate id, a qrels line naming an id that is not in the corpus or the queries, a score that is not an
integer within +-RELEVANCE_LIMIT, a query and document judged twice (both lines named: one judgement would be lost
without a word), an empty file: one `CsekitError` naming the file and line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from csekit.core.bounded_read import bounded_lines, open_regular
from csekit.core.errors import CsekitError, absolute, at
from csekit.core.json_lines import json_rows
from csekit.core.safe_names import check_name, child_path

QRELS_LINE_LIMIT = 2**16
"""The longest qrels line read (two ids and a score)."""
RELEVANCE_LIMIT = 2**31 - 1
"""The largest relevance in either direction (trec_eval's and pytrec_eval's C int); a gain beyond a float is a
traceback in nDCG, not a judgement."""
ID_TYPES = (str, int)


@dataclass(frozen=True)
class RetrievalSet:
    """A BEIR folder's ids, its queries' texts and the graded relevance of each query (the corpus texts are
    read again, a chunk at a time, by `corpus_texts`)."""

    folder: Path
    split: str
    doc_ids: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]

    @property
    def corpus(self) -> Path:
        return self.folder / "corpus.jsonl"


def _rows(path: Path, what: str, optional: dict[str, type | tuple[type, ...]]) -> Iterator[tuple[int, str, dict]]:
    """(line, id, row) of each row of a BEIR JSON-lines file, its `_id` a string (or integer) and `text` a string."""
    for number, row in json_rows(path, what, {"_id": ID_TYPES, "text": str}, optional):
        yield number, str(row["_id"]), row


def _unique_ids(path: Path, what: str, optional: dict[str, type | tuple[type, ...]]) -> dict[str, int]:
    """Each id of the file -> its line; an id given twice is refused, naming both lines."""
    lines: dict[str, int] = {}
    for number, doc_id, _ in _rows(path, what, optional):
        if doc_id in lines:
            raise CsekitError(f'{at(path, number)}: id "{doc_id[:100]}" is given twice (lines {lines[doc_id]} and '
                              f"{number}); ids must be unique")  # fmt: skip
        lines[doc_id] = number
    if not lines:
        raise CsekitError(f"{what} {path} holds no rows")
    return lines


def corpus_texts(retrieval: RetrievalSet, chunk: int) -> Iterator[list[str]]:
    """The corpus's texts (title and text joined by a space, as BEIR does), `chunk` at a time, in the order of
    `doc_ids` (checked: a corpus that changed since it was read is refused)."""
    texts: list[str] = []
    position = 0
    for number, doc_id, row in _rows(retrieval.corpus, "corpus", {"title": (str, type(None))}):
        if position >= len(retrieval.doc_ids) or retrieval.doc_ids[position] != doc_id:
            raise CsekitError(f"{at(retrieval.corpus, number)}: the corpus changed while it was read")
        texts.append(f"{row.get('title') or ''} {row['text']}".strip())
        position += 1
        if len(texts) == chunk:
            yield texts
            texts = []
    if texts:
        yield texts
    if position != len(retrieval.doc_ids):
        raise CsekitError(f"{retrieval.corpus}: the corpus changed while it was read")


def check_split(split: str, what: str = "--split") -> None:
    """A qrels split names one file inside qrels/ (`what` names the option in the error: `--split`, `split`)."""
    check_name(f"{split}.tsv", what)


def read_retrieval_set(folder: Path, split: str = "test", what: str = "--split") -> RetrievalSet:
    """The ids, queries and qrels of a BEIR folder (see the module's docstring); `what` names the option that gave
    `split` in errors."""
    if not os.path.isdir(folder):  # False, not OSError, for a name too long to be a file's
        raise CsekitError(f"retrieval folder {absolute(folder)} does not exist or is not a folder")
    qrels_path = child_path(folder / "qrels", f"{split}.tsv", what)
    if not qrels_path.exists():
        raise CsekitError(f"retrieval folder {folder}: no qrels/{split}.tsv (BEIR's layout; {what} names the qrels)")
    doc_lines = _unique_ids(folder / "corpus.jsonl", "corpus", {"title": (str, type(None))})
    query_texts: dict[str, str] = {}
    query_lines: dict[str, int] = {}
    queries = folder / "queries.jsonl"
    for number, query_id, row in _rows(queries, "queries", {}):
        if query_id in query_lines:
            raise CsekitError(f'{at(queries, number)}: id "{query_id[:100]}" is given twice (lines '
                              f"{query_lines[query_id]} and {number}); ids must be unique")  # fmt: skip
        query_lines[query_id], query_texts[query_id] = number, row["text"]
    if not query_texts:
        raise CsekitError(f"queries {queries} holds no rows")
    qrels = read_qrels(qrels_path, doc_lines, query_lines)
    return RetrievalSet(folder, split, list(doc_lines), list(qrels), [query_texts[q] for q in qrels], qrels)


def read_qrels(path: Path, doc_ids: dict[str, int], query_ids: dict[str, int]) -> dict[str, dict[str, int]]:
    """query -> document -> relevance of a qrels TSV, in the order of its lines; its first line is a header when
    its score is not an integer (BEIR writes `query-id corpus-id score`)."""
    try:
        handle = open_regular(path)
    except OSError as error:
        raise CsekitError(f"qrels {path}: cannot read it ({error.strerror or error})") from None
    qrels: dict[str, dict[str, int]] = {}
    judged_at: dict[tuple[str, str], int] = {}
    with handle:
        for number, (line, size) in enumerate(bounded_lines(handle, QRELS_LINE_LIMIT), start=1):
            where = at(path, number)
            if line is None:
                raise CsekitError(f"{where}: a line of {size:,} bytes, more than a qrels line can be")
            try:
                text = line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise CsekitError(f"{where}: not valid UTF-8") from None
            if not text.strip():
                continue
            fields = text.split("\t")
            if len(fields) != 3:
                raise CsekitError(
                    f"{where}: {len(fields)} tab-separated fields; a qrels line is query-id, corpus-id, score"
                )
            query_id, doc_id, score = (field.strip() for field in fields)
            try:
                relevance = int(score)
            except ValueError:
                if number == 1 and not qrels:
                    continue  # the header
                raise CsekitError(f'{where}: the score "{score[:80]}" is not an integer relevance') from None
            if abs(relevance) > RELEVANCE_LIMIT:
                raise CsekitError(f'{where}: the relevance "{score[:80]}" is beyond +-{RELEVANCE_LIMIT:,}')
            if query_id not in query_ids:
                raise CsekitError(f'{where}: query "{query_id[:100]}" is not in queries.jsonl')
            if doc_id not in doc_ids:
                raise CsekitError(f'{where}: document "{doc_id[:100]}" is not in corpus.jsonl')
            earlier = judged_at.setdefault((query_id, doc_id), number)
            if earlier != number:
                raise CsekitError(f'{where}: query "{query_id[:100]}" and document "{doc_id[:100]}" are judged twice '
                                  f"(lines {earlier} and {number}); give each pair one relevance")  # fmt: skip
            qrels.setdefault(query_id, {})[doc_id] = relevance
    if not qrels:
        raise CsekitError(f"qrels {path} holds no judgements")
    return qrels
