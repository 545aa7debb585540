"""Every method of the SimCSE family on a decoder backbone trains, or is refused in one line with its reason.

Issue 54 item 4: with a decoder LLM as the backbone (bidirectional attention, mean pooling, as LLM2Vec), each
shipped MiniLM recipe that runs offline is trained for two steps on a tiny random Llama: its views, negatives,
weighting, head and objectives as the recipe has them. What cannot work on a decoder is refused before training,
naming why: ConSERT's views need BERT's `embeddings` module, TSDAE's decoder needs cross-attention, the prompt
poolers need a mask token. Only the tiny model's width is adapted (WhitenedCSE's 128 groups, Matryoshka's widths).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import WORDS, make_corpus, read_metrics
from tiny_decoders import tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.prep.frequency import count_tokens, counts_by_token, load_counting_tokenizer
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[2]
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
    # The made inputs: SNCSE's negations and OssCSE's paraphrases and negations ({augmented}), SLT-FAI's counts
    # of the decoder's own tokens ({counts}); ISF's mask token is "_" (LLM2Vec's MNTP choice: no mask token).
    "sncse-minilm.yaml": ["data.corpus={augmented}"],
    "osscse-minilm.yaml": ["data.corpus={augmented}"],  # its mask pooler read at mean, as PromptBERT's
    "slt-fai-minilm.yaml": [
        "objectives.1.counts={counts}",
        "objectives.2.counts={counts}",
        "objectives.2.mask_token=_",
    ],
    "rankcse-minilm.yaml": ["objectives.1.teachers=[{model}]"],  # the teacher: the decoder itself (mean)
    "combined-minilm.yaml": [
        "data.corpus={augmented}",
        "model.head.num_groups=8",
        "weighting.model={model}",
        "objectives.1.counts={counts}",
        "objectives.2.counts={counts}",
        "objectives.2.mask_token=_",
    ],
    "mixcse+dclr-minilm.yaml": ["weighting.model={model}"],
    "sncse+dclr-minilm.yaml": ["data.corpus={augmented}", "weighting.model={model}"],
    "dclr+whitened-minilm.yaml": ["model.head.num_groups=8", "weighting.model={model}"],
}
REFUSED = {
    "consert-views-minilm.yaml": ([], "has no `embeddings` module"),
    "tsdae-minilm.yaml": ([], "has no cross-attention"),
    "promptbert-minilm.yaml": (["model.pooler=mask_denoised"], "needs a tokenizer with a mask token"),
    "osscse-minilm.yaml": (["data.corpus={augmented}", "model.pooler=mask"], "needs a tokenizer with a mask token"),
    "slt-fai-minilm.yaml": (["objectives.1.counts={counts}", "objectives.2.counts={counts}"], "set mask_token"),
}


def augmented_corpus(path: Path, lines: int = 64) -> Path:
    """A `csekit augment`-style .jsonl: each sentence with a paraphrase and a negation (some missing, as there)."""
    rng = random.Random(0)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(lines):
            text = " ".join(rng.choices(words, k=5))
            paraphrase = None if i % 4 == 0 else " ".join(rng.choices(words, k=6))
            negation = None if i % 5 == 0 else f"{text} not"
            handle.write(json.dumps({"text": text, "paraphrase": paraphrase, "negation": negation}) + "\n")
    return path


def decoder_counts(model: Path, corpus: Path, output: Path) -> Path:
    """`csekit freq --corpus CORPUS --tokenizer MODEL`: the decoder tokenizer's token counts over the corpus."""
    tokenizer = load_counting_tokenizer(str(model))
    counts = count_tokens(corpus, tokenizer, show_progress=False)
    output.write_text(json.dumps(counts_by_token(counts, tokenizer)), encoding="utf-8")
    return output


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoder")
    model = tiny_decoder_dir(root / "llama", attention="bidirectional")
    corpus = make_corpus(root / "corpus.txt", lines=64)
    made = {
        "augmented": augmented_corpus(root / "augmented.jsonl"),
        "counts": decoder_counts(model, corpus, root / "c.json"),
    }
    return {"model": model, "corpus": corpus, **made}


def decoder_recipe(name: str, extra: list[str], made: dict[str, Path]) -> object:
    overrides = [
        f"model.backbone={made['model']}",
        "model.pooler=mean",
        "model.max_length=16",
        f"data.corpus={made['corpus']}",
        "train.batch_size=8",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.log_every=1",
        "train.dev_task=none",
        "train.precision=fp32",
        *(item.format(**made) for item in extra),
    ]
    return load_recipe(REPO / "recipes" / name, overrides)


@pytest.mark.parametrize("name", TRAINS)
def test_the_method_trains_on_a_decoder(name: str, decoder: dict[str, Path], tmp_path: Path) -> None:
    recipe = decoder_recipe(name, TRAINS[name], decoder)
    assert train(recipe, tmp_path / "run", show_progress=False).steps == 2
    losses = [record["loss"] for record in read_metrics(tmp_path / "run") if "loss" in record]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("name", REFUSED)
def test_what_cannot_run_on_a_decoder_is_one_line_with_its_reason(
    name: str, decoder: dict[str, Path], tmp_path: Path
) -> None:
    extra, reason = REFUSED[name]
    with pytest.raises(CsekitError) as refused:
        train(decoder_recipe(name, extra, decoder), tmp_path / "run", show_progress=False)
    assert reason in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_isf_masks_a_decoders_words_with_the_mask_token_the_recipe_names(decoder: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    from csekit.parts.objectives.slt_fai import IncompleteSentenceFiltering

    tokenizer = AutoTokenizer.from_pretrained(decoder["model"])
    assert tokenizer.mask_token is None
    isf = IncompleteSentenceFiltering(
        32, tokenizer, 16, str(decoder["counts"]), mask_token="_", min_masked_words=1, low_fraction=0.9
    )
    inputs, masked_ids, masked = isf.make_incomplete(["the man plays guitar in the park", "a dog runs"])
    underscore = tokenizer.convert_tokens_to_ids("_")
    assert masked.any() and (masked_ids[masked] == underscore).all()
    assert torch.equal(masked_ids[~masked], inputs["input_ids"][~masked])
    with pytest.raises(ValueError, match="'<mask>' is not in the tokenizer's vocabulary"):
        IncompleteSentenceFiltering(32, tokenizer, 16, str(decoder["counts"]), mask_token="<mask>")
