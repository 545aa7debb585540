"""What mteb's `ModelMeta` says of a csekit model: measured on the loaded model, and read from its csekit.json.

mteb tells zero-shot results from the others by `ModelMeta.training_datasets` (MTEB task names). A model csekit
trained records its base model, corpus and dev task in csekit.json (`training`, written by the trainer); the corpus
and the dev splits are mapped here to the MTEB tasks made of the same sentences. A corpus or dev task with no MTEB
name is said so (`TrainingData.unnamed`), never guessed. The parameter count, embedding width and token limit are
the loaded model's own; the release date is the day the model was saved. A model mteb itself knows (the alias
`minilm-l6`, a hub name in mteb's registry) keeps mteb's facts about it, read offline.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.hub import ALIAS_HUB_NAMES, looks_like_hub_id, resolve_model_path
from csekit.encoding.model_folder import CSEKIT_CONFIG, read_json
from csekit.evaluation.tasks import TRAINING_DEV_TASKS

STS_SICK_TASKS = (
    "STS12",
    "STS13",
    "STS14",
    "STS15",
    "STS16",
    "STSBenchmark",
    "STSBenchmarkMultilingualSTS",  # its English subset is STS-B, its others STS-B translated
    "SICK-R",
)
"""The MTEB tasks made of SentEval's STS and SICK sentences (mteb adds their near copies: HUMESTS12, ...)."""
CORPUS_TASKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sts_sick_unlabeled", STS_SICK_TASKS),  # the 89,192 STS12-16, STS-B and SICK sentences (and their .jsonl)
    ("wiki1m", ()),  # SimCSE's English Wikipedia sentences: no MTEB task is made of them
)
"""A training corpus, known by the start of its file name, -> the MTEB tasks that hold its sentences."""
DEV_SPLIT_TASKS: Mapping[str, tuple[str, ...]] = {
    "stsb-dev": ("STSBenchmark", "STSBenchmarkMultilingualSTS"),
    "sick-dev": ("SICK-R",),
}
"""A dev split checkpoints were selected on (its gold scores seen) -> the MTEB tasks of that data set."""


@dataclass(frozen=True)
class TrainingData:
    """What a csekit run trained and selected on, in MTEB's names."""

    tasks: frozenset[str]  # the MTEB tasks whose data the run saw
    unnamed: tuple[str, ...]  # the corpus or dev tasks with no MTEB name: their overlap with MTEB is not known
    base_model: str
    saved_on: str


def corpus_tasks(corpus: str) -> tuple[str, ...] | None:
    """The MTEB tasks holding a corpus's sentences (none for wiki1m); None for a corpus csekit does not know."""
    name = corpus.replace("\\", "/").rsplit("/", 1)[-1]
    for prefix, tasks in CORPUS_TASKS:
        if name.startswith(prefix):
            return tasks
    return None


def training_data(facts: Mapping[str, Any]) -> TrainingData:
    """csekit.json's `training` facts in MTEB's names."""
    tasks: set[str] = set()
    unnamed: list[str] = []
    corpus = facts["corpus"]
    named = corpus_tasks(corpus)
    if named is None:
        unnamed.append(f"corpus {corpus}")
    else:
        tasks.update(named)
    dev = facts["dev_task"]
    for name in [dev] if isinstance(dev, str) else dev:
        for split in TRAINING_DEV_TASKS.get(name, () if name == "none" else (name,)):
            if split in DEV_SPLIT_TASKS:
                tasks.update(DEV_SPLIT_TASKS[split])
            else:
                unnamed.append(f"dev task {split}")
    return TrainingData(frozenset(tasks), tuple(unnamed), facts["base_model"], facts["saved_on"])


