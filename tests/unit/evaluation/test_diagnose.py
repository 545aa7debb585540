"""`csekit diagnose`: each metric against a hand computation, one encoding pass per model, the command."""

from __future__ import annotations

import json
import random
import sys
import zlib
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, assert_one_line_error, make_tiny_encoder, run_main

from csekit import cli
from csekit.core.errors import CsekitError
from csekit.data.data_dir import STS_SUBSETS
from csekit.evaluation.diagnose import (
    DiagnoseSettings,
    anisotropy,
    diagnose,
    false_negative_pairs,
    format_diagnose_table,
    frequency_classes,
    frequency_probe_accuracy,
    load_diagnose_data,
    low_frequency_shares,
    random_batches,
    random_pairs,
)

METRICS = (
    "anisotropy",
    "alignment",
    "uniformity",
    "frequency_probe_accuracy",
    "frequency_probe_baseline",
    "cont",
    "oppn",
    "cont_oppn_gap",
    "false_negative_rate",
)


# --- made-up data ----------------------------------------------------------------------------------


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choices([w for w in WORDS if w.isalpha()], k=rng.randint(3, 7)))


def make_probe_data_dir(root: Path, pairs: int = 12, seed: int = 0) -> Path:
    """A made-up data folder with every file the probes read: each STS12-16 subset and STS-B's three splits."""
    rng = random.Random(seed)
    for task, subsets in STS_SUBSETS.items():
        folder = root / "sts" / task
        folder.mkdir(parents=True)
        for subset in subsets:
            rows = [(_sentence(rng), _sentence(rng), rng.uniform(0, 5)) for _ in range(pairs)]
            (folder / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows), "utf-8")
            (folder / f"STS.gs.{subset}.txt").write_text("".join(f"{y:.2f}\n" for _, _, y in rows), "utf-8")
    folder = root / "sts" / "STSBenchmark"
    folder.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        rows = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{_sentence(rng)}\t{_sentence(rng)}"
            for i in range(3 * pairs)
        ]
        (folder / f"sts-{split}.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def write_counts(path: Path, vocabulary: dict[str, int]) -> Path:
    """Counts in which every other word of the tiny vocabulary is frequent, the rest (and word pieces) rare."""
    common = set(WORDS[::2])
    path.write_text(json.dumps({t: 1000 if t in common else 1 + i % 7 for t, i in vocabulary.items()}), "utf-8")
    return path


def counting(encode: Callable[[list[str]], np.ndarray], calls: list[int]) -> Callable[[list[str]], np.ndarray]:
    def wrapped(sentences: list[str]) -> np.ndarray:
        calls.append(len(sentences))
        return encode(sentences)

    return wrapped


def hashed_encoder(dim: int = 16, salt: str = "") -> Callable[[list[str]], np.ndarray]:
    """A stand-in model: a fixed random vector per sentence."""

    def encode(sentences: list[str]) -> np.ndarray:
        return np.stack(
            [np.random.default_rng(zlib.crc32((salt + s).encode())).standard_normal(dim) for s in sentences]
        ).astype(np.float32)

    return encode


# --- each metric against a hand computation --------------------------------------------------------


def test_anisotropy_is_one_for_identical_rows_and_zero_for_orthogonal_ones() -> None:
    pairs = random_pairs(8, 100, seed=0)
    assert anisotropy(np.tile([[0.3, -2.0, 1.0]], (8, 1)), pairs) == pytest.approx(1.0)
    assert anisotropy(np.eye(8) * 5.0, pairs) == pytest.approx(0.0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 4))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert anisotropy(x, pairs) == pytest.approx(np.mean([unit[i] @ unit[j] for i, j in pairs]))


def test_random_pairs_join_two_different_rows_reproducibly() -> None:
    pairs = random_pairs(5, 2000, seed=3)
    assert np.all(pairs[:, 0] != pairs[:, 1]) and pairs.min() == 0 and pairs.max() == 4
    assert np.array_equal(pairs, random_pairs(5, 2000, seed=3))
    assert len({tuple(p) for p in pairs}) == 20  # every ordered pair of 5 rows shows up
    with pytest.raises(CsekitError, match="at least 2"):
        random_pairs(1, 10)


def test_false_negative_pairs_on_a_constructed_batch() -> None:
    angle = np.arccos(0.85)
    # cosines: (0,1) = 1, (0,2) = (1,2) = 0.85, (2,3) = sin(angle) = 0.53, the rest 0
    rows = np.array([[1.0, 0.0], [2.0, 0.0], [np.cos(angle), np.sin(angle)], [0.0, 1.0]])
    batch = [np.arange(4)]
    assert false_negative_pairs(rows, batch, phi=0.9) == (1, 6)
    assert false_negative_pairs(rows, batch, phi=0.8) == (3, 6)
    assert false_negative_pairs(rows, batch, phi=1.0 - 1e-9) == (1, 6)


