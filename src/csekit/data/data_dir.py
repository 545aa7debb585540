"""Locate (and, with a network, fetch) the SentEval evaluation data.

Two layouts are accepted so that users can point csekit at a folder they already have:

* csekit's own layout: ``<dir>/sts/STS12 .. STS16``, ``<dir>/sts/STSBenchmark``, ``<dir>/sts/SICK``;
* SentEval's ``data/downstream`` layout: ``<dir>/STS/STS12-en-test``, ``<dir>/STS/STSBenchmark``,
  ``<dir>/SICK`` (``<dir>`` may also be SentEval's ``data`` folder, one level up).

Transfer tasks live in ``<dir>/transfer/MR, CR, SUBJ, MPQA, SST2, TREC, MRPC`` (csekit) or in SentEval's
``<dir>/MR``, ..., ``<dir>/SST/binary``.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from tqdm import tqdm

from csekit.core.atomic import atomic_write_text, move_file, refuse_unsafe_folder, swap_in, write_file
from csekit.core.bounded_read import TEXT_FILE_LIMIT, read_bounded_bytes, read_bounded_text
from csekit.core.errors import CsekitError, absolute, did_you_mean
from csekit.data.senteval_checksums import SENTEVAL_FILES, mismatch

ENV_VAR = "CSEKIT_DATA"

_STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
TRANSFER_FOLDERS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
DATA_FOLDERS = (*_STS_YEARS, "STSBenchmark", "SICK", *TRANSFER_FOLDERS)
# Subsets per STS year, in SentEval's order (which fixes the order of its per-subset averages).
STS_SUBSETS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
        "STS13": ("FNWN", "headlines", "OnWN"),  # no SMT: not redistributable, absent as in SentEval
        "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
        "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
        "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    }
)

_HOW_TO_GET = (
    "pass --data-dir DIR or set CSEKIT_DATA=DIR, where DIR holds sts/STS12..STS16, sts/STSBenchmark and "
    "sts/SICK (or SentEval's data/downstream folder); with a network, `csekit download-data DIR` fetches it"
)


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """Return the data folder: the explicit argument, else $CSEKIT_DATA, else a CsekitError.

    The error says how to provide or download the data, because a missing data folder is the
    first thing a new user runs into.
    """
    if explicit is not None and str(explicit) != "":
        source, raw = "--data-dir", str(explicit)
    elif os.environ.get(ENV_VAR):
        source, raw = ENV_VAR, os.environ[ENV_VAR]
    else:
        raise CsekitError(f"no evaluation data folder given: {_HOW_TO_GET}")
    path = Path(raw).expanduser()
    if not os.path.isdir(path):
        raise CsekitError(
            f"data folder {absolute(path)} (from {source}) does not exist or is not a folder; {_HOW_TO_GET}"
        )
    return path


def optional_data_dir(data_dir: str | Path | None) -> Path | None:
    """The data folder if one is given (it may hold the corpus); without a dev task none is required."""
    try:
        return resolve_data_dir(data_dir)
    except CsekitError:
        if data_dir is not None:
            raise
        return None


def _candidates(data_dir: Path, folder: str) -> list[Path]:
    """Places where `folder` may live under `data_dir`, ours first, then SentEval's."""
    if folder in _STS_YEARS:
        senteval = [f"STS/{folder}-en-test", f"downstream/STS/{folder}-en-test"]
    elif folder == "STSBenchmark":
        senteval = ["STS/STSBenchmark", "downstream/STS/STSBenchmark"]
    elif folder == "SST2":  # SentEval keeps binary SST under SST/binary
        return [data_dir / rel for rel in ("transfer/SST2", "SST2", "SST/binary", "downstream/SST/binary")]
    elif folder in TRANSFER_FOLDERS:
        return [data_dir / rel for rel in (f"transfer/{folder}", folder, f"downstream/{folder}")]
    else:  # SICK
        senteval = ["downstream/SICK"]
    return [data_dir / rel for rel in (f"sts/{folder}", folder, *senteval)]


