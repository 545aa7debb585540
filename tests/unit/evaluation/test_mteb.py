"""The mteb adapter returns csekit's own embeddings, through mteb's encoder protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.mteb import CsekitMtebEncoder

SENTENCES = ["a man plays the guitar", "a dog runs in the park", "she eats food", "a man plays the guitar", "it is red"]


def batches(sentences: list[str], size: int = 2) -> DataLoader:
    """Batches shaped like mteb 2's: dicts whose "text" is a list of strings."""
    return DataLoader(
        [{"text": s} for s in sentences], batch_size=size, collate_fn=lambda b: {"text": [x["text"] for x in b]}
    )


def test_adapter_embeddings_equal_csekit_encode(tiny_model_dir: Path) -> None:
    encoder = SentenceEncoder.load(tiny_model_dir)
    expected = encoder.encode(SENTENCES)
    adapter = CsekitMtebEncoder(tiny_model_dir)
    got = adapter.encode(batches(SENTENCES), task_metadata=None, hf_split="test", hf_subset="default")
    assert got.shape == expected.shape and np.array_equal(got, expected)
    assert np.array_equal(CsekitMtebEncoder(encoder).encode(SENTENCES), expected)  # mteb 1 style: a list
    # a different model gives different embeddings: the comparison above can fail
    other = CsekitMtebEncoder(tiny_model_dir, pooler="mean").encode(batches(SENTENCES))
    assert not np.allclose(other, expected)


def test_similarities_are_cosine(tiny_model_dir: Path) -> None:
    adapter = CsekitMtebEncoder(tiny_model_dir)
    emb = adapter.encode(batches(SENTENCES))
    sims = adapter.similarity(emb, emb)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    assert torch.allclose(sims, torch.from_numpy(unit @ unit.T), atol=1e-5)
    assert torch.allclose(adapter.similarity_pairwise(emb, emb), torch.ones(len(emb)), atol=1e-5)


def test_mteb_recognises_the_adapter(tiny_model_dir: Path) -> None:
    mteb = pytest.importorskip("mteb")
    from mteb.models import EncoderProtocol, ModelMeta

    adapter = CsekitMtebEncoder(tiny_model_dir)
    assert isinstance(adapter, EncoderProtocol)
    meta = adapter.mteb_model_meta
    assert isinstance(meta, ModelMeta) and meta.embed_dim == 32 and meta.name == f"csekit/{tiny_model_dir.name}"
    assert mteb.__version__


def test_mteb_names_keep_a_benchmarks_commas_and_corpora_map_to_mteb_tasks() -> None:
    """Without mteb: `--mteb`'s comma list, and a run's corpus and dev task in MTEB's names."""
    from csekit.evaluation.mteb_meta import training_data
    from csekit.evaluation.mteb_run import split_names

    assert split_names("MTEB(eng, v2), STS12,,SICK-R") == ["MTEB(eng, v2)", "STS12", "SICK-R"]
    facts = {"base_model": "minilm-l6", "saved_on": "2026-11-27"}
    wiki = training_data({**facts, "corpus": "corpus/wiki1m_for_simcse.txt", "dev_task": "none"})
    assert wiki.tasks == frozenset() and wiki.unnamed == ()  # Wikipedia sentences: in no MTEB task
    dev = training_data({**facts, "corpus": "corpus/wiki1m_for_simcse.txt", "dev_task": "sts"})
    assert dev.tasks == {"STSBenchmark", "STSBenchmarkMultilingualSTS", "SICK-R"}  # selected on their gold scores
    sncse = training_data({**facts, "corpus": "corpus/sts_sick_unlabeled_sncse.jsonl", "dev_task": "none"})
    assert {"STS12", "STS16", "STSBenchmark", "SICK-R"} <= sncse.tasks
    own = training_data({**facts, "corpus": "/data/legal.txt", "dev_task": ["pairs:legal"]})
    assert own.tasks == frozenset() and own.unnamed == ("corpus /data/legal.txt", "dev task pairs:legal")
