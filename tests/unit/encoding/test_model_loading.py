"""`model_folder.load_model`: the one way csekit loads a model by name or folder (issue 50 part 3).

`SentenceEncoder.load`, `csekit freq`'s tokenizer and the fsmt/marian paraphrase engines each loaded models their own
way before; each case here is one that a copy got wrong and the one function gets right.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, make_corpus, make_tiny_encoder, run_main
from safetensors.torch import load_file, save_file
from test_osscse import moses, save_tiny_fsmt  # noqa: F401  (moses: a fixture, the FSMT tokenizer's Moses steps)

from csekit.core.errors import CsekitError
from csekit.encoding import hub

SRC = Path(__file__).resolve().parents[3] / "src"
MODEL_FOLDER_MODULE = "csekit/encoding/model_folder.py"

CaptureErr = pytest.CaptureFixture[str]


def _sentence_transformers_folder(root: Path) -> Path:
    """An older sentence-transformers layout: the transformer (and its tokenizer) in 0_Transformer/, not at the top."""
    make_tiny_encoder(root / "tokenizer").save(root / "saved")
    folder = root / "st-model"
    folder.mkdir()
    shutil.move(root / "saved", folder / "0_Transformer")
    for name in ("modules.json", "csekit.json"):
        (folder / "0_Transformer" / name).unlink()
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}), encoding="utf-8")
    modules = [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    return folder


def test_freq_counts_with_the_tokenizer_of_a_sentence_transformers_folder_as_load_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """freq looked for the tokenizer at the folder's top and refused it ("no vocabulary"), though
    `SentenceEncoder.load` (and so `train` and `evaluate`) read the same folder."""
    from csekit.encoding.encoder import SentenceEncoder

    folder = _sentence_transformers_folder(tmp_path)
    assert SentenceEncoder.load(folder).pooler.name == "mean"
    corpus, output = make_corpus(tmp_path / "corpus.txt", lines=8), tmp_path / "counts.json"
    code, err = run_main(
        monkeypatch, capsys, "freq", "--corpus", str(corpus), "--tokenizer", str(folder), "-o", str(output)
    )
    assert code == 0, err
    counts = json.loads(output.read_text(encoding="utf-8"))
    assert sum(counts.values()) > 0 and "[UNK]" in counts


def test_freq_on_a_run_folder_names_its_best_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """It said "no vocabulary" of the run's folder; `evaluate` names the run's best model, and so does freq now."""
    run = tmp_path / "run"
    make_tiny_encoder(tmp_path / "tokenizer").save(run / "best")
    (run / "checkpoint").mkdir()
    corpus, output = make_corpus(tmp_path / "corpus.txt", lines=8), tmp_path / "counts.json"
    code, err = run_main(
        monkeypatch, capsys, "freq", "--corpus", str(corpus), "--tokenizer", str(run), "-o", str(output)
    )
    assert_one_line_error(code, err, "--tokenizer", f"its best model is {run / 'best'}")
    assert not output.exists()


@pytest.mark.usefixtures("moses")
def test_an_fsmt_folder_whose_weights_lack_a_layer_is_refused(tmp_path: Path) -> None:
    """transformers filled the missing layer in at random and the engine translated with it (a silent wrong model);
    the sentence encoder refused such a folder, and the engines now do too."""
    from csekit.prep.paraphrase import FsmtEngine

    for source, target in [("en", "ru"), ("ru", "en")]:
        save_tiny_fsmt(tmp_path / f"wmt19-{source}-{target}", source, target)
    weights = tmp_path / "wmt19-en-ru" / "model.safetensors"
    tensors = load_file(weights)
    dropped = next(name for name in sorted(tensors) if name.endswith("encoder.layers.0.fc1.weight"))
    save_file({name: value for name, value in tensors.items() if name != dropped}, weights, metadata={"format": "pt"})
    engine = FsmtEngine(pivots=["ru"], models=str(tmp_path / "wmt19-{source}-{target}"), device="cpu")
    with pytest.raises(CsekitError, match="refusing to fill them in at random") as error:
        engine(["the man plays"])
    assert "wmt19-en-ru" in str(error.value) and "fc1.weight" in str(error.value) and "\n" not in str(error.value)


def test_a_translation_model_the_offline_cache_lacks_fails_at_once_without_the_encoder_aliases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engines tried the hub whatever its reach (huggingface_hub's retries, about 25 s) and said "needs a
    network"; now the cache only when the hub is out of reach, one line, and no sentence-encoder alias offered."""
    from csekit.prep.paraphrase import MarianEngine

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=0.0: False)
    engine = MarianEngine(pivots=["de"], models="nobody-here/no-such-opus-mt-{source}-{target}", device="cpu")
    with pytest.raises(CsekitError, match="hub cannot be reached") as error:
        engine(["the man plays"])
    assert '"nobody-here/no-such-opus-mt-en-de"' in str(error.value) and "minilm" not in str(error.value)


def test_the_marian_engine_without_sentencepiece_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MarianTokenizer needs sentencepiece (not a csekit dependency): that was a traceback, as sacremoses was for
    fsmt before it was named."""
    import sys

    from transformers import MarianConfig, MarianMTModel

    from csekit.prep.paraphrase import MarianEngine

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import sentencepiece raises ImportError
    sizes = {"encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2}
    config = MarianConfig(
        vocab_size=40, d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, **sizes
    )
    config.pad_token_id = config.decoder_start_token_id = 39
    for source, target in [("en", "de"), ("de", "en")]:
        folder = tmp_path / f"opus-mt-{source}-{target}"
        MarianMTModel(config).save_pretrained(folder)
        for name in ("source.spm", "target.spm"):
            (folder / name).write_bytes(b"")
        (folder / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(40)}), encoding="utf-8")
    engine = MarianEngine(pivots=["de"], models=str(tmp_path / "opus-mt-{source}-{target}"), device="cpu")
    with pytest.raises(CsekitError, match="needs sentencepiece: pip install sentencepiece"):
        engine(["the man plays"])


# --- architecture: every model load goes through load_model -------------------------------------------------


def own_loads_elsewhere(sources: dict[str, str]) -> list[str]:
    """Calls of csekit's own `from_pretrained(loader, location)` outside model_folder.py: such a call checks the
    folder's files but skips what `load_model` adds (its layout, its own code refused, the offline hub cache)."""
    found = []
    for label, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            is_own = (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "from_pretrained"
            )
            if is_own and label != MODEL_FOLDER_MODULE:
                found.append(f"{label}:{node.lineno}")  # type: ignore[attr-defined]
    return found


def test_every_model_is_loaded_through_load_model() -> None:
    sources = {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted((SRC / "csekit").rglob("*.py"))}
    assert not own_loads_elsewhere(sources), "\n".join(own_loads_elsewhere(sources))


def test_the_load_model_check_can_fail() -> None:
    source = (
        "from csekit.encoding.model_folder import from_pretrained\n\n"
        "def load(name):\n    return from_pretrained(AutoTokenizer, name)\n"
    )
    assert own_loads_elsewhere({"csekit/cli.py": source}) == ["csekit/cli.py:4"]
