"""An adapter through which the `mteb` package evaluates a csekit model.

It implements mteb's `EncoderProtocol` (mteb >= 2): `encode(inputs, *, task_metadata, hf_split,
hf_subset, prompt_type=None, **kwargs)` receives a DataLoader of batches whose `"text"` holds the
sentences, and returns one row per sentence; `similarity` and `similarity_pairwise` are cosine, as
the papers use; `mteb_model_meta` describes the model. mteb is imported only for the metadata, so the
adapter itself works (and is tested) without mteb installed::

    import mteb
    from csekit.evaluation.mteb import CsekitMtebEncoder

    model = CsekitMtebEncoder("runs/simcse/best")
    mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.instructions import InstructionSet


class CsekitMtebEncoder:
    """A csekit `SentenceEncoder` (or a model path / alias) behind mteb's encoder protocol.

    `source` names where a given `SentenceEncoder` was loaded from (its csekit.json gives mteb its training data).

    All sentences of one `encode` call go to csekit's `SentenceEncoder.encode` at once, so the
    embeddings are exactly csekit's (length-sorted batches, duplicates encoded once, float32).
    Without `instructions` prompts (`prompt_type`) are ignored: the methods in csekit are symmetric sentence encoders.
    With them (`csekit.evaluation.instructions.InstructionSet`) each call's texts follow their task's instruction,
    its tokens attended to and not pooled, as LLM2Vec's MTEB evaluation (`csekit.encoding.instruction`).
    """

    def __init__(
        self,
        model: str | Path | SentenceEncoder,
        revision: str | None = None,
        *,
        device: str | None = None,
        pooler: str | None = None,
        batch_size: int = 128,
        precision: str = "fp32",
        source: str | Path | None = None,
        instructions: InstructionSet | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(model, SentenceEncoder):
            self.encoder = model
        else:
            self.encoder, source = SentenceEncoder.load(model, pooler=pooler), model
        self.source = source
        if device is not None:
            self.encoder.to(device)
        self.revision = revision
        self._meta: Any = None
        self.batch_size = batch_size
        self.precision = precision
        self.instructions = instructions

    @staticmethod
    def _texts(inputs: Any) -> list[str]:
        """Sentences from a DataLoader of `{"text": [...]}` batches (mteb 2), or from a list of strings (mteb 1)."""
        if isinstance(inputs, str):
            return [inputs]
        texts: list[str] = []
        for item in inputs if isinstance(inputs, Iterable) else []:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping) and "text" in item:
                batch = item["text"]
                texts.extend([batch] if isinstance(batch, str) else list(batch))
            else:
                raise CsekitError(f"mteb adapter: cannot read texts from an input of type {type(item).__name__}")
        return texts

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any = None,
        hf_split: str | None = None,
        hf_subset: str | None = None,
        prompt_type: Any = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """[number of sentences, dim] float32 embeddings, csekit's test-time representation."""
        texts = self._texts(inputs)
        instruction = None
        if self.instructions is not None:
            instruction = self.instructions.for_texts(getattr(task_metadata, "name", ""), prompt_type)
        return self.encoder.encode(texts, batch_size=self.batch_size, precision=self.precision, instruction=instruction)

    @staticmethod
    def _tensor(x: Any) -> torch.Tensor:
        t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x, dtype=torch.float32)
        return t.unsqueeze(0) if t.ndim == 1 else t

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity of every row of `embeddings1` with every row of `embeddings2`."""
        a = torch.nn.functional.normalize(self._tensor(embeddings1), dim=-1)
        b = torch.nn.functional.normalize(self._tensor(embeddings2), dim=-1)
        return a @ b.T

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity of corresponding rows."""
        return torch.nn.functional.cosine_similarity(self._tensor(embeddings1), self._tensor(embeddings2), dim=-1)

    @property
    def mteb_model_meta(self) -> Any:
        """mteb's ModelMeta: the model's parameters, width, token limit, release date and training data
        (`csekit.evaluation.mteb_meta`); needs mteb, which calls it."""
        from csekit.evaluation.mteb_meta import describe_model

        if self._meta is None:
            self._meta = describe_model(self.encoder, self.source, self.revision)
        return self._meta
