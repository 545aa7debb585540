"""Recipes: YAML files that compose a training run from named parts.

A recipe has six sections: `model` (backbone, pooler, head), `data` (corpus, views), `train`
(optimisation and selection), `negatives` and `weighting` (extra negative sources and how in-batch
negatives are weighted), `objectives` (loss terms with weights): what is learned; and `run` (`RunConfig`):
how this machine executes a step, decided in `csekit.training.execution`. The schema is a set of
dataclasses checked by OmegaConf; a wrong key or type is reported with the file, the line and the
closest valid key. Part options (everything beside `name` and `weight` in a part) are checked against the
part's constructor when the recipe is loaded (`csekit.training.part_building`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from csekit.core.bounded_read import parse_yaml_value, read_yaml_file
from csekit.core.errors import CsekitError, did_you_mean
from csekit.core.precision import PRECISIONS
from csekit.encoding.pooling import POOLERS, MaskPooler, make_pooler
from csekit.encoding.sentence_end import SENTENCE_ENDS
from csekit.encoding.whole_template import recipe_checks
from csekit.training.backbone_options import check_backbone_options
from csekit.training.compiled import COMPILE_MODES
from csekit.training.dev_selection import check_dev_selection
from csekit.training.part_building import BUILD_CONTEXT, check_part_options, yaml_text_number_hint
from csekit.training.recipe_values import (
    MAX_WORKERS,
    check_corpus_fields,
    check_data,
    check_view_indices,
    recipe_parts,
)
from csekit.training.sync_free import SYNC_FREE_CHOICES


@dataclass
class ModelConfig:
    backbone: str = "bert-base-uncased"
    pooler: str = "cls"
    max_length: int = 32
    dropout: float | None = None  # None keeps the backbone's own dropout (0.1 for BERT)
    head: dict[str, Any] = field(default_factory=lambda: {"name": "mlp"})
    head_at_test: bool = False
    # The prompt templates of the mask and mask_denoised poolers, one per view (view 0's is also the one
    # evaluation and the saved model use), each with one [X] (the sentence) and one [MASK] (the tokenizer's
    # mask token); null: the pooler's own. PromptBERT words them differently for RoBERTa.
    templates: list[str] | None = None
    # mask_denoised only: the positions of the template-alone pass. row: those the template has in the row
    # (the paper's "same positions"); from_zero: 0, 1, ... with the part after the sentence shifted by its
    # length, as PromptBERT's code numbers them (get_delta), which differs from row on RoBERTa only.
    template_positions: str = "row"
    # Decoder LLMs (csekit.encoding.decoder): causal (the model's own) or bidirectional (LLM2Vec's); null: as saved.
    attention: str | None = None
    # LoRA adapters through peft (csekit.encoding.lora): {r, alpha, dropout, target_modules}; only they train.
    lora: dict[str, Any] | None = None
    # The backbone's stored weights (csekit.training.backbone_options): fp32, bf16 (a LoRA run's frozen base), or auto.
    weights_dtype: str = "fp32"
    # How the saved model writes each sentence's end before evaluating (csekit.encoding.sentence_end): none,
    # promptbert ('.' unless it ends in . ? " ') or sncse (' .' unless it ends in punctuation), as their scripts did.
    sentence_end: str = "none"
    # The template (view 0's notation) whose whole text, the sentence in it, the saved model tokenises at test time
    # (csekit.encoding.whole_template: PromptBERT's, SNCSE's RoBERTa evaluation); none: the training ids.
    test_template: str = "none"


@dataclass
class DataConfig:
    corpus: str = "corpus/wiki1m_for_simcse.txt"
    views: dict[str, Any] = field(default_factory=lambda: {"name": "dropout"})
    max_chars: int = 10_000  # longer lines are input errors (or skipped with bad_lines: skip); at most 1,000,000
    bad_lines: str = "error"  # error | skip
    text_column: str = "text"  # for hub datasets and .jsonl corpora
    # Repeated sentences (csekit.data.duplicates): keep (as the corpus is), drop (the distinct sentences only,
    # each at its first occurrence) or separate (every copy, never two copies of a sentence in one batch).
    duplicates: str = "keep"
    # Compare sentences after lower-casing and removing surrounding whitespace and final punctuation.
    duplicates_normalise: bool = False


@dataclass
class TrainConfig:
    batch_size: int = 64
    lr: float = 3e-5
    epochs: int = 1
    max_steps: int | None = None  # when set, the run's length in steps (replaces epochs), as in transformers
    eval_every: int = 125
    log_every: int = 10
    precision: str = "auto"  # auto (bf16 where the hardware runs it natively, else fp32) | fp32 | bf16 | fp16
    seed: int = 42
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    # adamw: torch's AdamW (eps 1e-8, bias-corrected, as the HF Trainer); adamw_uncorrected: eps 1e-6 and no
    # bias correction, sentence-transformers 0.3's (ConSERT's and SLT-FAI's code), see training.optimization.
    optimizer: str = "adamw"
    max_grad_norm: float | None = 1.0  # the reference code trains with the HF Trainer's default clipping
    max_bad_steps: int = 20  # this many non-finite steps in a row stop the run
    # Dev tasks evaluated every eval_every steps, one or a list: sts (STS-B dev and SICK-R dev, and their mean
    # avg_sts, as SimCSE's and DCLR's code log them), stsb-dev, sick-dev, none, or your own files: pairs:PATH
    # and retrieval:PATH (csekit.training.dev_selection).
    dev_task: Any = "sts"
    # The dev score that picks the best checkpoint: stsb-dev, sick-dev, avg_sts, pairs:NAME/spearman, ...
    select_metric: str = "stsb-dev"
    # Stop after this many evaluations in a row without a better select_metric (null: never stop early).
    patience: int | None = None
    # How dev is scored during training, for selecting the checkpoint (the saved model is unchanged):
    # dev_with_head scores through the training head although model.head_at_test is false (MixCSE's code
    # selects that way); dev_denoise scores with mask_denoised's template denoising, in eval mode without
    # gradient (PromptBERT's code selects that way); dev_pooler_output scores the backbone's pooler layer on
    # [CLS] (transformers' pooler_output; DCLR's code selects that way); dev_precision: fp32 (the authors'
    # evaluation runs outside mixed precision) or training (the run's own precision).
    dev_with_head: bool = False
    dev_denoise: bool = False
    dev_pooler_output: bool = False
    dev_precision: str = "fp32"
    dev_sentence_end: bool = True  # dev written with model.sentence_end (SNCSE's dev script), or as given (false)
    dev_test_template: bool = True  # dev tokenised with model.test_template (SNCSE's), or with the training ids


@dataclass
class RunConfig:
    """How this machine executes a step; never what is learned beyond float rounding and the draw of dropout masks.

    Every `auto` is decided in one place, per device kind (`csekit.training.execution`); docs/performance.md
    names the figure behind each. A resumed run may change any of these without --allow-changes (the change
    is recorded in metrics.jsonl). Recipes older than this section gave them under model/data/train: they load
    as before, with one line naming the new keys (`LEGACY_RUN_KEYS`).
    """

    # Padding-free encoder passes (csekit.encoding.packed): every row's real tokens concatenated, attention within
    # rows; the same vectors and gradients as the padded pass (dropout masks are drawn in another shape). true |
    # false | auto: auto packs where it was measured faster (CPU training; CUDA in bf16/fp16 on Ampere or newer);
    # true refuses backbones it cannot run.
    packed: bool | str = "auto"
    # The packed pass's query, key and value as one product a layer (csekit.encoding.fused_qkv): auto | true |
    # false; auto fuses on CUDA, where it was measured faster, and not on a CPU, where it was not measured.
    fused_qkv: bool | str = "auto"
    # > 0: the packed pass's tokens padded to a multiple of this by rows of padding, so its shapes repeat across
    # steps and run.compile captures it (csekit.encoding.packed_fixed). 0 (off): it pays with a compile only.
    packed_bucket: int = 0
    # On a CPU, training passes run on groups of this many rows of similar token length, each padded only to its
    # own longest (0: one pass); the same loss and gradients up to float rounding. A GPU runs one pass.
    length_group_size: int = 32
    # On a CPU, dropout masks from 16 random bits an element and attention in plain ops (csekit.encoding.
    # fast_dropout): about 4x cheaper masks; the drop probability is rounded to 1/65536.
    fast_dropout: bool = True
    # Rows the encoder holds activations for at a time (null: the whole batch; csekit.training.chunked): the same
    # loss and gradients, for a second encoder pass. Must divide each process's share of train.batch_size.
    chunk_size: int | None = None
    # auto | true | false: between log points a step never waits for the device (csekit.training.sync_free); the
    # same weights; needs train.optimizer adamw and not train.precision fp16. auto: on for CUDA, off on a CPU.
    sync_free: str = "auto"
    # none | auto | default | reduce-overhead | max-autotune: the training forward through torch.compile (csekit.
    # training.compiled); auto: CUDA graphs on CUDA for runs long enough to repay the compile. Not ConSERT's views.
    compile: str = "auto"
    # DataLoader worker processes per training process; auto: none on a CPU, a few persistent ones on a GPU
    # (csekit.training.loading). The batches are the same with any number.
    num_workers: int | str = "auto"
    # On a CPU (Linux), glibc keeps freed memory for reuse (csekit.training.processes.keep_freed_memory).
    keep_freed_memory: bool = True
    # Sentences a dev evaluation encodes at a time.
    eval_batch_size: int = 128
    # Experiment trackers, through accelerate: none, or a comma list of tensorboard, aim, wandb, dvclive; their
    # files go under the run's logs/ folder.
    report_to: str = "none"
    # Recompute each layer's activations in backward instead of keeping them (transformers' gradient checkpointing,
    # non-reentrant): the same gradients, about a third more compute, far less activation memory (LLM2Vec's setting).
    gradient_checkpointing: bool = False
    # Half-precision copies of the linear weights for the step's products, refreshed after each optimizer step, fp32
    # masters beside them (csekit.training.compute_copies): auto | true | false; auto is off until measured on a GPU.
    compute_copies: bool | str = "auto"


@dataclass
class Recipe:
    name: str = "unnamed"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    negatives: list[dict[str, Any]] = field(default_factory=list)
    weighting: dict[str, Any] | None = None
    objectives: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "infonce", "temperature": 0.05}])
    run: RunConfig = field(default_factory=RunConfig)

    def to_yaml(self) -> str:
        return yaml.safe_dump(dataclasses.asdict(self), sort_keys=False)


RUN_SECTION = "run"
"""The recipe section of execution settings (`RunConfig`): compared on --resume never, recorded when changed."""

LEGACY_RUN_KEYS = {
    f"{section}.{key}": key
    for section, keys in {
        "model": ("packed", "length_group_size", "fast_dropout"),
        "data": ("num_workers",),
        "train": ("chunk_size", "sync_free", "compile", "keep_freed_memory", "eval_batch_size", "report_to"),
    }.items()
    for key in keys
}
"""Where recipes before the `run:` section gave each execution setting: read as `run.<key>`, with one line."""

OPTIMIZERS = ("adamw", "adamw_uncorrected")
"""`train.optimizer` choices (built by `csekit.training.optimization.make_optimizer`)."""

MAX_SEED = 2**32 - 1
"""The largest seed every generator accepts (numpy's legacy seeding takes [0, 2**32 - 1])."""


def _key_lines(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Map each dotted key of a YAML document to its 1-based line number."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, key + "."))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = f"{prefix.rstrip('.')}[{index}]"
            lines[key] = item.start_mark.line + 1
            lines.update(_key_lines(item, key + "."))
    return lines


def _check_keys(values: Mapping[str, Any], schema: type, prefix: str, where: Any) -> None:
    """Reject keys the schema does not have, naming the closest valid key."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise CsekitError(f'{where(dotted)}: unknown recipe key "{dotted}"{did_you_mean(key, fields, prefix)}')
        nested = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(nested) and isinstance(value, Mapping):
            _check_keys(value, nested, dotted + ".", where)


def _apply_override(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` in the resolved recipe `tree`; a number picks a list item (`objectives.0.weight`).

    Setting a part's `name` to another part replaces the whole part spec, since the old part's options
    would not fit the new one (`--set model.head.name=none`).
    """
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise CsekitError(f"--set {key}: {'.'.join(parts[:depth])} has {len(node)} items; no item {part}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                if part == "name" and node is not tree and node.get("name") != value:
                    node.clear()
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                elif not isinstance(node[part], dict | list):
                    raise CsekitError(f"--set {key}: {'.'.join(parts[: depth + 1])} is a value, not a section")
                node = node[part]


def _parse_override(item: str) -> tuple[str, Any]:
    """`"train.batch_size=32"` -> ("train.batch_size", 32); the value is parsed as YAML."""
    if "=" not in item:
        raise CsekitError(f'--set "{item}": expected dotted.key=value')
    key, raw = item.split("=", 1)
    value = parse_yaml_value(raw, f"--set {key.strip()}") if raw.strip() else None
    return key.strip(), value


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turn `["train.batch_size=32", ...]` into a nested dict (for checking keys against the schema)."""
    result: dict[str, Any] = {}
    for item in overrides:
        key, value = _parse_override(item)
        target = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):  # only keys matter here: a list or value above is not walked
                child = target[part] = {}
            target = child
        target[parts[-1]] = value
    return result


def _move_legacy_run_keys(raw: dict[str, Any], lines: dict[str, int], label: str) -> list[str]:
    """Move execution settings a recipe gives under model/data/train (before `run:`) into `run`; the keys moved.

    Their lines follow them, so an error in one still names the line it is on.
    """
    moved = []
    for legacy, key in LEGACY_RUN_KEYS.items():
        section = raw.get(legacy.split(".")[0])
        if not isinstance(section, dict) or key not in section:
            continue
        run = raw.setdefault(RUN_SECTION, {})
        if not isinstance(run, dict):
            break  # a run: that is no mapping is reported by the schema check
        if key in run:
            where = f"{label}:{lines[legacy]}" if legacy in lines else label
            raise CsekitError(f"{where}: recipe key {legacy} is given again as {RUN_SECTION}.{key}; keep the run: one")
        run[key] = section.pop(key)
        if legacy in lines:
            lines[f"{RUN_SECTION}.{key}"] = lines[legacy]
        moved.append(legacy)
    return moved


def _legacy_override(item: str, moved: list[str]) -> str:
    """`--set model.packed=true` as `run.packed=true` (an execution setting's old place), noted in `moved`."""
    key, equals, value = item.partition("=")
    new_key = LEGACY_RUN_KEYS.get(key.strip())
    if new_key is None:
        return item
    moved.append(key.strip())
    return f"{RUN_SECTION}.{new_key}{equals}{value}"


def load_recipe(path: str | Path | None, overrides: Sequence[str] = (), *, note_legacy_keys: bool = True) -> Recipe:
    """Read a recipe file (or the defaults when `path` is None) and apply `--set` overrides.

    Execution settings written where recipes before the `run:` section had them are read into `run`, with one
    line on stderr naming the new keys (none with `note_legacy_keys` False: a saved run's recipe read to compare).
    """
    raw: dict[str, Any] = {}
    lines: dict[str, int] = {}
    label = "recipe"
    if path is not None:
        path = Path(path)
        label = str(path)
        loaded, node = read_yaml_file(path, "recipe")
        if loaded is None:
            raise CsekitError(f"recipe {path} is empty: a recipe gives at least the model and the corpus")
        if not isinstance(loaded, dict):
            raise CsekitError(f"{path}: a recipe must be a mapping of sections (model, data, train, ...)")
        raw, lines = loaded, _key_lines(node) if node is not None else {}
    moved = _move_legacy_run_keys(raw, lines, label)
    overrides = [_legacy_override(item, moved) for item in overrides]
    if moved and note_legacy_keys:
        renamed = ", ".join(f"{key} as {RUN_SECTION}.{LEGACY_RUN_KEYS[key]}" for key in dict.fromkeys(moved))
        print(f"csekit: {label}: execution settings now live in the run: section; read {renamed}", file=sys.stderr)

    update = parse_overrides(overrides)
    overridden = {item.split("=", 1)[0].strip() for item in overrides}

    def where_in_file(key: str) -> str:
        if any(key == o or key.startswith((o + ".", o + "[")) for o in overridden):
            return f"--set {key}"
        line = lines.get(key)
        return f"{label}:{line}" if line else label

    _check_keys(raw, Recipe, "", where_in_file)
    _check_keys(update, Recipe, "", lambda key: f"--set {key}")
    try:
        resolved = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Recipe), raw))
        assert isinstance(resolved, dict)
        for item in overrides:
            _apply_override(resolved, *_parse_override(item))
        recipe: Recipe = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Recipe), resolved))  # type: ignore[assignment]
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        message = yaml_text_number_hint(getattr(error, "value", None)) or str(error).splitlines()[0]
        raise CsekitError(f"{where_in_file(key)}: recipe key {key}: {message}") from None
    validate_recipe(recipe, where_in_file)
    return recipe


