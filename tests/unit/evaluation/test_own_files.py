"""`csekit evaluate --pairs FILE` and `--retrieval DIR` (issue 51, items 1, 2 and 5): a user's own scored pairs and
BEIR-layout retrieval sets, their scores against independent references, bounded memory, and bad files."""

from __future__ import annotations

import json
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, make_tiny_encoder, run_main
from scipy.stats import pearsonr, spearmanr

from csekit import cli
from csekit.evaluation.file_tasks import read_file_tasks
from csekit.evaluation.pairs import read_pairs, score_pairs
from csekit.evaluation.result import EvalResult
from csekit.evaluation.retrieval import evaluate_retrieval, peak_bytes
from csekit.evaluation.retrieval_data import read_retrieval_set

SENTENCES = ["a man plays the guitar", "the dog runs in the park", "she eats food quickly", "a small cat sits"]


def hashed_encoder(dim: int = 16):
    """A made-up encoder: each distinct text a fixed random vector (no model). Seeded by CRC-32, not `hash()`, whose
    per-process salt made the vectors, and so the pytrec_eval comparison's near-ties, differ from run to run."""

    def encode(texts: list[str]) -> np.ndarray:
        rows = [np.random.default_rng(zlib.crc32(text.encode())).normal(size=dim) for text in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), dim)

    return encode


