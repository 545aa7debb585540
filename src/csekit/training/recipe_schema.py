"""A recipe's sections as dataclasses (the schema OmegaConf checks a recipe against) and the choices of its keys.

Kept apart from the reading (`recipe.py`) and the checks of values (`recipe_checks.py`) so that reading a recipe,
and finding a mistyped key in it, imports nothing heavy: the checks that need the parts (and torch) come after.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass
class ModelConfig:
    backbone: str = "bert-base-uncased"
    pooler: str = "cls"  # or auto: a sentence-transformers backbone's own Pooling and Normalize (folder_pooling)
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
    # promptbert ('.' unless it ends in . ? " '), sncse (' .' unless it ends in punctuation) or prompteol (promptbert's,
    # then " made ' and a final ? a period), as their scripts did.
    sentence_end: str = "none"
    # The template (view 0's notation) whose whole text, the sentence in it, the saved model tokenises at test time
    # (csekit.encoding.whole_template: PromptBERT's, SNCSE's RoBERTa evaluation); none: the training ids.
    test_template: str = "none"
    # prompteol only (csekit.encoding.prompteol): PromptEOL's in-context demonstration before its template,
    # {sentence: ..., word: ...} (the authors' README rows: run_icl.sh's); null: the template alone.
    demonstration: dict[str, str] | None = None
    # mean_padded only (LLM2Vec's SimCSE training pooling, csekit.encoding.decoder_pooling): whether the test-time
    # mean counts the tokenizer's BOS. true: csekit's mean (sentence-transformers' too); false: the text tokens only,
    # as LLM2Vec's encode (saved as mean_text, which sentence-transformers cannot load).
    test_bos: bool = True


@dataclass
class DataConfig:
    # A path (relative: from the current folder, else the data folder; recorded absolute when a run starts, see
    # csekit.training.recipe_paths), or hf:NAME[:split] for a hub dataset.
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
    precision: str = "auto"  # PRECISIONS: auto (bf16 where the hardware runs it natively, else fp32), fp32, bf16, fp16
    seed: int = 42
    warmup_ratio: float = 0.0  # of the schedule's steps
    # The learning-rate schedule (csekit.training.schedule): linear (to 0 at its last step, after the warm-up;
    # SimCSE's, the HF Trainer's) or constant (after the warm-up; sentence-transformers' constantlr, TSDAE's guide).
    schedule: str = "linear"
    # The schedule's length in steps (null: the run's, max_steps or its epochs); at least the run's. A run that
    # stops early in a longer schedule, as LLM2Vec's 1,000 steps of a 3-epoch one, keeps rates near the start's.
    schedule_steps: int | None = None
    weight_decay: float = 0.0
    # OPTIMIZERS. adamw: torch's AdamW (eps 1e-8, bias-corrected, as the HF Trainer); adamw_uncorrected: eps 1e-6
    # and no bias correction, sentence-transformers 0.3's (ConSERT's and SLT-FAI's code), see training.optimization.
    optimizer: str = "adamw"
    max_grad_norm: float | None = 1.0  # the reference code trains with the HF Trainer's default clipping
    max_bad_steps: int = 20  # this many non-finite steps in a row stop the run
    # Dev tasks evaluated every eval_every steps, one or a list: sts (STS-B dev and SICK-R dev, and their mean
    # avg_sts, as SimCSE's and DCLR's code log them), stsb-dev, sick-dev, none, or your own files: pairs:PATH
    # and retrieval:PATH, or {pairs: PATH, columns: [q, d, score]} and {retrieval: DIR, split: dev}, read as
    # --pairs-columns and --split read them (csekit.training.dev_selection).
    dev_task: Any = "sts"
    # The dev score that picks the best checkpoint: stsb-dev, sick-dev, avg_sts, pairs:NAME/spearman, ...
    select_metric: str = "stsb-dev"
    # Stop after this many evaluations in a row without a better select_metric (null: never stop early).
    patience: int | None = None
    # Which evaluated model best/ holds (csekit.training.best_model): best (the highest select_metric, the starting
    # model included) or last (the last evaluated step's: what TSDAE's and LLM2Vec's code keep).
    keep: str = "best"
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
    # Rows the encoder holds activations for at a time (null: the whole batch): any batch trains in the memory of
    # a chunk, with the same loss and gradients, for a second encoder pass (csekit.training.chunked). Must divide
    # each process's share of train.batch_size.
    chunk_size: int | None = None
    # SYNC_FREE_CHOICES: between log points a step never waits for the device (csekit.training.sync_free); the
    # same weights; needs train.optimizer adamw and not train.precision fp16. auto: on for CUDA, off on a CPU.
    sync_free: str = "auto"
    # COMPILE_MODES: the training forward through torch.compile (csekit.training.compiled); auto: CUDA graphs on
    # CUDA for runs long enough to repay the compile. Not ConSERT's views.
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


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""`train.precision` choices, and the commands' `--precision`: auto (bf16 where the device runs it natively, else fp32)
or a precision `csekit.core.precision` computes in (its `DTYPES`)."""

