"""STS evaluation: SentEval-exact parsing, aggregation, one-shot encoding and input errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from csekit.core.errors import CsekitError
from csekit.data.data_dir import find_task_dir, resolve_data_dir
from csekit.evaluation.sts import (
    STS_TASKS,
    evaluate_dev,
    evaluate_sts,
    format_sts_table,
    load_sts_task,
)

# --- fixtures --------------------------------------------------------------------------------------

# STS13 layout in miniature (three subsets as SentEval expects; the third is tiny). The second pair of
# "FNWN" has an empty gold line and must be skipped; sentences carry odd whitespace.
STS13_FILES = {
    "FNWN": (
        ["a  man   plays .\t a man is playing . ", "skipped pair\tnever encoded", "the cat\tthe   dog", "x y\tx y z"],
        ["4.5", "", "1.0", "3.2"],
    ),
    "headlines": (
        ["the cat\ta cat", "red car\tblue car", "dogs run\tdogs walk", "a man plays .\tthe cat"],
        ["4.0", "2.5", "3.0", "0.5"],
    ),
    "OnWN": (["x y z\tthe cat", "blue car\tred car"], ["0.2", "3.9"]),
}
SENTENCES = sorted(
    {
        "a man plays .",
        "a man is playing .",
        "the cat",
        "the dog",
        "x y",
        "x y z",
        "a cat",
        "red car",
        "blue car",
        "dogs run",
        "dogs walk",
    }
)


def fake_embeddings() -> dict[str, np.ndarray]:
    """A fixed, deterministic 3-d vector per normalised sentence."""
    rng = np.random.default_rng(1234)
    return {s: rng.standard_normal(3).astype(np.float32) for s in SENTENCES}


class RecordingEncoder:
    """Looks sentences up in a dict and records every call."""

    def __init__(self) -> None:
        self.table = fake_embeddings()
        self.calls: list[list[str]] = []

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls.append(list(sentences))
        return np.stack([self.table[s] for s in sentences])


def write_sts13(root: Path) -> Path:
    folder = root / "sts" / "STS13"
    folder.mkdir(parents=True)
    for name, (inputs, golds) in STS13_FILES.items():
        (folder / f"STS.input.{name}.txt").write_text("\n".join(inputs) + "\n", encoding="utf-8")
        (folder / f"STS.gs.{name}.txt").write_text("\n".join(golds) + "\n", encoding="utf-8")
    return folder


STSB_ROWS = [
    "main-captions\tMSRvid\t2012test\t0001\t5.000\ta  man is dancing .\tthe man dances .",
    "main-news\theadlines\t2013\t0002\t0.400\tred car\tthe cat ",
    "main-forum\tdeft\t2014\t0003\t2.250\tdogs run\tdogs walk",
]
SICK_ROWS = [
    "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
    "1\tA man is dancing\tThe man  dances\t4.5\tENTAILMENT",
    "2\tA red car\tA cat\t1.2\tNEUTRAL",
    "3\tDogs run\tDogs walk\t3.6\tNEUTRAL",
]


def write_pair_data(root: Path) -> None:
    stsb = root / "sts" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (stsb / f"sts-{split}.csv").write_text("\n".join(STSB_ROWS) + "\n", encoding="utf-8")
    sick = root / "sts" / "SICK"
    sick.mkdir(parents=True)
    for split in ("train", "trial", "test_annotated"):
        (sick / f"SICK_{split}.txt").write_text("\n".join(SICK_ROWS) + "\n", encoding="utf-8")


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- STS12-16 reader and aggregation --------------------------------------------------------------


def test_sts_year_matches_hand_computation(tmp_path: Path) -> None:
    write_sts13(tmp_path)
    enc = RecordingEncoder()
    res = evaluate_sts(enc, tmp_path, tasks=("STS13",))

    # Independent computation: explicit pairs, with the empty-gold pair left out by hand.
    pairs = {
        "FNWN": [("a man plays .", "a man is playing .", 4.5), ("the cat", "the dog", 1.0), ("x y", "x y z", 3.2)],
        "headlines": [
            ("the cat", "a cat", 4.0),
            ("red car", "blue car", 2.5),
            ("dogs run", "dogs walk", 3.0),
            ("a man plays .", "the cat", 0.5),
        ],
        "OnWN": [("x y z", "the cat", 0.2), ("blue car", "red car", 3.9)],
    }
    t = enc.table
    sims = {k: [cos(t[a], t[b]) for a, b, _ in v] for k, v in pairs.items()}
    golds = {k: [y for _, _, y in v] for k, v in pairs.items()}
    per = [spearmanr(sims[k], golds[k])[0] for k in pairs]
    sizes = [len(v) for v in pairs.values()]
    expected_all = spearmanr(np.concatenate(list(sims.values())), np.concatenate(list(golds.values())))[0]

    assert set(res) == {"STS13"}  # no avg unless all seven tasks ran
    assert res["STS13"]["all"] == pytest.approx(expected_all, abs=1e-6)
    assert res["STS13"]["mean"] == pytest.approx(np.mean(per), abs=1e-6)
    assert res["STS13"]["wmean"] == pytest.approx(np.average(per, weights=sizes), abs=1e-6)
    assert res["STS13"]["mean"] != pytest.approx(res["STS13"]["wmean"], abs=1e-6)
    assert all(type(v) is float for v in res["STS13"].values())


def test_encode_called_once_with_unique_normalised_sentences(tmp_path: Path) -> None:
    write_sts13(tmp_path)
    enc = RecordingEncoder()
    evaluate_sts(enc, tmp_path, tasks=("STS13",))
    assert len(enc.calls) == 1
    (sent,) = enc.calls
    assert len(sent) == len(set(sent))
    assert sorted(sent) == SENTENCES  # whitespace normalised, skipped pair absent
    assert "skipped pair" not in sent and "never encoded" not in sent


def test_loader_skips_empty_gold_and_normalises(tmp_path: Path) -> None:
    write_sts13(tmp_path)
    subsets = load_sts_task(tmp_path, "STS13")
    assert [s.name for s in subsets] == ["FNWN", "headlines", "OnWN"]
    fnwn = subsets[0]
    assert len(fnwn) == 3
    assert fnwn.sentences1 == ["a man plays .", "the cat", "x y"]
    assert fnwn.sentences2 == ["a man is playing .", "the dog", "x y z"]
    assert fnwn.scores == [4.5, 1.0, 3.2]


def test_senteval_layout_is_found(tmp_path: Path) -> None:
    ours = write_sts13(tmp_path / "ours")
    senteval = tmp_path / "downstream" / "STS" / "STS13-en-test"
    senteval.parent.mkdir(parents=True)
    ours.rename(senteval)
    assert find_task_dir(tmp_path / "downstream", "STS13") == senteval
    assert find_task_dir(tmp_path, "STS13") == senteval  # SentEval's data/ folder, one level up
    assert len(load_sts_task(tmp_path / "downstream", "STS13")) == 3


# --- STS-B and SICK-R -------------------------------------------------------------------------------


def test_stsb_and_sick_readers(tmp_path: Path) -> None:
    write_pair_data(tmp_path)
    (stsb,) = load_sts_task(tmp_path, "STSBenchmark")
    assert stsb.name == "test"
    assert stsb.sentences1 == ["a man is dancing .", "red car", "dogs run"]
    assert stsb.sentences2 == ["the man dances .", "the cat", "dogs walk"]
    assert stsb.scores == [5.0, 0.4, 2.25]

    (sick,) = load_sts_task(tmp_path, "SICKRelatedness")
    assert sick.sentences1 == ["A man is dancing", "A red car", "Dogs run"]
    assert sick.sentences2 == ["The man dances", "A cat", "Dogs walk"]
    assert sick.scores == [4.5, 1.2, 3.6]
    (sick_dev,) = load_sts_task(tmp_path, "sick-dev")
    assert sick_dev.name == "dev" and len(sick_dev) == 3


def test_pair_tasks_scores_and_avg(tmp_path: Path) -> None:
    write_pair_data(tmp_path)
    table = {
        s: v
        for s, v in zip(
            [
                "a man is dancing .",
                "the man dances .",
                "red car",
                "the cat",
                "dogs run",
                "dogs walk",
                "A man is dancing",
                "The man dances",
                "A red car",
                "A cat",
                "Dogs run",
                "Dogs walk",
            ],
            np.random.default_rng(7).standard_normal((12, 4)).astype(np.float32),
            strict=True,
        )
    }
    calls: list[list[str]] = []

    def enc(sentences: list[str]) -> np.ndarray:
        calls.append(sentences)
        return np.stack([table[s] for s in sentences])

    res = evaluate_sts(enc, tmp_path, tasks=("STSBenchmark", "SICKRelatedness"))
    sims = [
        cos(table[a], table[b])
        for a, b in [("a man is dancing .", "the man dances ."), ("red car", "the cat"), ("dogs run", "dogs walk")]
    ]
    assert res["STSBenchmark"]["test"] == pytest.approx(spearmanr(sims, [5.0, 0.4, 2.25])[0])
    assert set(res["SICKRelatedness"]) == {"test"} and "avg" not in res
    assert len(calls) == 1 and len(calls[0]) == 12  # only the test splits are encoded

    dev = evaluate_dev(enc, tmp_path)
    assert list(dev) == ["stsb-dev"] and dev["stsb-dev"] == pytest.approx(res["STSBenchmark"]["test"])


def test_format_table_and_avg() -> None:
    res = {t: {"all": 0.5, "mean": 0.4, "wmean": 0.45} for t in STS_TASKS[:5]}
    res["STSBenchmark"] = {"test": 0.8}
    res["SICKRelatedness"] = {"test": 0.7}
    res["avg"] = 0.6
    lines = format_sts_table(res).splitlines()
    heads = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == heads
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == ["50.00"] * 5 + ["80.00", "70.00", "60.00"]
    assert "-" in format_sts_table({"STS12": {"all": 0.1234}})


# --- input errors ---------------------------------------------------------------------------------


def test_non_numeric_gold_names_file_and_line(tmp_path: Path) -> None:
    folder = write_sts13(tmp_path)
    (folder / "STS.gs.headlines.txt").write_text("4.0\n2.5\nabc\n0.5\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"STS\.gs\.headlines\.txt:3\b.*'abc'"):
        load_sts_task(tmp_path, "STS13")


def test_missing_gs_file(tmp_path: Path) -> None:
    folder = write_sts13(tmp_path)
    (folder / "STS.gs.OnWN.txt").unlink()
    with pytest.raises(CsekitError, match=r"STS\.gs\.OnWN\.txt.*not found"):
        evaluate_sts(RecordingEncoder(), tmp_path, tasks=("STS13",))


def test_line_count_mismatch(tmp_path: Path) -> None:
    folder = write_sts13(tmp_path)
    (folder / "STS.gs.OnWN.txt").write_text("0.2\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"STS\.gs\.OnWN\.txt:2: .*1 lines.*STS\.input\.OnWN\.txt has 2"):
        load_sts_task(tmp_path, "STS13")


def test_wrong_field_count_names_line(tmp_path: Path) -> None:
    folder = write_sts13(tmp_path)
    (folder / "STS.input.OnWN.txt").write_text("x y z\tthe cat\nno tab here\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"STS\.input\.OnWN\.txt:2: expected 2"):
        load_sts_task(tmp_path, "STS13")

    write_pair_data(tmp_path)
    (tmp_path / "sts" / "STSBenchmark" / "sts-test.csv").write_text(STSB_ROWS[0] + "\nonly\tfour\tfields\tx\n")
    with pytest.raises(CsekitError, match=r"sts-test\.csv:2: expected at least 7"):
        load_sts_task(tmp_path, "STSBenchmark")
    sick_test = tmp_path / "sts" / "SICK" / "SICK_test_annotated.txt"
    sick_test.write_text("\n".join([*SICK_ROWS[:2], "2\ta\tb\tn/a\tNEUTRAL"]) + "\n")
    with pytest.raises(CsekitError, match=r"SICK_test_annotated\.txt:3: gold score 'n/a'"):
        load_sts_task(tmp_path, "SICKRelatedness")


def test_unknown_task_suggests(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r'unknown STS task "STS_12".*did you mean "STS12"'):
        evaluate_sts(RecordingEncoder(), tmp_path, tasks=("STS_12",))


def test_missing_data_dir_mentions_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CSEKIT_DATA", raising=False)
    with pytest.raises(CsekitError, match="CSEKIT_DATA") as info:
        resolve_data_dir(None)
    assert "--data-dir" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CsekitError, match="CSEKIT_DATA"):
        evaluate_sts(RecordingEncoder(), None)
    monkeypatch.setenv("CSEKIT_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(CsekitError, match=r"nowhere.*from CSEKIT_DATA"):
        resolve_data_dir(None)
    monkeypatch.setenv("CSEKIT_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    (tmp_path / "sts").mkdir()
    assert resolve_data_dir(tmp_path / "sts") == tmp_path / "sts"  # explicit beats the env var
    with pytest.raises(CsekitError, match="STS16 data not found"):
        load_sts_task(None, "STS16")


# --- real SentEval data ---------------------------------------------------------------------------


def real_data_dir() -> Path:
    candidates = [Path(os.environ["CSEKIT_DATA"])] if os.environ.get("CSEKIT_DATA") else []
    candidates.append(Path(__file__).parents[3].parent / "shared" / "data")
    for path in candidates:
        if (path / "sts").is_dir() or (path / "STS").is_dir():
            return path
    pytest.skip("SentEval data not found (set CSEKIT_DATA or stage ../shared/data)")


EXPECTED_PAIRS = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STSBenchmark": 1379,
    "SICKRelatedness": 4927,
}


@pytest.mark.data
@pytest.mark.parametrize("task", STS_TASKS)
def test_real_pair_counts(task: str) -> None:
    subsets = load_sts_task(real_data_dir(), task)
    assert sum(len(s) for s in subsets) == EXPECTED_PAIRS[task]
    for s in subsets:
        assert len(s.sentences1) == len(s.sentences2) == len(s.scores)
        assert all(0.0 <= y <= 5.0 for y in s.scores)


@pytest.mark.data
def test_real_suite_encodes_once() -> None:
    data = real_data_dir()
    calls: list[int] = []

    def enc(sentences: list[str]) -> np.ndarray:
        calls.append(len(sentences))
        # Deterministic bag-of-characters features: cheap and correlated with surface similarity.
        out = np.zeros((len(sentences), 32), dtype=np.float32)
        for i, s in enumerate(sentences):
            for ch in s:
                out[i, ord(ch) % 32] += 1.0
        return out

    res = evaluate_sts(enc, data)
    assert len(calls) == 1 and calls[0] < 2 * sum(EXPECTED_PAIRS.values())
    assert set(res) == {*STS_TASKS, "avg"}
    headline = [res[t]["all"] for t in STS_TASKS[:5]] + [res["STSBenchmark"]["test"], res["SICKRelatedness"]["test"]]
    assert res["avg"] == pytest.approx(np.mean(headline))
    assert all(0.0 < x < 1.0 for x in headline)  # surface overlap correlates positively with STS gold


def test_a_registered_sts_task_is_evaluated_like_the_built_in_ones(tmp_path: Path) -> None:
    """The task registry is open: an EvalTask of group sts with its own reader is scored, and named by --tasks."""
    import csekit
    from csekit.evaluation.suite import parse_tasks
    from csekit.evaluation.tasks import EVAL_TASKS, EvalTask, StsSubset

    pairs = StsSubset("test", ["a b", "c d", "e f"], ["a b", "c x", "y z"], [5.0, 2.5, 0.0])
    task = EvalTask("my-sts", "sts", "mine", load=lambda root: [pairs])
    with pytest.raises(CsekitError, match="group sts or dev"):
        csekit.register_part("task", "my-sts", EvalTask("my-sts", "transfer", "mine"))
    csekit.register_part("task", "my-sts", task)
    try:
        assert parse_tasks("my-sts").names("sts") == ["my-sts"]
        vectors = {"a b": [1.0, 0.0], "c d": [1.0, 1.0], "c x": [1.0, 0.2], "e f": [0.0, 1.0], "y z": [1.0, 0.0]}
        result = evaluate_sts(lambda sentences: np.array([vectors[s] for s in sentences]), tmp_path, ["my-sts"])
        assert result["my-sts"]["test"] == pytest.approx(1.0)  # cosines 1, 0.83, 0 follow the gold order
        assert "avg" not in result  # only the seven headline tasks make the papers' average
    finally:
        EVAL_TASKS.unregister("my-sts")
