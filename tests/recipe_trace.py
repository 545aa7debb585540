"""Fixed-seed loss traces of every shipped recipe on tiny models: a behaviour lock for refactors.

Each `recipes/*.yaml` is trained for `STEPS` steps on a tiny randomly initialised model of its
backbone's family and a tiny made-up corpus; the loss and every named loss part of every step (as
`metrics.jsonl` logs them with `train.log_every=1`) form the recipe's trace. A change that keeps
csekit's behaviour keeps every trace; `tests/invariants/test_recipe_losses.py` compares them with the ones in
`tests/data/recipe_losses.json`, which `benchmarks/recipe_loss_trace.py --write` records.

The recipes run as shipped (seed, lr, schedule, views, head, negatives, weighting, objectives, warm-ups)
except for what the tiny setup must change; `tiny_overrides` is the one place that says what that is.
Lives beside conftest.py because it builds its models with `make_tiny_encoder`.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from conftest import WORDS, make_tiny_encoder, make_tiny_mlm
from tiny_decoders import make_tiny_decoder

from csekit.core.errors import CsekitError
from csekit.core.precision import cpu_model_and_flags
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
RECORDED = REPO / "tests" / "data" / "recipe_losses.json"
RECORDED_ON = REPO / "tests" / "data" / "recipe_losses.machine"
"""The machines the traces were recorded on (see `machine_signature`): a first line naming the machine of
every trace, then one `recipe.yaml = signature` line per trace recorded on another (see `read_machines`)."""
RECORDED_PER_MACHINE = REPO / "tests" / "data" / "recipe_losses.per_machine.json"
"""The traces of the MACHINE_DEPENDENT recipes, one set per machine signature: {signature: {recipe: trace}}."""
RECORD_COMMAND = "python benchmarks/recipe_loss_trace.py --write"

CROSS_MACHINE_RTOL = 1e-4
"""How far a trace may move on another machine: the largest relative deviation of any other recipe between
an AVX2 CPU (Zen 3) and an AVX-512 one (Zen 4) was 4.5e-5 (combined-bert-base.yaml; most were under 3e-6)."""

MACHINE_DEPENDENT = {
    "whitenedcse-bert-base-pca.yaml": (
        "PCA whitening of one group of all 32 channels: its running covariance after a batch of 16 rows has one "
        "eigenvalue repeated over 16 or more dimensions, whose eigenvector basis is the solver's choice and "
        "reaches the loss through the head's linear layer; the traces of an AVX2 and an AVX-512 CPU part by "
        "23% in 20 steps"
    ),
}
"""Recipes whose trace depends on the machine beyond rounding (a discontinuity that rounding tips), with the
reason: each is recorded per machine signature (RECORDED_PER_MACHINE) and compared on a machine of a
recorded signature only. Every other recipe has one trace (RECORDED), compared on every machine within
CROSS_MACHINE_RTOL."""

STEPS = 20
BATCH_SIZE = 8
CORPUS_ROWS = 64
"""8 batches an epoch: the 20 steps cross two epoch boundaries (reshuffling), and every SLT-FAI warm-up
of the shipped recipes (0.01 to 0.5 epoch) ends inside them, so both sides of it are traced."""
TINY_WIDTH = 32
"""The tiny models' hidden size (conftest.make_tiny_encoder): Matryoshka's widths are scaled to it."""
TINY_GROUPS = 8
"""Whitening groups of 4 of the tiny model's 32 channels: estimable from a batch of 8 rows, like the
recipes' groups of 2 or 3 channels from a batch of 64."""

BACKBONE_SPREAD = 0.3
"""The tiny models' weight standard deviation (transformers' initializer_range). At the default 0.02 every
sentence's [CLS] vector is almost the same (cosines of 0.99+), so DCLR's weighting (phi 0.85 to 0.9) would
zero every in-batch negative and each loss would sit at log(batch); at 0.3 a batch's cosines spread."""
COMPLEMENTARY_SPREAD = {False: 0.2, True: 0.1}
"""DCLR's complementary model without and with its dropout on (weighting.dropout, the authors' code):
spreads at which its weighting zeroes some in-batch negatives of most steps but never all of them
(measured over the 20 steps: 0 to 50% of a step's negatives for BERT, 29 to 89% for RoBERTa, 4 to 71%
with dropout; at 0.3 the model with dropout zeroed none)."""

MODEL_TYPE_OF_BACKBONE = {
    "bert-base-uncased": "bert",
    "minilm-l6": "bert",
    "roberta-base": "roberta",
    "princeton-nlp/Sheared-LLaMA-1.3B": "llama",
    "mistralai/Mistral-7B-Instruct-v0.2": "mistral",
}
"""The transformers model type of the tiny stand-in for each backbone the shipped recipes name (decoder types:
tests/tiny_decoders.py's tiny decoder, initializer range 0.2)."""
DECODER_TYPES = ("llama", "mistral")

