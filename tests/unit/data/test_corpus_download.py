"""`csekit download-data DIR --corpus wiki1m`: a resumable, checked, atomic download (a local server on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from csekit.core.errors import CsekitError
from csekit.data.corpus_download import CORPORA, CorpusSource, corpus_source, download_corpus

LINES = 50
HEAD_LINES = 10


def _corpus(seed: int = 0) -> bytes:
    return b"".join(f"sentence {seed}-{i} of a small corpus\n".encode() for i in range(LINES))


def _source(url: str, body: bytes, lines: int = LINES) -> CorpusSource:
    """The wiki1m checks scaled down: this corpus's line count and the digest of its first HEAD_LINES lines."""
    head = b"".join(body.splitlines(keepends=True)[:HEAD_LINES])
    return replace(
        CORPORA["wiki1m"],
        url=url,
        lines=lines,
        head_lines=HEAD_LINES,
        head_bytes=len(head),
        head_sha256=hashlib.sha256(head).hexdigest(),
        max_bytes=1 << 20,
    )


@dataclass
class _Served:
    """What the local server sends: `body`, optionally cut after `cut_at` bytes (the connection then closes)."""

    body: bytes = b""
    cut_at: int | None = None
    ranges: list[str | None] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[tuple[str, _Served]]:
    """An HTTP server on 127.0.0.1 in a thread, answering Range requests with 206 (as the hub does)."""
    served = _Served()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested = self.headers.get("Range")
            served.ranges.append(requested)
            start = int(requested.removeprefix("bytes=").rstrip("-")) if requested else 0
            if start >= len(served.body) and requested:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(served.body)}")
                self.end_headers()
                return
            part = served.body[start:]
            self.send_response(206 if requested else 200)
            if requested:
                self.send_header("Content-Range", f"bytes {start}-{len(served.body) - 1}/{len(served.body)}")
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            cut = None if served.cut_at is None else max(0, served.cut_at - start)
            self.wfile.write(part if cut is None else part[:cut])
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/wiki1m_for_simcse.txt", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_good_download_is_checked_and_lands_in_the_corpus_folder(tmp_path: Path, server: tuple[str, _Served]) -> None:
    url, served = server
    served.body = _corpus()
    written = download_corpus(
        tmp_path / "data", _source(url, served.body), https_only=False, timeout=10, show_progress=False
    )
    assert written == tmp_path / "data" / "corpus" / "wiki1m_for_simcse.txt"
    assert written.read_bytes() == served.body and _files(tmp_path / "data") == ["corpus/wiki1m_for_simcse.txt"]
    assert served.ranges == [None]
    again = download_corpus(tmp_path / "data", _source(url, served.body), https_only=False, show_progress=False)
    assert again == written and served.ranges == [None]  # already there and checked: nothing fetched


def test_a_truncated_download_is_kept_and_resumed_with_a_range_request(
    tmp_path: Path, server: tuple[str, _Served]
) -> None:
    url, served = server
    served.body, served.cut_at = _corpus(), 700  # past the head (10 lines, ~330 bytes), before the end
    source = _source(url, served.body)
    with pytest.raises(CsekitError, match=r"stopped after 700 bytes .*run the same command again to resume it"):
        download_corpus(tmp_path, source, https_only=False, timeout=10, show_progress=False)
    partial = tmp_path / "corpus" / ".wiki1m_for_simcse.txt.part"
    assert partial.read_bytes() == served.body[:700] and _files(tmp_path) == ["corpus/.wiki1m_for_simcse.txt.part"]

    served.cut_at = None
    written = download_corpus(tmp_path, source, https_only=False, timeout=10, show_progress=False)
    assert served.ranges == [None, "bytes=700-"]
    assert written.read_bytes() == served.body and _files(tmp_path) == ["corpus/wiki1m_for_simcse.txt"]


def test_a_partial_that_is_already_complete_is_checked_without_fetching_more(
    tmp_path: Path, server: tuple[str, _Served]
) -> None:
    url, served = server
    served.body = _corpus()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / ".wiki1m_for_simcse.txt.part").write_bytes(served.body)
    written = download_corpus(tmp_path, _source(url, served.body), https_only=False, timeout=10, show_progress=False)
    assert served.ranges == [f"bytes={len(served.body)}-"] and written.read_bytes() == served.body


