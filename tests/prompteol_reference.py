"""PromptEOL's evaluation as its authors wrote it, transcribed as references for tests: the templates of `run_icl.sh`
and the batcher of `evaluation.py`, kongds/scaling_sentemb at commit 8567aa0 (read from its git objects:
`git show 8567aa0:run_icl.sh`, `8567aa0:evaluation.py` L191-223, `8567aa0:README.md`).

Each function computes what their lines do, on the same inputs; the names say whose it is.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

AUTHORS_COMMIT = "8567aa0"
"""The commit of kongds/scaling_sentemb every transcription here was read at."""

PLAIN_TEMPLATE = 'This_sentence_:_"*sent_0*"_means_in_one_word:"'
"""The README's and run scripts' PromptEOL template (`--mask_embedding_sentence_template`), no demonstration."""

RUN_ICL_TEMPLATES = {
    "opt-125m": 'This_sentence_:_"A_man_is_smoking."_means_in_one_word:"Smoking".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-350m": 'This_sentence_:_"A_man_is_playing_on_a_guitar_and_singing."_means_in_one_word:"Music".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-1.3b": 'This_sentence_:_"relating_to_switzerland_or_its_people."_means_in_one_word:"Swiss".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-2.7b": 'This_sentence_:_"A_jockey_riding_a_horse."_means_in_one_word:"Equestrian".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-6.7b": 'This_sentence_:_"The_man_is_riding_a_horse."_means_in_one_word:"Horseback-riding".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-13b": 'This_sentence_:_"meat_from_a_deer."_means_in_one_word:"Venison".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-30b": 'This_sentence_:_"The_man_is_riding_a_motorcycle_down_the_road."_means_in_one_word:"Motorcycling".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-66b": 'This_sentence_:_"of_or_relating_to_tutors_or_tutoring."_means_in_one_word:"Tutorial".'
    'This_sentence_:_"*sent_0*"_means_in_one_word:"',
}
"""run_icl.sh's `icl_examples[MODEL]`, model by model (`bash run_icl.sh MODEL` evaluates `facebook/MODEL` with it):
the templates of the README's table "Results on STS Tasks with in-context learning (without fine-tuning)"."""

RUN_ICL_PATTERN = re.compile(r'This_sentence_:_"(?P<sentence>.+?)"_means_in_one_word:"(?P<word>.+?)"\.(?P<rest>.+)')
"""A run_icl.sh template: one demonstration (its sentence and word in the authors' notation), then the plain one."""


def demonstration_of(template: str) -> tuple[str, str]:
    """The demonstration's sentence and word in one of run_icl.sh's templates, underscores read as spaces."""
    match = RUN_ICL_PATTERN.fullmatch(template)
    assert match is not None and match["rest"] == PLAIN_TEMPLATE, template
    return match["sentence"].replace("_", " "), match["word"].replace("_", " ")


def run_icl_template(sentence: str, word: str) -> str:
    """A template written as run_icl.sh writes its eight: the demonstration in the authors' notation (a space as
    `_`, since the script passes the template unquoted), then the plain template."""
    notation = f'This_sentence_:_"{sentence}"_means_in_one_word:"{word}".{PLAIN_TEMPLATE}'
    return notation.replace(" ", "_")


def authors_sentence_edit(sentence: str) -> str:
    """evaluation.py L198-200: a period unless the sentence ends in . ? " ', double quotes made single, a final ?
    made a period."""
    s = sentence
    if len(s) > 0 and s[-1] not in ".?\"'":
        s += "."
    s = s.replace('"', "'")
    if len(s) > 0 and s[-1] == "?":
        s = s[:-1] + "."
    return s


def authors_text(template: str, sentence: str) -> str:
    """evaluation.py L193-201: the template's underscores read as spaces (`*sep+*` and `*cls*` dropped), the edited
    sentence put in, the text stripped."""
    filled = template.replace("_", " ").replace("*sep+*", "").replace("*cls*", "")
    return filled.replace("*sent 0*", authors_sentence_edit(sentence)).strip()


def readme_text(template: str, sentence: str) -> str:
    """The README's example: `template.replace('*sent_0*', i).replace('_', ' ')` (on an edited sentence)."""
    return template.replace("*sent_0*", authors_sentence_edit(sentence)).replace("_", " ")


def authors_batcher(backbone: nn.Module, tokenizer: Any, template: str, sentences: Sequence[str]) -> Tensor:
    """evaluation.py's `batcher` (L191-223) with `--mask_embedding_sentence`: each sentence edited and put into the
    template, the texts tokenised at once (`batch_encode_plus`; `tokenizer(...)` in transformers 5) padded on the left
    with pad id 0 (L143-144), the last layer's state at the last position."""
    theirs = copy.deepcopy(tokenizer)
    theirs.pad_token_id = 0
    theirs.padding_side = "left"
    batch = theirs([authors_text(template, s) for s in sentences], return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden_states = backbone(output_hidden_states=True, return_dict=True, **batch).hidden_states
    return hidden_states[-1][:, -1, :]
