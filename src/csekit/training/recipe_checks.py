"""The checks of a recipe's values that its schema cannot express: ranges, choices, the parts and their options.

`csekit.training.recipe.load_recipe` runs them after the schema check, importing this module only then: the
parts' choices live with the code that builds them (the registries), which brings torch. The keys whose value is
one of a fixed list (precisions, optimizers, sync-free and compile modes, keep) read it from the schema
(`recipe_schema.KEY_CHOICES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from csekit.core.errors import CsekitError, did_you_mean
from csekit.core.numbers import is_finite_number
from csekit.encoding.folder_pooling import AUTO_POOLER, check_pooler_name
from csekit.encoding.pooling import POOLERS, MaskPooler, make_pooler
from csekit.encoding.prompteol import PromptEOLPooler, check_demonstration
from csekit.encoding.sentence_end import SENTENCE_ENDS
from csekit.encoding.whole_template import recipe_checks
from csekit.training.backbone_options import check_backbone_options
from csekit.training.dev_selection import check_dev_selection
from csekit.training.part_building import BUILD_CONTEXT, check_part_options
from csekit.training.recipe_bounds import check_option_bounds, check_schema_bounds, check_step_size
from csekit.training.recipe_schema import (
    KEY_CHOICES,
    TRACKER_FOLDER_OPTIONS,
    ModelConfig,
    Recipe,
    is_choice,
    spoken_choices,
    tracker_names,
)
from csekit.training.recipe_values import (
    MAX_WORKERS,
    check_corpus_fields,
    check_data,
    check_view_indices,
    recipe_parts,
)
from csekit.training.schedule import SCHEDULES, check_schedule_length


def _check_run(recipe: Recipe, where: Any) -> None:
    """The execution settings' ranges and choices, and the two that exclude each other."""
    run = recipe.run
    batch_size = recipe.train.batch_size
    checks = [
        (
            "run.chunk_size",
            run.chunk_size is None or 1 <= run.chunk_size <= batch_size,
            f"must be at least 1 and at most train.batch_size ({batch_size}), or null for one pass",
        ),
        ("run.sync_free", is_choice("run.sync_free", run.sync_free), f"must be {spoken_choices('run.sync_free')}"),
        ("run.compile", is_choice("run.compile", run.compile), f"must be one of {_listed('run.compile')}"),
        (
            "run.packed",
            isinstance(run.packed, bool) or run.packed == "auto",  # 1 == True: not a setting
            "must be auto, true or false",
        ),
        ("run.fused_qkv", isinstance(run.fused_qkv, bool) or run.fused_qkv == "auto", "must be auto, true or false"),
        (
            "run.compute_copies",
            isinstance(run.compute_copies, bool) or run.compute_copies == "auto",  # 1 == True: not a setting
            "must be auto, true or false",
        ),
        (
            "run.num_workers",
            run.num_workers == "auto" or type(run.num_workers) is int,  # its range: recipe_bounds
            f"must be from 0 (batches in the main process) to {MAX_WORKERS}, or auto",
        ),
        (
            "run.packed",
            run.packed is not True or run.compile in ("none", "auto") or run.packed_bucket > 0,
            "cannot be true with run.compile unless run.packed_bucket gives the packed pass fixed shapes (it would "
            "drive the layers one by one and never call the compiled forward); use auto or set run.packed_bucket",
        ),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")
    _check_report_to(run.report_to, where)


def _listed(key: str) -> str:
    """`key`'s choices (`recipe_schema.KEY_CHOICES`) as a list: "best, last"."""
    return ", ".join(KEY_CHOICES[key])


def validate_recipe(recipe: Recipe, where: Any = lambda key: "recipe") -> None:
    """Checks the schema cannot express: value ranges (`recipe_bounds`, every number) and choices."""
    train = recipe.train
    checks = [
        (
            "train.precision",
            is_choice("train.precision", train.precision),
            f"must be {spoken_choices('train.precision')}",
        ),
        (
            "train.optimizer",
            is_choice("train.optimizer", train.optimizer),
            f"must be one of {_listed('train.optimizer')}",
        ),
        ("objectives", len(recipe.objectives) >= 1, "must list at least one objective (e.g. - name: infonce)"),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")
    check_data(recipe.data, where)
    _check_run(recipe, where)  # before the bounds: its relations (a chunk within the batch) say more
    check_schema_bounds(recipe, where)
    _check_schedule_and_keep(train, where)
    check_dev_selection(train.dev_task, train.select_metric, train.patience, where)
    _check_dev_scoring(recipe, where)
    _check_templates(recipe.model, where)
    _check_demonstration(recipe.model, where)
    check_backbone_options(recipe.model, where)
    for index, spec in enumerate(recipe.objectives):
        weight = spec.get("weight", 1.0) if isinstance(spec, Mapping) else 1.0
        if not (is_finite_number(weight) and weight >= 0):
            key = f"objectives[{index}].weight"
            raise CsekitError(f"{where(key)}: recipe key {key} must be a number >= 0, got {weight!r}")
    # A mistyped part name, an option of the wrong type, a view or corpus field that cannot exist: reported here,
    # with the file and line, not when the model is built or at the first step.
    parts = recipe_parts(recipe, where)
    for key, factory, spec in parts:
        check_part_options(factory, spec, key, BUILD_CONTEXT, where)
    check_option_bounds(parts, where)
    check_step_size(recipe, parts, where)
    check_view_indices(parts, where)
    check_corpus_fields(parts, recipe.data.corpus, where)
    check_pooler_name(recipe.model.pooler, f"{where('model.pooler')}: recipe key model.pooler")


def _check_schedule_and_keep(train: Any, where: Any) -> None:
    """`train.schedule` and `train.keep` are choices; a schedule ends no earlier than `train.max_steps` (with epochs,
    when the corpus is read: `csekit.training.schedule.check_schedule_length`); patience needs `keep: best`."""
    checks = [
        ("train.schedule", train.schedule in SCHEDULES, f"must be one of {', '.join(SCHEDULES)}"),
        ("train.keep", is_choice("train.keep", train.keep), f"must be one of {_listed('train.keep')}"),
        (
            "train.patience",
            train.patience is None or train.keep == "best",
            "stops a run when select_metric stops improving, which train.keep: last does not select on; set "
            "patience: null, or keep: best",
        ),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")
    if train.max_steps is not None:
        try:
            check_schedule_length(train, train.max_steps)
        except CsekitError as error:
            raise CsekitError(f"{where('train.schedule_steps')}: {error}") from None


TEMPLATE_POSITIONS = ("row", "from_zero")
"""`model.template_positions` choices (see `csekit.encoding.pooling.DenoisedMaskPooler`)."""
DEV_PRECISIONS = ("fp32", "training")
"""`train.dev_precision` choices."""


def _check_dev_scoring(recipe: Recipe, where: Any) -> None:
    """The keys that score dev as an author's code did must fit the model they score."""
    model, train = recipe.model, recipe.train
    denoised = model.pooler == "mask_denoised"
    checks = [
        ("model.template_positions", model.template_positions in TEMPLATE_POSITIONS, "must be row or from_zero"),
        (
            "model.template_positions",
            model.template_positions == "row" or denoised,
            f"{model.template_positions} is for model.pooler mask_denoised (the template-alone pass), "
            f"not {model.pooler}",
        ),
        (
            "model.test_bos",
            model.test_bos or model.pooler == "mean_padded",
            f"false is for model.pooler mean_padded (its test-time mean), not {model.pooler}; the mean_text pooler "
            "leaves BOS out in training too",
        ),
        ("train.dev_precision", train.dev_precision in DEV_PRECISIONS, "must be fp32 or training"),
        ("model.sentence_end", model.sentence_end in SENTENCE_ENDS, f"must be one of {', '.join(SENTENCE_ENDS)}"),
        (
            "train.dev_denoise",
            not train.dev_denoise or denoised,
            f"needs model.pooler mask_denoised (not {model.pooler})",
        ),
        (
            "train.dev_with_head",
            not train.dev_with_head or model.head.get("name") != "none",
            "needs a training head (model.head is none)",
        ),
        (
            "train.dev_pooler_output",
            not train.dev_pooler_output or (model.pooler == "cls" and not train.dev_with_head),
            f"reads the [CLS] state through the backbone's pooler layer: it needs model.pooler cls (not "
            f"{model.pooler}) and no train.dev_with_head",
        ),
        *recipe_checks(model.pooler, model.test_template, train.dev_denoise and train.dev_test_template),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")


def _check_templates(model: ModelConfig, where: Any) -> None:
    """`model.templates` needs a prompt pooler, which must accept them (one [X] and one [MASK] each)."""
    if model.templates is None:
        return
    key = "model.templates"
    try:
        if model.pooler == AUTO_POOLER or not issubclass(POOLERS.get(model.pooler), MaskPooler):
            raise CsekitError(f"are for the prompt poolers (mask, mask_denoised), not model.pooler {model.pooler}")
        make_pooler(model.pooler, templates=model.templates)
    except CsekitError as error:
        raise CsekitError(f"{where(key)}: recipe key {key}: {error}") from None


def _check_demonstration(model: ModelConfig, where: Any) -> None:
    """`model.demonstration` is the prompteol pooler's, a sentence and a word its template can hold."""
    if model.demonstration is None:
        return
    key = "model.demonstration"
    if model.pooler != PromptEOLPooler.name:
        raise CsekitError(f"{where(key)}: recipe key {key} is for model.pooler prompteol, not {model.pooler}")
    check_demonstration(model.demonstration, f"{where(key)}: recipe key {key}")


def _check_report_to(report_to: str, where: Any) -> None:
    """`report_to` is none or a comma list of the trackers csekit can keep inside the run folder ("all" is refused)."""
    from accelerate.utils import LoggerType

    known = [tracker.value for tracker in LoggerType if tracker != LoggerType.ALL]
    choices = [name for name in known if name in TRACKER_FOLDER_OPTIONS]
    names = tracker_names(report_to)
    if not names and report_to.strip() != "none":
        raise CsekitError(f"{where('run.report_to')}: recipe key run.report_to is empty; use none or a tracker")
    for name in names:
        if name in known and name not in choices:
            raise CsekitError(
                f"{where('run.report_to')}: recipe key run.report_to: {name} writes its local files where its own "
                f"configuration says, outside the run folder; csekit keeps {', '.join(choices)} inside it"
            )
        if name not in choices:
            raise CsekitError(
                f'{where("run.report_to")}: recipe key run.report_to: unknown tracker "{name}"'
                f"{did_you_mean(name, choices)}; choose none or {', '.join(choices)}"
            )
