"""benchmarks/minilm_mlm_standin.py, the testbed with headroom's maker (issue 63 item 1), end to end on a tiny BERT.

The real stand-in starts from all-MiniLM-L6-v2 and trains for minutes; here the same code runs a 2-layer model for
two steps: its folder loads in csekit and in sentence-transformers with the same embeddings, its top layer was
re-initialised (the sentence model's training is gone there), it is cached by its settings, and a folder in the way
is refused before any training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_corpus, make_tiny_mlm
from transformers import BertForMaskedLM

from csekit.encoding.encoder import SentenceEncoder

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import minilm_mlm_standin

    return minilm_mlm_standin


def tiny_bert(folder: Path) -> Path:
    """A 2-layer BERT with an MLM head and the tests' tiny vocabulary, weights drawn wide (a 'trained' model)."""
    return make_tiny_mlm(folder, initializer_range=0.3, layers=2)


def arguments(tmp_path: Path, *extra: str) -> list[str]:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=200)
    backbone = tiny_bert(tmp_path / "backbone") if not (tmp_path / "backbone").exists() else tmp_path / "backbone"
    common = ["--backbone", str(backbone), "--corpus", str(corpus), "--steps", "2", "--held-out", "32"]
    return [*common, "--reinit-top-layers", "1", *extra]


def test_the_standin_loads_in_csekit_and_sentence_transformers(tmp_path: Path, standin) -> None:  # type: ignore[no-untyped-def]
    output = tmp_path / "generators" / "standin"
    standin.main([*arguments(tmp_path), "--output", str(output)])
    record = json.loads((output / "standin.json").read_text(encoding="utf-8"))
    assert record["settings"]["reinit_top_layers"] == 1 and record["settings"]["steps"] == 2
    assert 0.0 <= record["masked_accuracy"]["after"] <= 1.0
    # The top layer was drawn afresh, the lower one only moved by two small steps (lr 1e-4).
    start, made = (BertForMaskedLM.from_pretrained(folder) for folder in (tmp_path / "backbone", output))

    def moved(layer: int) -> float:
        before, after = (m.bert.encoder.layer[layer].attention.self.query.weight for m in (start, made))
        return (after - before).abs().max().item()

    assert moved(0) < 0.01 < 0.1 < moved(1)
    from sentence_transformers import SentenceTransformer

    sentences = ["the dog runs", "a man plays music in the park"]
    ours = SentenceEncoder.load(output, "mean").encode(sentences)
    theirs = SentenceTransformer(str(output), device="cpu").encode(sentences)  # mean pooling: its default
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_the_standin_is_cached_by_its_settings_and_a_folder_in_the_way_is_refused(
    tmp_path: Path, standin, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    output = tmp_path / "standin"
    standin.main([*arguments(tmp_path), "--output", str(output)])
    made = (output / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    standin.main([*arguments(tmp_path), "--output", str(output)])
    assert "holds this stand-in already (cached)" in capsys.readouterr().out
    assert (output / "model.safetensors").stat().st_mtime_ns == made
    with pytest.raises(SystemExit) as exit_info:  # other settings: refused before any training
        standin.main([*arguments(tmp_path, "--seed", "1"), "--output", str(output)])
    assert exit_info.value.code == 2
    assert "holds no stand-in of these settings" in capsys.readouterr().err
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SystemExit):
        standin.main([*arguments(tmp_path), "--output", str(tmp_path / "link")])
    assert "is a link" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()