def run_evaluate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """`csekit ARGS` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["csekit", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


def write_pairs_tsv(path: Path, rows: list[tuple[str, str, str]], header: str = "sentence1\tsentence2\tscore") -> Path:
    path.write_text(header + "\n" + "".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


def many_pairs(count: int = 30, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    words = "a the man woman dog cat plays runs sits on in with guitar ball park house red blue".split()
    return [
        (" ".join(rng.choice(words, 5)), " ".join(rng.choice(words, 5)), f"{rng.uniform(-10, 250):.3f}")
        for _ in range(count)
    ]


# --- pairs --------------------------------------------------------------------------------------------------


def test_pairs_scores_are_scipys_spearman_and_pearson_of_the_cosines_for_gold_scores_of_any_range(
    tmp_path: Path,
) -> None:
    rows = many_pairs()
    pairs = read_pairs(write_pairs_tsv(tmp_path / "mine.tsv", rows))
    encode = hashed_encoder()
    u, v = encode([a for a, _, _ in rows]), encode([b for _, b, _ in rows])
    cos = (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
    gold = [float(score) for _, _, score in rows]
    scores = score_pairs(encode, pairs)
    assert scores["pairs"] == 30 and scores["skipped"] == 0
    assert scores["spearman"] == pytest.approx(spearmanr(cos, gold)[0], abs=1e-6)
    assert scores["pearson"] == pytest.approx(pearsonr(cos, gold)[0], abs=1e-6)


def test_tsv_csv_and_json_lines_give_the_same_pairs_and_columns_are_found_by_the_header(tmp_path: Path) -> None:
    rows = many_pairs(8)
    tsv = read_pairs(
        write_pairs_tsv(tmp_path / "a.tsv", [(b, a, s) for a, b, s in rows], "sentence2\tsentence1\tscore")
    )
    # a spreadsheet's CSV: its byte-order mark, quoted fields holding commas
    header = "\ufeffsentence1,score,id,sentence2\n"
    csv_text = header + "".join(f'"{a}, x",{s},{i},"{b}"\n' for i, (a, b, s) in enumerate(rows))
    (tmp_path / "b.csv").write_text(csv_text, encoding="utf-8")
    csv_pairs = read_pairs(tmp_path / "b.csv")
    jsonl = "".join(json.dumps({"q": a, "p": b, "label": float(s)}) + "\n" for a, b, s in rows)
    (tmp_path / "c.jsonl").write_text(jsonl, encoding="utf-8")
    json_pairs = read_pairs(tmp_path / "c.jsonl", ("q", "p", "label"))
    (tmp_path / "d.tsv").write_text("".join(f"{s}\t{a}\t{b}\n" for a, b, s in rows), encoding="utf-8")
    numbered = read_pairs(tmp_path / "d.tsv", (2, 3, 1))  # no header: the columns by number
    expected = [a for a, _, _ in rows]
    assert tsv.sentences1 == json_pairs.sentences1 == numbered.sentences1 == expected
    assert csv_pairs.sentences1 == [f"{a}, x" for a in expected]
    assert tsv.scores == csv_pairs.scores == json_pairs.scores == numbered.scores == [float(s) for _, _, s in rows]


def test_incomplete_lines_are_skipped_with_their_reasons(tmp_path: Path) -> None:
    rows = [*many_pairs(4), ("", "a b", "1"), ("a b", "c d", ""), ("a b", "   ", "2")]
    pairs = read_pairs(write_pairs_tsv(tmp_path / "holes.tsv", rows))
    assert len(pairs.scores) == 4
    assert [(skip.line, skip.reason) for skip in pairs.skipped] == [
        (6, "an empty sentence1"),
        (7, "no score"),
        (8, "an empty sentence2"),
    ]


def test_evaluate_scores_each_pairs_file_as_its_own_task_and_writes_it_in_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    make_tiny_encoder(tmp_path / "tok", initializer_range=0.2).save(model)
    first = write_pairs_tsv(tmp_path / "legal.tsv", [*many_pairs(12), ("a b", "c d", "")])
    (tmp_path / "medical.jsonl").write_text(
        "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in many_pairs(9, 1))
    )
    out = tmp_path / "out.json"
    monkeypatch.delenv("CSEKIT_DATA", raising=False)  # no SentEval task runs: no data folder is needed
    args = ["evaluate", str(model), "--pairs", str(first), "--pairs", str(tmp_path / "medical.jsonl"), "-o", str(out)]
    code, printed, err = run_evaluate(monkeypatch, capsys, *args)
    assert code == 0, err
    report = json.loads(out.read_text())
    result = EvalResult.from_json(report, str(out))
    assert set(result.tasks) == {"pairs:legal", "pairs:medical"}  # no SentEval task when only files are given
    assert result.tasks["pairs:legal"]["pairs"] == 12 and result.tasks["pairs:medical"]["skipped"] == 0
    assert report["skipped_lines"] == {"pairs:legal": [{"line": 14, "reason": "no score"}]}
    assert f"skipped {first}:14: no score" in err
    assert "pairs:legal: Spearman " in printed and "(12 pairs; 1 line skipped)" in printed


PAIRS_ERRORS = {
    "wrong-column": ("a.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\nc\td\t2\n", "a.tsv:1: the header names"),
    "non-numeric-score": (
        "a.tsv",
        "sentence1\tsentence2\tscore\na\tb\t1\nc\td\thigh\n",
        'a.tsv:3: the score (score) "high"',
    ),
    "infinite-score": ("a.csv", "sentence1,sentence2,score\na,b,1\nc,d,inf\n", "a.csv:3: the score"),
    "too-few-fields": ("a.tsv", "sentence2\tscore\tsentence1\na\t1\tb\nc\td\n", "a.tsv:3: 2 fields"),
    "empty-file": ("a.tsv", "", "pairs file"),
    "header-only": ("a.tsv", "sentence1\tsentence2\tscore\n", "no scored pairs"),
    "json-not-an-object": (
        "a.jsonl",
        '{"sentence1": "a", "sentence2": "b", "score": 1}\n[1, 2]\n',
        "a.jsonl:2: not a JSON",
    ),
    "json-missing-field": ("a.jsonl", '{"sentence1": "a", "score": 1}\n', 'a.jsonl:1: missing field "sentence2"'),
    "unknown-suffix": ("a.txt", "a\tb\t1\n", "name it .tsv, .csv or .jsonl"),
    "unclosed-quote": ("a.csv", 'sentence1,sentence2,score\n"a,b,1\n', "a.csv:2: not a CSV row"),
}


@pytest.mark.parametrize("case", list(PAIRS_ERRORS))
def test_a_bad_pairs_file_is_one_line_naming_the_file_and_line(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name, text, needle = PAIRS_ERRORS[case]
    (tmp_path / name).write_text(text, encoding="utf-8")
    # the files are read before the model is loaded: a bad file is found at once (the model here does not exist)
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--pairs", str(tmp_path / name))
    assert_one_line_error(code, err, needle)


def test_a_ten_megabyte_pairs_line_is_one_line_and_is_never_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.tsv"
    path.write_text("sentence1\tsentence2\tscore\na\tb\t1\n" + "x" * 10_000_000 + "\tb\t1\n", encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--pairs", str(path))
    assert_one_line_error(code, err, f"{path}:3: a line of 10,000,005 bytes")
    tracemalloc.start()  # again, the modules imported: what reading the line holds
    run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--pairs", str(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8_000_000  # the line is 10 MB: never held whole


def test_two_pairs_files_of_one_name_and_bad_columns_are_refused(tmp_path: Path) -> None:
    from csekit.core.errors import CsekitError

    (tmp_path / "x").mkdir()
    first, second = write_pairs_tsv(tmp_path / "a.tsv", many_pairs(3)), write_pairs_tsv(tmp_path / "x" / "a.tsv", [])
    with pytest.raises(CsekitError, match="would both be task pairs:a"):
        read_file_tasks([first, second])
    for columns in ("a,b", "1,1,2", "0,1,2", "a,a,b"):
        with pytest.raises(CsekitError, match="--pairs-columns"):
            read_file_tasks([first], columns)


# --- retrieval ----------------------------------------------------------------------------------------------


def write_beir(folder: Path, docs: dict[str, str], queries: dict[str, str], qrels: list[tuple[str, str, int]]) -> Path:
    (folder / "qrels").mkdir(parents=True)
    corpus = "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in docs.items())
    (folder / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries.items()))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels), encoding="utf-8"
    )
    return folder


def tied_set(folder: Path, seed: int = 0) -> Path:
    """150 documents drawn from 6 texts (many exact ties), 12 queries with graded judgements (0-3); one query's
    id is a document's id too (BEIR leaves that document out of its ranking)."""
    rng = np.random.default_rng(seed)
    texts = [f"text {i}" for i in range(6)]
    docs = {f"d{i:03d}": texts[rng.integers(6)] for i in range(150)}
    queries = {f"q{i}": texts[rng.integers(6)] for i in range(11)} | {"d007": texts[0]}
    qrels = [
        (q, d, int(rng.integers(0, 4)))
        for q in queries
        for d in rng.choice(sorted(docs), size=int(rng.integers(1, 9)), replace=False)
    ]
    return write_beir(folder, docs, queries, qrels)


