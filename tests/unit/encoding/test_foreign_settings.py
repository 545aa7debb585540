"""Every foreign setting read is honoured or refused (issue "Hostile files IV"): the Transformer module's
`sentence_bert_config.json` of a sentence-transformers folder was never read, so its `max_seq_length` (where
sentence-transformers truncates) and `do_lower_case` (it lowercases the text) were ignored, silently. Now the
length is honoured and every other setting csekit does not reproduce is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_folder_pooling import SENTENCES, sentence_transformers_folder, st_embeddings

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder

CONFIG = "sentence_bert_config.json"


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sentence_transformers_folder(tmp_path_factory.mktemp("st"), "mean", True)


def _with_settings(folder: Path, tmp_path: Path, **settings: Any) -> Path:
    import shutil

    copy = Path(shutil.copytree(folder, tmp_path / "model"))
    config = json.loads((copy / CONFIG).read_text(encoding="utf-8"))
    (copy / CONFIG).write_text(json.dumps({**config, **settings}), encoding="utf-8")
    return copy


def test_the_transformer_modules_max_seq_length_is_honoured(st_folder: Path, tmp_path: Path) -> None:
    """A sentence longer than max_seq_length: csekit embeds what sentence-transformers embeds (its first tokens)."""
    folder = _with_settings(st_folder, tmp_path, max_seq_length=5)
    encoder = SentenceEncoder.load(folder)
    assert encoder.max_seq_length == 5
    assert np.abs(encoder.encode(SENTENCES) - st_embeddings(folder)).max() <= 2e-6
    assert SentenceEncoder.load(folder, pooler="mean").max_seq_length == 64  # a named pooler reads the transformer


REFUSED = {
    "lowercases": {"do_lower_case": True},
    "another task": {"transformer_task": "sequence-classification"},
    "processing arguments": {"processing_kwargs": {"text": {"padding": "max_length"}}},
    "multi-vector lengths": {"query_length": 32},
    "model arguments": {"model_args": {"torch_dtype": "float16"}},
    "tokenizer arguments": {"processor_kwargs": {"model_max_length": 8}},
    "another output": {"modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}},
    "an unknown setting": {"pooling_trick": 1},
    "a length that is text": {"max_seq_length": "long"},
    "a length of zero": {"max_seq_length": 0},
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_transformer_setting_csekit_does_not_reproduce_is_one_line(
    st_folder: Path, tmp_path: Path, case: str
) -> None:
    folder = _with_settings(st_folder, tmp_path, **REFUSED[case])
    with pytest.raises(CsekitError) as error:
        SentenceEncoder.load(folder)
    message = str(error.value)
    assert "\n" not in message and str(folder / CONFIG) in message, message
    SentenceEncoder.load(folder, pooler="mean")  # a named pooler reads the transformer alone: no refusal
