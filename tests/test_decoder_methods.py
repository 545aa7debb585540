"""Every method of the SimCSE family on a decoder backbone trains, or is refused in one line with its reason.

Issue 54 item 4: with a decoder LLM as the backbone (bidirectional attention, mean pooling, as LLM2Vec), each
shipped MiniLM recipe that runs offline is trained for two steps on a tiny random Llama: its views, negatives,
weighting, head and objectives as the recipe has them. What cannot work on a decoder is refused before training,
naming why: ConSERT's views need BERT's `embeddings` module, TSDAE's decoder needs cross-attention, the prompt
poolers need a mask token. Only the tiny model's width is adapted (WhitenedCSE's 128 groups, Matryoshka's widths).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import make_corpus, read_metrics
from tiny_decoders import tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
TRAINS = {
    "quickstart.yaml": [],  # SimCSE
    "cropping-minilm.yaml": [],
    "ct-minilm.yaml": [],
    "dclr-minilm.yaml": ["weighting.model={model}"],  # the complementary model: the decoder itself
    "esimcse-minilm.yaml": [],
    "mixcse-minilm.yaml": [],
    "promptbert-minilm.yaml": ["model.pooler=mean"],  # its denoising needs the mask pooler (refused below)
    "whitenedcse-minilm.yaml": ["model.head.num_groups=8"],
    "matryoshka-simcse-minilm.yaml": ["objectives.0.dims=[32,16,8,4,2]"],
}
REFUSED = {
    "consert-views-minilm.yaml": ([], "has no `embeddings` module"),
    "tsdae-minilm.yaml": ([], "has no cross-attention"),
    "promptbert-minilm.yaml": (["model.pooler=mask_denoised"], "needs a tokenizer with a mask token"),
}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("decoder")
    return tiny_decoder_dir(root / "llama", attention="bidirectional"), make_corpus(root / "corpus.txt", lines=64)


def decoder_recipe(name: str, extra: list[str], model: Path, corpus: Path) -> object:
    overrides = [
        f"model.backbone={model}",
        "model.pooler=mean",
        "model.max_length=16",
        f"data.corpus={corpus}",
        "train.batch_size=8",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.log_every=1",
        "train.dev_task=none",
        "train.precision=fp32",
        *(item.format(model=model) for item in extra),
    ]
    return load_recipe(REPO / "recipes" / name, overrides)


@pytest.mark.parametrize("name", TRAINS)
def test_the_method_trains_on_a_decoder(name: str, decoder: tuple[Path, Path], tmp_path: Path) -> None:
    model, corpus = decoder
    recipe = decoder_recipe(name, TRAINS[name], model, corpus)
    assert train(recipe, tmp_path / "run", show_progress=False).steps == 2
    losses = [record["loss"] for record in read_metrics(tmp_path / "run") if "loss" in record]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("name", REFUSED)
def test_what_cannot_run_on_a_decoder_is_one_line_with_its_reason(
    name: str, decoder: tuple[Path, Path], tmp_path: Path
) -> None:
    model, corpus = decoder
    extra, reason = REFUSED[name]
    with pytest.raises(CsekitError) as refused:
        train(decoder_recipe(name, extra, model, corpus), tmp_path / "run", show_progress=False)
    assert reason in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