def test_false_negative_pairs_are_counted_within_batches_only() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((200, 3))
    batches = random_batches(200, 64, seed=1)
    assert [len(b) for b in batches] == [64, 64, 64]  # the last 8 rows make no full batch
    assert len(set(np.concatenate(batches))) == 192
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    flags = [unit[i] @ unit[j] >= 0.5 for b in batches for i, j in combinations(b, 2)]
    assert false_negative_pairs(rows, batches, phi=0.5) == (sum(flags), len(flags))
    with pytest.raises(CsekitError, match="at least one batch"):
        false_negative_pairs(rows[:10], random_batches(10, 64))


def test_low_frequency_shares_and_the_median_split() -> None:
    labels = np.array([0, 0, 1, 1, 0])
    shares = low_frequency_shares([[2, 3], [0, 2], [0, 1, 4], [], [3, 0, 0, 0]], labels)
    assert shares == pytest.approx([1.0, 0.5, 0.0, 0.0, 0.25])
    assert frequency_classes(shares).tolist() == [1, 1, 0, 0, 0]  # median 0.25: at it is the low class


def test_the_frequency_probe_is_chance_on_random_vectors_and_perfect_when_a_coordinate_encodes_the_class() -> None:
    rng = np.random.default_rng(0)
    classes = np.repeat([0, 1], 200)
    noise = rng.standard_normal((400, 16))
    assert frequency_probe_accuracy(noise, classes) == pytest.approx(0.5, abs=0.08)
    encoded = noise.copy()
    encoded[:, 0] = np.where(classes == 1, 4.0, -4.0)
    assert frequency_probe_accuracy(encoded, classes) > 0.97
    with pytest.raises(CsekitError, match="at least 5 sentences in each frequency class"):
        frequency_probe_accuracy(noise[:10], np.array([0] * 6 + [1] * 4))


# --- one pass -------------------------------------------------------------------------------------