def find_task_dir(data_dir: str | Path, folder: str) -> Path:
    """Find the folder of one data set (STS12..STS16, STSBenchmark, SICK, a transfer task) in either layout."""
    if folder not in DATA_FOLDERS:
        raise CsekitError(f'unknown data set folder "{folder}"{did_you_mean(folder, DATA_FOLDERS)}')
    candidates = _candidates(Path(data_dir), folder)
    for path in candidates:
        if path.is_dir():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise CsekitError(f"{folder} data not found under {data_dir} (looked for {tried}); {_HOW_TO_GET}")


# --- download (needs a network; tests replace _fetch) ----------------------------------------------
# URLs and archive layouts as listed in SentEval's data/downstream/get_transfer_data.bash, over
# https only. The hosts are academic servers that are sometimes offline; failures are reported, not
# retried. Every file csekit reads from an archive is checked against senteval_checksums before use.

_STS_URLS = {
    "STS12": ("https://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip", "test-gold"),
    "STS13": ("https://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip", "test-gs"),
    "STS14": ("https://ixa2.si.ehu.es/stswiki/images/8/8c/STS2014-en-test.zip", "sts-en-test-gs-2014"),
    "STS15": ("https://ixa2.si.ehu.es/stswiki/images/d/da/STS2015-en-test.zip", "test_evaluation_task2a"),
    "STS16": (
        "https://ixa2.si.ehu.es/stswiki/images/9/98/STS2016-en-test.zip",
        "sts2016-english-with-gs-v1.0",
    ),
}
_STSB_URL = "https://ixa2.si.ehu.es/stswiki/images/4/48/Stsbenchmark.tar.gz"
_SICK_URL = "https://alt.qcri.org/semeval2014/task1/data/uploads/sick_{split}.zip"


def _fetch(url: str, target: Path) -> None:
    """Download `url` to `target` with a progress bar; network problems become CsekitError.

    Only https is fetched, and a redirect to plain http is refused: the files are checked against
    pinned hashes anyway, but a man in the middle should not even get to offer one.
    """
    _require_https(url)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            _require_https(response.geturl())
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name) as bar:
                write_file(target, lambda handle: _copy_stream(response, handle, bar))
    except (urllib.error.URLError, OSError) as exc:
        raise CsekitError(f"download of {url} failed ({exc}); the host may be offline, try again later") from exc


def _copy_stream(response: Any, out: BinaryIO, bar: Any) -> None:
    while chunk := response.read(1 << 16):
        out.write(chunk)
        bar.update(len(chunk))


def _require_https(url: str) -> None:
    if not url.lower().startswith("https://"):
        raise CsekitError(f"download of {url} refused: csekit fetches data over https only")


def _verify(path: Path, relative: str, source: str) -> None:
    """Check one extracted file against its pinned checksum before anything reads it."""
    if not path.is_file():
        raise CsekitError(f"{source}: the archive has no {path.name} (for {relative}); nothing from it was used")
    problem = mismatch(read_bounded_bytes(path, TEXT_FILE_LIMIT), SENTEVAL_FILES[relative])
    if problem is not None:
        raise CsekitError(
            f"downloaded file {relative} (from {source}) does not match its pinned checksum ({problem}); "
            "nothing from it was used: the download was damaged or changed on the way"
        )


def _extract(archive: Path, into: Path, source: str) -> None:
    """Unpack a .zip or .tar.gz (members outside `into` are refused); a damaged archive is a CsekitError."""
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(into)  # zipfile drops absolute paths and ".." from member names
        else:
            with tarfile.open(archive) as tf:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12: refuse unsafe members
                    tf.extractall(into, filter="data")
                else:
                    tf.extractall(into)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as error:
        raise CsekitError(f"downloaded archive from {source} cannot be unpacked ({error})") from None


def _moses_tokenizer() -> Callable[[str], str]:
    """Moses tokenisation (sacremoses) as SentEval applies it, or identity with a warning."""
    try:
        from sacremoses import MosesTokenizer  # type: ignore[import-not-found]
    except ImportError:
        warnings.warn(
            "sacremoses is not installed: the downloaded text is kept as distributed, without SentEval's "
            "Moses tokenisation and lower-casing, so scores will differ slightly from published ones "
            "(pip install sacremoses and download again to match them)",
            stacklevel=3,
        )
        return lambda s: s
    moses = MosesTokenizer(lang="en")
    return lambda s: moses.tokenize(s, escape=False, return_str=True)


