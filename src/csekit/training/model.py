"""A recipe's parts assembled into one module whose forward pass computes one step's losses.

    sentences -> views (token ids for every view, stacked) -> encoder (one forward pass) -> pooler
      -> head -> StepState -> negative sources -> weighting -> objectives -> named loss parts

The training loop only calls `model(batch)` and back-propagates the total; it knows nothing of any
method. A method is a recipe naming parts from the tables below, or a user's own registered ones
(`csekit.register_part` or a `csekit.parts` entry point; see `csekit.core.registry`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.folder_pooling import AUTO_POOLER, choose_pooling
from csekit.encoding.hub import resolve_model_path
from csekit.encoding.model_folder import local_model_layout
from csekit.encoding.passes import ONE_PADDED_PASS, PassPlan, PlannedEncoder
from csekit.encoding.pooling import MaskPooler
from csekit.encoding.prompteol import check_demonstration
from csekit.encoding.representation import Reading
from csekit.parts.heads import HEADS
from csekit.parts.hooks import MakesViews, reads_token_states
from csekit.parts.negatives import NEGATIVES
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.step_state import StepState
from csekit.parts.views import VIEWS
from csekit.parts.weighting import WEIGHTINGS
from csekit.training.part_building import build_part
from csekit.training.recipe import Recipe
from csekit.training.recipe_values import part_specs


class ContrastiveModel(nn.Module):
    """The encoder, the training head and the recipe's parts; `forward` returns one step's losses."""

    def __init__(
        self,
        encoder: SentenceEncoder,
        head: nn.Module,
        num_views: int,
        objectives: list[tuple[nn.Module, float]],
        negatives: list[nn.Module] | None = None,
        weighting: nn.Module | None = None,
        plan: PassPlan = ONE_PADDED_PASS,
        head_at_test: bool = False,
    ) -> None:
        super().__init__()
        if not objectives:
            raise ValueError("a recipe needs at least one objective")
        self.encoder = encoder
        #: How training passes execute on this device (`csekit.encoding.passes`), for every pass of a step.
        self.plan = plan
        #: Whether the saved model keeps the training head (`model.head_at_test`; see `saved_encoder`).
        self.head_at_test = head_at_test
        self.head = head
        self.num_views = num_views
        self.negatives = nn.ModuleList(negatives or [])
        self.weighting = weighting
        self.objectives = nn.ModuleList([objective for objective, _ in objectives])
        self.objective_weights = [float(weight) for _, weight in objectives]
        parts = [head, weighting, *self.negatives, *self.objectives]
        #: Each part with the recipe key and name it came from (`objectives[1] (slt_fai_isf)`), set by `build_model`.
        self.part_names: list[tuple[str, object]] = []
        #: Whether some part reads the last layer's token states; if none does, the encoder computes the
        #: last layer only where the pooler reads it (see `SentenceEncoder.forward`).
        self.reads_token_states = any(reads_token_states(part) for part in parts)

    def training_encoder(self) -> PlannedEncoder:
        """The encoder as this step's passes call it: with the run's pass plan."""
        return PlannedEncoder(self.encoder, self.plan)

    def saved_encoder(self) -> SentenceEncoder:
        """The encoder as it is saved and evaluated: through the training head with `model.head_at_test`."""
        return self.encoder.with_head(self.head) if self.head_at_test else self.encoder

    def make_state(
        self,
        inputs: dict[str, Tensor],
        sentences: list[str],
        fields: dict[str, Any],
        step: int = 0,
        steps_per_epoch: int | None = None,
        encoder: Any = None,
    ) -> StepState:
        """Encode all views in one forward pass (through `encoder`, default the model's with its pass plan) and apply
        the head."""
        encoder = encoder if encoder is not None else self.training_encoder()
        output = encoder(inputs, token_states=self.reads_token_states)
        features = list(output.pooled.chunk(self.num_views))
        if isinstance(self.head, MakesViews):
            embeddings = self.head.forward_views(features)
        else:
            embeddings = list(self.head(output.pooled).chunk(self.num_views))
        return StepState(
            sentences,
            features,
            embeddings,
            output,
            encoder,
            head=self.head,
            fields=fields,
            step=step,
            steps_per_epoch=steps_per_epoch,
        )

    def forward(
        self,
        inputs: dict[str, Tensor],
        sentences: list[str],
        fields: dict[str, Any] | None = None,
        step: int = 0,
        steps_per_epoch: int | None = None,
        encoder: Any = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The weighted total loss and each named loss part (unweighted).

        `step` and `steps_per_epoch` (from the trainer) go into the `StepState` so that parts can
        schedule themselves, e.g. switch on after a warm-up; the loop itself knows no schedule.
        `encoder` stands in for the model's encoder in this step, for the step's every pass (the
        chunked step's `csekit.training.chunked.ChunkedEncoder`).
        """
        state = self.make_state(inputs, sentences, fields or {}, step, steps_per_epoch, encoder)
        for source in self.negatives:
            source(state)
        if self.weighting is not None:
            self.weighting(state)
        total: Tensor | None = None
        parts: dict[str, Tensor] = {}
        for objective, weight in zip(self.objectives, self.objective_weights, strict=True):
            for name, value in objective(state).items():
                parts[name] = value
                total = weight * value if total is None else total + weight * value
        assert total is not None
        return total, parts


def load_encoder(recipe: Recipe, weights_dtype: torch.dtype = torch.float32) -> SentenceEncoder:
    """The recipe's backbone and pooler, checked against the recipe before the run folder exists (not at the first
    batch): `model.max_length` fits the backbone, and a mask pooler's template leaves room for a sentence.
    `weights_dtype`: the backbone's stored weights (the run's `Execution.weights_dtype`)."""
    model = recipe.model
    reading = Reading(
        templates=None if model.templates is None else tuple(model.templates),
        template_positions=model.template_positions,
        test_bos=model.test_bos,
        demonstration=check_demonstration(model.demonstration, "recipe key model.demonstration"),
        sentence_end=model.sentence_end,
        test_template=model.test_template,
    )  # the recipe's representation, read once: the saved model and every evaluation read it whole
    encoder = SentenceEncoder.load(
        model.backbone,
        model.pooler,
        reading=reading,
        dropout=model.dropout,
        attention=model.attention,
        lora=model.lora,
        weights_dtype=weights_dtype,
    )
    if model.max_length > encoder.max_seq_length:
        raise CsekitError(
            f"recipe key model.max_length: {model.max_length} is more tokens than "
            f"{model.backbone} accepts ({encoder.max_seq_length})"
        )
    if isinstance(encoder.pooler, MaskPooler):
        try:
            encoder.pooler.check_room(encoder.tokenizer, encoder.max_seq_length)
        except CsekitError as error:
            raise CsekitError(f"recipe key model.templates: {error} ({model.backbone})") from None
    return encoder


def start_representation_warning(recipe: Recipe) -> str | None:
    """A warning when `model.pooler` names a pooler other than the backbone folder's own representation (csekit.json's
    pooler, or a sentence-transformers folder's Pooling and Normalize): the run starts from, scores at step 0 and
    keeps in best/ (while no step beats it) the backbone read another way, not the model as it encodes now.
    None for `auto`, a plain transformers model or a hub name (no own representation to differ from).

    Likewise when the start is scored through the training head (`model.head_at_test`, `train.dev_with_head`): the
    head is built new, so the start is the backbone through an untrained head, for any backbone."""
    dev_with_head = "train.dev_with_head" if recipe.train.dev_with_head else None
    through = "model.head_at_test" if recipe.model.head_at_test else dev_with_head
    head = recipe.model.head.get("name")
    if through and head != "none":
        kept = "and best/ while no step beats it, is" if recipe.model.head_at_test else "which a step must beat, is"
        return (
            f"csekit: warning: {through} scores the start through model.head {head}, built new: the start scored at "
            f"step 0, {kept} the backbone through an untrained head, not the backbone as it encodes now (compare "
            f"best/ with it: csekit evaluate {recipe.model.backbone})"
        )
    requested, location = recipe.model.pooler, Path(resolve_model_path(recipe.model.backbone))
    if requested == AUTO_POOLER or not location.is_dir():
        return None
    layout = local_model_layout(location)
    if not (layout.csekit_trained or layout.sentence_transformers):
        return None
    try:
        own = choose_pooling(None, str(location), layout)
    except CsekitError:  # modules csekit does not reproduce (a Dense module...): read as the transformer alone
        described = f"modules csekit does not train ({location / 'modules.json'})"
    else:
        if own.pooler == requested and not own.normalize:
            return None
        described = f"{own.pooler} pooling{', then Normalize' if own.normalize else ''} ({own.source})"
    return (
        f"csekit: warning: {recipe.model.backbone} encodes with {described}, and model.pooler {requested} reads it "
        "another way: the start scored at step 0, and best/ while no step beats it, is not the model as it encodes "
        "now (model.pooler: auto starts from and keeps its own)"
    )


def build_model(
    recipe: Recipe, encoder: SentenceEncoder, plan: PassPlan = ONE_PADDED_PASS
) -> tuple[ContrastiveModel, Callable[[list[str]], Any]]:
    """The model and the views function (run in the DataLoader) that a recipe describes; its training passes run
    as `plan` says (`csekit.training.execution` decides it for the run's device)."""
    # The build arguments a part may name (csekit.training.part_building.BUILD_CONTEXT): plain values.
    context: Mapping[str, Any] = {
        "dim": encoder.dim,
        "tokenizer": encoder.tokenizer,
        "pooler": encoder.pooler,
        "max_length": recipe.model.max_length,
        "encoder": encoder,
        "seed": recipe.train.seed,  # for parts that draw their own randomness (ConSERT's and ESimCSE's views)
        "batch_size": recipe.train.batch_size,  # the global batch (ESimCSE's queue, WhitenedCSE's check)
        "head_at_test": recipe.model.head_at_test,
        "recipe": recipe,  # deprecated: only for users' parts that still name it
    }
    views = build_part(VIEWS, recipe.data.views, "data.views", **context)
    context = {**context, "input_view_count": views.num_views}
    head = build_part(HEADS, recipe.model.head, "model.head", **context)
    context = {**context, "head": head}  # parts that copy or reuse the training head (ESimCSE's momentum encoder)
    negatives = [build_part(NEGATIVES, spec, f"negatives[{i}]", **context) for i, spec in enumerate(recipe.negatives)]
    weighting = build_part(WEIGHTINGS, recipe.weighting, "weighting", **context) if recipe.weighting else None
    objectives = [
        (build_part(OBJECTIVES, spec, f"objectives[{i}]", **context), spec.get("weight", 1.0))
        for i, spec in enumerate(recipe.objectives)
    ]
    positions = getattr(encoder.pooler, "template_positions", None)  # mask_denoised's, set when it is loaded
    if positions is not None and positions != recipe.model.template_positions:
        raise CsekitError(
            f"recipe key model.template_positions is {recipe.model.template_positions} but the encoder was loaded "
            f"with {positions}: load it with SentenceEncoder.load(..., reading=Reading(template_positions=...))"
        )
    model = ContrastiveModel(
        encoder, head, views.num_views, objectives, negatives, weighting, plan, recipe.model.head_at_test
    )
    built = [head, views, *negatives, *([weighting] if weighting is not None else []), *(o for o, _ in objectives)]
    model.part_names = [
        (f"{key} ({spec['name']})", part) for (key, spec), part in zip(part_specs(recipe), built, strict=True)
    ]
    return model, views
