"""An instruction before each text, attended to but not pooled: how LLM2Vec's `encode` reads a decoder with a task's
instruction (BehnamGhader et al., 2024; McGill-NLP/llm2vec 312adcf, `llm2vec/llm2vec.py`).

LLM2Vec's `encode([[instruction, text], ...])` writes `f"{instruction.strip()} !@#$%^&*(){text}"` (`_convert_to_str`;
the text alone after the separator when the instruction is empty), and `tokenize` splits it there again: the model
reads `instruction.strip() + " " + text` tokenised whole, with the tokenizer's special tokens, and `embed_mask` marks
the row's last k tokens, k the text's own token count (tokenised alone, no special tokens). With `skip_instruction`
(its default) the pooling reads `embed_mask` instead of the attention mask (`get_pooling`): the mean over the text's
tokens, the weighted mean with weights 1..k over them, or the last token (`eos_token`, where its EOS was appended to
the text). So the BOS token and the instruction's tokens shape every state through attention and are pooled never,
an empty instruction included (the BOS token is still left out).

Here the pooler's own ids of the whole text (`last_token` appends its EOS after the text, as LLM2Vec's " </s>") and
a `pooling_mask` (`csekit.encoding.passes.POOLING_MASK`) over each row's last k tokens (k counting that EOS), which
`SentenceEncoder` hands the pooler instead of the attention mask. LLM2Vec pads on the left and csekit on the right
with position ids that count real tokens: the same states. A text of no tokens keeps its row's last token pooled
(LLM2Vec's mean would be NaN). Poolers that read a fixed position (cls, pooler_output) or wrap a template (mask,
prompteol) have no instruction to leave out and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.decoder_pooling import LastTokenPooler
from csekit.encoding.passes import POOLING_MASK
from csekit.encoding.pooler_base import Pooler
from csekit.encoding.token_input import token_ids

INSTRUCTION_POOLERS = ("mean", "weighted_mean", "last_token", "max", "mean_sqrt_len", "first_last_avg")
"""The poolers that read the tokens a mask marks, so an instruction's tokens can be left out of what they read."""


def check_instruction_pooler(pooler: Pooler) -> None:
    """One line unless `pooler` reads the tokens a mask marks (INSTRUCTION_POOLERS)."""
    if pooler.name not in INSTRUCTION_POOLERS or pooler.view_dependent:
        raise CsekitError(
            f"instructions are left out of the pooled tokens, which the {pooler.name} pooler does not read by a mask: "
            f"use one of {', '.join(INSTRUCTION_POOLERS)} (--pooler)"
        )


def instructed_text(instruction: str, text: str) -> str:
    """What the model reads: LLM2Vec's `_convert_to_str` joined again at its separator by `tokenize`."""
    return f"{instruction.strip()} {text}" if instruction else text


def instruction_ids(
    pooler: Pooler,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    instruction: str,
    max_positions: int | None,
) -> dict[str, list[list[int]]]:
    """Unpadded ids of `instruction` + each text, tokenised whole through `pooler`, and the `pooling_mask` of each
    row: its last k tokens, k the text's own token count (and the EOS the last_token pooler appends)."""
    check_instruction_pooler(pooler)
    ids = pooler.encode_ids(tokenizer, [instructed_text(instruction, text) for text in texts], None, 0, max_positions)
    appended = 1 if isinstance(pooler, LastTokenPooler) else 0
    masks = []
    for row, text_ids in zip(ids["input_ids"], token_ids(tokenizer, texts), strict=True):
        pooled = max(1, min(len(text_ids) + appended, len(row)))
        masks.append([0] * (len(row) - pooled) + [1] * pooled)
    return {**ids, POOLING_MASK: masks}
