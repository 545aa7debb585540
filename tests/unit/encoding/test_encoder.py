"""Poolers' math, encode() behaviour, and saving for sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.passes import PassPlan
from csekit.encoding.pooling import ClsPooler, FirstLastAvgPooler, MeanPooler, make_pooler
from csekit.parts.heads.mlp import MLPHead

SENTENCES = [
    "a man plays the guitar .",
    "the dog runs",
    "a man plays the guitar .",
    "she eats food quickly in the park",
]


def test_poolers_compute_their_definitions_by_hand() -> None:
    torch.manual_seed(0)
    layers = [torch.randn(2, 4, 3) for _ in range(3)]  # embeddings, layer 1, layer 2
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    ids = torch.zeros(2, 4, dtype=torch.long)
    torch.testing.assert_close(ClsPooler()(layers, mask, ids), layers[-1][:, 0])
    expected_mean = torch.stack([layers[-1][0, :3].mean(0), layers[-1][1, :2].mean(0)])
    torch.testing.assert_close(MeanPooler()(layers, mask, ids), expected_mean)
    both = (layers[1] + layers[2]) / 2  # the first transformer layer, not the embedding layer
    expected_first_last = torch.stack([both[0, :3].mean(0), both[1, :2].mean(0)])
    torch.testing.assert_close(FirstLastAvgPooler()(layers, mask, ids), expected_first_last)


def test_mean_pooler_ignores_padding_values() -> None:
    states = torch.randn(1, 5, 4)
    mask = torch.tensor([[1, 1, 0, 0, 0]])
    changed = states.clone()
    changed[:, 2:] = 1000.0
    ids = torch.zeros(1, 5, dtype=torch.long)
    torch.testing.assert_close(MeanPooler()([states], mask, ids), MeanPooler()([changed], mask, ids))


def test_unknown_pooler_suggests_the_closest_name() -> None:
    with pytest.raises(CsekitError, match='did you mean "mean"'):
        make_pooler("maen")


def test_encode_matches_a_direct_forward_pass_in_input_order(tiny_encoder: SentenceEncoder) -> None:
    embeddings = tiny_encoder.encode(SENTENCES, batch_size=2)
    assert embeddings.dtype == np.float32 and embeddings.shape == (4, tiny_encoder.dim)
    np.testing.assert_array_equal(embeddings[0], embeddings[2])
    tiny_encoder.eval()
    with torch.inference_mode():
        for sentence, row in zip(SENTENCES, embeddings, strict=True):
            direct = tiny_encoder(tiny_encoder.tokenize([sentence])).pooled[0].numpy()
            np.testing.assert_allclose(row, direct, rtol=1e-4, atol=1e-5)


def test_encode_calls_the_model_once_per_unique_sentence(tiny_encoder: SentenceEncoder) -> None:
    seen: list[int] = []
    original = tiny_encoder.forward

    def counting(inputs, **options):  # type: ignore[no-untyped-def]
        seen.append(inputs["input_ids"].shape[0])
        return original(inputs, **options)

    tiny_encoder.forward = counting  # type: ignore[method-assign]
    tiny_encoder.encode(SENTENCES * 3, batch_size=64)
    assert sum(seen) == 3


def test_encode_restores_training_mode(tiny_encoder: SentenceEncoder) -> None:
    tiny_encoder.train()
    tiny_encoder.encode(SENTENCES)
    assert tiny_encoder.training


def test_bf16_encoding_stays_close_to_fp32(tiny_encoder: SentenceEncoder) -> None:
    full = tiny_encoder.encode(SENTENCES)
    half = tiny_encoder.encode(SENTENCES, precision="bf16")
    cosine = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert cosine.min() > 0.99


@pytest.mark.parametrize("pooler", ["cls", "mean", "first_last_avg", "pooler_output"])
@pytest.mark.parametrize("with_head", [False, True])
def test_saved_model_loads_in_sentence_transformers_with_the_same_embeddings(
    tmp_path: Path, pooler: str, with_head: bool
) -> None:
    st = pytest.importorskip("sentence_transformers")
    from conftest import make_tiny_encoder

    encoder = make_tiny_encoder(tmp_path / "tok", pooler=pooler)
    if with_head:
        encoder.head = MLPHead(encoder.dim)
    ours = encoder.encode(SENTENCES)
    encoder.save(tmp_path / "model")

    assert (tmp_path / "model" / "README.md").exists()  # the model card does not get in the way of loading
    theirs = st.SentenceTransformer(str(tmp_path / "model"), device="cpu").encode(SENTENCES)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999

    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert reloaded.pooler.name == pooler
    np.testing.assert_allclose(reloaded.encode(SENTENCES), ours, rtol=1e-5, atol=1e-6)


def test_loads_a_sentence_transformers_directory_with_its_pooling(tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from conftest import make_tiny_encoder

    tiny = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    tiny.backbone.save_pretrained(tmp_path / "hf")
    tiny.tokenizer.save_pretrained(tmp_path / "hf")
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer
    transformer = Transformer(str(tmp_path / "hf"))
    pooling = Pooling(encoder_dim := transformer.auto_model.config.hidden_size, pooling_mode="mean")
    assert encoder_dim == 32
    model = st.SentenceTransformer(modules=[transformer, pooling], device="cpu")
    model.save(str(tmp_path / "st"))

    loaded = SentenceEncoder.load(tmp_path / "st")
    assert loaded.pooler.name == "mean"
    np.testing.assert_allclose(loaded.encode(SENTENCES), model.encode(SENTENCES), rtol=1e-4, atol=1e-5)


def test_plain_transformers_checkpoint_defaults_to_cls(tmp_path: Path) -> None:
    from conftest import make_tiny_encoder

    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    encoder.backbone.save_pretrained(tmp_path / "hf")
    encoder.tokenizer.save_pretrained(tmp_path / "hf")
    assert SentenceEncoder.load(tmp_path / "hf").pooler.name == "cls"
    assert SentenceEncoder.load(tmp_path / "hf", pooler="mean").pooler.name == "mean"


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match="does not exist"):
        SentenceEncoder.load(tmp_path / "no-such-model")


def test_folder_without_a_model_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CsekitError, match="not a model directory"):
        SentenceEncoder.load(tmp_path / "empty")


@pytest.mark.parametrize("pooler", ["cls", "mean", "first_last_avg", "mask"])
@pytest.mark.parametrize("embedding_mask", [None, "tokens", "features"])
def test_length_groups_give_the_whole_batch_results_and_gradients(
    tiny_model_dir: Path, pooler: str, embedding_mask: str | None
) -> None:
    """Grouping rows by length changes only the padding computed: same pooled vectors, token states, gradients."""
    from conftest import WORDS

    from csekit.encoding.passes import EMBEDDING_MASK

    encoder = SentenceEncoder.load(tiny_model_dir, pooler=pooler, dropout=0.0).train()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for _ in range(21)]
    inputs = encoder.tokenize(sentences, max_length=40)
    batch, width = inputs["input_ids"].shape
    if embedding_mask == "tokens":  # ConSERT's token cutoff: [B, L, 1]
        inputs[EMBEDDING_MASK] = torch.from_numpy(rng.random((batch, width, 1)) > 0.2).float()
    elif embedding_mask == "features":  # feature cutoff: [B, 1, d]
        inputs[EMBEDDING_MASK] = torch.from_numpy(rng.random((batch, 1, encoder.dim)) > 0.2).float()
    assert inputs["attention_mask"].sum(dim=1).unique().numel() > 3  # rows of many lengths

    def run(group_size: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        encoder.zero_grad(set_to_none=True)
        output = encoder(inputs, plan=PassPlan(length_group_size=group_size))
        real = output.token_states * inputs["attention_mask"][..., None]
        (output.pooled.pow(2).sum() + real.pow(2).sum()).backward()
        grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
        return output.pooled.detach(), real.detach(), grads

    pooled, states, grads = run(0)
    grouped_pooled, grouped_states, grouped_grads = run(4)  # 6 groups, the last one short
    torch.testing.assert_close(grouped_pooled, pooled, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped_states, states, rtol=1e-5, atol=1e-5)
    assert grouped_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert encoder(inputs, plan=PassPlan(length_group_size=4)).token_states.shape == (
        batch,
        width,
        encoder.dim,
    )  # padding states: unspecified


def _mixed_length_inputs(encoder: SentenceEncoder, rows: int = 13) -> dict[str, torch.Tensor]:
    from conftest import WORDS

    rng = np.random.default_rng(1)
    sentences = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for _ in range(rows)]
    return encoder.tokenize(sentences, max_length=40)


def _last_layer_widths(encoder: SentenceEncoder) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """Positions the last layer's feed-forward sees, one entry a backbone pass."""
    widths: list[int] = []
    feed_forward = encoder.backbone.encoder.layer[-1].intermediate
    handle = feed_forward.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    return widths, handle