COMMON_OVERRIDES = (
    f"train.max_steps={STEPS}",
    f"train.batch_size={BATCH_SIZE}",
    "train.dev_task=none",
    "train.patience=null",  # early stopping counts dev evaluations, and there are none
    "train.precision=fp32",  # the recipes' auto would pick bf16 on a CPU that has it
    "train.log_every=1",
    "train.eval_every=0",
    "model.max_length=16",
)
"""Set for every recipe: length of the run, batch, no dev evaluation, fp32, a log record every step."""

METRICS_NOT_LOSSES = {"step", "lr", "sentences_per_second"}
"""Keys of a metrics.jsonl step record that are not the loss or a named loss part."""


@dataclass(frozen=True)
class TinyInputs:
    """The tiny stand-ins for the recipes' models, corpora and SLT-FAI token counts."""

    backbones: dict[str, Path]  # model type -> saved tiny model
    complementary: dict[tuple[str, bool], Path]  # (model type, dropout on) -> DCLR's complementary model
    text_corpus: Path
    osscse_corpus: Path  # .jsonl with text, paraphrase and negation, as `csekit augment` writes it
    counts: Path  # {token: count} over the tiny vocabulary
    generators: dict[str, Path]  # model type -> DiffCSE's MLM generator (a tiny masked LM of the tiny vocabulary)
    causal_lms: dict[str, Path]  # decoder type -> the tiny decoder with its LM head (MNTP predicts through it)


def make_tiny_inputs(folder: Path) -> TinyInputs:
    """Write tiny models (BERT and RoBERTa), both corpora and the counts under `folder`; deterministic."""

    def make_model(name: str, model_type: str, seed: int, spread: float) -> Path:
        path = folder / name
        encoder = make_tiny_encoder(
            folder / f"{name}-tokenizer", seed=seed, model_type=model_type, initializer_range=spread
        )
        encoder.save(path)
        return path

    backbones, complementary = {}, {}
    for model_type in DECODER_TYPES:  # no complementary model: DCLR's recipes are on BERT and RoBERTa
        encoder = make_tiny_decoder(model_type, seed=0)
        backbones[model_type] = folder / f"tiny-{model_type}"
        encoder.save(backbones[model_type])
    for model_type in sorted(set(MODEL_TYPE_OF_BACKBONE.values()) - set(DECODER_TYPES)):
        backbones[model_type] = make_model(f"tiny-{model_type}", model_type, 0, BACKBONE_SPREAD)
        for dropout, spread in COMPLEMENTARY_SPREAD.items():
            name = f"tiny-{model_type}-complementary{'-dropout' if dropout else ''}"
            complementary[model_type, dropout] = make_model(name, model_type, 1, spread)

    rng = random.Random(0)
    words = [word for word in WORDS if word.isalpha()]
    sentences = [" ".join(rng.choices(words, k=rng.randint(3, 8))) for _ in range(CORPUS_ROWS)]
    text_corpus = folder / "corpus.txt"
    text_corpus.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    osscse_corpus = folder / "corpus.osscse.jsonl"
    with open(osscse_corpus, "w", encoding="utf-8") as handle:
        for index, sentence in enumerate(sentences):
            split = sentence.split()
            paraphrase = None if index % 8 == 7 else " ".join(reversed(split))  # augment drops some: null
            negation = " ".join([split[0], "not", *split[1:]])
            handle.write(json.dumps({"text": sentence, "negation": negation, "paraphrase": paraphrase}) + "\n")

    vocabulary = make_tiny_encoder(folder / "tokenizer-counts").tokenizer.get_vocab()
    frequent = set(WORDS[::2])  # every other word is frequent; the rest and the word pieces are rare
    counts = {token: 1000 if token in frequent else 1 + index % 7 for token, index in vocabulary.items()}
    counts_path = folder / "counts.json"
    counts_path.write_text(json.dumps(counts), encoding="utf-8")
    generators = {
        model_type: make_tiny_mlm(folder / f"tiny-{model_type}-generator", 2, model_type, BACKBONE_SPREAD)
        for model_type in sorted(set(backbones) - set(DECODER_TYPES))  # DiffCSE's recipes are on BERT and RoBERTa
    }
    causal_lms = {
        model_type: _tiny_causal_lm(folder / f"tiny-{model_type}-lm", model_type) for model_type in DECODER_TYPES
    }
    return TinyInputs(backbones, complementary, text_corpus, osscse_corpus, counts_path, generators, causal_lms)