@pytest.mark.parametrize("block", [7, 64, 16384])
def test_retrieval_metrics_equal_pytrec_eval_on_a_graded_set_with_ties(tmp_path: Path, block: int) -> None:
    pytrec_eval = pytest.importorskip("pytrec_eval")
    retrieval = read_retrieval_set(tied_set(tmp_path / "set"))
    encode = hashed_encoder(8)
    scores = evaluate_retrieval(encode, retrieval, chunk=11, block=block)

    doc_emb, query_emb = encode(corpus_texts_of(tmp_path / "set")), encode(retrieval.query_texts)
    cos = (query_emb / np.linalg.norm(query_emb, axis=1, keepdims=True)) @ (
        doc_emb / np.linalg.norm(doc_emb, axis=1, keepdims=True)
    ).T
    run = {
        q: {d: float(cos[i, j]) for j, d in enumerate(retrieval.doc_ids) if d != q}  # BEIR's ignore_identical_ids
        for i, q in enumerate(retrieval.query_ids)
    }
    run = {q: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:100]) for q, docs in run.items()}
    measures = {"ndcg_cut.10", "recall.10", "recall.100", "recip_rank"}
    per_query = pytrec_eval.RelevanceEvaluator(retrieval.qrels, measures).evaluate(run)
    reference = {
        name: np.mean([per_query[q][key] for q in retrieval.query_ids])
        for name, key in (("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"), ("recall@100", "recall_100"))
    }
    # MRR@10 (BEIR's mrr): the reciprocal rank when the first relevant document is in the first 10, else 0
    reference["mrr@10"] = np.mean([rr if (rr := per_query[q]["recip_rank"]) >= 0.1 else 0.0 for q in per_query])
    assert scores["queries"] == 12 and scores["documents"] == 150
    for name, value in reference.items():
        assert scores[name] == pytest.approx(value, abs=1e-9), name
    assert 0 < scores["ndcg@10"] < 1 and 0 < scores["recall@10"] < scores["recall@100"] < 1


