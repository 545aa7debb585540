"""Training corpora: one sentence per line, checked line by line, indexed without a decoded copy.

A plain-text corpus is scanned once: blank lines are skipped and counted, and undecodable or
absurdly long lines are reported with their line numbers. What is kept in memory is only the byte
offset and length of each sentence; sentences are read from the file and decoded when a batch asks
for them, so a corpus of millions of lines costs a few bytes per line. A file that changes after the
scan (truncated or rewritten during training) stops the run with an error naming it; a memory map
would instead kill the process with a bus error when it reads past a truncated end. `.gz` corpora are decompressed
into memory; `.jsonl` corpora give one JSON object per line (the text under `text_column`, plus any
fields a method needs, such as a paraphrase).
"""

from __future__ import annotations

import gzip
import os
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from csekit.core.bounded_read import bounded_lines, open_regular
from csekit.core.errors import CsekitError, absolute
from csekit.core.json_lines import RowProblem, json_row
from csekit.encoding.packed import PACKING_LAYOUT, PackingLayout

HUB_PREFIX = "hf:"


@dataclass
class CorpusReport:
    """What reading a corpus found: kept sentences, blank lines, and problem lines that were skipped."""

    path: str
    sentences: int = 0
    blank_lines: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def summary(self) -> str:
        text = f"{self.path}: {self.sentences:,} sentences, {self.blank_lines:,} blank lines skipped"
        if self.skipped:
            lines = ", ".join(str(line) for line, _ in self.skipped[:10])
            more = "..." if len(self.skipped) > 10 else ""
            text += f", {len(self.skipped):,} bad lines skipped (lines {lines}{more})"
        return text


MAX_SENTENCE_CHARS = 1_000_000
"""The largest `data.max_chars`: a line of a million characters is a document, not a sentence (4 MB of a line is the
most a corpus scan holds)."""

LINE_READ_FLOOR = 2**20
"""Lines up to this many bytes are decoded whatever data.max_chars is, so that the error gives their length in
characters; only a longer line is skipped unread (counted in bytes)."""


def line_byte_limit(max_chars: int) -> int:
    """The most bytes of one line read into memory: what `max_chars` characters can take (4 bytes a character in
    UTF-8, and `\r\n`), at least LINE_READ_FLOOR."""
    return max(4 * max_chars + 2, LINE_READ_FLOOR)


def _problem(raw: bytes | None, max_chars: int, size: int = 0) -> tuple[str | None, str | None]:
    """Decode one line (None: longer than `line_byte_limit`, `size` bytes); return (text, None) or (None, reason)."""
    if raw is None:
        return None, f"{size:,} bytes, more than data.max_chars={max_chars:,} characters can take"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1})"
    if len(text) > max_chars:
        return None, f"{len(text):,} characters, more than data.max_chars={max_chars:,}"
    return text, None


