"""`csekit evaluate --mteb ... --instructions llm2vec|FILE`: a per-task instruction for MTEB, as decoder papers scored.

LLM2Vec's MTEB numbers (unsupervised Mistral-7B 56.80, Sheared-LLaMA-1.3B 49.42 on MTEB's 56 tasks) were scored
with an instruction per task, read by its `encode` with the instruction's tokens left out of the pooling
(`csekit.encoding.instruction`). Its instruction set ships with csekit (`data/llm2vec_instructions.json`, its
source and licence inside: McGill-NLP/llm2vec `test_configs/mteb/task_to_instructions.json`, MIT). As its MTEB
wrapper (`experiments/mteb_eval_custom.py`: `encode` and `encode_queries` with the task's instruction,
`encode_corpus` with ""), the instruction goes to every text of a task except a retrieval task's documents (mteb 2's
`PromptType.document`); a task the set has no instruction for gets "" (the text's tokens pooled alone).

A user's own set is a JSON file: an object of MTEB task name -> instruction, or csekit's layout (that object under
"instructions").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError

SHIPPED = {"llm2vec": "data/llm2vec_instructions.json"}
"""The instruction sets shipped with csekit, by the name `--instructions` takes."""


@dataclass(frozen=True)
class InstructionSet:
    """Per MTEB task name, the instruction its texts follow; `name` says where the set came from."""

    name: str
    instructions: Mapping[str, str]

    def for_texts(self, task_name: str, prompt_type: Any) -> str:
        """The instruction of `task_name`'s texts of `prompt_type` (mteb's PromptType): "" for documents."""
        if getattr(prompt_type, "value", prompt_type) == "document":
            return ""
        return self.instructions.get(task_name, "")


def _instructions(value: Any, where: str) -> dict[str, str]:
    """The task -> instruction object of a set's JSON (csekit's layout or a bare object), else one line."""
    if isinstance(value, dict) and "instructions" in value:
        value = value["instructions"]
    if not isinstance(value, dict) or not value:
        raise CsekitError(f"{where}: an instruction set is a JSON object of MTEB task name -> instruction")
    for task, instruction in value.items():
        if not isinstance(instruction, str):
            raise CsekitError(f'{where}: the instruction of "{task}" must be a string, found {instruction!r}')
    return dict(value)


def read_instruction_set(spec: str | None, mteb: str | None) -> InstructionSet | None:
    """`--instructions`: a shipped set's name or a JSON file, read before the model loads; None without it."""
    if spec is None:
        return None
    if mteb is None:
        raise CsekitError("--instructions gives MTEB's tasks their instructions: it needs --mteb")
    if spec in SHIPPED:
        shipped = Path(str(resources.files("csekit").joinpath(SHIPPED[spec])))  # a package's files are files
        return InstructionSet(
            spec, _instructions(read_json_file(shipped, "instruction set"), f"csekit/{SHIPPED[spec]}")
        )
    path = Path(spec)
    if not path.is_file():
        raise CsekitError(
            f'--instructions "{spec}" is neither a shipped set ({", ".join(SHIPPED)}) nor a JSON file of task -> '
            "instruction"
        )
    return InstructionSet(str(path), _instructions(read_json_file(path, "instruction set"), str(path)))
