"""PromptEOL (Jiang et al., 2023, "Scaling Sentence Embeddings with Large Language Models"): its template, the
in-context demonstration its README's rows put before it, and the pooler that reads the last token.

The authors' code is kongds/scaling_sentemb at 8567aa0: `evaluation.py`'s batcher (L191-223) fills the template and
reads the last token; the README's table "Results on STS Tasks with in-context learning (without fine-tuning)" was
computed by `run_icl.sh`, whose template for each OPT model is one demonstration (a sentence and the one word for
it) followed by the template, e.g. for opt-125m
`This_sentence_:_"A_man_is_smoking."_means_in_one_word:"Smoking".This_sentence_:_"*sent_0*"_means_in_one_word:"`,
its underscores read as spaces (L193-194). The template has one home, `PROMPTEOL_TEMPLATE`; a demonstration is that
template with its sentence in it, its word and `".` (`Demonstration.text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.decoder_pooling import LastTokenPooler
from csekit.encoding.pooler_base import special_tokens_around
from csekit.encoding.token_input import tokenize_texts

PROMPTEOL_TEMPLATE = 'This sentence : "[X]" means in one word:"'
"""PromptEOL's template: kongds/scaling_sentemb 8567aa0's `This_sentence_:_"*sent_0*"_means_in_one_word:"` (README;
`evaluation.py` L193-201 reads its underscores as spaces)."""

SENTENCE_SLOTS = ("[X]", "*sent 0*")
"""Where a template takes the sentence: csekit's notation, and the authors' once its underscore is read as a space."""

DEMONSTRATION_PARTS = ("sentence", "word")
"""A demonstration's two texts, as csekit.json and `model.demonstration` write them."""


def _part_problem(text: object) -> str | None:
    """What keeps `text` out of a demonstration (it would break the template or be no authors' text), or None."""
    if not isinstance(text, str):
        return f"must be a text, found {type(text).__name__}"
    if not text.strip():
        return "is empty"
    if '"' in text:
        return "contains a double quote, which would close the template's quote early; write ' instead"
    if "_" in text:
        return "contains _, which the authors' notation (run_icl.sh) reads as a space; write the space"
    slot = next((slot for slot in SENTENCE_SLOTS if slot in text), None)
    if slot is not None:
        return f"contains {slot}, the template's slot for the sentence"
    if not text.isprintable():
        return "contains a line break or another unprintable character; a demonstration is one line"
    return None


@dataclass(frozen=True)
class Demonstration:
    """PromptEOL's in-context demonstration: a sentence and the one word that sums it up, written before the template
    as `PROMPTEOL_TEMPLATE` with the sentence in it, the word, then `".` (run_icl.sh's templates)."""

    sentence: str
    word: str

    def __post_init__(self) -> None:
        for part in DEMONSTRATION_PARTS:
            problem = _part_problem(getattr(self, part))
            if problem is not None:
                raise CsekitError(f"the PromptEOL demonstration's {part} {_shown(getattr(self, part))} {problem}")

    @property
    def text(self) -> str:
        """What goes before the template: `This sentence : "SENTENCE" means in one word:"WORD".`"""
        return PROMPTEOL_TEMPLATE.replace(SENTENCE_SLOTS[0], self.sentence) + self.word + '".'

    def as_json(self) -> dict[str, str]:
        """The demonstration as csekit.json and a report write it."""
        return {"sentence": self.sentence, "word": self.word}


def _shown(text: object) -> str:
    """`text` for a one-line message: quoted, cut at 60 characters, its line breaks escaped."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def check_demonstration(value: object, where: str) -> Demonstration | None:
    """`value` (None, a `Demonstration` or a mapping {sentence, word}) as a demonstration, else one line naming
    `where` (an option, a recipe key, a file's key)."""
    if value is None or isinstance(value, Demonstration):
        return value
    if not isinstance(value, Mapping) or sorted(map(str, value)) != sorted(DEMONSTRATION_PARTS):
        raise CsekitError(f"{where} must be {{sentence: ..., word: ...}}, found {_shown(value)}")
    for part in DEMONSTRATION_PARTS:
        problem = _part_problem(value[part])
        if problem is not None:
            raise CsekitError(f"{where}: the {part} {_shown(value[part])} {problem}")
    return Demonstration(value["sentence"], value["word"])


def prompteol_template(demonstration: Demonstration | None = None) -> str:
    """The template the pooler fills (`[X]`: the sentence): `PROMPTEOL_TEMPLATE`, after the demonstration if any."""
    return ("" if demonstration is None else demonstration.text) + PROMPTEOL_TEMPLATE


class PromptEOLPooler(LastTokenPooler):
    """PromptEOL, the training-free decoder representation: the sentence put into the template's text (after the
    in-context demonstration, if one is given), the whole text tokenised with the tokenizer's own special tokens (no
    EOS appended), the last token's state read: where the model would write the one word that sums the sentence up.

    As the authors' `evaluation.py` batcher (L191-223): `template.replace('*sent 0*', s)`, `batch_encode_plus`,
    `hidden_states[-1][:, -1, :]` on left-padded rows (csekit pads on the right and reads each row's last real
    token, with position ids that count real tokens: the same state). The batcher's edit of the sentence (a final
    period, quotes made single) is the `prompteol` sentence-end rule (`csekit.encoding.sentence_end`); the
    demonstration is written as given, as the authors' template holds it. A row too long for the backbone keeps the
    template whole and cuts the sentence's tokens (the authors' STS inputs never were).
    """

    name = "prompteol"

    def __init__(self, demonstration: Demonstration | Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.demonstration = check_demonstration(demonstration, "the prompteol pooler's demonstration")

    @property
    def template(self) -> str:
        """The template this pooler fills (`prompteol_template`)."""
        return prompteol_template(self.demonstration)

    def texts(self, sentences: Sequence[str]) -> list[str]:
        """Each sentence in the template's text: what the tokenizer is given."""
        before, after = self.template.split(SENTENCE_SLOTS[0])
        return [before + sentence + after for sentence in sentences]

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, list[list[int]]]:
        """The whole templated texts' ids; `max_length` bounds the sentence's tokens (as the mask pooler's)."""
        rows = [list(row) for row in tokenize_texts(tokenizer, self.texts(sentences), None)["input_ids"]]
        head, tail = special_tokens_around(tokenizer)
        pieces = tokenize_texts(tokenizer, self.template.split(SENTENCE_SLOTS[0]), None, add_special_tokens=False)
        prefix, suffix = list(pieces["input_ids"][0]), list(pieces["input_ids"][1])
        template = len(head) + len(prefix) + len(suffix) + len(tail)
        room = None if max_positions is None else max_positions - template
        if room is not None and room < 1:
            raise CsekitError(f"the prompteol template takes {template} tokens; the model accepts {max_positions}")
        budget = min((n for n in (max_length, room) if n is not None), default=None)
        misfits = [] if budget is None else [i for i, row in enumerate(rows) if len(row) > template + budget]
        if misfits:
            bodies = tokenize_texts(tokenizer, [sentences[i] for i in misfits], budget, add_special_tokens=False)
            for i, body in zip(misfits, bodies["input_ids"], strict=True):
                rows[i] = head + prefix + list(body[:budget]) + suffix + tail
        ids = {"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]}
        if "token_type_ids" in tokenizer.model_input_names:
            ids["token_type_ids"] = [[0] * len(row) for row in rows]
        return ids
