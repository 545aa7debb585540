"""Exact cosine search over a BEIR-layout retrieval set in bounded memory, scored as BEIR scores it.

The corpus is encoded once, a chunk of texts at a time, into one float32 array of unit rows (the only thing of
the corpus's size held besides its ids). Queries are scored against it a block of documents at a time, and
only the best `TOP_K` documents of each query are kept between blocks, so the memory is
`peak_bytes(documents, dim)`: the embeddings, one block of scores and the ids (1,000,000 documents of 768
dimensions: about 3.3 GiB; docs/evaluation.md, "Your own domain").

The metrics are BEIR's (`EvaluateRetrieval.evaluate`, pytrec_eval's `ndcg_cut`, `recall`; BEIR's own `mrr`),
averaged over the queries the qrels name:

* a ranking sorts by score, ties by document id in decreasing order (trec_eval's order, which pytrec_eval
  applies to BEIR's results), and the document whose id is the query's own is left out (BEIR's default
  `ignore_identical_ids`);
* nDCG@10: the gain of a document is its relevance (graded; 0 or less is no gain), discounted by
  log2(rank + 1), over the ideal ordering of all of the query's judged documents;
* Recall@k: the share of the query's relevant documents (relevance 1 or more) in the first k;
* MRR@10: the reciprocal rank of the first relevant document (relevance above 0) in the first 10.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from csekit.core.errors import CsekitError
from csekit.evaluation.retrieval_data import RetrievalSet, corpus_texts

Encoder = Callable[[list[str]], np.ndarray]

TOP_K = 100
"""The documents kept for each query (Recall@100 is the deepest metric)."""
CORPUS_CHUNK = 8192
"""Documents handed to the encoder at once (their texts are held only for that call)."""
QUERY_CHUNK = 256
CORPUS_BLOCK = 16384
"""Queries x documents scored at once: one block of float32 scores is QUERY_CHUNK x CORPUS_BLOCK x 4 bytes."""
ID_BYTES = 256
"""What each document's id costs while the set is read and searched (a short id: the string, a list slot, a dict
entry while the ids are checked, its rank), for `peak_bytes`."""
METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100")


def peak_bytes(documents: int, dim: int, text_bytes: int = 1024) -> int:
    """The most memory a search of `documents` documents of `dim` dimensions holds, besides the model's own: the
    embeddings, one block of scores with its selection's temporaries (scores, their negation, int64 positions,
    2 x 16 bytes a value), the ids, and one chunk of texts (`text_bytes` each) with its embeddings."""
    embeddings = documents * dim * 4
    block = QUERY_CHUNK * min(CORPUS_BLOCK, documents) * (4 + 4 + 8 + 16)
    chunk = min(CORPUS_CHUNK, documents) * (text_bytes + 2 * dim * 4)
    return embeddings + block + documents * ID_BYTES + chunk


def _unit_rows(emb: np.ndarray, what: str, count: int) -> np.ndarray:
    """float32 rows of length 1 (a zero or NaN row stays zero: its cosine with anything is 0)."""
    emb = np.nan_to_num(np.asarray(emb, dtype=np.float32))
    if emb.ndim != 2 or emb.shape[0] != count:
        raise ValueError(f"encode returned shape {emb.shape} for {count} {what}; expected one row each")
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    np.divide(emb, norms, out=emb, where=norms > 0)
    return emb


def encode_corpus(encode: Encoder, retrieval: RetrievalSet, chunk: int = CORPUS_CHUNK) -> np.ndarray:
    """The corpus's unit embeddings, encoded `chunk` documents at a time into one preallocated array."""
    corpus: np.ndarray | None = None
    start = 0
    for texts in corpus_texts(retrieval, chunk):
        emb = _unit_rows(encode(texts), "documents", len(texts))
        if corpus is None:
            corpus = np.empty((len(retrieval.doc_ids), emb.shape[1]), dtype=np.float32)
        corpus[start : start + len(texts)] = emb
        start += len(texts)
    if corpus is None:  # read_retrieval_set refuses an empty corpus
        raise CsekitError(f"{retrieval.corpus} holds no documents")
    return corpus


def id_ranks(doc_ids: list[str]) -> np.ndarray:
    """Each document's place when the ids are sorted in decreasing order: the tie-break of trec_eval's ranking."""
    order = sorted(range(len(doc_ids)), key=doc_ids.__getitem__, reverse=True)
    ranks = np.empty(len(doc_ids), dtype=np.int64)
    ranks[np.asarray(order, dtype=np.int64)] = np.arange(len(doc_ids), dtype=np.int64)
    return ranks