def read_training_facts(model: str | Path) -> dict[str, Any] | None:
    """csekit.json's `training` facts of a model folder a csekit run saved; None for any other model."""
    folder = Path(resolve_model_path(model))
    config = folder / CSEKIT_CONFIG
    if not folder.is_dir() or not config.exists():
        return None
    facts = read_json(config).get("training")
    if facts is None:
        return None
    dev = facts.get("dev_task") if isinstance(facts, dict) else None
    if not (
        isinstance(facts, dict)
        and all(isinstance(facts.get(key), str) for key in ("base_model", "corpus", "saved_on"))
        and (isinstance(dev, str) or (isinstance(dev, list) and all(isinstance(item, str) for item in dev)))
    ):
        raise CsekitError(
            f'{config}: "training" must give base_model, corpus and saved_on as text and dev_task as text or a list'
        )
    try:
        datetime.date.fromisoformat(facts["saved_on"])
    except ValueError:
        raise CsekitError(
            f'{config}: "training.saved_on" must be a date (YYYY-MM-DD), got {facts["saved_on"]!r}'
        ) from None
    return facts


def hub_name(model: str | Path | None) -> str | None:
    """How the hub (and mteb) names a model: an alias's model, a hub id as given; None for a local folder."""
    if model is None:
        return None
    text = str(model)
    if text in ALIAS_HUB_NAMES:
        return ALIAS_HUB_NAMES[text]
    return text if not Path(text).exists() and looks_like_hub_id(text) else None


def known_meta(name: str | None) -> Any:
    """mteb's own ModelMeta of a model in its registry (read offline), else None."""
    if name is None:
        return None
    import mteb

    try:
        return mteb.get_model_meta(name, fetch_from_hf=False)
    except (KeyError, ValueError):
        return None


def model_name(model: str | Path | None, hub: str | None) -> str:
    """The name results are filed under: `owner/name` as mteb asks; a run's `best`/`last` folder with its run."""
    if hub is not None:
        return hub if "/" in hub else f"csekit/{hub}"
    if model is None:
        return "csekit/in-memory"
    path = Path(str(model))
    label = f"{path.parent.name}-{path.name}" if path.name in ("best", "last") and path.parent.name else path.name
    return f"csekit/{label or str(model)}"


def model_facts(encoder: SentenceEncoder) -> dict[str, Any]:
    """What is measured on the loaded model: parameters (its kept head's too), embedding width, token limit."""
    return {
        "n_parameters": sum(parameter.numel() for parameter in encoder.parameters()),
        "n_embedding_parameters": encoder.backbone.get_input_embeddings().weight.numel(),
        "embed_dim": encoder.dim,
        "max_tokens": encoder.max_seq_length,
    }


KNOWN_FIELDS = ("license", "languages", "reference", "open_weights", "public_training_code", "public_training_data")
"""mteb's facts of a model it knows that stay true of it when csekit evaluates it as it is."""


def describe_model(encoder: SentenceEncoder, model: str | Path | None, revision: str | None = None) -> Any:
    """mteb's ModelMeta for `encoder`, loaded from `model` (a folder, alias or hub name; None: built in memory)."""
    from mteb.models import ModelMeta

    facts = read_training_facts(model) if model is not None else None
    hub = hub_name(model)
    known = known_meta(hub)
    fields: dict[str, Any] = {
        "name": model_name(model, hub),
        "revision": revision or "local",
        **model_facts(encoder),
        "similarity_fn_name": "cosine",
        "framework": ["PyTorch"],
        "use_instructions": False,
    }
    if facts is not None:
        data = training_data(facts)
        base = hub_name(data.base_model)
        fields |= {"release_date": data.saved_on, "training_datasets": set(data.tasks), "adapted_from": base}
    elif known is not None:
        fields |= {key: getattr(known, key) for key in (*KNOWN_FIELDS, "release_date", "training_datasets")}
        fields["adapted_from"] = known.adapted_from
    empty = ModelMeta.create_empty()
    return ModelMeta(**{**{key: getattr(empty, key) for key in type(empty).model_fields}, **fields})  # validated


def overlap(meta: Any, task_names: Sequence[str]) -> list[str] | None:
    """The tasks among `task_names` the model saw data of (mteb's similar tasks included); None when unknown."""
    seen = meta.get_training_datasets()
    return None if seen is None else sorted(set(task_names) & seen)
