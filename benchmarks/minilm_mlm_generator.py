"""An offline masked-LM generator for DiffCSE's controlled row: all-MiniLM-L6-v2 given an MLM head here.

    PYTHONPATH=src python benchmarks/minilm_mlm_generator.py --output generators/minilm-mlm

DiffCSE edits each sentence with a frozen masked-LM generator (DistilBERT in the paper). None installs offline and
all-MiniLM-L6-v2 has no MLM head, so the controlled suite (benchmarks/suites/controlled.yaml) cannot use the
paper's. This script makes a stand-in: transformers' `BertForMaskedLM` from the MiniLM weights (its prediction
head, tied to the word embeddings, starts untrained), trained with BERT's masking (transformers'
`DataCollatorForLanguageModeling`, 15%) on the unlabeled STS/SICK sentences of the data folder (the controlled
suite's corpus), all weights, `--steps` of 64 sentences of at most 32 tokens, AdamW at `--lr`. It prints the top-1
accuracy on the masked tokens of `--held-out` sentences kept out of training, before and after, and writes a
model folder (config, safetensors weights and the MiniLM tokenizer) that `objectives.N.generator` names.

A row trained with it is DiffCSE with a weaker, smaller generator than the paper's, on a fine-tuned sentence model:
a measurement of csekit's DiffCSE parts on MiniLM, never a paper reproduction.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from csekit.core.atomic import atomic_directory, refuse_unsafe_file, write_file
from csekit.core.bounded_read import read_with
from csekit.core.errors import CsekitError, message_line
from csekit.core.numbers import is_finite_number
from csekit.data.corpus import Corpus
from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.hub import resolve_model_path
from csekit.encoding.model_folder import refuse_non_finite
from csekit.training.state_checks import StateMismatch, check_state

CORPUS = "corpus/sts_sick_unlabeled_sentences.txt"
MAX_LENGTH = 32
BATCH = 64


@dataclass(frozen=True)
class TrainingState:
    """Where an MLM training run keeps its state between sittings (the stand-in takes about an hour of a 2-core
    CPU): one file of tensors and plain values, read with `torch.load(weights_only=True)` (no code runs), tagged
    with the settings it belongs to, written whole (a temporary file renamed over it) every `every` steps."""

    path: Path
    settings: str
    every: int = 50

    def save(self, model: Any, optimizer: torch.optim.Optimizer, step: int, before: float) -> None:
        state = {
            "settings": self.settings,
            "step": step,
            "before": before,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),  # the masking's draws go on as they would have
        }
        write_file(self.path, lambda handle: torch.save(state, handle))

    def resume(self, model: Any, optimizer: torch.optim.Optimizer, steps: int) -> tuple[int, float | None]:
        """The step to continue after and the held-out accuracy before training, the model, optimizer and random
        state restored; (0, None) when there is no state of these settings to continue."""
        refuse_unsafe_file(self.path)  # a link or a special file: refused, never followed
        if not self.path.exists():
            return 0, None
        try:
            state = read_with(
                self.path, lambda handle: torch.load(handle, map_location="cpu", weights_only=True), "training state"
            )
        except CsekitError:
            raise
        except pickle.UnpicklingError:  # torch's own text for this runs to several sentences
            raise CsekitError(
                f"{self.path} is damaged or not a training state (not tensors and plain values)"
            ) from None
        except Exception as error:  # any other failure to read it
            raise CsekitError(f"{self.path} is damaged or not a training state ({_first_line(error)})") from None
        if not isinstance(state, dict) or state.get("settings") != self.settings:
            print(f"{self.path} holds another run's training state: starting afresh", flush=True)
            return 0, None
        step, before = state.get("step"), state.get("before")
        if not (isinstance(step, int) and not isinstance(step, bool) and 0 < step < steps):
            raise CsekitError(f"{self.path}: step must be a whole number from 1 to {steps - 1}; remove it")
        if not (is_finite_number(before) and 0.0 <= before <= 1.0):
            raise CsekitError(f"{self.path}: before must be an accuracy from 0 to 1; remove it")
        try:
            check_state(state.get("optimizer"), optimizer)  # as a checkpoint's: a wrong shape or value never steps
        except StateMismatch as error:
            raise CsekitError(f"{self.path} does not fit this model ({str(error)[:200]}); remove it") from None
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
        except (KeyError, RuntimeError, ValueError, TypeError) as error:
            raise CsekitError(f"{self.path} does not fit this model ({_first_line(error)}); remove it") from None
        refuse_non_finite(str(self.path), model)
        return step, float(before)

    def remove(self) -> None:
        refuse_unsafe_file(self.path)
        self.path.unlink(missing_ok=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def masked_logits(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLM head's logits at the masked positions only, and their labels: `BertForMaskedLM`'s loss is the mean
    over those, and scoring all 30,522 tokens at every position would cost the step several times over."""
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    chosen = batch["labels"] != -100
    return model.cls(hidden[chosen]), batch["labels"][chosen]