def corpus_texts_of(folder: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (folder / "corpus.jsonl").read_text().splitlines()]


def test_a_null_title_is_no_title_and_a_title_is_joined_to_the_text_as_beir_does(tmp_path: Path) -> None:
    from csekit.evaluation.retrieval_data import corpus_texts

    folder = write_beir(tmp_path / "set", {"d1": "a b"}, {"q1": "a"}, [("q1", "d1", 1)])
    rows = [{"_id": "d1", "title": None, "text": "a b"}, {"_id": "d2", "title": "Title", "text": "c d"}]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert list(corpus_texts(read_retrieval_set(folder), 10)) == [["a b", "Title c d"]]


def test_the_ranking_breaks_ties_by_decreasing_id_and_leaves_out_the_querys_own_document(tmp_path: Path) -> None:
    docs = {"a": "same", "c": "same", "b": "same", "q1": "same"}
    retrieval = read_retrieval_set(write_beir(tmp_path / "set", docs, {"q1": "same"}, [("q1", "a", 1)]))
    scores = evaluate_retrieval(hashed_encoder(), retrieval)
    # all tied: c, b, a (trec_eval's order), q1 left out; the relevant "a" is third
    assert scores["mrr@10"] == pytest.approx(1 / 3)
    assert scores["ndcg@10"] == pytest.approx(1 / np.log2(4))


def synthetic_encoder(dim: int = 64):
    """Texts `doc N` -> fixed vectors computed from N (fast enough for 100,000 documents, no model)."""
    freqs = np.random.default_rng(0).uniform(0.001, 1.0, size=dim)

    def encode(texts: list[str]) -> np.ndarray:
        numbers = np.array([int(text.rsplit(" ", 1)[1]) for text in texts], dtype=np.float64)
        return np.sin(np.outer(numbers, freqs) + np.arange(dim)).astype(np.float32)

    return encode