def test_diagnose_encodes_once_per_model_and_once_more_for_a_distinct_complementary_model(tmp_path: Path) -> None:
    data = load_diagnose_data(make_probe_data_dir(tmp_path / "data"))
    tokenizer = make_tiny_encoder(tmp_path / "tokenizer").tokenizer
    labels = np.zeros(len(tokenizer), dtype=np.int64)
    labels[tokenizer.convert_tokens_to_ids(WORDS[1::2])] = 1

    def tokenize(batch: list[str]) -> list[list[int]]:
        return tokenizer(batch, add_special_tokens=False)["input_ids"]

    settings = DiagnoseSettings(sentences=300, phi=0.5, seed=0)
    calls: list[int] = []
    own = diagnose(counting(hashed_encoder(), calls), data, tokenize, labels, settings)
    assert len(calls) == 1 and calls[0] == len(data.sentences) and own["encode_calls"] == 1
    assert own["in_batch_pairs"] == (300 // 64) * (64 * 63 // 2)
    assert own["false_negative_rate"] == own["false_negative_pairs"] / own["in_batch_pairs"]
    assert set(METRICS) <= set(own)

    model_calls: list[int] = []
    judge_calls: list[int] = []
    judged = diagnose(
        counting(hashed_encoder(), model_calls),
        data,
        tokenize,
        labels,
        settings,
        complementary=counting(hashed_encoder(salt="other model"), judge_calls),
    )
    assert len(model_calls) == 1 and judge_calls == [300]
    # Only the false-negative rate depends on the complementary model.
    assert judged["false_negative_rate"] != own["false_negative_rate"]
    assert {k: judged[k] for k in METRICS if k != "false_negative_rate"} == {
        k: own[k] for k in METRICS if k != "false_negative_rate"
    }


def test_the_table_puts_models_side_by_side() -> None:
    report = dict.fromkeys(METRICS, 0.25) | {"cont": None}
    table = format_diagnose_table({"first-model": report, "second": report})
    head, _, *rows = table.splitlines()
    assert head.split() == ["metric", "first-model", "second"]
    assert len(rows) == len(METRICS)
    cont = next(row for row in rows if row.startswith("Cont. Spearman"))
    assert cont.split()[-2:] == ["-", "-"]
    gap = next(row for row in rows if row.startswith("Cont.-Oppn. gap"))
    assert gap.split()[-2:] == ["25.00", "25.00"]  # Spearman rows are x100
    tiny = format_diagnose_table({"m": report | {"false_negative_rate": 9.54e-6}})
    assert next(row for row in tiny.splitlines() if row.startswith("false negatives")).split()[-1] == "0.000954"


# --- the command ----------------------------------------------------------------------------------


def test_cli_diagnoses_two_models_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = make_probe_data_dir(tmp_path / "data")
    first, second = tmp_path / "first", tmp_path / "second"
    make_tiny_encoder(tmp_path / "tok1", seed=0, initializer_range=0.2).save(first)
    make_tiny_encoder(tmp_path / "tok2", seed=1, initializer_range=0.2).save(second)
    counts = write_counts(tmp_path / "counts.json", make_tiny_encoder(tmp_path / "tok3").tokenizer.get_vocab())
    output = tmp_path / "report.json"
    args = ["diagnose", str(first), str(second), "--data-dir", str(data_dir), "--counts", str(counts)]
    monkeypatch.setattr(sys, "argv", ["csekit", *args, "--sentences", "256", "--precision", "fp32", "-o", str(output)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["metric", str(first), str(second)]

    report = json.loads(output.read_text(encoding="utf-8"))
    assert list(report["models"]) == [str(first), str(second)]
    assert report["phi"] == 0.9 and report["sentences"] == 256 and report["counts"] == str(counts)
    for model in report["models"].values():
        assert set(METRICS) <= set(model) and model["encode_calls"] == 1 and model["precision"] == "fp32"
        assert -1 <= model["anisotropy"] <= 1 and 0 <= model["false_negative_rate"] <= 1
    assert report["models"][str(first)]["anisotropy"] != report["models"][str(second)]["anisotropy"]
    assert {model["pooler"] for model in report["models"].values()} == {"cls"}  # the tiny models' own

    # --pooler reads every model another way (the base model's [CLS] before training, say).
    monkeypatch.setattr(sys, "argv", ["csekit", *args, "--sentences", "256", "--pooler", "mean", "-o", str(output)])
    with pytest.raises(SystemExit):
        cli.main()
    by_mean = json.loads(output.read_text(encoding="utf-8"))["models"]
    assert {model["pooler"] for model in by_mean.values()} == {"mean"}
    assert by_mean[str(first)]["anisotropy"] != report["models"][str(first)]["anisotropy"]


def test_cli_refuses_a_bad_model_path_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = make_probe_data_dir(tmp_path / "data")
    counts = write_counts(tmp_path / "counts.json", make_tiny_encoder(tmp_path / "tok").tokenizer.get_vocab())
    missing = tmp_path / "no-such-model"
    common = ["--data-dir", str(data_dir), "--counts", str(counts)]
    code, err = run_main(monkeypatch, capsys, "diagnose", str(missing), *common)
    assert_one_line_error(code, err, str(missing), "does not exist")
    code, err = run_main(monkeypatch, capsys, "diagnose", str(missing), *common, "--phi", "1.5")
    assert_one_line_error(code, err, "--phi")
    code, err = run_main(monkeypatch, capsys, "diagnose", str(missing), *common, "--sentences", "10")
    assert_one_line_error(code, err, "--sentences", "64")
    code, err = run_main(monkeypatch, capsys, "diagnose", str(missing), "--data-dir", str(data_dir))
    assert_one_line_error(code, err, "freq/bookcorpus_bert-base-uncased/labels.json", "not found", "csekit freq")


def test_cli_warns_when_the_models_are_read_with_different_poolers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base model read with its mean pooler beside a model trained on [CLS] compares two representations."""
    data_dir = make_probe_data_dir(tmp_path / "data")
    base, trained = tmp_path / "base", tmp_path / "trained"
    make_tiny_encoder(tmp_path / "tok1", pooler="mean", initializer_range=0.2).save(base)
    make_tiny_encoder(tmp_path / "tok2", pooler="cls", initializer_range=0.2).save(trained)
    counts = write_counts(tmp_path / "counts.json", make_tiny_encoder(tmp_path / "tok3").tokenizer.get_vocab())
    args = ["diagnose", str(base), str(trained), "--data-dir", str(data_dir), "--counts", str(counts)]
    args += ["--sentences", "256"]
    for extra, warned in (([], True), (["--pooler", "cls"], False)):
        monkeypatch.setattr(sys, "argv", ["csekit", *args, *extra])
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        assert exit_info.value.code in (0, None)
        err = capsys.readouterr().err
        assert ("warning: the models are read with different poolers" in err) is warned, err
        if warned:
            assert f"{base} with mean, {trained} with cls" in err and "--pooler" in err


def test_cli_refuses_a_token_count_beyond_int64_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A count of 2^63 in the counts file was an overflow traceback when the frequency labels were made."""
    data_dir = make_probe_data_dir(tmp_path / "data")
    model = tmp_path / "model"
    encoder = make_tiny_encoder(tmp_path / "tok")
    encoder.save(model)
    counts = write_counts(tmp_path / "counts.json", encoder.tokenizer.get_vocab())
    values = json.loads(counts.read_text(encoding="utf-8"))
    values[next(iter(values))] = 2**63
    counts.write_text(json.dumps(values), encoding="utf-8")
    code, err = run_main(
        monkeypatch, capsys, "diagnose", str(model), "--data-dir", str(data_dir), "--counts", str(counts)
    )
    assert_one_line_error(code, err, str(counts), "at most 2^62")
