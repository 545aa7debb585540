"""Per-task instructions for MTEB, as LLM2Vec scored decoders: the pooled vectors equal a transcription of LLM2Vec's
`tokenize` and `get_pooling` (the instruction's tokens attended to, not pooled); instructions reach mteb's encode
calls (a retrieval task's documents get none); `--instructions` through the command; bad input in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_one_line_error, run_main
from tiny_decoders import make_tiny_decoder

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.instruction import instruction_ids
from csekit.evaluation.instructions import InstructionSet, read_instruction_set

TEXTS = ["a man plays the guitar .", "the dog runs", "she eats food quickly in the big park .", "it is red"]
INSTRUCTION = "find the big red ball in the park :"


def llm2vec_vectors(encoder: SentenceEncoder, instruction: str, texts: list[str], mode: str) -> torch.Tensor:
    """McGill-NLP/llm2vec 312adcf `llm2vec.py`: `_convert_to_str` (`f"{instruction.strip()} !@#$%^&*(){text}"`),
    `tokenize` (the parts joined again, padded on the left with EOS; `embed_mask` over the last len(text ids)
    tokens) and `get_pooling` with `skip_instruction` (mean or weighted_mean over `embed_mask`)."""
    tok = encoder.tokenizer
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        joined = [f"{instruction.strip()} !@#$%^&*(){text}" if instruction else f"!@#$%^&*(){text}" for text in texts]
        parts = [text.split("!@#$%^&*()") for text in joined]
        original = tok(["".join(t) for t in parts], return_tensors="pt", padding=True)
        embed_mask = torch.zeros_like(original["attention_mask"])
        for row, part in enumerate(parts):
            length = len(tok([part[1]], add_special_tokens=False)["input_ids"][0])
            if length > 0:
                embed_mask[row, -length:] = 1
    finally:
        tok.padding_side = side
    with torch.no_grad():
        states = encoder.backbone(**original).last_hidden_state
    lengths = embed_mask.sum(dim=-1)
    if mode == "mean":
        return torch.stack([states[i, -n:, :].mean(dim=0) for i, n in enumerate(lengths)])
    weights = torch.zeros(states.shape[:2])
    for i, n in enumerate(lengths):
        weights[i, -n:] = torch.arange(n) + 1
        weights[i] /= torch.clamp(weights[i].sum(), min=1e-9)
    return torch.sum(states * weights.unsqueeze(-1), dim=1)


@pytest.mark.parametrize("mode", ["mean", "weighted_mean"])
def test_instructed_vectors_equal_llm2vecs_embed_mask_pooling(mode: str) -> None:
    encoder = make_tiny_decoder("llama", pooler=mode, attention="bidirectional").eval()  # as a loaded model
    ours = torch.from_numpy(encoder.encode(TEXTS, instruction=INSTRUCTION))
    theirs = llm2vec_vectors(encoder, INSTRUCTION, TEXTS, mode)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # the empty instruction of a document: the text alone, its BOS token attended to and not pooled
    torch.testing.assert_close(
        torch.from_numpy(encoder.encode(TEXTS, instruction="")), llm2vec_vectors(encoder, "", TEXTS, mode)
    )
    # the instruction's tokens are left out of the pooling, not only added: pooling every token differs
    whole = [f"{INSTRUCTION} {text}" for text in TEXTS]
    assert not np.allclose(encoder.encode(whole), ours.numpy(), atol=1e-3)
    assert not np.allclose(encoder.encode(TEXTS), ours.numpy(), atol=1e-3)  # and the instruction is read


def test_the_pooling_mask_marks_the_texts_own_tokens_and_the_appended_eos() -> None:
    encoder = make_tiny_decoder("llama", pooler="last_token")
    ids = instruction_ids(encoder.pooler, encoder.tokenizer, ["the dog runs", ""], INSTRUCTION, 64)
    first = encoder.tokenizer.convert_ids_to_tokens(ids["input_ids"][0])
    assert first[0] == "<s>" and first[-4:] == ["the", "dog", "runs", "</s>"]
    assert ids["pooling_mask"][0] == [0] * (len(first) - 4) + [1] * 4
    assert sum(ids["pooling_mask"][1]) == 1  # an empty text: its EOS alone
    with pytest.raises(CsekitError, match="the cls pooler does not read by a mask"):
        instruction_ids(make_tiny_decoder("llama", pooler="cls").pooler, encoder.tokenizer, ["a"], "x", 64)


def test_the_shipped_llm2vec_set_names_its_source_and_covers_mteb_eng_v1() -> None:
    shipped = read_instruction_set("llm2vec", "STS12")
    assert shipped is not None and len(shipped.instructions) == 67
    assert shipped.instructions["STS12"] == "Retrieve semantically similar text:"
    assert shipped.for_texts("STS12", None) == "Retrieve semantically similar text:"
    assert shipped.for_texts("NQ", "query") == "Given a question, retrieve Wikipedia passages that answer the question:"
    assert shipped.for_texts("NQ", "document") == "" and shipped.for_texts("NotATask", None) == ""
    raw = json.loads((Path(__file__).parents[3] / "src/csekit/data/llm2vec_instructions.json").read_text("utf-8"))
    assert "McGill-NLP/llm2vec" in raw["source"] and raw["license"][0] == "MIT License"


def test_instructions_reach_mteb_encode_calls_through_the_command(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--instructions FILE` on a BERT read with the mean pooler, mteb's own evaluation of two mock tasks (no
    download): every encode call of the STS task and of the retrieval task's queries reaches csekit's encoder with
    its task's instruction, the documents' with ""; the line it prints and each task's instruction in the JSON."""
    pytest.importorskip("mteb")
    from csekit import cli
    from csekit.evaluation.mteb import CsekitMtebEncoder
    from csekit.evaluation.mteb_run import instruction_facts

    asked: list[tuple[str, str | None]] = []  # what mteb asked the adapter: (task, prompt type)
    reached: list[tuple[str | None, list[str]]] = []  # what reached csekit's encoder: (instruction, texts)
    adapter_encode, encoder_encode = CsekitMtebEncoder.encode, SentenceEncoder.encode

    def ask(self: Any, inputs: Any, *, task_metadata: Any, prompt_type: Any = None, **kwargs: Any) -> np.ndarray:
        asked.append((task_metadata.name, getattr(prompt_type, "value", prompt_type)))
        return adapter_encode(self, inputs, task_metadata=task_metadata, prompt_type=prompt_type, **kwargs)

    def reach(self: Any, texts: list[str], *args: Any, instruction: str | None = None, **kwargs: Any) -> np.ndarray:
        reached.append((instruction, list(texts)))
        return encoder_encode(self, texts, *args, instruction=instruction, **kwargs)

    monkeypatch.setattr(CsekitMtebEncoder, "encode", ask)
    monkeypatch.setattr(SentenceEncoder, "encode", reach)
    given = {"MockSTSTask": "the man :", "MockRetrievalTask": "a dog :", "STS12": "x"}
    own = tmp_path / "instructions.json"
    own.write_text(json.dumps(given), encoding="utf-8")
    output = tmp_path / "result.json"
    args = ["evaluate", str(tiny_model_dir), "--pooler", "mean", "--mteb", "MockSTSTask,MockRetrievalTask"]
    monkeypatch.setattr(sys, "argv", ["csekit", *args, "--instructions", str(own), "-o", str(output)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None), out

    assert len(asked) == len(reached) > 2
    expected = {("MockSTSTask", None): "the man :", ("MockRetrievalTask", "query"): "a dog :"}
    for (task, prompt_type), (instruction, texts) in zip(asked, reached, strict=True):
        assert instruction == expected.get((task, prompt_type), ""), (task, prompt_type, texts)
    assert set(asked) == {*expected, ("MockRetrievalTask", "document")}
    assert f"mteb: instructions {own} (2 of 2 tasks)" in out
    facts = json.loads(output.read_text(encoding="utf-8"))["mteb"]["instructions"]
    assert facts == {"set": str(own), "tasks": {"MockSTSTask": "the man :", "MockRetrievalTask": "a dog :"}}
    line, _ = instruction_facts(InstructionSet("s", {"A": "a :"}), ["A", "B"])
    assert line == "mteb: instructions s (1 of 2 tasks; none for B (their texts' tokens pooled alone))"


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--instructions", "llm2vec"], ["--instructions", "needs --mteb"]),
        (["--mteb", "MockSTSTask", "--instructions", "llm2vek"], ["neither a shipped set (llm2vec)"]),
        (["--mteb", "MockSTSTask", "--instructions", "BAD"], ["instruction set is not valid JSON"]),
        (["--mteb", "MockSTSTask", "--instructions", "LIST"], ["JSON object of MTEB task name -> instruction"]),
        (["--mteb", "MockSTSTask", "--instructions", "llm2vec"], ["the cls pooler does not read by a mask"]),
    ],
)
def test_bad_instructions_are_one_line(
    extra: list[str],
    needles: list[str],
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("mteb")
    (tmp_path / "bad.json").write_text('{"STS12": ', encoding="utf-8")
    (tmp_path / "list.json").write_text('["STS12"]', encoding="utf-8")
    paths = {"BAD": str(tmp_path / "bad.json"), "LIST": str(tmp_path / "list.json")}
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tiny_model_dir), *[paths.get(a, a) for a in extra])
    assert_one_line_error(code, err, *needles)