def test_a_30000_document_corpus_is_searched_within_the_stated_memory_bound(tmp_path: Path) -> None:
    documents, dim, queries = 30_000, 64, 3000  # tracemalloc slows every allocation: 100,000 documents took a minute
    folder = tmp_path / "big"
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for i in range(documents):
            handle.write(f'{{"_id": "d{i}", "title": "", "text": "doc {i}"}}\n')
    picked = np.random.default_rng(0).choice(documents, size=queries, replace=False)
    (folder / "queries.jsonl").write_text("".join(f'{{"_id": "q{i}", "text": "doc {i}"}}\n' for i in picked))
    (folder / "qrels" / "test.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in picked))
    tracemalloc.start()
    scores = evaluate_retrieval(synthetic_encoder(dim), read_retrieval_set(folder))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert scores["documents"] == documents and scores["recall@10"] == 1.0 and scores["mrr@10"] == 1.0
    embeddings = documents * dim * 4
    bound = peak_bytes(documents, dim, text_bytes=64)
    # the whole score matrix (queries x documents x 4 bytes: 360 MB) would be over twice the bound
    assert queries * documents * 4 > 2 * bound
    assert embeddings < peak <= bound, (peak, bound)


RETRIEVAL_ERRORS = {
    "qrels-unknown-document": (
        lambda f: (f / "qrels" / "test.tsv").write_text("q\td\ts\nq1\tnope\t1\n"),
        'qrels/test.tsv:2: document "nope" is not in corpus.jsonl',
    ),
    "qrels-unknown-query": (
        lambda f: (f / "qrels" / "test.tsv").write_text("q1\td1\t1\nq9\td1\t1\n"),
        'qrels/test.tsv:2: query "q9" is not in queries.jsonl',
    ),
    "qrels-score-not-an-integer": (
        lambda f: (f / "qrels" / "test.tsv").write_text("q1\td1\t1\nq1\td2\tvery\n"),
        'qrels/test.tsv:2: the score "very" is not an integer',
    ),
    "qrels-wrong-columns": (
        lambda f: (f / "qrels" / "test.tsv").write_text("q1 d1 1\n"),
        "qrels/test.tsv:1: 1 tab-separated fields",
    ),
    "duplicate-document-id": (
        lambda f: (f / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n'),
        'corpus.jsonl:2: id "d1" is given twice (lines 1 and 2)',
    ),
    "duplicate-query-id": (
        lambda f: (f / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n\n{"_id": "q1", "text": "b"}\n'),
        'queries.jsonl:3: id "q1" is given twice (lines 1 and 3)',
    ),
    "empty-corpus": (lambda f: (f / "corpus.jsonl").write_text(""), "corpus.jsonl holds no rows"),
    "corpus-text-not-a-string": (
        lambda f: (f / "corpus.jsonl").write_text('{"_id": "d1", "text": 5}\n'),
        'corpus.jsonl:1: field "text" is an integer, not a string',
    ),
    "ten-megabyte-corpus-line": (
        lambda f: (f / "corpus.jsonl").write_text(
            '{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "' + "x" * 10**7 + '"}\n'
        ),
        "corpus.jsonl:2: a line of 10,000,026 bytes",
    ),
    "no-such-split": (lambda f: (f / "qrels" / "test.tsv").unlink(), "no qrels/test.tsv"),
}


@pytest.mark.parametrize("case", list(RETRIEVAL_ERRORS))
def test_a_bad_retrieval_folder_is_one_line_naming_the_file_and_line(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spoil, needle = RETRIEVAL_ERRORS[case]
    folder = write_beir(tmp_path / "set", {"d1": "a b", "d2": "c d"}, {"q1": "a"}, [("q1", "d1", 1)])
    spoil(folder)
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--retrieval", str(folder))
    assert_one_line_error(code, err, needle)


def test_a_split_that_leads_outside_the_folder_and_whitening_a_corpus_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_beir(tmp_path / "set", {"d1": "a b"}, {"q1": "a"}, [("q1", "d1", 1)])
    code, err = run_main(monkeypatch, capsys, "evaluate", "m", "--retrieval", str(folder), "--split", "../../x")
    assert_one_line_error(code, err, "--split")
    code, err = run_main(monkeypatch, capsys, "evaluate", "m", "--retrieval", str(folder), "--whiten")
    assert_one_line_error(code, err, "--whiten does not go with --retrieval")


def test_evaluate_searches_a_retrieval_folder_with_a_model_and_prints_beirs_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    make_tiny_encoder(tmp_path / "tok", initializer_range=0.2).save(model)
    docs = {f"d{i}": text for i, text in enumerate(SENTENCES)}
    queries = {"q0": SENTENCES[0], "q1": SENTENCES[2]}
    folder = write_beir(tmp_path / "faq", docs, queries, [("q0", "d0", 2), ("q1", "d2", 1), ("q1", "d3", 0)])
    out = tmp_path / "out.json"
    code, printed, err = run_evaluate(
        monkeypatch, capsys, "evaluate", str(model), "--retrieval", str(folder), "-o", str(out)
    )
    assert code == 0, err
    result = EvalResult.from_json(json.loads(out.read_text()), str(out))
    scores = result.tasks["retrieval:faq"]
    assert scores["queries"] == 2 and scores["documents"] == 4
    assert scores["mrr@10"] == 1.0 and scores["ndcg@10"] == 1.0  # each query is a document's own text
    assert "retrieval:faq: nDCG@10 100.00, MRR@10 100.00, Recall@10 100.00, Recall@100 100.00" in printed
