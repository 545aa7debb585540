"""The test-time representation as one value: everything but the weights that decides how a sentence becomes its
vector at test time, saved and loaded whole as csekit.json's "representation" object.

`Representation` holds the pooler's name and options (a prompt pooler's templates, PromptEOL's demonstration),
whether the pooled vector is scaled to unit length, the sentence-end rule (`csekit.encoding.sentence_end`), the test
template (`csekit.encoding.whole_template`) and the head applied at test (`csekit.encoding.kept_head`: its width and
the folder of its weights). As sentence-transformers' modules do (`config_keys`, `get_config_dict`, `save_config`), its
settings are one dict (`CONFIG_KEYS`, `as_json`) written whole, and `from_json` is the one reader: every value checked,
each failure one line naming the file and the key. Older csekit wrote the same settings as flat keys of csekit.json;
`read_csekit_meta` reads either layout into the same value, and refuses a file holding both.

`Reading` is the partial value a load is asked for (a recipe's `model` section, `csekit evaluate`'s options): each
field None reads the model's own. `Reading.read` resolves it against what a folder saved into the pooler to build
and the representation the encoder holds; `SentenceEncoder` holds that one value and passes it whole
(`with_representation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.decoder_pooling import MeanPaddedPooler
from csekit.encoding.pooling import POOLERS, DenoisedMaskPooler, MaskPooler, Pooler, check_prompt_template, make_pooler
from csekit.encoding.prompteol import Demonstration, PromptEOLPooler, check_demonstration
from csekit.encoding.sentence_end import NO_SENTENCE_END, check_sentence_end, end_sentences
from csekit.encoding.whole_template import (
    NO_TEST_TEMPLATE,
    check_test_template,
    check_test_template_pooler,
    evaluation_ids,
)

REPRESENTATION_KEY = "representation"
"""csekit.json's key for the representation object."""

Where = Callable[[str], str]
"""How a message names a key: the file and the key (`csekit.json: "representation.pooler"`)."""


@dataclass(frozen=True)
class KeptHead:
    """The head applied at test time: a `dim` x `dim` Dense with tanh, its weights in the model folder's `path`
    (None: not saved yet; the export names the folder)."""

    dim: int
    path: str | None = None


@dataclass(frozen=True)
class Representation:
    """How a sentence becomes its test-time vector, weights aside (module docstring). `pooler` None: a csekit.json that
    names no pooler (a load reads cls, or the folder's own)."""

    pooler: str | None = None
    templates: tuple[str, ...] | None = None  # the mask pooler's, one per view (view 0's read at test)
    demonstration: Demonstration | None = None  # the prompteol pooler's
    normalize: bool = False  # unit-length vectors (a sentence-transformers Normalize module)
    sentence_end: str = NO_SENTENCE_END
    test_template: str = NO_TEST_TEMPLATE
    head: KeptHead | None = None

    def __post_init__(self) -> None:
        checked = _checked({key: getattr(self, key) for key in CONFIG_KEYS}, lambda key: f'Representation: "{key}"')
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    @classmethod
    def from_json(cls, values: Mapping[str, Any], where: Where) -> Representation:
        """The representation csekit.json's settings give (a missing key: its default); `where(key)` names a key in
        each one-line refusal."""
        present = {key: values[key] for key in CONFIG_KEYS if key in values}
        return cls(**_checked({**_defaults(), **present}, where))

    def as_json(self) -> dict[str, Any]:
        """Every setting, as csekit.json's "representation" object holds it (`from_json` reads it back equal)."""
        head = None if self.head is None else {"dim": self.head.dim, "path": self.head.path}
        return {
            "pooler": self.pooler,
            "templates": None if self.templates is None else list(self.templates),
            "demonstration": None if self.demonstration is None else self.demonstration.as_json(),
            "normalize": self.normalize,
            "sentence_end": self.sentence_end,
            "test_template": self.test_template,
            "head": head,
        }

    def report_facts(self) -> dict[str, Any]:
        """How the text was written and tokenised, for an evaluation's report: the sentence-end rule, the test template
        and PromptEOL's demonstration where there is one."""
        facts: dict[str, Any] = {"sentence_end": self.sentence_end, "test_template": self.test_template}
        if self.demonstration is not None:
            facts["demonstration"] = self.demonstration.as_json()
        return facts

    def describing(self, pooler: Pooler, head_dim: int | None) -> Representation:
        """This representation with its pooler's part read off `pooler` (its name, templates, demonstration and
        normalisation) and its head off the head module's width (`head_dim` None: no head): the encoder's value cannot
        disagree with the modules it runs. A test template is refused for a pooler without a mask to read."""
        check_test_template_pooler(self.test_template, pooler)
        head = (
            None if head_dim is None else self.head if self.head and self.head.dim == head_dim else KeptHead(head_dim)
        )
        return replace(
            self,
            pooler=pooler.name,
            templates=tuple(pooler.templates) if isinstance(pooler, MaskPooler) else None,
            demonstration=pooler.demonstration if isinstance(pooler, PromptEOLPooler) else None,
            normalize=pooler.normalized,
            head=head,
        )

    @property
    def pooling(self) -> tuple[object, ...]:
        """What the pooler module is built from: two representations with the same share one."""
        return self.pooler, self.templates, self.demonstration, self.normalize

    def make_pooler(self) -> Pooler:
        """A new pooler module for this representation (its test-time pooler)."""
        if self.pooler is None:
            raise CsekitError("a representation without a pooler cannot build one; name a pooler")
        options: dict[str, Any] = {}
        if self.templates is not None:
            options["templates"] = self.templates
        if self.demonstration is not None:
            options["demonstration"] = self.demonstration
        pooler = make_pooler(self.pooler, **options)
        pooler.normalized = self.normalize
        return pooler

    def write(self, sentences: Sequence[str]) -> list[str]:
        """`sentences` as the sentence-end rule writes them for an evaluation pass (`csekit.encoding.sentence_end`)."""
        return end_sentences(sentences, self.sentence_end)

    def evaluation_ids(
        self, pooler: Pooler, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_positions: int
    ) -> dict[str, list[list[int]]]:
        """Unpadded ids of the written `texts` for an evaluation pass: tokenised whole in the test template, or by
        `pooler` (`csekit.encoding.whole_template`)."""
        return evaluation_ids(pooler, tokenizer, texts, self.test_template, max_positions)

    def dropping(self, sentence_end: bool = False, test_template: bool = False) -> Representation:
        """This representation reading the text as given (`sentence_end`) or as the training ids (`test_template`)."""
        return replace(
            self,
            sentence_end=NO_SENTENCE_END if sentence_end else self.sentence_end,
            test_template=NO_TEST_TEMPLATE if test_template else self.test_template,
        )