def _rewrite_columns(path: Path, columns: dict[int, Callable[[str], str]], header: bool = False) -> None:
    """Apply a function to some tab-separated columns of a file (like SentEval's cut | moses | paste)."""
    lines = read_bounded_bytes(path, TEXT_FILE_LIMIT).decode("utf-8", errors="replace").splitlines()
    out = lines[:1] if header else []
    for line in lines[1:] if header else lines:
        fields = line.split("\t")
        out.append("\t".join(columns[i](f) if i in columns else f for i, f in enumerate(fields)))
    atomic_write_text(path, "\n".join(out) + "\n")


def download_senteval_data(dest: str | Path) -> Path:
    """Download STS12-16, STS-B and SICK from SentEval's sources into `dest` in csekit's layout.

    Needs a network. Mirrors SentEval's get_transfer_data.bash: STS and STS-B sentences are Moses-
    tokenised and lower-cased, SICK sentences are only tokenised (when sacremoses is installed).
    STS-B keeps SentEval's 7 columns. Returns `dest`, ready for --data-dir.
    """
    dest = Path(dest).expanduser()
    sts_root = dest / "sts"
    sts_root.mkdir(parents=True, exist_ok=True)
    tok = _moses_tokenizer()

    def tok_lower(s: str) -> str:
        return tok(s).lower()

    with tempfile.TemporaryDirectory(dir=dest) as tmp_name:
        tmp = Path(tmp_name)
        for year, (url, subdir) in _STS_URLS.items():
            archive = tmp / f"{year}.zip"
            _fetch(url, archive)
            _extract(archive, tmp / year, url)
            folder = tmp / year / subdir
            for subset in STS_SUBSETS[year]:
                for kind in ("input", "gs"):
                    if year == "STS16":  # STS16 ships STS2016.*.txt names
                        renamed = folder / f"STS2016.{kind}.{subset}.txt"
                        if renamed.is_file():
                            move_file(renamed, folder / f"STS.{kind}.{subset}.txt")
                    name = f"STS.{kind}.{subset}.txt"
                    _verify(folder / name, f"sts/{year}/{name}", url)
            for subset in STS_SUBSETS[year]:
                _rewrite_columns(folder / f"STS.input.{subset}.txt", {0: tok_lower, 1: tok_lower})
            swap_in(folder, sts_root / year)

        archive = tmp / "Stsbenchmark.tar.gz"
        _fetch(_STSB_URL, archive)
        _extract(archive, tmp / "stsb", _STSB_URL)
        folder = tmp / "stsb" / "stsbenchmark"
        for split in ("train", "dev", "test"):
            _verify(folder / f"sts-{split}.csv", f"sts/STSBenchmark/sts-{split}.csv", _STSB_URL)
        for split in ("train", "dev", "test"):
            csv = folder / f"sts-{split}.csv"
            rows = [line.split("\t") for line in read_bounded_text(csv, "STS-B file", TEXT_FILE_LIMIT).splitlines()]
            atomic_write_text(csv, "".join("\t".join([*r[:5], tok_lower(r[5]), tok_lower(r[6])]) + "\n" for r in rows))
        swap_in(folder, sts_root / "STSBenchmark")

        target = sts_root / "SICK"
        if not refuse_unsafe_folder(target):
            target.mkdir()
        for split in ("train", "trial", "test_annotated"):
            archive = tmp / f"sick_{split}.zip"
            url = _SICK_URL.format(split=split)
            _fetch(url, archive)
            _extract(archive, tmp / f"sick_{split}", url)
            _verify(tmp / f"sick_{split}" / f"SICK_{split}.txt", f"sts/SICK/SICK_{split}.txt", url)
            move_file(tmp / f"sick_{split}" / f"SICK_{split}.txt", target / f"SICK_{split}.txt")
            _rewrite_columns(target / f"SICK_{split}.txt", {1: tok, 2: tok}, header=True)
    return dest
