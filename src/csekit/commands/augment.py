"""`csekit augment`'s option checks and its paraphrase engine, before any corpus is read or model loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from csekit.commands.options import require_at_least
from csekit.core.errors import CsekitError, absolute


def check_augment_options(
    corpus: Path,
    output: Path,
    engine: str,
    paraphrases: Path | None,
    chunk_size: int,
    limit: int | None,
    mer_range: tuple[float, float],
    can: str,
) -> None:
    """Every option's one-line error, in the order a user reads them."""
    if output.suffix != ".jsonl":
        raise CsekitError(f"--output {output}: must end in .jsonl (a recipe reads the fields from it)")
    min_mer, max_mer = mer_range
    if not 0 <= min_mer <= max_mer <= 1:
        raise CsekitError(f"--min-mer {min_mer} / --max-mer {max_mer}: need 0 <= min <= max <= 1")
    require_at_least("--chunk-size", chunk_size)
    if limit is not None:
        require_at_least("--limit", limit)
    if paraphrases is not None and engine != "file":
        raise CsekitError(f"--paraphrases is read only with --engine file (the engine is {engine})")
    if can not in ("cannot", "can not"):
        raise CsekitError(f'--can "{can}": choose cannot or "can not"')
    if not corpus.is_file():
        raise CsekitError(f"corpus {absolute(corpus)} does not exist")


def paraphrase_engine(engine: str, paraphrases: Path | None, pivots: str | None) -> Any:
    """The engine named by --engine (csekit.prep.paraphrase.ENGINES; None for `none`), built with its options."""
    if engine == "none":
        return None
    from csekit.prep.paraphrase import ENGINES

    factory = ENGINES.get(engine, "--engine (or none)")
    if engine == "file":
        if paraphrases is None:
            raise CsekitError("--engine file needs --paraphrases FILE")
        return factory(paraphrases)
    if engine in ("fsmt", "marian"):
        if pivots is None:
            return factory()
        languages = [p.strip() for p in pivots.split(",") if p.strip()]
        if not languages:
            raise CsekitError(f'--pivots "{pivots}": name at least one pivot language, e.g. ru,de')
        return factory(pivots=languages)
    return factory()
