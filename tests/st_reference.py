"""sentence-transformers models built on the tests' tiny encoders, for equivalence tests against its losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from csekit.encoding.encoder import SentenceEncoder


def sentence_transformer_of(encoder: SentenceEncoder, folder: Path, max_length: int = 32) -> Any:
    """A SentenceTransformer with the encoder's backbone weights and tokenizer and its (mean or cls) pooling."""
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer
    encoder.backbone.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    transformer = Transformer(str(folder), max_seq_length=max_length)
    pooling = Pooling(encoder.dim, pooling_mode=encoder.pooler.name)
    return st.SentenceTransformer(modules=[transformer, pooling], device="cpu")


def st_losses() -> Any:
    """sentence-transformers' losses module (skips the test where it is not installed)."""
    try:
        return pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    except pytest.skip.Exception:  # sentence-transformers < 6
        return pytest.importorskip("sentence_transformers.losses")