def masked_accuracy(model: Any, batches: list[dict[str, torch.Tensor]]) -> float:
    """Top-1 accuracy on the masked positions of fixed, already masked batches."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in batches:
            logits, labels = masked_logits(model, batch)
            right += int((logits.argmax(-1) == labels).sum())
            total += len(labels)
    model.train()
    return right / max(total, 1)


def train_masked_lm(
    model: Any,
    tokenizer: Any,
    train: list[str],
    held_out: list[str],
    steps: int,
    lr: float,
    progress: TrainingState | None = None,
) -> tuple[float, float]:
    """`steps` batches of BERT's masking (15%, 80/10/10) over `train` in order, AdamW at `lr` on all weights; the
    masked-token top-1 accuracy on `held_out` before and after, printed as it goes (this script and the stand-in's).

    With `progress`, the training state is saved every `progress.every` steps and a run started again continues
    from it (a CPU run takes longer than one sitting), giving the weights an uninterrupted run gives."""
    from transformers import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")

    def batch_of(texts: list[str]) -> dict[str, torch.Tensor]:
        encoded = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)
        return collate([{key: encoded[key][i] for key in encoded} for i in range(len(texts))])

    evaluation = [batch_of(held_out[i : i + BATCH]) for i in range(0, len(held_out), BATCH)]
    print(f"{len(train):,} training and {len(held_out):,} held-out distinct sentences; {steps} steps of {BATCH}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    done, before = progress.resume(model, optimizer, steps) if progress is not None else (0, None)
    if before is None:
        before = masked_accuracy(model, evaluation)
    else:
        print(f"continuing after step {done} ({progress.path if progress else ''})", flush=True)
    print(f"masked-token top-1 accuracy before: {before:.3f}", flush=True)
    model.train()
    started = time.perf_counter()
    for step in range(done + 1, steps + 1):
        start = ((step - 1) * BATCH) % max(len(train) - BATCH, 1)
        logits, labels = masked_logits(model, batch_of(train[start : start + BATCH]))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps:
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
        if progress is not None and step % progress.every == 0 and step < steps:
            progress.save(model, optimizer, step, before)
    after = masked_accuracy(model, evaluation)
    print(f"masked-token top-1 accuracy after: {after:.3f}")
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="the model folder to write (must not exist)")
    parser.add_argument("--data-dir", default=None, help="the data folder (default: $CSEKIT_DATA)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--held-out", type=int, default=2000, help="sentences kept out of training for accuracy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    output = Path(args.output)
    try:
        check_output(output)  # before the training: a folder that cannot be written lost the work at the end
        corpus = Corpus(resolve_data_dir(args.data_dir) / CORPUS)
    except CsekitError as error:  # no data folder, or no corpus in it: one line, as csekit's commands say it
        print(f"minilm_mlm_generator: {message_line(error)}", file=sys.stderr)
        sys.exit(2)

    from transformers import AutoTokenizer, BertForMaskedLM

    torch.manual_seed(args.seed)
    sentences = sorted({corpus[i] for i in range(len(corpus))})  # distinct sentences, in a fixed order
    random.Random(args.seed).shuffle(sentences)
    held_out, train = sentences[: args.held_out], sentences[args.held_out :]
    folder = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertForMaskedLM.from_pretrained(folder)  # the MLM head's transform starts random, its decoder tied
    train_masked_lm(model, tokenizer, train, held_out, args.steps, args.lr)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(output) as folder:  # written whole or not at all; a link put at its name is refused
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    print(f"wrote {output}")


def check_output(output: Path) -> None:
    """Refuse an --output the model could not be written to, before any work: something at its name (a link, a
    dangling one too, a file or a folder), a file where a parent folder must be, a parent that cannot be written."""
    if os.path.lexists(output):
        kind = "a symbolic link" if output.is_symlink() else "a folder" if output.is_dir() else "a file"
        raise CsekitError(f"--output {output} exists ({kind}); name a new folder")
    existing = next(folder for folder in Path(os.path.abspath(output)).parents if os.path.lexists(folder))
    if not existing.is_dir():
        raise CsekitError(f"--output {output}: {existing} is not a folder, so the model cannot be written there")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CsekitError(f"--output {output}: the folder {existing} cannot be written")


if __name__ == "__main__":
    try:
        main()
    except CsekitError as error:  # the output folder could not be written after all (a link put there since)
        print(f"minilm_mlm_generator: {message_line(error)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the folder is written only at the end, so nothing half-made is left
        print("minilm_mlm_generator: interrupted; nothing written", file=sys.stderr)
        sys.exit(130)