def _check_run(recipe: Recipe, where: Any) -> None:
    """The execution settings' ranges and choices, and the two that exclude each other."""
    run = recipe.run
    batch_size = recipe.train.batch_size
    checks = [
        ("run.eval_batch_size", run.eval_batch_size >= 1, "must be at least 1"),
        (
            "run.chunk_size",
            run.chunk_size is None or 1 <= run.chunk_size <= batch_size,
            f"must be at least 1 and at most train.batch_size ({batch_size}), or null for one pass",
        ),
        ("run.sync_free", run.sync_free.lower() in SYNC_FREE_CHOICES, "must be auto, true or false"),
        ("run.compile", run.compile in COMPILE_MODES, f"must be one of {', '.join(COMPILE_MODES)}"),
        ("run.length_group_size", run.length_group_size >= 0, "must be 0 (off) or a positive size"),
        (
            "run.packed",
            isinstance(run.packed, bool) or run.packed == "auto",  # 1 == True: not a setting
            "must be auto, true or false",
        ),
        ("run.fused_qkv", isinstance(run.fused_qkv, bool) or run.fused_qkv == "auto", "must be auto, true or false"),
        ("run.compute_copies", run.compute_copies in ("auto", True, False), "must be auto, true or false"),
        (
            "run.num_workers",
            run.num_workers == "auto" or (type(run.num_workers) is int and 0 <= run.num_workers <= MAX_WORKERS),
            f"must be from 0 (batches in the main process) to {MAX_WORKERS}, or auto",
        ),
        ("run.packed_bucket", run.packed_bucket >= 0, "must be 0 (off) or a number of tokens"),
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


def validate_recipe(recipe: Recipe, where: Any = lambda key: "recipe") -> None:
    """Checks the schema cannot express: value ranges and choices."""
    train = recipe.train
    seed_range = f"must be in [0, {MAX_SEED}] (numpy's seed range)"
    checks = [
        ("train.batch_size", train.batch_size >= 2, "must be at least 2 (contrastive learning needs negatives)"),
        ("train.lr", math.isfinite(train.lr) and train.lr > 0, "must be a positive number"),
        ("train.epochs", train.epochs >= 1, "must be at least 1"),
        ("train.max_steps", train.max_steps is None or train.max_steps >= 1, "must be at least 1"),
        ("train.eval_every", train.eval_every >= 0, "must be >= 0 (0 evaluates only at the end)"),
        ("train.log_every", train.log_every >= 1, "must be at least 1"),
        ("train.max_bad_steps", train.max_bad_steps >= 1, "must be at least 1"),
        ("train.precision", train.precision in PRECISIONS, "must be auto, fp32, bf16 or fp16"),
        ("train.optimizer", train.optimizer in OPTIMIZERS, f"must be one of {', '.join(OPTIMIZERS)}"),
        ("train.warmup_ratio", 0 <= train.warmup_ratio < 1, "must be in [0, 1)"),
        ("train.weight_decay", math.isfinite(train.weight_decay) and train.weight_decay >= 0, "must be >= 0"),
        (
            "train.max_grad_norm",
            train.max_grad_norm is None or train.max_grad_norm > 0,
            "must be positive (the gradient norm is clipped to it), or null for no clipping",
        ),
        (
            "train.patience",
            train.patience is None or train.patience >= 1,
            "must be at least 1 (evaluations without improvement), or null for no early stopping",
        ),
        ("train.seed", 0 <= train.seed <= MAX_SEED, seed_range),
        ("model.max_length", recipe.model.max_length >= 4, "must be at least 4"),
        (
            "model.dropout",
            recipe.model.dropout is None or 0 <= recipe.model.dropout < 1,
            "must be in [0, 1), or null for the backbone's own",
        ),
        ("objectives", len(recipe.objectives) >= 1, "must list at least one objective (e.g. - name: infonce)"),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")
    check_data(recipe.data, where)
    _check_run(recipe, where)
    check_dev_selection(train.dev_task, train.select_metric, train.patience, where)
    _check_dev_scoring(recipe, where)
    _check_templates(recipe.model, where)
    check_backbone_options(recipe.model, where)
    for index, spec in enumerate(recipe.objectives):
        weight = spec.get("weight", 1.0) if isinstance(spec, Mapping) else 1.0
        number = isinstance(weight, int | float) and not isinstance(weight, bool)
        if not (number and math.isfinite(weight) and weight >= 0):
            key = f"objectives[{index}].weight"
            raise CsekitError(f"{where(key)}: recipe key {key} must be a number >= 0, got {weight!r}")
    # A mistyped part name, an option of the wrong type, a view or corpus field that cannot exist: reported here,
    # with the file and line, not when the model is built or at the first step.
    parts = recipe_parts(recipe, where)
    for key, factory, spec in parts:
        check_part_options(factory, spec, key, BUILD_CONTEXT, where)
    check_view_indices(parts, where)
    check_corpus_fields(parts, recipe.data.corpus, where)
    POOLERS.get(recipe.model.pooler, f"{where('model.pooler')}: recipe key model.pooler")


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
        if not issubclass(POOLERS.get(model.pooler), MaskPooler):
            raise CsekitError(f"are for the prompt poolers (mask, mask_denoised), not model.pooler {model.pooler}")
        make_pooler(model.pooler, templates=model.templates)
    except CsekitError as error:
        raise CsekitError(f"{where(key)}: recipe key {key}: {error}") from None


def tracker_names(report_to: str) -> list[str]:
    """The trackers `run.report_to` names (none: an empty list)."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    return [] if names == ["none"] else names


TRACKER_FOLDER_OPTIONS: dict[str, str | None] = {"tensorboard": None, "aim": None, "wandb": "dir", "dvclive": "dir"}
"""The trackers csekit keeps inside the run folder (`OUTPUT/logs/<name>`), each with the option of its init that
places its local files there (None: accelerate's `logging_dir` does: TensorBoard's event files, Aim's repository).
accelerate's other trackers (comet_ml, mlflow, clearml, swanlab, trackio) keep local files where their own
configuration says (mlflow's `./mlruns`, trackio's cache), outside csekit's rules, and are refused."""


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


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a resolved recipe (`objectives[0].temperature`) and their values."""
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat or {prefix: {}}
    if isinstance(value, list) and value:
        flat = {}
        for index, item in enumerate(value):
            flat.update(_flatten(item, f"{prefix}[{index}]"))
        return flat
    return {prefix: value}


def recipe_changes(old: Recipe, new: Recipe) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs between two resolved recipes: {key: (old, new)} (None: absent)."""
    before, after = _flatten(dataclasses.asdict(old)), _flatten(dataclasses.asdict(new))
    return {
        key: (before.get(key), after.get(key))
        for key in [*before, *(k for k in after if k not in before)]
        if before.get(key) != after.get(key) or (key in before) != (key in after)
    }
