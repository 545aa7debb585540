"""A raw masked-LM encoder made offline: the testbed with headroom (all-MiniLM-L6-v2 trained back to MLM only).

    PYTHONPATH=src python benchmarks/minilm_mlm_standin.py            # writes generators/minilm-mlm-standin

The papers measure each method from a raw masked-LM encoder (BERT-base: untrained STS averages of about 20-40,
SimCSE +30 or more). None installs offline; all-MiniLM-L6-v2, the one real encoder here, was trained
contrastively on about a billion pairs, so every method starts near its ceiling. This script undoes that: from
the shipped weights it re-initialises the top `--reinit-top-layers` transformer layers (4 of MiniLM's 6 by
default: BERT's initialiser; with 2, the [CLS] STS average stayed at 58.65, above raw BERT's) and
trains the whole model with BERT's masked-LM objective alone (transformers' `BertForMaskedLM` and
`DataCollatorForLanguageModeling`: 15% of tokens, 80/10/10), `--steps` batches of 64 sentences of at most 32
tokens from the data folder's text (its Wikipedia sample and the distinct unlabeled STS/SICK sentences), AdamW at
`--lr`, seeded. It prints and records (standin.json) the top-1 accuracy on the masked tokens of held-out sentences
and, with `--measure`, the untrained STS average with the `cls`, `mean` and `first_last_avg` poolers.

The folder (config, safetensors weights with the MLM head, the MiniLM tokenizer, standin.json) loads as a recipe's
`model.backbone`, in csekit and in sentence-transformers. It is made once and cached: a folder holding a
standin.json of the same settings is kept as it is. The training saves its state every `--save-every` steps
beside the folder (`<output>.training-state.pt`; on a 2-core CPU the 800 steps take about an hour alone): stopped,
the same command continues from it to the same weights. A stand-in, never BERT-base: numbers from it are
measurements of csekit's methods on an encoder with headroom, not paper reproductions.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from minilm_mlm_generator import TrainingState, train_masked_lm

from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError, message_line
from csekit.data.corpus import Corpus
from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.hub import resolve_model_path

CORPORA = ("corpus/wiki1m_for_simcse.head11913.txt", "corpus/sts_sick_unlabeled_sentences.txt")
DEFAULT_OUTPUT = "generators/minilm-mlm-standin"
MAX_LENGTH = 32
BATCH = 64
POOLERS = ("cls", "mean", "first_last_avg")
SETTINGS_FILE = "standin.json"
SETTINGS_LIMIT = 2**20
"""The largest standin.json read back (the stand-in writes a few hundred bytes)."""
STATE_SUFFIX = ".training-state.pt"
"""Beside the output folder until the stand-in is written: the training state a run started again continues from."""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help=f"the model folder (default {DEFAULT_OUTPUT})")
    parser.add_argument("--data-dir", default=None, help="the data folder (default: $CSEKIT_DATA)")
    parser.add_argument("--backbone", default="minilm-l6", help="the model to start from (a BERT folder or alias)")
    parser.add_argument("--corpus", action="append", help="a text file to train on instead of the data folder's")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--reinit-top-layers", type=int, default=4, help="top layers re-initialised before training")
    parser.add_argument("--held-out", type=int, default=2000, help="sentences kept out of training for accuracy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measure", action="store_true", help="score the untrained STS average of each pooler")
    parser.add_argument("--save-every", type=int, default=50, help="steps between saves of the training state")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What decides the stand-in's weights: a cached folder is reused only when these are equal."""
    keys = ("backbone", "corpus", "steps", "lr", "reinit_top_layers", "held_out", "seed")
    return {key: getattr(args, key) for key in keys} | {"batch": BATCH, "max_length": MAX_LENGTH}


def check_output(output: Path, settings: dict[str, Any]) -> bool:
    """True when `output` already holds this stand-in (cached); refuses, before any training, a folder that holds
    something else, a link, or a parent that cannot be written."""
    if output.is_symlink():
        raise CsekitError(f"{output} is a link; name a new folder")
    if output.exists():
        recorded = output / SETTINGS_FILE
        if recorded.is_file() and not recorded.is_symlink():
            try:  # bounded: a standin.json of gigabytes was read whole
                if read_json_file(recorded, "stand-in record", SETTINGS_LIMIT).get("settings") == settings:
                    return True
            except (CsekitError, AttributeError):
                pass
        raise CsekitError(f"{output} exists and holds no stand-in of these settings; name a new folder")
    parent = output.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    if not parent.is_dir():
        raise CsekitError(f"{parent} is not a folder")
    return False


