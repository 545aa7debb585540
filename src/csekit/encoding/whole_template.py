"""The test template: a prompt model's templated text tokenised whole at test time, as two authors' evaluations did.

csekit's prompt poolers tokenise a template's pieces and the sentence apart and join the ids, which are the
authors' training ids (Prompt-BERT `train.py` L618-641, SNCSE `train_SNCSE.py` L490-535). Their evaluation
scripts put the sentence into the template's text and tokenise the whole string at once (issue #53 item 3):

* Prompt-BERT `evaluation.py` (kongds/Prompt-BERT at 690ba6e), `batcher` L193-202: `template.replace('*sent 0*',
  s).strip()`, the string tokenised by `batch_encode_plus` (L221-231); for RoBERTa (`eval_only.sh` unsup-roberta)
  the string is `This sentence : ' {s} ' means<mask>.`. The trainer's dev (`prompt_bert/trainers.py` L105-117 and
  `models.py` L307-322) joins the training ids: dev keeps them (`train.dev_test_template: false`).
* SNCSE (Sense-GVT/SNCSE at faa013e) `roberta_prediction.py` L68-70 (test) and `roberta_evaluation.py` L83-85
  (dev): `'This sentence : " ' + s + ' " means <mask> .'`, tokenised at once (L17): dev as test.

On a byte-level BPE tokenizer (RoBERTa) the ids differ: the sentence's first word takes its space (`Ġword`, not
`word`) and SNCSE's training prefix ends in a lone space token that the whole string does not have. WordPiece
(BERT) splits at whitespace and punctuation before looking words up, so both ways give it the same ids.

A model carries its test template (recipe key `model.test_template`, `csekit.json` "test_template"; `none`: the
training ids), written in the pooler's notation (`[X]` the sentence, `[MASK]` the mask token); `SentenceEncoder.encode`
applies it to every sentence it encodes, so `csekit evaluate`, `bench` and dev scoring read the model as its
authors did. Training never applies it. A saved prompt model is refused by sentence-transformers already
(`PromptNotExported`: it cannot put a sentence inside a template), so the export adds no other refusal.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import DenoisedMaskPooler, MaskPooler, Pooler, check_prompt_template
from csekit.encoding.token_input import text_bound, tokenize_texts

NO_TEST_TEMPLATE = "none"
"""The training ids at test time too (template pieces and sentence tokenised apart)."""

PROMPT_POOLERS = ("mask", "mask_denoised")
"""The poolers a test template is for (it replaces view 0's template at test)."""


def template_problem(template: object) -> str | None:
    """What is wrong with `template` as a test template, or None (`none` or a prompt template: [X], then [MASK])."""
    if not isinstance(template, str):
        return f"must be none or a prompt template with [X] and [MASK], found {template!r}"
    if template != NO_TEST_TEMPLATE:
        try:
            check_prompt_template(template)
        except CsekitError as error:
            return f"is not a prompt template: {error}"
    return None


def check_test_template(template: object, where: str) -> str:
    """`template` if it is `none` or a prompt template, else one line naming `where` (an option, a file's key)."""
    problem = template_problem(template)
    if problem is not None:
        raise CsekitError(f"{where} {problem}")
    return str(template)


def check_test_template_pooler(template: str, pooler: Pooler) -> None:
    """A test template is read at the prompt poolers' mask: one line for any other pooler."""
    if template != NO_TEST_TEMPLATE and not isinstance(pooler, MaskPooler):
        raise CsekitError(f"a test template is for the prompt poolers ({', '.join(PROMPT_POOLERS)}), not {pooler.name}")


def recipe_checks(pooler: str, template: object, dev_denoised: bool) -> list[tuple[str, bool, str]]:
    """The recipe's checks of `model.test_template` as (key, ok, message): a valid template, a prompt pooler, and
    no dev denoising on a dev scored with it (`dev_denoised`: `train.dev_denoise` and `train.dev_test_template`)."""
    problem = template_problem(template)
    used = problem is None and template != NO_TEST_TEMPLATE
    return [
        ("model.test_template", problem is None, problem or ""),
        ("model.test_template", not used or pooler in PROMPT_POOLERS, f"is for the prompt poolers, not {pooler}"),
        (
            "train.dev_test_template",
            not (used and dev_denoised),
            "cannot go with train.dev_denoise (denoising subtracts the template's state from the training ids); "
            "set train.dev_test_template: false",
        ),
    ]


def evaluation_ids(
    pooler: Pooler, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], template: str, max_positions: int
) -> dict[str, list[list[int]]]:
    """Unpadded ids of `texts` for an evaluation pass: the pooler's own (`none`), or `template` with each text in it,
    tokenised whole. A text too long for the backbone within the template keeps the pooler's ids, whose sentence is
    cut (the authors' scripts never met one: they would cut the mask or fail)."""
    if template == NO_TEST_TEMPLATE:
        return pooler.encode_ids(tokenizer, texts, None, max_positions=max_positions)
    check_test_template_pooler(template, pooler)
    if isinstance(pooler, DenoisedMaskPooler) and pooler.denoise_at_test:  # dev denoising (`denoising()`)
        raise CsekitError("template denoising reads the training ids, not a test template's (train.dev_denoise)")
    before, after = template.split("[X]")
    after = after.replace("[MASK]", str(tokenizer.mask_token))
    whole_texts = [before + text + after for text in texts]
    whole = tokenize_texts(tokenizer, whole_texts, None)
    bound = text_bound(max_positions)
    misfits = [
        i for i, text in enumerate(whole_texts) if len(text) > bound or len(whole["input_ids"][i]) > max_positions
    ]
    own = (
        pooler.encode_ids(tokenizer, [texts[i] for i in misfits], None, max_positions=max_positions) if misfits else {}
    )
    keys = ["input_ids", "attention_mask"] + (
        ["token_type_ids"] if "token_type_ids" in tokenizer.model_input_names else []
    )
    rows: dict[str, list[list[int]]] = {key: [] for key in keys}
    cut = dict(zip(misfits, range(len(misfits)), strict=True))
    for i in range(len(texts)):
        source, row = (own, cut[i]) if i in cut else (whole, i)
        for key in keys:
            rows[key].append(list(source[key][row]) if key in source else [0] * len(source["input_ids"][row]))
    return rows