OPTIMIZERS = ("adamw", "adamw_uncorrected")
"""`train.optimizer` choices (built by `csekit.training.optimization.make_optimizer`)."""

SYNC_FREE_CHOICES = ("auto", "true", "false")
"""`run.sync_free` choices, any case (YAML's `true` reads as "True"): auto (on where measured faster:
`csekit.training.execution`), true, false."""

COMPILE_MODES = ("none", "auto", "default", "reduce-overhead", "max-autotune")
"""`run.compile` choices: none, auto (`csekit.training.compiled.graphs_repay`), or a `torch.compile` mode."""

KEEPS = ("best", "last")
"""`train.keep` choices: the best-scoring evaluated model, or the last evaluated one (`csekit.training.best_model`)."""

KEY_CHOICES: dict[str, tuple[str, ...]] = {
    "train.precision": PRECISIONS,
    "train.optimizer": OPTIMIZERS,
    "train.keep": KEEPS,
    "run.sync_free": SYNC_FREE_CHOICES,
    "run.compile": COMPILE_MODES,
}
"""The recipe keys whose value is one of a list, with the list: what the checks accept (`recipe_checks`), the
commands' help and the docs name (tests/unit/training/test_choices.py)."""

ANY_CASE_KEYS = ("run.sync_free",)
"""Keys whose choices are taken in any case: a YAML `true` reaches the string key as "True"."""


def is_choice(key: str, value: object) -> bool:
    """Whether `value` is one of `key`'s choices (`KEY_CHOICES`; in any case for `ANY_CASE_KEYS`)."""
    if not isinstance(value, str):
        return False
    return (value.lower() if key in ANY_CASE_KEYS else value) in KEY_CHOICES[key]


def spoken_choices(key: str) -> str:
    """`key`'s choices as a sentence says them: "auto, true or false"."""
    *rest, last = KEY_CHOICES[key]
    return f"{', '.join(rest)} or {last}" if rest else last


MAX_SEED = 2**32 - 1
"""The largest seed every generator accepts (numpy's legacy seeding takes [0, 2**32 - 1])."""


def tracker_names(report_to: str) -> list[str]:
    """The trackers `run.report_to` names (none: an empty list)."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    return [] if names == ["none"] else names


TRACKER_FOLDER_OPTIONS: dict[str, str | None] = {"tensorboard": None, "aim": None, "wandb": "dir", "dvclive": "dir"}
"""The trackers csekit keeps inside the run folder (`OUTPUT/logs/<name>`), each with the option of its init that
places its local files there (None: accelerate's `logging_dir` does: TensorBoard's event files, Aim's repository).
accelerate's other trackers (comet_ml, mlflow, clearml, swanlab, trackio) keep local files where their own
configuration says (mlflow's `./mlruns`, trackio's cache), outside csekit's rules, and are refused."""