def _select(scores: np.ndarray, ids: np.ndarray, k: int, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best (score, id) of each row, ties at the cut decided by `ranks` (so the result is exact)."""
    if scores.shape[1] <= k:
        return scores, np.broadcast_to(ids, scores.shape).copy()
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top_scores = np.take_along_axis(scores, part, axis=1)
    top_ids = ids[part] if ids.ndim == 1 else np.take_along_axis(ids, part, axis=1)
    cut = top_scores.min(axis=1)
    for row in np.flatnonzero((scores >= cut[:, None]).sum(axis=1) > k):  # a tie at the cut: decide it by id
        (columns,) = np.nonzero(scores[row] >= cut[row])
        row_ids = ids[columns] if ids.ndim == 1 else ids[row, columns]
        best = np.lexsort((ranks[row_ids], -scores[row, columns]))[:k]
        top_scores[row], top_ids[row] = scores[row, columns[best]], row_ids[best]
    return top_scores, top_ids


def search(
    queries: np.ndarray,
    corpus: np.ndarray,
    ranks: np.ndarray,
    own: np.ndarray,
    k: int = TOP_K,
    block: int = CORPUS_BLOCK,
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best documents of each query, best first: (cosines, document rows), both (queries, k).

    `queries` and `corpus` are unit rows; `own[q]` is the row of the document whose id is query q's own (left
    out, as BEIR does), or -1. Documents are scored `block` at a time against QUERY_CHUNK queries.
    """
    k = min(k, corpus.shape[0])
    all_scores, all_ids = [], []
    for q0 in range(0, queries.shape[0], QUERY_CHUNK):
        chunk, chunk_own = queries[q0 : q0 + QUERY_CHUNK], own[q0 : q0 + QUERY_CHUNK]
        top_scores = np.empty((chunk.shape[0], 0), dtype=np.float32)
        top_ids = np.empty((chunk.shape[0], 0), dtype=np.int64)
        for d0 in range(0, corpus.shape[0], block):
            scores = chunk @ corpus[d0 : d0 + block].T
            mine = np.flatnonzero((chunk_own >= d0) & (chunk_own < d0 + scores.shape[1]))
            scores[mine, chunk_own[mine] - d0] = -np.inf
            block_scores, block_ids = _select(scores, np.arange(d0, d0 + scores.shape[1]), k, ranks)
            del scores
            merged_ids = np.concatenate([top_ids, block_ids], axis=1)
            top_scores, top_ids = _select(np.concatenate([top_scores, block_scores], axis=1), merged_ids, k, ranks)
        order = np.lexsort((ranks[top_ids], -top_scores), axis=1)
        all_scores.append(np.take_along_axis(top_scores, order, axis=1))
        all_ids.append(np.take_along_axis(top_ids, order, axis=1))
    return np.concatenate(all_scores), np.concatenate(all_ids)


def ranking_metrics(rankings: list[list[str]], qrels: list[dict[str, int]]) -> dict[str, float]:
    """nDCG@10, MRR@10, Recall@10 and Recall@100 (fractions) of each query's ranked ids, averaged over queries,
    with pytrec_eval's and BEIR's definitions (see the module's docstring)."""
    totals = dict.fromkeys(METRICS, 0.0)
    for ranked, judged in zip(rankings, qrels, strict=True):
        gains = [max(judged.get(doc_id, 0), 0) for doc_id in ranked]
        ideal = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:10]
        discounts = 1 / np.log2(np.arange(2, 12))
        best = float(np.dot(ideal, discounts[: len(ideal)]))
        totals["ndcg@10"] += float(np.dot(gains[:10], discounts[: len(gains[:10])])) / best if best > 0 else 0.0
        first = next((rank for rank, gain in enumerate(gains[:10], start=1) if gain > 0), None)
        totals["mrr@10"] += 1 / first if first is not None else 0.0
        relevant = sum(1 for rel in judged.values() if rel >= 1)
        for cut in (10, 100):
            found = sum(1 for doc_id in ranked[:cut] if judged.get(doc_id, 0) >= 1)
            totals[f"recall@{cut}"] += found / relevant if relevant else 0.0
    return {name: total / len(qrels) for name, total in totals.items()}


def evaluate_retrieval(
    encode: Encoder, retrieval: RetrievalSet, *, chunk: int = CORPUS_CHUNK, block: int = CORPUS_BLOCK
) -> dict[str, float]:
    """BEIR's four metrics of exact cosine search over the whole corpus, the number of queries and documents."""
    corpus = encode_corpus(encode, retrieval, chunk)
    queries = _unit_rows(encode(retrieval.query_texts), "queries", len(retrieval.query_ids))
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"queries encoded to {queries.shape[1]} dimensions, documents to {corpus.shape[1]}")
    query_rows = {query_id: row for row, query_id in enumerate(retrieval.query_ids)}
    own = np.full(len(query_rows), -1, dtype=np.int64)
    for doc_row, doc_id in enumerate(retrieval.doc_ids):
        if doc_id in query_rows:
            own[query_rows[doc_id]] = doc_row
    ranks = id_ranks(retrieval.doc_ids)
    scores, rows = search(queries, corpus, ranks, own, TOP_K, block)
    del corpus
    rankings = [
        [retrieval.doc_ids[row] for row, score in zip(ranked, kept, strict=True) if score > -np.inf]
        for ranked, kept in zip(rows.tolist(), scores.tolist(), strict=True)
    ]
    metrics = ranking_metrics(rankings, [retrieval.qrels[query_id] for query_id in retrieval.query_ids])
    return {**metrics, "queries": len(retrieval.query_ids), "documents": len(retrieval.doc_ids)}
