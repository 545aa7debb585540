"""What csekit knows of the files it takes from SentEval's archives, checked before they are used.

`csekit download-data` fetches STS12-16, STS-B and SICK from their original hosts. The archives
themselves could not be hashed when this table was made (no network), so it pins the files *inside*
them, computed from the SentEval-processed copy of the data (the one SimCSE and SLT-FAI distribute,
see docs/reliability.md):

* gold-score files (`STS.gs.*`) are used as the archive holds them: their SHA-256 is pinned;
* STS-B and SICK files get their sentence columns re-tokenised: the SHA-256 of the other columns
  (ids, genre, gold score, entailment label) and the number of lines are pinned;
* STS sentence files (`STS.input.*`) are re-tokenised in every column: only their number of lines is
  pinned. A changed sentence in them is not detected.

Line ends (CRLF or LF) and a final newline do not change a column digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Pinned:
    """One file as the archive holds it: the SHA-256 of the whole file (or of `columns`), its lines."""

    sha256: str | None
    columns: tuple[int, ...] | None = None  # None: the whole file's bytes are hashed
    lines: int | None = None


STSB_KEPT = (0, 1, 2, 3, 4)  # genre, file, year, id, score (the sentences are columns 5 and 6)
SICK_KEPT = (0, 3, 4)  # pair_ID, relatedness_score, entailment_judgment

SENTEVAL_FILES: Mapping[str, Pinned] = MappingProxyType(
    {
        "sts/STS12/STS.gs.MSRpar.txt": Pinned("5526be59228bc34ccb3cb6f1f56c0d7278d3419b8886713ae016fd92b151f19c"),
        "sts/STS12/STS.input.MSRpar.txt": Pinned(None, lines=750),
        "sts/STS12/STS.gs.MSRvid.txt": Pinned("9c6096c6bcfb0144c8bbddb00900ca9198c88498630cd0c8f08d18365f1d7150"),
        "sts/STS12/STS.input.MSRvid.txt": Pinned(None, lines=750),
        "sts/STS12/STS.gs.SMTeuroparl.txt": Pinned("708530c4d006d06881f3289fce35d624d7efe562dcf0fe5f8aa0eec3a135f6d4"),
        "sts/STS12/STS.input.SMTeuroparl.txt": Pinned(None, lines=459),
        "sts/STS12/STS.gs.surprise.OnWN.txt": Pinned(
            "088d8ca22c0aa406e4a5d2e6e308a4f38b482b8e736c2445a38ffb6e4c4fb4fd"
        ),
        "sts/STS12/STS.input.surprise.OnWN.txt": Pinned(None, lines=750),
        "sts/STS12/STS.gs.surprise.SMTnews.txt": Pinned(
            "aa6dfc868db333c43dc59be14d46fa6587c7ebddc0d497e717f647bf35121cf1"
        ),
        "sts/STS12/STS.input.surprise.SMTnews.txt": Pinned(None, lines=399),
        "sts/STS13/STS.gs.FNWN.txt": Pinned("8ca95b7228119578e2007839cf7969f22c4f1fd41fd610c4b7f9683072d98066"),
        "sts/STS13/STS.input.FNWN.txt": Pinned(None, lines=189),
        "sts/STS13/STS.gs.headlines.txt": Pinned("f49f64089011436dd296ef384c07160219406feef7dc4b9fa2af52a519f32bc6"),
        "sts/STS13/STS.input.headlines.txt": Pinned(None, lines=750),
        "sts/STS13/STS.gs.OnWN.txt": Pinned("0cd497aaddb00a2fb6db25f77bccfc09e8aa012e11549b81b434bab1a27ad954"),
        "sts/STS13/STS.input.OnWN.txt": Pinned(None, lines=561),
        "sts/STS14/STS.gs.deft-forum.txt": Pinned("ba6dc76696b5c93985590a325b4d142449932cdf0d715b2bab1b1743fe3c488c"),
        "sts/STS14/STS.input.deft-forum.txt": Pinned(None, lines=450),
        "sts/STS14/STS.gs.deft-news.txt": Pinned("105c5b333abd50c274efb4dae9e3e0dab36ed63eee780cfb49955b1586bd62f2"),
        "sts/STS14/STS.input.deft-news.txt": Pinned(None, lines=300),
        "sts/STS14/STS.gs.headlines.txt": Pinned("f243c34647255cd0b994565ed4f58dd31506e7d9c9d6250d1a6dd14095625832"),
        "sts/STS14/STS.input.headlines.txt": Pinned(None, lines=750),
        "sts/STS14/STS.gs.images.txt": Pinned("fc994ebacc7074c332626fa9e29542d7340a48a3cdb999b47cdb59c378523a62"),
        "sts/STS14/STS.input.images.txt": Pinned(None, lines=750),
        "sts/STS14/STS.gs.OnWN.txt": Pinned("1c80147df270ea4cfce14a47ed29f8a2f10d5dc016d02836077fd786ff7f535b"),
        "sts/STS14/STS.input.OnWN.txt": Pinned(None, lines=750),
        "sts/STS14/STS.gs.tweet-news.txt": Pinned("0098c644bfeaa2d511a8297b1940771865900c372c9dd49a62726dc5ec02c9a3"),
        "sts/STS14/STS.input.tweet-news.txt": Pinned(None, lines=750),
        "sts/STS15/STS.gs.answers-forums.txt": Pinned(
            "1644301a7540e5484da285002e9269062852efb2272be614cad99c9530f6a102"
        ),
        "sts/STS15/STS.input.answers-forums.txt": Pinned(None, lines=2000),
        "sts/STS15/STS.gs.answers-students.txt": Pinned(
            "028db213140f8c7aef7497c4ae38b6380938f20359852231669c83dce11c3701"
        ),
        "sts/STS15/STS.input.answers-students.txt": Pinned(None, lines=1500),
        "sts/STS15/STS.gs.belief.txt": Pinned("5736192faaccbdbecd0ef6b73ec04b24115cd2e48d55dc3b1b170da3d2a81c75"),
        "sts/STS15/STS.input.belief.txt": Pinned(None, lines=2000),
        "sts/STS15/STS.gs.headlines.txt": Pinned("e8e432f769c8a94ddb62ae3343890ac24a9dd78a116d56c707313bc59413dd56"),
        "sts/STS15/STS.input.headlines.txt": Pinned(None, lines=1500),
        "sts/STS15/STS.gs.images.txt": Pinned("ed8878209098c77ca7f02ac413d3fd698f92ad3425999555e50fda89fc46012a"),
        "sts/STS15/STS.input.images.txt": Pinned(None, lines=1500),
        "sts/STS16/STS.gs.answer-answer.txt": Pinned(
            "332efd741b0cb247d20dd2a6cec854360c921c7e6b395f328f562d8d26057214"
        ),
        "sts/STS16/STS.input.answer-answer.txt": Pinned(None, lines=1572),
        "sts/STS16/STS.gs.headlines.txt": Pinned("01e33a95996201a6e81e3cce9eda0f15048b77613ea64dce2929bb35479f7d85"),
        "sts/STS16/STS.input.headlines.txt": Pinned(None, lines=1498),
        "sts/STS16/STS.gs.plagiarism.txt": Pinned("29984944a91aaff484f2b2e5d4d434fc8a6f5ef6f578a880cccd2786f5142fdc"),
        "sts/STS16/STS.input.plagiarism.txt": Pinned(None, lines=1271),
        "sts/STS16/STS.gs.postediting.txt": Pinned("81947ed9dbe7f85b7bd249df68ed5c7b2f16f06390ad568eb5554b1e26bc5577"),
        "sts/STS16/STS.input.postediting.txt": Pinned(None, lines=3287),
        "sts/STS16/STS.gs.question-question.txt": Pinned(
            "cf9ebf9d140191f73620cda0560947ad9283c910735d0d541b8a401a5e64afb0"
        ),
        "sts/STS16/STS.input.question-question.txt": Pinned(None, lines=1555),
        "sts/STSBenchmark/sts-train.csv": Pinned(
            "5e765a5b319bcb43bae43ed5b06de51d793aabe828cc0f51c357045b6bf9a194", STSB_KEPT, 5749
        ),
        "sts/STSBenchmark/sts-dev.csv": Pinned(
            "2555b11c91d3a83cb5a20819a1d4e028c8dec999f644273e2443084c0ca64fff", STSB_KEPT, 1500
        ),
        "sts/STSBenchmark/sts-test.csv": Pinned(
            "2416bee4a1e270a82c14bfd055de0627f0cc1056d2dc51f01239315547db550e", STSB_KEPT, 1379
        ),
        "sts/SICK/SICK_train.txt": Pinned(
            "55d043816f7dc822d762dce11a4b98f2b30c15dfba7cd214180682de88d3f760", SICK_KEPT, 4501
        ),
        "sts/SICK/SICK_trial.txt": Pinned(
            "001ccf53064f0c32c1fd054426a11b0b2b9b3405f8d63ed9667634f43d627c4b", SICK_KEPT, 501
        ),
        "sts/SICK/SICK_test_annotated.txt": Pinned(
            "ec3b6b999a2d10d8cbae55049604be77071a1ed030645ccf8436d4b99ebfb167", SICK_KEPT, 4928
        ),
    }
)


def split_lines(data: bytes) -> list[bytes]:
    """Lines of a file, independent of CRLF or LF line ends and of a final newline."""
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def mismatch(data: bytes, pinned: Pinned) -> str | None:
    """Why `data` is not the pinned file (a short reason), or None when it is."""
    lines = split_lines(data)
    if pinned.lines is not None and len(lines) != pinned.lines:
        return f"{len(lines)} lines, expected {pinned.lines}"
    if pinned.sha256 is None:
        return None
    if pinned.columns is None:
        actual = hashlib.sha256(data).hexdigest()
    else:
        kept = (b"\t".join(f for i, f in enumerate(line.split(b"\t")) if i in pinned.columns) for line in lines)
        actual = hashlib.sha256(b"\n".join(kept)).hexdigest()
    if actual != pinned.sha256:
        what = "SHA-256" if pinned.columns is None else f"SHA-256 of columns {', '.join(map(str, pinned.columns))}"
        return f"{what} is {actual[:16]}..., expected {pinned.sha256[:16]}..."
    return None
