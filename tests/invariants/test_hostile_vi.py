"""Hostile files VI: cases of the rules nobody had named, found by the red team attacking every input surface through
the command line (own task files, outputs, model folders, run folders). Each test failed before its fix: a
traceback, a link or FIFO found only after the work, a value silently lost, or a reason that named nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import assert_one_line_error, hostile_examples, make_corpus, run_main
from hypothesis import given
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.evaluation.retrieval_data import RELEVANCE_LIMIT, read_retrieval_set

CaptureErr = pytest.CaptureFixture[str]


def _beir(folder: Path, qrels: str) -> Path:
    """A BEIR folder of three documents and two queries whose qrels/test.tsv is `qrels` (after BEIR's header)."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    docs = "".join(f'{{"_id": "d{i}", "text": "document {i}"}}\n' for i in (1, 2, 3))
    (folder / "corpus.jsonl").write_text(docs, encoding="utf-8")
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n{"_id": "q2", "text": "b"}\n', "utf-8")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels, encoding="utf-8")
    return folder


# --- a qrels file: each judgement once, each relevance a number nDCG can sum -------------------------------------


@hostile_examples(40)
@given(relevance=st.integers(min_value=-(10**400), max_value=10**400) | st.integers(-5, 5))
def test_any_integer_relevance_is_read_within_its_bound_or_one_line(relevance: int) -> None:
    """A relevance of 10^400 was an OverflowError traceback in nDCG (`float(np.dot(...))` of Python ints)."""
    import tempfile

    from csekit.evaluation.retrieval import ranking_metrics

    with tempfile.TemporaryDirectory() as folder:
        beir = _beir(Path(folder), f"q1\td1\t{relevance}\nq2\td2\t1\n")
        try:
            retrieval = read_retrieval_set(beir)
        except CsekitError as error:
            assert abs(relevance) > RELEVANCE_LIMIT
            assert str(error).startswith(f"{beir / 'qrels' / 'test.tsv'}:2: ") and "\n" not in str(error)
            return
    assert abs(relevance) <= RELEVANCE_LIMIT
    metrics = ranking_metrics([["d1", "d2", "d3"], ["d2", "d1", "d3"]], [retrieval.qrels[q] for q in ("q1", "q2")])
    assert all(0 <= value <= 1 for value in metrics.values())


def test_a_query_and_document_judged_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """The second relevance replaced the first without a word (ids given twice were already refused)."""
    beir = _beir(tmp_path / "beir", "q1\td1\t1\nq2\td2\t1\nq1\td1\t2\n")
    with pytest.raises(CsekitError) as caught:
        read_retrieval_set(beir)
    message = str(caught.value)
    assert message.startswith(f"{beir / 'qrels' / 'test.tsv'}:4: ") and "(lines 2 and 4)" in message, message


def test_distinct_judgements_of_one_query_are_all_kept(tmp_path: Path) -> None:
    """Guard: one query judged against several documents, one document for several queries."""
    beir = _beir(tmp_path / "beir", "q1\td1\t2\nq1\td2\t1\nq2\td1\t0\nq2\td3\t1\n")
    assert read_retrieval_set(beir).qrels == {"q1": {"d1": 2, "d2": 1}, "q2": {"d1": 0, "d3": 1}}


# --- an output that cannot be written is refused before the work -------------------------------------------------


def _plant(kind: str, path: Path, victim: Path) -> None:
    if kind == "link-to-file":
        victim.write_text("yours\n", encoding="utf-8")
        path.symlink_to(victim)
    elif kind == "dangling-link":
        path.symlink_to(victim)
    elif kind == "link-to-folder":
        victim.mkdir()
        path.symlink_to(victim)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["link-to-file", "dangling-link", "link-to-folder", "fifo"])
@pytest.mark.parametrize("command", ["encode", "evaluate", "freq"])
def test_an_output_that_is_a_link_or_a_fifo_is_refused_before_the_work(
    command: str, kind: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """`--output` a link or a FIFO was refused only when the result was written, after the whole encoding,
    evaluation or count (a link to a folder was called a folder, the one fix a user should not make)."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=8)
    output, victim = tmp_path / "out.npy", tmp_path / "victim"
    _plant(kind, output, victim)
    args = {
        "evaluate": ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(tmp_path / "none")],
        "freq": ["freq", "--corpus", str(corpus), "--tokenizer", str(tiny_model_dir)],
        "encode": ["encode", str(tiny_model_dir), "--input", str(corpus)],
    }[command]
    code, err = run_main(monkeypatch, capsys, *args, "--output", str(output))
    reason = "not a regular file" if kind == "fifo" else "is a symbolic link"
    assert_one_line_error(code, err, str(output), reason)
    assert "encoding" not in err
    if kind == "link-to-file":
        assert victim.read_text(encoding="utf-8") == "yours\n"
    if kind == "link-to-folder":
        assert list(victim.iterdir()) == []
    if kind == "dangling-link":
        assert not victim.exists()


# --- a model folder's weights: a tensor of another shape is named ------------------------------------------------


def test_a_weight_of_another_shape_is_one_line_naming_it(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """The error was transformers' "You set `ignore_mismatched_sizes` to `False` ... look at the above report!",
    a report csekit's quiet loading hides: no weight, no shapes."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = tiny_model_dir / "model.safetensors"
    tensors = load_file(weights)
    name = next(key for key in sorted(tensors) if key.endswith("attention.self.query.weight"))
    tensors[name] = torch.zeros(5, 5)
    weights.unlink()
    save_file(tensors, weights)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=4)
    args = ("encode", str(tiny_model_dir), "-i", str(corpus), "-o", str(tmp_path / "x.npy"))
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(tiny_model_dir), name, "[5, 5]")
    assert "look at" not in err


