"""How dev is scored during training: as the saved model encodes, or as an author's code scored it.

Every `eval_every` steps the selection metric is read off a dev score. By default it scores what is
saved (the test-time pooler, a head only with `model.head_at_test`), in fp32. Some authors' code scored
dev with parts of the training representation and tested without them, so its checkpoint was chosen by
another representation than the one it reported:

* MixCSE's script has no `--mlp_only_train`, so its dev runs through the MLP head (MixCSE_AAAI2022
  `mixcse/models_mix.py` L328-330) while its test reads [CLS] before it (`--pooler cls_before_pooler`):
  `train.dev_with_head: true`.
* PromptBERT's dev evaluation subtracts the template's state as training does (Prompt-BERT
  `prompt_bert/models.py` L290-303, L362-368: `sentemb_forward` with the training arguments, in eval mode
  and without gradient), while its final test runs without `--mask_embedding_sentence_delta`:
  `train.dev_denoise: true`.
* SNCSE's dev script writes each sentence's end as its test does (`bert_evaluation.py`: " ." after one without
  end punctuation) and PromptBERT's trainer does not (its dev batcher adds no period, its test's does): dev is
  written with `model.sentence_end` unless `train.dev_sentence_end: false`. Likewise SNCSE's RoBERTa dev script
  tokenises the whole templated string as its test does (`roberta_evaluation.py` L83-85) and PromptBERT's trainer
  joins the training ids: dev is tokenised with `model.test_template` unless `train.dev_test_template: false`.
* DCLR's code scores dev on `pooler_output`, BERT's pooler layer (dense + tanh) on [CLS] (DCLR `trainers.py`
  L106-118, `models.py` L767), while its test reads [CLS] before it: `train.dev_pooler_output: true`.

Each only changes what is encoded for dev; the saved model (best/, last/) is the same. The starting model (step 0)
is scored the same way as every step, so `best/` is never worse than the start on that dev score, which may differ
from what `best/` gives as saved (csekit.training.best_model). Dev is encoded
in fp32 whatever the training precision (the authors' evaluation runs outside autocast);
`train.dev_precision: training` keeps the run's precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
from torch import nn

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.pooling import DenoisedMaskPooler, backbone_pooler_layer, make_pooler
from csekit.evaluation.task_set import TaskSet
from csekit.training.recipe import TrainConfig


def dev_precision(train: TrainConfig, training_precision: str) -> str:
    """The precision dev is encoded in: fp32, or the run's own with `train.dev_precision: training`."""
    return training_precision if train.dev_precision == "training" else "fp32"


@contextlib.contextmanager
def dev_encoder(saved: SentenceEncoder, head: nn.Module, train: TrainConfig) -> Iterator[SentenceEncoder]:
    """The encoder whose `encode` gives the representation `train` scores dev with (see above), from `saved`, the
    encoder as the run saves it. It shares every module with `saved`; nothing of `saved` is changed."""
    with contextlib.ExitStack() as restore:
        encoder = saved
        if train.dev_denoise:
            if not isinstance(encoder.pooler, DenoisedMaskPooler):
                raise CsekitError("recipe key train.dev_denoise needs model.pooler mask_denoised")
            restore.enter_context(encoder.pooler.denoising())
        if train.dev_with_head and encoder.head is None:
            encoder = encoder.with_head(head)
        if train.dev_pooler_output:
            encoder = restore.enter_context(pooler_output_for_dev(encoder))
        as_given = (not train.dev_sentence_end, not train.dev_test_template)  # the text as given, the training ids
        if any(as_given):
            encoder = encoder.with_representation(encoder.representation.dropping(*as_given))
        yield encoder


def score_dev(
    saved: SentenceEncoder, head: nn.Module, train: TrainConfig, precision: str, batch_size: int, tasks: TaskSet
) -> dict[str, float | None]:
    """The dev tasks' scores (`csekit.training.dev_selection`: the splits, alignment and uniformity, the dev files)
    of `saved` as it is now, encoded as `dev_encoder` says, in `precision` (`dev_precision`), `batch_size`
    sentences at a time: the flat view a run logs and selects on (`EvalResult.metrics()`)."""
    with dev_encoder(saved, head, train) as encoder:

        def encode(sentences: list[str]) -> np.ndarray:
            return encoder.encode(sentences, batch_size=batch_size, precision=precision, show_progress_bar=False)

        return tasks.run(encode).metrics()


def check_dev_representation(encoder: SentenceEncoder, train: TrainConfig) -> None:
    """What `train` scores dev with exists in `encoder` (a CsekitError at the start, not at the first evaluation)."""
    if train.dev_pooler_output:
        backbone_pooler_layer(encoder.backbone, "recipe key train.dev_pooler_output")


@contextlib.contextmanager
def pooler_output_for_dev(encoder: SentenceEncoder) -> Iterator[SentenceEncoder]:
    """`encoder` pooling with the backbone's pooler layer on [CLS]; the layer's parameters' training flags (the
    `pooler_output` pooler unfreezes the layer) restored afterwards."""
    layer = backbone_pooler_layer(encoder.backbone, "recipe key train.dev_pooler_output")
    trainable = [parameter.requires_grad for parameter in layer.parameters()]
    try:
        yield encoder.with_pooler(make_pooler("pooler_output"))
    finally:
        for parameter, flag in zip(layer.parameters(), trainable, strict=True):
            parameter.requires_grad_(flag)