class Corpus(Dataset):
    """A checked, indexable corpus; `corpus[i]` is a sentence (or a dict for `.jsonl`)."""

    def __init__(
        self,
        path: str | Path,
        max_chars: int = 10_000,
        bad_lines: str = "error",
        text_column: str = "text",
        fields: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.text_column = text_column
        # The fields the recipe's parts read (`.jsonl`): a string or null in every row that has them, in some row.
        self.fields = {name: (str, type(None)) for name in fields if name != text_column}
        self._fields_seen: set[str] = set()
        self.report = CorpusReport(str(self.path))
        self._starts = np.zeros(0, dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.int32)
        self._lines: list[Any] | None = None
        self._handle: Any = None  # opened on first read (forked DataLoader workers share it)
        if not os.path.exists(self.path):  # False, not OSError, for a name too long to be a file's
            raise CsekitError(f"corpus {absolute(self.path)} does not exist")
        if not self.path.is_file():
            raise CsekitError(f"corpus {self.path} is not a file")
        self._scanned = self._signature()
        self._scan(max_chars, bad_lines)
        if self._signature() != self._scanned:
            raise CsekitError(f"corpus {self.path} changed while it was being read; read it again when it is complete")
        if self.report.sentences == 0:
            raise CsekitError(
                f"corpus {self.path} has no sentences ({self.report.blank_lines:,} blank lines, "
                f"{len(self.report.skipped):,} bad lines)"
            )
        missing = [name for name in self.fields if name not in self._fields_seen]
        if missing:
            raise CsekitError(
                f'corpus {self.path}: no row has the field "{missing[0]}", which the recipe reads; make the corpus '
                "with `csekit augment`"
            )

    def _scan(self, max_chars: int, bad_lines: str) -> None:
        jsonl = self.path.suffix == ".jsonl" or self.path.name.endswith(".jsonl.gz")
        compressed = self.path.suffix == ".gz"
        keep_in_memory = compressed or jsonl
        starts = array("q")  # compact while scanning: 12 bytes a line, not two Python ints
        lengths = array("i")
        lines: list[Any] = []
        try:  # bounded_lines: a line is never held beyond the bytes max_chars allows (decompressed, for .gz)
            with open_regular(self.path) as file, gzip.GzipFile(fileobj=file) if compressed else file as handle:
                offset = 0
                for number, (raw_line, size) in enumerate(bounded_lines(handle, line_byte_limit(max_chars)), 1):
                    content = None if raw_line is None else raw_line.rstrip(b"\r\n")
                    text, reason = _problem(content, max_chars, size)
                    if text is not None and jsonl and text.strip():
                        text, reason = self._json_text(text)
                    if reason is not None:
                        if bad_lines == "error":
                            raise CsekitError(
                                f"{self.path}:{number}: {reason} (fix the line, or set data.bad_lines: skip)"
                            )
                        self.report.skipped.append((number, reason))
                    elif not (text if isinstance(text, str) else text[self.text_column]).strip():
                        self.report.blank_lines += 1
                    elif keep_in_memory:
                        lines.append(text)
                    else:
                        starts.append(offset)
                        lengths.append(len(content or b""))
                    offset += size
        except (OSError, EOFError, zlib.error) as error:  # zlib.error: a damaged .gz body (BadGzipFile is an OSError)
            raise CsekitError(f"corpus {self.path}: cannot read it ({error})") from None
        if keep_in_memory:
            self._lines = lines
            self.report.sentences = len(lines)
        else:
            self._starts = np.frombuffer(starts, dtype=np.int64) if starts else np.zeros(0, dtype=np.int64)
            self._lengths = np.frombuffer(lengths, dtype=np.int32) if lengths else np.zeros(0, dtype=np.int32)
            self.report.sentences = len(starts)

    def _json_text(self, text: str) -> tuple[Any, str | None]:
        try:
            row = json_row(text, {self.text_column: str}, self.fields)
            self._fields_seen.update(name for name in self.fields if row.get(name) is not None)
            return row, None
        except RowProblem as problem:
            named = f'"{self.text_column}"' in str(problem)
            return None, f"{problem} (data.text_column)" if named else str(problem)

    def __len__(self) -> int:
        return self.report.sentences

    def _signature(self) -> tuple[int, int]:
        """(size, modification time) of the file: what must not change between the scan and the reads."""
        try:
            info = self.path.stat()
        except OSError as error:
            raise CsekitError(f"corpus {self.path}: cannot read it ({error.strerror})") from None
        return info.st_size, info.st_mtime_ns

    def __getitem__(self, index: int) -> Any:
        if self._lines is not None:
            return self._lines[index]
        if self._handle is None:
            try:
                self._handle = open_regular(self.path, buffered=False)  # held for the corpus's life
            except OSError as error:
                raise CsekitError(f"corpus {self.path}: cannot read it ({error.strerror})") from None
        # Checked before every read: one fstat, microseconds, next to a training step's milliseconds.
        info = os.fstat(self._handle.fileno())
        start, length = int(self._starts[index]), int(self._lengths[index])
        raw = b""
        if (info.st_size, info.st_mtime_ns) == self._scanned:
            # A positional read: DataLoader workers forked after the parent read a line share this descriptor and
            # its offset, so a seek then a read could return another worker's bytes (seen on a GPU, 2026-11-27).
            raw = os.pread(self._handle.fileno(), length, start)
        if len(raw) != length:
            raise CsekitError(
                f"corpus {self.path} changed after it was read at the start (now {info.st_size:,} bytes, then "
                f"{self._scanned[0]:,}); restore it, then continue with --resume"
            )
        return raw.decode("utf-8")

    def __getstate__(self) -> dict[str, Any]:
        # An open file cannot be pickled (spawned DataLoader workers reopen it; forked ones share it, hence pread).
        return {**self.__dict__, "_handle": None}

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            handle.close()


class HubCorpus(Dataset):
    """A Hugging Face hub dataset column as a corpus (needs `pip install datasets` and a network)."""

    def __init__(self, spec: str, text_column: str = "text") -> None:
        name, _, split = spec.removeprefix(HUB_PREFIX).partition(":")
        try:
            import datasets
        except ImportError:
            raise CsekitError("hub corpora need the datasets package: pip install datasets") from None
        try:
            self._rows = datasets.load_dataset(name, split=split or "train")
        except Exception as error:  # the hub client raises many types; all mean "cannot get it"
            raise CsekitError(f'cannot load hub dataset "{name}": {str(error).splitlines()[0]}') from None
        if text_column not in self._rows.column_names:
            raise CsekitError(f'hub dataset "{name}" has no column "{text_column}" (data.text_column)')
        self._rows = self._rows.filter(lambda row: bool(str(row[text_column]).strip()))
        self.text_column = text_column
        self.report = CorpusReport(spec, sentences=len(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> str:
        return str(self._rows[index][self.text_column])


def resolve_corpus_path(corpus: str, data_dir: Path | None) -> str | Path:
    """A corpus given as a path, absolute: as it is if absolute, else from the current folder, else from the data
    folder (when one is given; a corpus in neither is refused naming both); a hub dataset's name as it is."""
    if corpus.startswith(HUB_PREFIX):
        return corpus
    path = Path(corpus).expanduser()
    here = Path(absolute(path))
    if path.is_absolute() or os.path.exists(here) or data_dir is None:
        return here
    candidate = Path(absolute(data_dir / path))
    if os.path.exists(candidate):
        return candidate
    raise CsekitError(f"corpus {corpus} not found (looked for {here} and, in the data folder, {candidate})")


def open_corpus(
    corpus: str, data_dir: Path | None, max_chars: int, bad_lines: str, text_column: str, fields: Sequence[str] = ()
) -> Corpus | HubCorpus:
    """Open a corpus file or hub dataset named by a recipe's `data.corpus` (`fields`: those its parts read)."""
    location = resolve_corpus_path(corpus, data_dir)
    if isinstance(location, str):
        return HubCorpus(location, text_column)
    return Corpus(location, max_chars=max_chars, bad_lines=bad_lines, text_column=text_column, fields=fields)


def sentence_text(item: Any, text_column: str = "text") -> str:
    """The sentence of a corpus item: the item itself, or a `.jsonl` row's `text_column`."""
    return item[text_column] if isinstance(item, dict) else item


class TrainCollator:
    """Turns a list of corpus items into the model's inputs for all views, in the DataLoader.

    The inputs carry the batch's `PackingLayout` (where its real tokens are), made here on the CPU from
    the rows' lengths, so that a padding-free pass on a GPU never reads it back from the device.
    """

    def __init__(self, make_views: Callable[[list[str]], dict[str, torch.Tensor]], text_column: str = "text"):
        self.make_views = make_views
        self.text_column = text_column

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        if items and isinstance(items[0], dict):
            sentences = [item[self.text_column] for item in items]
            names = dict.fromkeys(key for item in items for key in item if key != self.text_column)
            fields = {key: [item.get(key) for item in items] for key in names}  # a row without one: None
        else:
            sentences, fields = list(items), {}
        inputs = self.make_views(sentences)
        if isinstance(inputs, dict) and isinstance(inputs.get("attention_mask"), torch.Tensor):
            inputs = {**inputs, PACKING_LAYOUT: PackingLayout.of_host_mask(inputs["attention_mask"])}
        return {"sentences": sentences, "fields": fields, "inputs": inputs}
