"""Paraphrase engines for OssCSE's back-translation augmentation: where candidate paraphrases come from.

An engine is any callable from sentences to candidate paraphrases (one list per sentence). Offline
here: Debian's apertium (rule-based EN-ES-EN, csekit's default: not the paper's) or a file of the
user's own paraphrases. With a network: `fsmt`, the paper's engine (section 4 and footnote 4:
facebook/wmt19-en-ru, ru-en, en-de, de-en, EN-RU-EN and EN-DE-EN round trips), or `marian`
(Helsinki-NLP opus-mt models through the same pivots; smaller and faster, not the paper's).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from csekit.core.errors import CsekitError, at
from csekit.core.json_lines import json_rows
from csekit.core.lines import read_lines
from csekit.core.registry import Registry
from csekit.encoding.model_folder import LoadedModel, load_model
from csekit.encoding.token_input import tokenize_texts

TRANSLATION_SPECIAL_TOKENS = ("unk_token", "pad_token")
"""What a translation model's tokenizer must define (FSMT's has no eos_token attribute: its </s> is sep_token)."""


class ParaphraseEngine(Protocol):
    """Gives candidate paraphrases per sentence (one list each, possibly empty)."""

    name: str

    def __call__(self, sentences: list[str]) -> list[list[str]]: ...


class ApertiumEngine:
    """English -> Spanish -> English through Debian's apertium (offline, rule-based; `apertium-eng-spa`)."""

    name = "apertium"

    def __init__(self, pivot: str = "spa", binary: str = "apertium") -> None:
        self.binary = shutil.which(binary)
        if self.binary is None:
            raise CsekitError("the apertium engine needs apertium: apt-get install apertium-eng-spa")
        self.pivot = pivot

    def _translate(self, lines: list[str], pair: str) -> list[str]:
        text = "\n".join(line.replace("\n", " ") for line in lines) + "\n"
        try:
            done = subprocess.run(
                [self.binary, "-u", pair], input=text, capture_output=True, text=True, check=True, timeout=600
            )
        except subprocess.CalledProcessError as error:
            raise CsekitError(f"apertium {pair} failed: {error.stderr.strip().splitlines()[-1:]}") from None
        out = done.stdout.rstrip("\n").split("\n")
        if len(out) != len(lines):  # apertium keeps line breaks; if not, translate one line at a time
            return [self._translate([line], pair)[0] for line in lines] if len(lines) > 1 else [" ".join(out)]
        return out

    def __call__(self, sentences: list[str]) -> list[list[str]]:
        pivot = self._translate(sentences, f"eng-{self.pivot}")
        back = self._translate(pivot, f"{self.pivot}-eng")
        return [[" ".join(line.split())] if line.strip() else [] for line in back]


class BackTranslationEngine:
    """Round trips English -> pivot -> English through sequence-to-sequence translation models.

    `models` names each model from its languages (`{source}`, `{target}`): a hub name or a local
    folder. Loading needs the models from the hub (a network, the first time) and is slow on CPU; a GPU
    is advised. Every pivot gives one candidate; the augmenter keeps the first within the MER range.
    """

    name = "back_translation"
    default_pivots: tuple[str, ...] = ()
    default_models = ""

    def __init__(
        self,
        pivots: Sequence[str] | None = None,
        device: str | None = None,
        batch_size: int = 32,
        models: str | None = None,
    ) -> None:
        import torch

        self.pivots = tuple(pivots) if pivots is not None else self.default_pivots
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.models = models or self.default_models
        self._models: dict[str, tuple[Any, Any]] = {}

    def _load(self, name: str) -> LoadedModel:
        """The translation model called `name`, with its tokenizer (`model_folder.load_model`)."""
        raise NotImplementedError

    def _model(self, source: str, target: str) -> tuple[Any, Any]:
        name = self.models.format(source=source, target=target)
        if name not in self._models:
            loaded = self._load(name)  # a hub name or a folder, checked; every failure one line
            self._models[name] = (loaded.tokenizer, loaded.model.to(self.device).eval())
        return self._models[name]

    def _translate(self, sentences: list[str], source: str, target: str) -> list[str]:
        import torch

        tokenizer, model = self._model(source, target)
        out: list[str] = []
        for start in range(0, len(sentences), self.batch_size):
            texts = sentences[start : start + self.batch_size]  # cut and truncated to the model's positions
            batch = tokenize_texts(tokenizer, texts, None, return_tensors="pt", padding=True, truncation=True)
            batch = {key: value.to(self.device) for key, value in batch.items()}
            with torch.inference_mode():
                generated = model.generate(**batch, num_beams=4, max_new_tokens=128)
            out += tokenizer.batch_decode(generated, skip_special_tokens=True)
        return out

    def __call__(self, sentences: list[str]) -> list[list[str]]:
        candidates: list[list[str]] = [[] for _ in sentences]
        for pivot in self.pivots:
            back = self._translate(self._translate(sentences, "en", pivot), pivot, "en")
            for row, text in zip(candidates, back, strict=True):
                if text.strip():
                    row.append(text.strip())
        return candidates