# --- a checkpoint file that is there but is not a file is named for what it is -----------------------------------


@pytest.mark.parametrize("kind", ["link-to-dev-zero", "folder", "fifo"])
def test_a_checkpoint_file_that_is_a_device_folder_or_fifo_is_named_as_such_not_missing(
    kind: str, tmp_path: Path
) -> None:
    """`is_file()` read a link to /dev/zero, a folder or a FIFO at rng_state_0.pt as missing: "the run was saved by
    fewer processes ... resume with as many processes as the run had", a fix that cannot work."""
    from csekit.training.checkpoint import load_rng_state, rng_file

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    path = checkpoint / rng_file(0)
    if kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    with pytest.raises(CsekitError) as caught:
        load_rng_state(checkpoint, 0)
    message = str(caught.value)
    assert str(path) in message and "missing" not in message and "\n" not in message, message
    assert ("a folder" if kind == "folder" else "not a regular file") in message
    if kind == "folder":
        path.rmdir()
    else:
        path.unlink()
    with pytest.raises(CsekitError, match="is missing"):  # guard: nothing there is still "missing"
        load_rng_state(checkpoint, 0)


# --- a model folder's weights: every tensor is floating point, or an index buffer ---------------------------------

SAFETENSORS_DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"]


@hostile_examples(30)
@given(
    stored=st.dictionaries(
        st.sampled_from(["encoder.weight", "encoder.bias", "embeddings.position_ids", "token_type_ids", "scale", "x"]),
        st.sampled_from(SAFETENSORS_DTYPES),
        min_size=1,
    ),
    suffix=st.sampled_from(["safetensors", "bin"]),
)
def test_any_weight_file_is_refused_exactly_when_a_tensor_is_not_floating_point(stored: dict, suffix: str) -> None:
    """An I32 or BOOL copy of a float weight loaded as its integer part (zeros for trained weights), silently: the
    rule reads every weight file's dtypes (safetensors' header, a .bin's tensors on the meta device) before
    transformers does, and refuses any tensor that is not floating point, except the integer index buffers."""
    import tempfile

    import torch
    from safetensors.torch import save_file

    from csekit.encoding.weight_files import FLOATING_DTYPES, check_weight_files

    torch_dtypes = {"I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}
    torch_dtypes |= {"BOOL": torch.bool, **{k: getattr(torch, v) for k, v in FLOATING_DTYPES.items()}}
    tensors = {name: torch.ones(2, 3, dtype=torch_dtypes[dtype]) for name, dtype in stored.items()}
    wrong = [name for name, dtype in stored.items() if dtype not in FLOATING_DTYPES and not name.endswith("_ids")]
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / f"model-00001-of-00002.{suffix}"  # a shard: every weight file is read
        if suffix == "bin":
            torch.save(tensors, weights)
        else:
            save_file(tensors, weights)
        try:
            check_weight_files(Path(folder), {}, Path(folder) / "config.json")
        except CsekitError as error:
            assert wrong, error
            message = str(error)
            assert message.startswith(f"{weights}: tensor ") and "\n" not in message
            assert any(repr(name) in message for name in wrong)
            return
    assert not wrong, wrong


def test_a_model_whose_weights_are_stored_as_integers_is_one_line_before_it_loads(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """`csekit encode` loaded an I32 copy of the weights (their integer parts: zeros) and wrote embeddings."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = tiny_model_dir / "model.safetensors"
    tensors = {name: tensor.to(torch.int32) for name, tensor in load_file(weights).items()}
    weights.unlink()
    save_file(tensors, weights)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=4)
    output = tmp_path / "x.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(tiny_model_dir), "-i", str(corpus), "-o", str(output))
    assert_one_line_error(code, err, str(weights), "stored as I32")
    assert not output.exists()


@hostile_examples(20)
@given(content=st.binary(max_size=300) | st.sampled_from([b"PK\x03\x04" + b"\x00" * 40, b"\x80\x02}q\x00."]))
def test_any_bytes_as_a_pytorch_weights_file_are_read_or_one_line(content: bytes) -> None:
    """A .bin is read (weights_only, on the meta device) only for its dtypes: whatever its bytes, the answer is a
    mapping of tensors or one line naming the file, never a traceback."""
    import tempfile

    from csekit.encoding.weight_files import check_weight_files

    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "pytorch_model.bin"
        weights.write_bytes(content)
        try:
            check_weight_files(Path(folder), {}, Path(folder) / "config.json")
        except CsekitError as error:
            assert str(error).startswith(f"{weights}: ") and "\n" not in str(error)


@hostile_examples(20)
@given(
    dtype=st.sampled_from(["F32", "I64", "F8_E4M3"])
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    | st.none()
    | st.integers()
    | st.floats(allow_nan=False)
)
def test_any_json_dtype_in_a_safetensors_header_is_read_or_one_line(dtype: object) -> None:
    """A header's dtype is any JSON value an attacker writes: a list was "unhashable type" in the dtype check."""
    import json
    import struct
    import tempfile

    from csekit.encoding.weight_files import check_weight_files

    header = json.dumps({"encoder.weight": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}).encode()
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "model.safetensors"
        weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
        try:
            check_weight_files(Path(folder), {}, Path(folder) / "config.json")
        except CsekitError as error:
            assert str(error).startswith(f"{weights}: tensor 'encoder.weight' is stored as ") and dtype != "F32"
            return
    assert dtype == "F32"