def test_length_groups_run_on_a_cpu_only(tiny_model_dir: Path) -> None:
    """On a GPU the batch is one backbone pass whatever `run.length_group_size` says: many small passes cost their
    launches and a host sync each (on an H100, BERT-base at batch 512 ran 9x slower in groups of 32 rows)."""
    from csekit.training.execution import decide_execution
    from csekit.training.recipe import load_recipe

    encoder = SentenceEncoder.load(tiny_model_dir, dropout=0.0).train()
    recipe = load_recipe(None, ["run.length_group_size=4", "run.packed=false"])
    plans = {kind: decide_execution(recipe, device_type=kind).pass_plan(encoder.backbone) for kind in ("cpu", "cuda")}
    assert plans["cpu"].length_group_size == 4 and plans["cuda"].length_group_size == 0
    inputs = _mixed_length_inputs(encoder)
    widths, handle = _last_layer_widths(encoder)
    encoder(inputs, plan=plans["cpu"])
    assert len(widths) == 4  # 13 rows in groups of 4
    widths.clear()
    encoder(inputs, plan=plans["cuda"])  # as a GPU runs it
    handle.remove()
    assert len(widths) == 1


@pytest.mark.parametrize("pooler", ["cls", "mask", "pooler_output"])
@pytest.mark.parametrize("group_size", [0, 4])
def test_a_pooled_only_pass_runs_less_of_the_last_layer_with_the_same_vectors_and_gradients(
    tiny_model_dir: Path, pooler: str, group_size: int
) -> None:
    """token_states=False: the last layer's feed-forward sees one position a row; nothing else changes."""
    from csekit.encoding.passes import EMBEDDING_MASK

    encoder = SentenceEncoder.load(tiny_model_dir, pooler=pooler, dropout=0.0).train()
    inputs = _mixed_length_inputs(encoder)
    batch, width = inputs["input_ids"].shape
    inputs[EMBEDDING_MASK] = (torch.rand(batch, width, 1, generator=torch.Generator().manual_seed(0)) > 0.2).float()
    weights = torch.randn(batch, encoder.dim, generator=torch.Generator().manual_seed(1))
    widths, handle = _last_layer_widths(encoder)

    def run(token_states: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
        encoder.zero_grad(set_to_none=True)
        widths.clear()
        output = encoder(inputs, token_states=token_states, plan=PassPlan(length_group_size=group_size))
        (output.pooled * weights).sum().backward()
        grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
        if not token_states:
            assert output.last_layer_states is None
            with pytest.raises(CsekitError, match="reads_token_states"):
                output.token_states  # noqa: B018
        return output.pooled.detach(), grads, list(widths)

    try:
        pooled, grads, full_widths = run(True)
        fast_pooled, fast_grads, fast_widths = run(False)
    finally:
        handle.remove()
    assert min(full_widths) > 1 and fast_widths == [1] * len(full_widths)
    torch.testing.assert_close(fast_pooled, pooled, rtol=1e-5, atol=1e-5)
    assert fast_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("pooler", ["mean", "first_last_avg"])
def test_poolers_that_read_every_position_keep_the_whole_last_layer(tiny_model_dir: Path, pooler: str) -> None:
    encoder = SentenceEncoder.load(tiny_model_dir, pooler=pooler, dropout=0.0).eval()
    inputs = _mixed_length_inputs(encoder)
    widths, handle = _last_layer_widths(encoder)
    try:
        with torch.no_grad():
            fast, full = encoder(inputs, token_states=False), encoder(inputs)
    finally:
        handle.remove()
    assert widths == [inputs["input_ids"].shape[1]] * 2
    assert fast.last_layer_states is not None
    torch.testing.assert_close(fast.pooled, full.pooled)


@pytest.mark.gpu_image
def test_gradient_checkpointing_keeps_the_whole_last_layer(tiny_model_dir: Path) -> None:
    """Checkpointing re-runs the layer in backward, after the pass's hook is gone: no shortcut then."""
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="cls", dropout=0.0).train()
    # transformers 5.x up to 5.17 (the GPU image's) has gradient_checkpointing_enable only; later 5.x renamed it
    # activation_checkpointing_enable and keep the old name as a deprecated alias.
    backbone = encoder.backbone
    getattr(backbone, "activation_checkpointing_enable", backbone.gradient_checkpointing_enable)()
    inputs = _mixed_length_inputs(encoder)
    widths, handle = _last_layer_widths(encoder)
    try:
        encoder(inputs, token_states=False).pooled.sum().backward()
    finally:
        handle.remove()
    assert widths and min(widths) == inputs["input_ids"].shape[1]
    assert all(p.grad is not None for p in encoder.backbone.encoder.parameters())


