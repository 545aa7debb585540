"""`csekit diagnose`'s work over several models: all loaded first, then one encoding pass each."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import typer

from csekit.commands.options import warn

if TYPE_CHECKING:
    from csekit.evaluation.diagnose import DiagnoseData, DiagnoseSettings


def diagnose_models(
    models: list[str],
    pooler: str | None,
    data: DiagnoseData,
    settings: DiagnoseSettings,
    counts: dict[str, int],
    counts_source: str,
    complementary: str | None,
    precision: str,
    batch_size: int,
) -> dict[str, dict[str, Any]]:
    """Every model (and frequency labels) loaded first, so a bad one fails before any encoding; then one pass
    per model, and one of a distinct complementary model shared by them all. Every model is read with `pooler`
    (None: each its own)."""
    from csekit.encoding.token_input import token_ids
    from csekit.evaluation.cache import EmbeddingCache
    from csekit.evaluation.command_encoder import command_encoder, encoding_with, load_encoder
    from csekit.evaluation.diagnose import diagnose as diagnose_model
    from csekit.prep.frequency import frequency_labels

    encoders = {name: load_encoder(name, pooler, warn=None) for name in models}
    poolers = {name: encoder.pooler.name for name, encoder in encoders.items()}
    if len(set(poolers.values())) > 1:
        read_as = ", ".join(f"{name} with {used}" for name, used in poolers.items())
        warn(
            f"csekit: warning: the models are read with different poolers ({read_as}), so their numbers "
            "compare two representations, not before and after; pass --pooler to read them all the same way"
        )
    labels = {
        name: frequency_labels(counts, encoder.tokenizer, source=f"--counts {counts_source}")
        for name, encoder in encoders.items()
    }
    judge = None
    if complementary is not None and complementary not in encoders:
        judge = EmbeddingCache(command_encoder(complementary, None, precision, batch_size, warn=warn))
    reports: dict[str, dict[str, Any]] = {}
    for name, encoder in encoders.items():
        encode = encoding_with(encoder, precision, batch_size, warn=warn)
        started = time.perf_counter()
        metrics = diagnose_model(
            encode,
            data,
            lambda batch, tokenizer=encoder.tokenizer: token_ids(tokenizer, batch),
            labels[name],
            settings,
            complementary=None if complementary in (None, name) else judge,
        )
        seconds = time.perf_counter() - started
        reports[name] = {
            "pooler": encode.pooler,
            "precision": encode.precision,
            "seconds": round(seconds, 2),
            **metrics,
        }
        typer.echo(f"({name}, pooler {encode.pooler}, {encode.label}, {seconds:.1f} s)", err=True)
    return reports
