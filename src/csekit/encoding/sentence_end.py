"""How a sentence's end is written before an evaluation pass, as the authors' evaluation scripts wrote it.

Two authors' scripts add end punctuation to every test sentence without it, so their published numbers are
those of the sentences so written (issue #53). A model carries its rule (`csekit.json` "sentence_end", recipe
key `model.sentence_end`); `SentenceEncoder.encode` applies it, so `csekit evaluate`, `bench` and the Python API
read the model as its authors did. Training never applies it.

* `promptbert`: Prompt-BERT `evaluation.py`, its `batcher`: `if len(s) > 0 and s[-1] not in '.?"\\'': s += '.'`
  (test only: its trainer's dev batcher adds nothing).
* `prompteol`: PromptEOL's `evaluation.py` batcher (kongds/scaling_sentemb 8567aa0, L198-200): PromptBERT's period, then
  every double quote made single (`s.replace('"', "'")`) and a final question mark made a period.
* `sncse`: SNCSE `bert_prediction.py`, `roberta_prediction.py` (test) and `bert_evaluation.py` (dev, the
  checkpoint selection): `s + " ." if s.strip()[-1] not in string.punctuation else s`.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from csekit.core.errors import CsekitError


def _promptbert(sentence: str) -> str:
    """PromptBERT's batcher: a period glued to a sentence that does not end in . ? " or '."""
    return sentence + "." if sentence and sentence[-1] not in ".?\"'" else sentence


def _prompteol(sentence: str) -> str:
    """PromptEOL's batcher: PromptBERT's period, double quotes made single, a final ? made a period."""
    written = _promptbert(sentence).replace('"', "'")
    return written[:-1] + "." if written.endswith("?") else written


def _sncse(sentence: str) -> str:
    """SNCSE's scripts: " ." after a sentence whose last non-space character is not ASCII punctuation."""
    stripped = sentence.strip()
    return sentence + " ." if stripped and stripped[-1] not in string.punctuation else sentence


NO_SENTENCE_END = "none"

SENTENCE_ENDS: Mapping[str, Callable[[str], str]] = MappingProxyType(
    {NO_SENTENCE_END: lambda sentence: sentence, "promptbert": _promptbert, "sncse": _sncse, "prompteol": _prompteol}
)
"""Each rule by name: `none` (the sentence as given), `promptbert`, `sncse`, `prompteol`."""


def check_sentence_end(rule: object, where: str) -> str:
    """`rule` if it names a rule, else one line naming `where` (a recipe key, a file's key, an option)."""
    if not isinstance(rule, str) or rule not in SENTENCE_ENDS:
        raise CsekitError(f"{where} must be one of {', '.join(SENTENCE_ENDS)}, found {rule!r}")
    return rule


def end_sentences(sentences: Sequence[str], rule: str) -> list[str]:
    """`sentences` written as `rule` writes them before an evaluation pass."""
    write = SENTENCE_ENDS[check_sentence_end(rule, "the sentence-end rule")]
    return [write(sentence) for sentence in sentences]


class SentenceEndNotExported:
    """Named in the modules.json of a saved model with a sentence-end rule, so that sentence-transformers refuses it
    loudly: it has no module that edits the text before tokenising, and would embed the sentences unchanged."""

    MESSAGE = (
        "this csekit model adds end punctuation to each sentence before encoding (csekit.json sentence_end), which "
        "sentence-transformers cannot reproduce; load it with csekit.SentenceEncoder.load(path)"
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise CsekitError(self.MESSAGE)

    @classmethod
    def load(cls, *args: object, **kwargs: object) -> SentenceEndNotExported:
        raise CsekitError(cls.MESSAGE)
