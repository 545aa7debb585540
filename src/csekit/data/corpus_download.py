"""Fetch a papers' training corpus (SimCSE's one million Wikipedia sentences) and check it offline.

`csekit download-data DIR --corpus wiki1m` writes `DIR/corpus/wiki1m_for_simcse.txt`, where every paper
recipe looks for it. The download goes to a staging file beside it (`.wiki1m_for_simcse.txt.part`) and is
renamed into place only once it is complete and checked, so a reader never sees half a corpus. An
interrupted download keeps the staging file, and the next call asks the server for the rest (an HTTP
Range request); a server that ignores the range sends the whole file again.

What can be checked without the full file at hand: the line count (1,000,000) and that the first 11,913
lines equal the sample in csekit's shared data (`corpus/wiki1m_for_simcse.head11913.txt`, from a truncated
public copy; see its PROVENANCE.md), pinned here by length and SHA-256 so no sample needs to be present.
The head is checked as soon as its bytes arrive: a wrong file is refused after about 1.3 MB, not 120 MB.
A file that fails a check is deleted: nothing of it is left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO

from tqdm import tqdm

from csekit.core.atomic import commit_staged_file, open_bytes_for_append
from csekit.core.bounded_read import open_regular
from csekit.core.errors import CsekitError, did_you_mean

CHUNK = 1 << 16
PARTIAL_SUFFIX = ".part"


@dataclass(frozen=True)
class CorpusSource:
    """Where a corpus comes from and what it must look like (its line count and its first lines' digest)."""

    name: str
    file_name: str  # written to DIR/corpus/<file_name>
    url: str
    lines: int
    head_lines: int
    head_bytes: int  # the length of the first `head_lines` lines, newlines included
    head_sha256: str
    max_bytes: int  # a download never grows past this


CORPORA: Mapping[str, CorpusSource] = MappingProxyType(
    {
        "wiki1m": CorpusSource(
            name="wiki1m",
            file_name="wiki1m_for_simcse.txt",
            # SimCSE's data/download_wiki.sh names this file; the same bytes are on its hub dataset.
            url="https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/wiki1m_for_simcse.txt",
            lines=1_000_000,
            head_lines=11_913,
            head_bytes=1_279_689,
            head_sha256="626175d8bf7d77e323f6d74bed023563abe2123b1b7990ccfcd958880ea71f5b",
            max_bytes=512 * 2**20,  # the file is about 120 MB
        )
    }
)


def corpus_source(name: str) -> CorpusSource:
    """The corpus named `name`, or one line naming the choices."""
    if name not in CORPORA:
        raise CsekitError(
            f"--corpus: unknown corpus {name!r}{did_you_mean(name, CORPORA)}; choose from {list(CORPORA)}"
        )
    return CORPORA[name]


def download_corpus(
    dest: str | Path, source: CorpusSource, https_only: bool = True, timeout: float = 60.0, show_progress: bool = True
) -> Path:
    """Fetch `source` into `dest/corpus/`, resuming a partial download, and return the checked file's path.

    `https_only` is for the tests' local server only; csekit's command always fetches over https.
    """
    if https_only:
        _require_https(source.url)
    folder = Path(dest).expanduser() / "corpus"
    target = folder / source.file_name
    if target.is_file() and not target.is_symlink():
        _check_complete(target, source, delete_on_failure=False)
        return target
    created = [p for p in (folder.parent, folder) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{source.file_name}{PARTIAL_SUFFIX}"
    try:
        _fetch_rest(source, partial, https_only, timeout, show_progress)
        _check_complete(partial, source, delete_on_failure=True)
    except _Refused as refusal:
        partial.unlink(missing_ok=True)
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty
        raise CsekitError(f"{source.url}: {refusal}; nothing of it was kept") from None
    commit_staged_file(partial, target)
    return target


class _Refused(Exception):
    """The file is not the corpus: its partial download is deleted."""


def _require_https(url: str) -> None:
    if urllib.parse.urlsplit(url).scheme.lower() != "https":
        raise CsekitError(f"download of {url} refused: csekit fetches data over https only")


def _open_partial(partial: Path) -> BinaryIO:
    """The staging file for appending; a link there is refused (csekit writes only its own files)."""
    try:
        return open_bytes_for_append(partial)
    except OSError as error:
        raise CsekitError(f"{partial}: cannot write the download there ({error.strerror or error})") from None


def _fetch_rest(source: CorpusSource, partial: Path, https_only: bool, timeout: float, show_progress: bool) -> None:
    """Append what `partial` lacks; a network failure keeps it for the next call, a wrong head is _Refused."""
    with _open_partial(partial) as out:
        offset = out.seek(0, os.SEEK_END)
        request = urllib.request.Request(source.url, headers={"Range": f"bytes={offset}-"} if offset else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if https_only:
                    _require_https(response.geturl())
                offset, total = _start(response, out, offset, source)
                head = _HeadCheck(source, partial, offset)
                _stream(response, out, offset, total, head, source, show_progress)
        except urllib.error.HTTPError as error:
            if error.code == 416 and offset:  # nothing left to send: the staging file is complete
                return
            raise CsekitError(f"download of {source.url} failed (HTTP {error.code} {error.reason})") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise CsekitError(
                f"download of {source.url} stopped after {partial.stat().st_size:,} bytes ({error}); "
                "run the same command again to resume it"
            ) from None


def _start(
    response: http.client.HTTPResponse, out: BinaryIO, offset: int, source: CorpusSource
) -> tuple[int, int | None]:
    """Where the response's bytes go (a server that ignores the range starts over) and the file's full size."""
    length = response.headers.get("Content-Length")
    if response.status == 206:
        content_range = response.headers.get("Content-Range") or ""
        if not content_range.startswith(f"bytes {offset}-"):
            raise _Refused(f"the server answered a resume at byte {offset} with {content_range!r}")
        total_text = content_range.rpartition("/")[2]
        total = int(total_text) if total_text.isdigit() else None
    else:
        if offset:
            out.truncate(0)
            offset = 0
        total = int(length) if length and length.isdigit() else None
    if total is not None and total > source.max_bytes:
        raise _Refused(f"it is {total:,} bytes, more than the {source.max_bytes:,} the {source.name} corpus can be")
    return offset, total


class _HeadCheck:
    """The SHA-256 of the first `head_bytes` bytes, fed as they arrive (a resumed download reads its own first)."""

    def __init__(self, source: CorpusSource, partial: Path, offset: int) -> None:
        self.source, self.seen, self.digest = source, 0, hashlib.sha256()
        with open_regular(partial) as handle:
            self.feed(handle.read(min(offset, source.head_bytes)))

    def feed(self, data: bytes) -> None:
        wanted = self.source.head_bytes - self.seen
        if wanted <= 0:
            return
        self.digest.update(data[:wanted])
        self.seen += min(wanted, len(data))
        if self.seen == self.source.head_bytes and self.digest.hexdigest() != self.source.head_sha256:
            raise _Refused(_wrong_head(self.source))


def _wrong_head(source: CorpusSource) -> str:
    return (
        f"its first {source.head_lines:,} lines differ from SimCSE's {source.file_name} "
        f"(sha256 of the first {source.head_bytes:,} bytes is not {source.head_sha256[:12]}...)"
    )


def _stream(
    response: http.client.HTTPResponse,
    out: BinaryIO,
    offset: int,
    total: int | None,
    head: _HeadCheck,
    source: CorpusSource,
    show_progress: bool,
) -> None:
    """Copy the body into `out`, at most `max_bytes` in all; a short body is a resumable failure."""
    written = offset
    with tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, desc=source.file_name, disable=not show_progress
    ) as bar:
        while chunk := response.read(CHUNK):
            written += len(chunk)
            if written > source.max_bytes:
                raise _Refused(f"it grew past {source.max_bytes:,} bytes, more than the {source.name} corpus can be")
            head.feed(chunk)
            out.write(chunk)
            bar.update(len(chunk))
    out.flush()
    if total is not None and written < total:
        raise OSError(f"the connection closed at byte {written:,} of {total:,}")


def count_lines(path: Path, limit: int) -> int:
    """Lines of a file (a last line without a newline counts), reading at most `limit` bytes."""
    lines, last = 0, b"\n"
    with open_regular(path) as handle:
        for _ in range(limit // CHUNK + 2):
            chunk = handle.read(CHUNK)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _check_complete(path: Path, source: CorpusSource, delete_on_failure: bool) -> None:
    """The head's digest and the line count of a complete file; a failure is _Refused (or one line if kept)."""
    size = path.stat().st_size
    with open_regular(path) as handle:
        head_ok = hashlib.sha256(handle.read(source.head_bytes)).hexdigest() == source.head_sha256
    problem = None if head_ok else _wrong_head(source)
    if problem is None and size > source.max_bytes:
        problem = f"it is {size:,} bytes, more than the {source.name} corpus can be"
    if problem is None:
        lines = count_lines(path, source.max_bytes)
        if lines != source.lines:
            problem = f"it has {lines:,} lines, not the {source.lines:,} of SimCSE's {source.file_name}"
    if problem is None:
        return
    if delete_on_failure:
        raise _Refused(problem)
    raise CsekitError(
        f"{path} is there but is not the {source.name} corpus: {problem}; move it away and download again"
    )
