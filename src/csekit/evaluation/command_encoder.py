"""An encoder and its encode function for a command: the one way `csekit evaluate`, `encode`, `probe`,
`diagnose` and `bench` read a model.

Loading, the warning about reading a trained model with another pooler, the precision for the device (with
auto's reason and the slow-bf16 warning, said before the slow work) and the encode call live here once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csekit.core.precision import resolve_precision, slow_bf16_warning
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.representation import Reading, Representation

Warn = Callable[[str], None]


def warn_on_stderr(message: str) -> None:
    """A warning line on stderr (where the commands say what is not their result)."""
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class CommandEncoder:
    """A loaded encoder with the precision chosen for its device; calling it encodes sentences."""

    encoder: SentenceEncoder
    precision: str  # the precision chosen (auto resolved)
    label: str  # how a command's last line names it: `fp32`, or `bf16 (auto: ...)`
    batch_size: int
    show_progress: bool = True

    @property
    def pooler(self) -> str:
        return self.encoder.pooler.name

    @property
    def representation(self) -> Representation:
        """The test-time representation the encoder reads (its sentence-end rule, test template, demonstration...)."""
        return self.encoder.representation

    def __call__(self, sentences: Sequence[str], progress_label: str = "encoding") -> np.ndarray:
        """The embeddings of `sentences`; the progress bar says `progress_label` (what is encoded)."""
        return self.encoder.encode(
            list(sentences),
            batch_size=self.batch_size,
            precision=self.precision,
            show_progress_bar=self.show_progress,
            progress_label=progress_label,
        )


def load_encoder(
    model: str | Path,
    pooler: str | None = None,
    *,
    warn: Warn | None = warn_on_stderr,
    reading: Reading | None = None,
) -> SentenceEncoder:
    """The model read with `pooler` and `reading` (None: its own); with `warn`, a csekit-trained model read with
    another pooler than its own is warned about (it gives embeddings the model never learnt)."""
    encoder = SentenceEncoder.load(model, pooler=pooler, reading=reading)
    trained, used = encoder.trained_pooler, encoder.pooler.name
    if warn is not None and trained is not None and trained != used:
        warn(
            f"csekit: warning: {model} was trained with the {trained} pooler; --pooler {used} reads another "
            f"representation, not the one it learnt (leave --pooler out to read {trained})"
        )
    return encoder


def encoding_with(
    encoder: SentenceEncoder,
    precision: str,
    batch_size: int,
    *,
    show_progress: bool = True,
    warn: Warn = warn_on_stderr,
    option: str = "--precision",
) -> CommandEncoder:
    """`encoder` with `precision` resolved for its device; an explicit bf16 on a CPU without native bf16 is
    warned about at once, before the slow work."""
    device = encoder.device
    chosen, reason = resolve_precision(precision, device)
    warning = slow_bf16_warning(chosen, device, option)
    if warning is not None:
        warn(warning)
    label = f"{chosen} (auto: {reason})" if precision == "auto" else chosen
    return CommandEncoder(encoder, chosen, label, batch_size, show_progress)


def command_encoder(
    model: str | Path,
    pooler: str | None,
    precision: str,
    batch_size: int,
    *,
    show_progress: bool = True,
    warn: Warn = warn_on_stderr,
    reading: Reading | None = None,
) -> CommandEncoder:
    """Load `model` (warning about a pooler it was not trained with) and choose its precision: what a command
    that encodes with one model needs. `reading` overrides how the model is read (None: its own; `Reading`)."""
    encoder = load_encoder(model, pooler, warn=warn, reading=reading)
    return encoding_with(encoder, precision, batch_size, show_progress=show_progress, warn=warn)