def training_sentences(args: argparse.Namespace) -> list[str]:
    """The distinct sentences of the corpora, in a fixed shuffled order."""
    paths = [Path(p) for p in args.corpus] if args.corpus else [resolve_data_dir(args.data_dir) / c for c in CORPORA]
    sentences: set[str] = set()
    for path in paths:
        corpus = Corpus(path)
        sentences.update(corpus[i] for i in range(len(corpus)))
    ordered = sorted(sentences)
    random.Random(args.seed).shuffle(ordered)
    return ordered


def reinitialise_top_layers(model: Any, count: int) -> None:
    """BERT's initialiser on the top `count` transformer layers: what they learnt as a sentence model is gone."""
    layers = model.bert.encoder.layer
    if not 0 <= count <= len(layers):
        raise CsekitError(f"--reinit-top-layers must be 0 to {len(layers)}, not {count}")
    std = model.config.initializer_range
    with torch.no_grad():  # by hand: transformers' own initialiser skips modules loaded from a checkpoint
        for module in (m for layer in layers[len(layers) - count :] for m in layer.modules()):
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std)
                module.bias.zero_()
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()


def untrained_sts(folder: Path, data_dir: str | None) -> dict[str, float]:
    """The STS average (x100, SentEval's seven tasks) of the stand-in with each pooler, before any training."""
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.evaluation.sts import evaluate_sts

    scores = {}
    for pooler in POOLERS:
        encoder = SentenceEncoder.load(folder, pooler)
        scores[pooler] = round(100 * evaluate_sts(encoder.encode, data_dir)["avg"], 2)
        print(f"untrained STS average, {pooler} pooler: {scores[pooler]:.2f}", flush=True)
    return scores


def state_path(output: Path) -> Path:
    return output.with_name(output.name + STATE_SUFFIX)


def make_standin(args: argparse.Namespace) -> Path:
    from transformers import AutoTokenizer, BertForMaskedLM

    output, settings = Path(args.output), settings_of(args)
    if args.save_every < 1:
        raise CsekitError(f"--save-every must be a whole number of steps, at least 1, not {args.save_every}")
    if check_output(output, settings):
        print(f"{output} holds this stand-in already (cached): {SETTINGS_FILE} has its numbers")
        return output
    torch.manual_seed(args.seed)
    sentences = training_sentences(args)
    held_out, train = sentences[: args.held_out], sentences[args.held_out :]
    folder = resolve_model_path(args.backbone)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertForMaskedLM.from_pretrained(folder)  # the MLM head's transform starts random, its decoder tied
    reinitialise_top_layers(model, args.reinit_top_layers)
    progress = TrainingState(state_path(output), json.dumps(settings, sort_keys=True), args.save_every)
    before, after = train_masked_lm(model, tokenizer, train, held_out, args.steps, args.lr, progress)
    staging = output.with_name(output.name + ".partial")  # a leftover of an interrupted save is made again
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        raise CsekitError(f"{staging} is in the way (a link or a file); remove it")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    record: dict[str, Any] = {"settings": settings, "masked_accuracy": {"before": before, "after": after}}
    if args.measure:
        record["untrained_sts_avg"] = untrained_sts(staging, args.data_dir)
    (staging / SETTINGS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    staging.rename(output)  # whole or not at all
    progress.remove()
    print(f"wrote {output}")
    return output


def main(argv: list[str] | None = None) -> None:
    try:
        make_standin(parse_arguments(argv))
    except CsekitError as error:
        print(f"minilm_mlm_standin: {message_line(error)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the folder is renamed into place only at the end, so nothing half-made is left
        kept = state_path(Path(parse_arguments(argv).output))
        where = f"; the same command continues from the training state in {kept}" if kept.is_file() else ""
        print(f"minilm_mlm_standin: interrupted; no stand-in written{where}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