def _load_translation_model(name: str, model_class: Any, tokenizer_class: Any) -> LoadedModel:
    """A translation model and its tokenizer, loaded (and checked) as every model is; no sentence-encoder alias is
    suggested for a name that cannot be found."""
    return load_model(
        name, model_class, tokenizer_class=tokenizer_class, special_tokens=TRANSLATION_SPECIAL_TOKENS, aliases=False
    )


class FsmtEngine(BackTranslationEngine):
    """The paper's back-translation: facebook's WMT19 FSMT models, EN-RU-EN then EN-DE-EN (OssCSE footnote 4).

    transformers' FSMT classes; their tokenizer needs `sacremoses` (pip install sacremoses).
    """

    name = "fsmt"
    default_pivots = ("ru", "de")  # the paper's order: "English-Russian-English, English-German-English"
    default_models = "facebook/wmt19-{source}-{target}"

    def _load(self, name: str) -> LoadedModel:
        from transformers import FSMTForConditionalGeneration, FSMTTokenizer

        try:
            return _load_translation_model(name, FSMTForConditionalGeneration, FSMTTokenizer)
        except ImportError:
            raise CsekitError("the fsmt engine's tokenizer needs sacremoses: pip install 'csekit[fsmt]'") from None


class MarianEngine(BackTranslationEngine):
    """Helsinki-NLP opus-mt (MarianMT) round trips through the paper's pivots: smaller, not the paper's models."""

    name = "marian"
    default_pivots = ("de", "ru")
    default_models = "Helsinki-NLP/opus-mt-{source}-{target}"

    def _load(self, name: str) -> LoadedModel:
        from transformers import MarianMTModel, MarianTokenizer

        try:
            return _load_translation_model(name, MarianMTModel, MarianTokenizer)
        except ImportError:
            raise CsekitError("the marian engine's tokenizer needs sentencepiece: pip install sentencepiece") from None


class FileEngine:
    """A user's own paraphrases: `.jsonl` with "text" and "paraphrase", or `sentence<TAB>paraphrase` lines."""

    name = "file"

    def __init__(self, path: str | Path) -> None:
        self.table: dict[str, list[str]] = {}
        path = Path(path)
        if path.suffix == ".jsonl":
            rows = json_rows(path, "paraphrase file", {"text": str}, {"paraphrase": (str, type(None))})
            pairs = ((row["text"], row.get("paraphrase")) for _, row in rows)
        else:
            pairs = self._tab_separated(path)
        for source, paraphrase in pairs:
            if isinstance(paraphrase, str) and paraphrase.strip():
                self.table.setdefault(source.strip(), []).append(paraphrase.strip())

    @staticmethod
    def _tab_separated(path: Path) -> Iterator[tuple[str, str]]:
        try:
            lines = read_lines(path)
        except (OSError, UnicodeDecodeError) as error:
            raise CsekitError(f"paraphrase file {path}: cannot read it ({error})") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise CsekitError(f"{at(path, number)}: expected sentence<TAB>paraphrase, found {len(parts)} fields")
            yield parts[0], parts[1]

    def __call__(self, sentences: list[str]) -> list[list[str]]:
        return [list(self.table.get(sentence.strip(), [])) for sentence in sentences]


BUILTIN: Mapping[str, Callable[..., ParaphraseEngine]] = MappingProxyType(
    {"apertium": ApertiumEngine, "fsmt": FsmtEngine, "marian": MarianEngine, "file": FileEngine}
)
"""`csekit augment --engine` names; see `ENGINES`."""

ENGINES: Registry[Callable[..., ParaphraseEngine]] = Registry("engine", BUILTIN, "paraphrase engine")
"""`csekit augment --engine`: where back-translated paraphrases come from."""