@pytest.mark.parametrize(
    ("model_type", "shortcut"), [("roberta", True), ("electra", True), ("deberta-v2", True), ("mpnet", False)]
)
def test_the_pooled_only_shortcut_finds_bert_style_layers_and_leaves_others_whole(
    tmp_path: Path, model_type: str, shortcut: bool
) -> None:
    """BERT-style layers (attention.output, then the feed-forward) take the shortcut; MPNet's layout runs whole."""
    from conftest import make_tiny_encoder

    encoder = make_tiny_encoder(tmp_path / "tokenizer", model_type=model_type).eval()
    inputs = _mixed_length_inputs(encoder)
    if model_type == "mpnet":
        inputs.pop("token_type_ids")
    widths, handle = _last_layer_widths(encoder)
    try:
        with torch.no_grad():
            full, fast = encoder(inputs), encoder(inputs, token_states=False)
    finally:
        handle.remove()
    assert widths[1] == (1 if shortcut else inputs["input_ids"].shape[1])
    torch.testing.assert_close(fast.pooled, full.pooled, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the backbone's own pooler layer
@pytest.mark.parametrize("token_states", [True, False])
@pytest.mark.parametrize("group_size", [0, 4])
def test_pooler_output_is_the_backbones_own_pooler_output(
    tiny_model_dir: Path, token_states: bool, group_size: int
) -> None:
    """transformers' `pooler_output` (BERT: tanh(dense([CLS]))), through the shortcut and length groups too."""
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="pooler_output", dropout=0.0).eval()
    inputs = _mixed_length_inputs(encoder)
    with torch.no_grad():
        pooled = encoder(inputs, token_states=token_states, plan=PassPlan(length_group_size=group_size)).pooled
        reference = encoder.backbone(**inputs, return_dict=True).pooler_output
        raw_cls = encoder.backbone(**inputs, return_dict=True).last_hidden_state[:, 0]
    torch.testing.assert_close(pooled, reference, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(pooled, raw_cls, atol=1e-3)  # the layer really ran


def test_pooler_output_trains_the_layer_other_poolers_leave_frozen(tiny_model_dir: Path) -> None:
    reading = SentenceEncoder.load(tiny_model_dir, pooler="pooler_output")
    assert all(p.requires_grad for p in reading.backbone.pooler.parameters())
    plain = SentenceEncoder.load(tiny_model_dir, pooler="cls")
    assert not any(p.requires_grad for p in plain.backbone.pooler.parameters())
    reading(reading.tokenize(SENTENCES), token_states=False).pooled.sum().backward()
    assert reading.backbone.pooler.dense.weight.grad is not None
    # The layer stays the backbone's: one state_dict entry, no copy under the pooler.
    assert not [key for key in reading.state_dict() if key.startswith("pooler.")]


@pytest.mark.parametrize("model_type", ["electra", "distilbert"])
def test_pooler_output_refuses_a_backbone_without_a_pooler_layer(tmp_path: Path, model_type: str) -> None:
    from conftest import make_tiny_encoder

    with pytest.raises(CsekitError, match=r"pooler_output pooler needs a backbone with a pooler layer.*has none"):
        make_tiny_encoder(tmp_path / "tok", pooler="pooler_output", model_type=model_type)


def test_pooler_output_refuses_a_checkpoint_whose_pooler_layer_is_random(tmp_path: Path) -> None:
    """A checkpoint saved without the layer (transformers initialises it at random) would pool through noise."""
    from conftest import make_tiny_encoder
    from transformers import BertModel

    tiny = make_tiny_encoder(tmp_path / "tok")
    BertModel(tiny.backbone.config, add_pooling_layer=False).save_pretrained(tmp_path / "no-pooler")
    tiny.tokenizer.save_pretrained(tmp_path / "no-pooler")
    with pytest.raises(
        CsekitError, match=r"no weights for the pooler layer \(pooler\.dense\.bias, pooler\.dense\.weight"
    ):
        SentenceEncoder.load(tmp_path / "no-pooler", pooler="pooler_output")
    assert SentenceEncoder.load(tmp_path / "no-pooler", pooler="cls").pooler.name == "cls"


def test_a_kept_head_that_cannot_fold_into_a_dense_layer_is_refused_before_anything_is_written(
    tmp_path: Path, tiny_encoder: SentenceEncoder
) -> None:
    """Only a DenseTanh or a head with `to_dense_tanh` (the ExportsAsDenseTanh hook) can be exported."""
    tiny_encoder.head = torch.nn.Identity()
    with pytest.raises(CsekitError, match="Identity head cannot be exported to sentence-transformers"):
        tiny_encoder.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_the_pass_options_are_named_never_positional(tiny_model_dir: Path) -> None:
    """`encoder(inputs, 32)` once meant groups of 32 rows; with the plan given by name it cannot silently mean
    `token_states=32` now."""
    encoder = SentenceEncoder.load(tiny_model_dir)
    inputs = encoder.tokenize(["a dog runs", "a cat sleeps on the mat"])
    with pytest.raises(TypeError):
        encoder(inputs, 4)
    assert encoder(inputs, token_states=False, plan=PassPlan(length_group_size=1)).last_layer_states is None