CONFIG_KEYS = tuple(field.name for field in fields(Representation))
"""The representation's settings: csekit.json's "representation" keys, and the flat keys older csekit wrote."""


def _defaults() -> dict[str, Any]:
    return {field.name: field.default for field in fields(Representation)}


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")


def _checked(values: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """Each setting checked and in its type (a JSON list a tuple, an object a `Demonstration` or `KeptHead`), else
    one line naming `where(key)`."""
    pooler, templates, normalize = values["pooler"], values["templates"], values["normalize"]
    if pooler is not None and not isinstance(pooler, str):
        raise CsekitError(f"{where('pooler')} must be a pooler's name, found {_kind(pooler)}")
    if templates is not None:
        if not isinstance(templates, list | tuple) or not all(isinstance(t, str) for t in templates):
            raise CsekitError(f"{where('templates')} must be a list of strings, found {_kind(templates)}")
        if not templates:
            raise CsekitError(f"{where('templates')} must hold at least one prompt template (one per view)")
        for template in templates:
            try:
                check_prompt_template(template)
            except CsekitError as error:
                raise CsekitError(f"{where('templates')}: {error}") from None
    if not isinstance(normalize, bool):
        raise CsekitError(f"{where('normalize')} must be true or false, found {_kind(normalize)}")
    demonstration = check_demonstration(values["demonstration"], where("demonstration"))
    if demonstration is not None and pooler != PromptEOLPooler.name:
        raise CsekitError(f"{where('demonstration')} is for the prompteol pooler, not {pooler}")
    return {
        "pooler": pooler,
        "templates": None if templates is None else tuple(templates),
        "demonstration": demonstration,
        "normalize": normalize,
        "sentence_end": check_sentence_end(values["sentence_end"], where("sentence_end")),
        "test_template": check_test_template(values["test_template"], where("test_template")),
        "head": _kept_head(values["head"], where),
    }


def _kept_head(value: object, where: Where) -> KeptHead | None:
    """csekit.json's head, {dim, path} (its width checked against the model's where it is loaded)."""
    if value is None or isinstance(value, KeptHead):
        return value
    if not isinstance(value, Mapping) or not {"dim", "path"} <= set(value):
        raise CsekitError(f'{where("head")} must give the head\'s "dim" and "path"')
    dim, path = value["dim"], value["path"]
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise CsekitError(f'{where("head")}: "dim" must be a whole number >= 1, found {_kind(dim)}')
    if not isinstance(path, str) or not path:
        raise CsekitError(f'{where("head")}: "path" must name the head\'s folder, found {_kind(path)}')
    return KeptHead(dim, path)


def read_csekit_meta(meta: Mapping[str, Any], file: object) -> Representation:
    """The representation csekit.json (`meta`, read from `file`) saves: its "representation" object, or the flat keys
    older csekit wrote (the same settings, read the same way); a file holding both is refused in one line."""
    flat = [key for key in CONFIG_KEYS if key in meta]
    if REPRESENTATION_KEY not in meta:
        return Representation.from_json(meta, lambda key: f'{file}: "{key}"')
    if flat:
        raise CsekitError(
            f'{file}: holds both a "{REPRESENTATION_KEY}" object and the older flat keys ({", ".join(flat)}); '
            "a csekit.json holds one layout"
        )
    nested = meta[REPRESENTATION_KEY]
    if not isinstance(nested, dict):
        raise CsekitError(f'{file}: "{REPRESENTATION_KEY}" must be an object, found {_kind(nested)}')
    unknown = sorted(str(key) for key in set(nested) - set(CONFIG_KEYS))
    if unknown:
        raise CsekitError(
            f'{file}: "{REPRESENTATION_KEY}" has {unknown[0]!r:.60}, none of its keys ({", ".join(CONFIG_KEYS)})'
        )
    return Representation.from_json(nested, lambda key: f'{file}: "{REPRESENTATION_KEY}.{key}"')


def csekit_meta(representation: Representation) -> dict[str, Any]:
    """csekit.json's representation entry (what `read_csekit_meta` reads back)."""
    return {REPRESENTATION_KEY: representation.as_json()}


@dataclass(frozen=True)
class Reading:
    """How a load is asked to read a model beyond its pooler's name (a recipe's `model` section, `csekit evaluate`'s
    options); each field None: the model's own, else the pooler's default.

    `templates` a prompt pooler's (instead of those saved with the model); `template_positions` where
    `mask_denoised`'s template-alone pass numbers positions (row or from_zero); `test_bos` whether `mean_padded`'s
    test-time mean counts BOS (false: `mean_text`); `demonstration` the `prompteol` pooler's; `sentence_end` the rule
    `encode` applies; `test_template` the template `encode` tokenises whole (None: the saved one when the model is read
    with its saved prompt pooler and templates, else none)."""

    templates: tuple[str, ...] | None = None
    template_positions: str | None = None
    test_bos: bool | None = None
    demonstration: Demonstration | None = None
    sentence_end: str | None = None
    test_template: str | None = None

    def __post_init__(self) -> None:
        if self.templates is not None:
            object.__setattr__(self, "templates", tuple(self.templates))
        demonstration = check_demonstration(self.demonstration, "Reading: demonstration")
        object.__setattr__(self, "demonstration", demonstration)
        if self.sentence_end is not None:
            check_sentence_end(self.sentence_end, "Reading: sentence_end")
        if self.test_template is not None:
            check_test_template(self.test_template, "Reading: test_template")

    def read(self, chosen: str, saved: Representation, normalize: bool) -> tuple[Pooler, Representation]:
        """The pooler `chosen` (its options this reading's, else the `saved` ones where they are its) and the
        representation the encoder holds: its pooler's part is read off the pooler (`Representation.describing`)."""
        pooler = self._pooler(chosen, saved)
        pooler.normalized = normalize
        as_saved = chosen == MaskPooler.name and not self.templates  # the saved prompt pooler and templates
        test_template = self.test_template
        if test_template is None:
            test_template = saved.test_template if as_saved else NO_TEST_TEMPLATE
        sentence_end = saved.sentence_end if self.sentence_end is None else self.sentence_end
        kept = replace(Representation(), sentence_end=sentence_end, test_template=test_template, head=saved.head)
        return pooler, kept.describing(pooler, None if saved.head is None else saved.head.dim)

    def _pooler(self, name: str, saved: Representation) -> Pooler:
        """The pooler `name`; a prompt pooler gets this reading's templates, else the `mask` pooler those saved with the
        model; `mask_denoised` gets `template_positions`, `mean_padded` `test_bos`, `prompteol` the demonstration,
        else the one saved with it."""
        kind = POOLERS.get(name)
        templates, demonstration = self.templates, self.demonstration
        if templates is not None and not issubclass(kind, MaskPooler):
            raise CsekitError(
                f"prompt templates are for the prompt poolers (mask, mask_denoised), not the {name} pooler"
            )
        if demonstration is not None and not issubclass(kind, PromptEOLPooler):
            raise CsekitError(f"a PromptEOL demonstration is for the prompteol pooler, not the {name} pooler")
        if templates is None and name == MaskPooler.name:
            templates = saved.templates
        options: dict[str, Any] = {} if templates is None else {"templates": list(templates)}
        if demonstration is None and issubclass(kind, PromptEOLPooler):
            demonstration = saved.demonstration
        if demonstration is not None:
            options["demonstration"] = demonstration
        if self.template_positions is not None and issubclass(kind, DenoisedMaskPooler):
            options["template_positions"] = self.template_positions
        if self.test_bos is not None and issubclass(kind, MeanPaddedPooler):
            options["test_bos"] = self.test_bos
        return make_pooler(name, **options)