@pytest.mark.parametrize("wrong", ["other head", "too few lines", "other head after a resume"])
def test_a_wrong_file_is_refused_and_nothing_is_left_behind(
    tmp_path: Path, server: tuple[str, _Served], wrong: str
) -> None:
    url, served = server
    expected = _corpus()
    if wrong == "other head":
        served.body = _corpus(seed=1)  # same size and line count, other sentences
    elif wrong == "too few lines":
        served.body = expected[: expected.index(b"\n", 600) + 1]  # the right head, then stops at a line's end
    else:  # a partial from the right file, the rest from another whose head differs
        served.body = _corpus(seed=1)
        (tmp_path / "data" / "corpus").mkdir(parents=True)
        (tmp_path / "data" / "corpus" / ".wiki1m_for_simcse.txt.part").write_bytes(expected[:100])
    message = "its first 10 lines differ" if "head" in wrong else "it has 20 lines, not the 50"
    with pytest.raises(CsekitError, match=f"{url}: {message}.*nothing of it was kept"):
        download_corpus(tmp_path / "data", _source(url, expected), https_only=False, timeout=10, show_progress=False)
    assert _files(tmp_path) == []
    if wrong != "other head after a resume":
        assert not (tmp_path / "data").exists()  # the folders it made are gone too


def test_a_wrong_head_is_refused_before_the_rest_arrives(
    tmp_path: Path, server: tuple[str, _Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's digest is checked as its last byte arrives: a wrong 120 MB file costs its first chunk."""
    import csekit.data.corpus_download as module

    url, served = server
    served.body = _corpus(seed=1) * 200  # 5 chunks of 64 KiB
    source = replace(_source(url, _corpus()), max_bytes=len(served.body) + 1)
    fed: list[int] = []
    original = module._HeadCheck.feed

    def counting(self: module._HeadCheck, data: bytes) -> None:
        fed.append(len(data))
        original(self, data)

    monkeypatch.setattr(module._HeadCheck, "feed", counting)
    with pytest.raises(CsekitError, match="its first 10 lines differ"):
        download_corpus(tmp_path, source, https_only=False, timeout=10, show_progress=False)
    assert sum(fed) <= module.CHUNK < len(served.body) and _files(tmp_path) == []


def test_plain_http_is_refused_before_any_request(tmp_path: Path, server: tuple[str, _Served]) -> None:
    url, served = server
    served.body = _corpus()
    with pytest.raises(CsekitError, match="refused: csekit fetches data over https only"):
        download_corpus(tmp_path, _source(url, served.body), show_progress=False)
    assert served.ranges == [] and _files(tmp_path) == []


def test_an_existing_wrong_corpus_is_reported_not_replaced(tmp_path: Path, server: tuple[str, _Served]) -> None:
    url, served = server
    served.body = _corpus()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "wiki1m_for_simcse.txt").write_bytes(_corpus(seed=2))
    with pytest.raises(CsekitError, match="is there but is not the wiki1m corpus: its first 10 lines differ"):
        download_corpus(tmp_path, _source(url, served.body), https_only=False, show_progress=False)
    assert served.ranges == [] and (tmp_path / "corpus" / "wiki1m_for_simcse.txt").read_bytes() == _corpus(seed=2)


def test_the_pinned_head_is_the_shared_sample_of_wiki1m(data_dir: Path) -> None:
    """The digest and length pinned for wiki1m are those of the sample in the shared data folder."""
    sample = data_dir / "corpus" / "wiki1m_for_simcse.head11913.txt"
    if not sample.is_file():
        pytest.skip("the shared data folder has no wiki1m sample")
    data = sample.read_bytes()
    source = corpus_source("wiki1m")
    assert (len(data), data.count(b"\n")) == (source.head_bytes, source.head_lines)
    assert hashlib.sha256(data).hexdigest() == source.head_sha256
    assert source.url.startswith("https://") and source.lines == 1_000_000


def test_download_data_names_the_corpora_it_knows(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from csekit.cli import app

    result = CliRunner().invoke(app, ["download-data", str(tmp_path / "d"), "--corpus", "wiki"])
    assert isinstance(result.exception, CsekitError)
    assert "--corpus: unknown corpus 'wiki' (did you mean \"wiki1m\"?); choose from ['wiki1m']" in str(result.exception)
    assert not (tmp_path / "d").exists()