def _tiny_causal_lm(path: Path, model_type: str) -> Path:
    """The tiny decoder of `model_type` as a causal LM (its LM head untied, from the checkpoint) saved with its
    tokenizer: the MNTP recipes' stand-in (a saved csekit encoder has no LM head)."""
    from tiny_decoders import decoder_config, make_decoder_tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = make_decoder_tokenizer()
    config = decoder_config(model_type, len(tokenizer))
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_overrides(recipe: Recipe, tiny: TinyInputs) -> list[str]:
    """The `--set` overrides that run `recipe` on the tiny setup, by the kinds of part it names.

    Only paths and sizes change: no part is removed or replaced, and no option of a method is touched.
    """
    model_type = MODEL_TYPE_OF_BACKBONE.get(recipe.model.backbone)
    if model_type is None:
        raise CsekitError(
            f"recipe {recipe.name}: no tiny stand-in for backbone {recipe.model.backbone}; "
            "add its model type to MODEL_TYPE_OF_BACKBONE in tests/recipe_trace.py"
        )
    corpus = tiny.osscse_corpus if recipe.data.corpus.endswith(".jsonl") else tiny.text_corpus
    # MNTP predicts through the backbone's LM head, which only a causal-LM checkpoint has.
    mntp = any(objective.get("name") == "mntp" for objective in recipe.objectives)
    backbone = tiny.causal_lms[model_type] if mntp else tiny.backbones[model_type]
    overrides = [*COMMON_OVERRIDES, f"model.backbone={backbone}", f"data.corpus={corpus}"]
    head = recipe.model.head
    if head.get("name") == "whitening" and head.get("num_groups") is not None:
        overrides.append(f"model.head.num_groups={TINY_GROUPS}")  # the recipes' 384 or 128 do not divide 32
    weighting = recipe.weighting or {}
    if weighting.get("model", "self") != "self":
        # The MiniLM recipes weigh with their own backbone; the others with a second (SimCSE) model.
        if weighting["model"] == recipe.model.backbone:
            model = tiny.backbones[model_type]
        else:
            model = tiny.complementary[model_type, bool(weighting.get("dropout", False))]
        overrides.append(f"weighting.model={model}")
    for index, objective in enumerate(recipe.objectives):
        if "counts" in objective:
            overrides.append(f"objectives.{index}.counts={tiny.counts}")
        if "teachers" in objective:  # RankCSE: the backbone teaches as itself, any other teacher as a second model
            teachers = [
                tiny.backbones[model_type] if name == recipe.model.backbone else tiny.complementary[model_type, False]
                for name in objective["teachers"]
            ]
            overrides.append(f"objectives.{index}.teachers=[{', '.join(str(path) for path in teachers)}]")
        if "generator" in objective:  # DiffCSE: a tiny masked LM of the backbone's kind and vocabulary
            overrides.append(f"objectives.{index}.generator={tiny.generators[model_type]}")
        if "dims" in objective:  # Matryoshka's widths, scaled from the recipe's widest to the tiny model's
            dims = [max(1, int(d) * TINY_WIDTH // max(objective["dims"])) for d in objective["dims"]]
            overrides.append(f"objectives.{index}.dims=[{', '.join(str(d) for d in dims)}]")
    return overrides


def trace_recipe(recipe_path: Path, tiny: TinyInputs, output: Path) -> dict[str, list[float]]:
    """Train the recipe on the tiny setup into `output` and return each logged loss series by name."""
    recipe = load_recipe(recipe_path)
    recipe = load_recipe(recipe_path, tiny_overrides(recipe, tiny))
    train(recipe, output, show_progress=False)
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    steps = [record for record in records if "loss" in record]
    if [record["step"] for record in steps] != list(range(1, STEPS + 1)):
        raise CsekitError(f"{recipe_path.name}: expected a loss record for each of steps 1..{STEPS} in metrics.jsonl")
    names = [name for name in steps[0] if name not in METRICS_NOT_LOSSES]
    return {name: [float(record[name]) for record in steps] for name in names}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch on one thread for the block, then as before.

    The thread count is part of the fixed setup (a sum split over threads rounds differently), and a
    tiny model's operations are far too small to share: on the 2 busy cores of the development machine a
    recipe took 3 to 18 s with 2 threads and 0.7 s with one.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def trace_recipes(recipe_paths: Iterable[Path], folder: Path | None = None) -> dict[str, dict[str, list[float]]]:
    """The trace of each recipe, keyed by its file name; in `folder` (else a temporary one)."""
    with tempfile.TemporaryDirectory(prefix="recipe-trace-") as temporary, one_thread():
        root = Path(folder or temporary)
        tiny = make_tiny_inputs(root / "tiny")
        return {path.name: trace_recipe(path, tiny, root / "runs" / path.stem) for path in recipe_paths}


def shipped_recipes() -> list[Path]:
    return sorted(RECIPES.glob("*.yaml"))


def read_recorded(path: Path = RECORDED) -> dict[str, dict[str, list[float]]]:
    """The recorded traces (none when the file does not exist yet)."""
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def read_recorded_per_machine(path: Path = RECORDED_PER_MACHINE) -> dict[str, dict[str, dict[str, list[float]]]]:
    """The MACHINE_DEPENDENT recipes' traces by machine signature (none when the file does not exist yet)."""
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def format_traces_per_machine(traces: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """One `format_traces` block per machine signature, signatures in name order."""
    blocks = [
        f"  {json.dumps(signature)}: " + format_traces(traces[signature]).strip().replace("\n", "\n  ")
        for signature in sorted(traces)
    ]
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def record_per_machine(
    recorded: dict[str, dict[str, dict[str, list[float]]]], here: str, traces: dict[str, dict[str, list[float]]]
) -> tuple[dict[str, dict[str, dict[str, list[float]]]], list[str]]:
    """`recorded` with `traces` (of MACHINE_DEPENDENT recipes) as this machine's, and what went stale.

    A recipe whose new trace here differs from the one recorded here (beyond rounding) has changed its
    computation, so its traces on other machines are dropped, each named in the returned notes (record it
    there again); a first recording here leaves the other machines' as they are.
    """
    updated = {signature: dict(recipes) for signature, recipes in recorded.items()}
    notes = []
    for recipe_file, trace in traces.items():
        before = updated.get(here, {}).get(recipe_file)
        changed = before is not None and (
            set(before) != set(trace)
            or any(deviation(trace[name], before[name]) > CROSS_MACHINE_RTOL for name in trace)
        )
        for signature in sorted(updated):
            if changed and signature != here and updated[signature].pop(recipe_file, None) is not None:
                notes.append(f"{recipe_file}: its trace changed, so the one recorded on [{signature}] was dropped")
        updated.setdefault(here, {})[recipe_file] = trace
    return {signature: recipes for signature, recipes in updated.items() if recipes}, notes


def format_traces(traces: dict[str, dict[str, list[float]]]) -> str:
    """JSON with one line per series, recipes in name order; floats as Python writes them (exact round trip)."""
    blocks = []
    for recipe_file in sorted(traces):
        series = ",\n".join(
            f"    {json.dumps(name)}: {json.dumps(values)}" for name, values in traces[recipe_file].items()
        )
        blocks.append(f"  {json.dumps(recipe_file)}: {{\n{series}\n  }}")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def machine_signature() -> str:
    """What decides float rounding here: CPU model, its vector extensions and the PyTorch version.

    Another CPU (AVX2 against AVX-512) or PyTorch build rounds a matrix product differently; over 20
    steps that stays within the test's tolerance for smooth losses, but not where a result is
    discontinuous in its input (DCLR's threshold, the sign an eigensolver picks for PCA whitening).
    """
    cpu, flags = cpu_model_and_flags()
    vector = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if name in flags]
    return f"{cpu}; {' '.join(vector) or 'no AVX2'}; torch {torch.__version__}"


def read_machines(path: Path = RECORDED_ON) -> tuple[str, dict[str, str]]:
    """The machine of the traces in general and those of the recipes recorded elsewhere, by recipe file.

    Recording some recipes again on another machine (`--write recipes/x.yaml`) must not claim that the
    others were recorded there too, so their machine is noted per recipe.
    """
    if not path.exists():
        return "unknown", {}
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    default, per_recipe = (lines[0] if lines else "unknown"), {}
    for line in lines[1:]:
        recipe_file, separator, signature = line.partition(" = ")
        if not separator or not recipe_file.endswith(".yaml"):
            raise CsekitError(f"{path}: expected `recipe.yaml = machine signature`, got {line!r}")
        per_recipe[recipe_file] = signature
    return default, per_recipe


def recorded_machine(recipe_file: str, path: Path = RECORDED_ON) -> str:
    """The machine `recipe_file`'s trace was recorded on."""
    default, per_recipe = read_machines(path)
    return per_recipe.get(recipe_file, default)


def format_machines(default: str, per_recipe: dict[str, str]) -> str:
    """The machine file's text: the general machine, then each recipe recorded on another one."""
    lines = [default] + [
        f"{name} = {signature}" for name, signature in sorted(per_recipe.items()) if signature != default
    ]
    return "\n".join(lines) + "\n"


def deviation(actual: list[float], expected: list[float]) -> float:
    """The largest relative difference |a - e| / max(|e|, tiny) of two series (0.0 when equal)."""
    return max((abs(a - e) / max(abs(e), 1e-30) for a, e in zip(actual, expected, strict=True)), default=0.0)
