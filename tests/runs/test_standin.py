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
import torch
from conftest import make_corpus, make_tiny_mlm
from transformers import BertForMaskedLM

from csekit.encoding.encoder import SentenceEncoder

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_a_stopped_standin_continues_from_its_training_state_to_the_same_weights(
    tmp_path: Path, standin, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """Stopped at step 3 of 4 (its state saved at step 2), the same command continues after step 2 and writes the
    weights an uninterrupted run writes; the state file goes once the stand-in is written."""
    import minilm_mlm_generator

    settings = [*arguments(tmp_path), "--steps", "4", "--save-every", "2"]
    whole = tmp_path / "whole"
    standin.main([*settings, "--output", str(whole)])
    assert not standin.state_path(whole).exists()

    stopped = tmp_path / "stopped"
    real, calls = minilm_mlm_generator.masked_logits, []

    def stop_at_step_three(model, batch):  # type: ignore[no-untyped-def]
        calls.append(1)  # call 1 scores the held-out batch, calls 2.. are steps 1..
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(model, batch)

    monkeypatch.setattr(minilm_mlm_generator, "masked_logits", stop_at_step_three)
    with pytest.raises(SystemExit) as exit_info:
        standin.main([*settings, "--output", str(stopped)])
    assert exit_info.value.code == 130 and not stopped.exists()
    assert f"continues from the training state in {standin.state_path(stopped)}" in capsys.readouterr().err
    monkeypatch.setattr(minilm_mlm_generator, "masked_logits", real)
    standin.main([*settings, "--output", str(stopped)])
    assert "continuing after step 2" in capsys.readouterr().out
    expected, made = _weights(whole), _weights(stopped)
    assert set(expected) == set(made) and all(torch.equal(expected[key], made[key]) for key in expected)
    assert not standin.state_path(stopped).exists()
    before = [json.loads((folder / "standin.json").read_text())["masked_accuracy"] for folder in (whole, stopped)]
    assert before[0] == before[1]


def test_a_training_state_of_other_settings_is_not_continued_and_a_damaged_one_is_refused(
    tmp_path: Path, standin, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    output = tmp_path / "standin"
    state = standin.state_path(output)
    torch.save({"settings": "another run", "step": 1}, state)
    standin.main([*arguments(tmp_path), "--output", str(output)])
    assert "holds another run's training state: starting afresh" in capsys.readouterr().out
    assert output.is_dir() and not state.exists()

    other = tmp_path / "other"
    standin.state_path(other).write_bytes(b"not a torch file")
    with pytest.raises(SystemExit) as exit_info:
        standin.main([*arguments(tmp_path), "--output", str(other)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after transformers' loading bar
    assert exit_info.value.code == 2 and last.startswith("minilm_mlm_standin: ") and not other.exists()
    assert last.endswith("is damaged or not a training state (not tensors and plain values)")
    with pytest.raises(SystemExit) as exit_info:
        standin.main([*arguments(tmp_path), "--output", str(tmp_path / "third"), "--save-every", "0"])
    assert exit_info.value.code == 2 and "--save-every must be" in capsys.readouterr().err
