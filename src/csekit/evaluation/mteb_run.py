"""`csekit evaluate --mteb`: MTEB's tasks (or benchmarks) through the `mteb` package, on csekit's embeddings.

The names are checked before the model is loaded (an unknown one is one line saying where the names are listed).
mteb evaluates with no cache of its own (`cache=None`: nothing written while it runs); with `--output`, its result
files (`results/MODEL/REVISION/TASK.json`, `model_meta.json`, `run_settings.jsonl`, mteb's layout) are then
written by mteb's own `ResultCache` into a folder csekit made beside the JSON (`core/atomic.atomic_directory`:
held open, swapped in whole, the previous one kept on a failure), and every entry mteb wrote there is checked to
be a file or folder inside it before it is kept. MTEB's real tasks download their data from the Hugging Face hub;
when it cannot be fetched, that is one line. mteb's offline mock tasks (`MockSTSTask`, ...) can be named too.
With `--instructions` each task's texts follow its instruction (`csekit.evaluation.instructions`); the run says how
many tasks had one, and the JSON holds each task's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csekit.core.atomic import STAGING_MARKER, atomic_directory
from csekit.core.errors import CsekitError
from csekit.core.save_guard import guarded_save
from csekit.encoding.instruction import check_instruction_pooler
from csekit.evaluation.command_encoder import CommandEncoder
from csekit.evaluation.instructions import InstructionSet
from csekit.evaluation.mteb import CsekitMtebEncoder
from csekit.evaluation.mteb_meta import overlap, read_training_facts, training_data

MTEB_PREFIX = "mteb:"
"""An MTEB task's name in csekit's results (`tasks["mteb:STS12"]`)."""
FIND_NAMES = "list them with `mteb available-tasks` and `mteb available-benchmarks`"


def require_mteb() -> Any:
    """The mteb package, or one line saying how to install it."""
    try:
        import mteb
    except ImportError:
        raise CsekitError("--mteb needs the mteb package: pip install 'csekit[mteb]'") from None
    return mteb


def split_names(spec: str) -> list[str]:
    """`--mteb`'s comma list; a comma inside parentheses belongs to a benchmark's name (`MTEB(eng, v2)`)."""
    names, depth, current = [], 0, ""
    for char in spec:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth <= 0:
            names.append(current)
            current = ""
        else:
            current += char
    return [name.strip() for name in [*names, current] if name.strip()]


def mock_tasks() -> dict[str, Any]:
    """mteb's offline text mock tasks by name (they check a set-up without a network); none before mteb ships them."""
    try:
        from mteb.mocks import ALL_MOCK_TASK_TEST_GRID
    except ImportError:
        return {}
    return {task.metadata.name: type(task) for task in ALL_MOCK_TASK_TEST_GRID if task.metadata.modalities == ["text"]}


def _suggestion(error: KeyError) -> str:
    """mteb's "Did you mean: X?" of an unknown name."""
    return str(error.args[0] if error.args else "").partition("Did you mean:")[2].strip().rstrip("?")


def _tasks_named(mteb: Any, name: str) -> list[Any]:
    try:
        return list(mteb.get_benchmark(name).tasks)
    except KeyError as error:
        benchmark_hint = _suggestion(error)
    try:
        return [mteb.get_task(name)]
    except KeyError as error:
        hint = benchmark_hint if "(" in name else _suggestion(error)
    mock = mock_tasks().get(name)
    if mock is not None:
        return [mock()]
    suggestion = f" (did you mean {hint}?)" if hint else ""
    raise CsekitError(f'--mteb: "{name}" is no MTEB task or benchmark{suggestion}; {FIND_NAMES}')


def resolve_tasks(spec: str | None, whiten: bool = False) -> list[Any]:
    """The mteb tasks `--mteb` names (a benchmark gives all of its tasks), each once; [] without `--mteb`."""
    if spec is None:
        return []
    if whiten:
        raise CsekitError("--whiten does not go with --mteb (mteb scores the model's own embeddings)")
    mteb = require_mteb()
    tasks: dict[str, Any] = {}
    for name in split_names(spec):
        for task in _tasks_named(mteb, name):
            tasks.setdefault(task.metadata.name, task)
    if not tasks:
        raise CsekitError(f'--mteb "{spec}": no task given; {FIND_NAMES}')
    return list(tasks.values())


def fetch_errors() -> tuple[type[BaseException], ...]:
    """What loading a task's data raises when the hub cannot be reached (or holds no such data set)."""
    from datasets.exceptions import DatasetsError
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, DatasetsError]
    errors += [HfHubHTTPError, LocalEntryNotFoundError]
    try:
        import httpx

        errors.append(httpx.TransportError)
    except ImportError:  # huggingface_hub before 1.0 uses requests
        import requests

        errors.append(requests.RequestException)
    return tuple(errors)


def evaluate_tasks(model: CsekitMtebEncoder, tasks: Sequence[Any]) -> list[Any]:
    """mteb's TaskResult of each task, one task at a time (a task whose data cannot be fetched is one line)."""
    mteb = require_mteb()
    results = []
    for task in tasks:
        try:
            outcome = mteb.evaluate(
                model,
                task,
                cache=None,
                co2_tracker=False,
                encode_kwargs={"batch_size": model.batch_size},
                show_progress_bar=False,
            )
        except fetch_errors() as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise CsekitError(
                f"--mteb {task.metadata.name}: its data could not be fetched ({reason}); MTEB's tasks download their "
                "data from the Hugging Face hub: run with a network (or with the data in the hub cache, HF_HOME)"
            ) from None
        results += outcome.task_results
    return results


def result_folder(output: Path) -> Path:
    """Where mteb's result files go beside `--output FILE`: `FILE-STEM-mteb/` (never the file's own name)."""
    return output.with_name(f"{output.stem}-mteb")


def written_files(folder: Path, shown: Path) -> list[str]:
    """Every file under `folder`, relative to it; a link or anything but a file or folder is refused (`shown`)."""
    files = []
    for root, folders, names in os.walk(folder):
        for name in [*folders, *names]:
            path = Path(root, name)
            mode = os.lstat(path).st_mode
            relative = path.relative_to(folder)
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise CsekitError(
                    f"{shown / relative}: mteb wrote something that is not a file or a folder (a link?); nothing of "
                    f"this evaluation was kept in {shown}"
                )
            if stat.S_ISREG(mode) and name != STAGING_MARKER:
                files.append(relative.as_posix())
    return sorted(files)


def _save_results(staging: Path, results: Sequence[Any], meta: Any, shown: Path) -> list[str]:
    """mteb's own writer (`ResultCache.save_to_cache`) into the held staging folder, then its files checked."""
    import mteb

    cache = mteb.ResultCache(staging)
    for result in results:
        target = cache.get_task_result_path(task_name=result.task_name, model_name=meta)
        if not target.is_relative_to(staging) or ".." in target.parts:
            raise CsekitError(f"mteb would write {result.task_name}'s results outside {shown}: nothing was kept")
        cache.save_to_cache(result, meta)
    return written_files(staging, shown)


def save_results(folder: Path, results: Sequence[Any], meta: Any) -> list[str]:
    """mteb's result files in `folder`, replaced as a whole (a failure keeps the previous one); their names."""
    intact = f"{folder} was not written (a previous version is unchanged)"
    with guarded_save("mteb's results", folder.parent, intact), atomic_directory(folder) as staging:
        return _save_results(staging, results, meta, folder)


@dataclass
class MtebRun:
    """What `--mteb` adds to `csekit evaluate`: the tasks' scores, the lines it prints, the facts of its JSON."""

    tasks: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def task_scores(result: Any) -> dict[str, Any]:
    """A TaskResult as csekit's scores: `main_score` (mteb's mean over splits and subsets), then split -> subset."""
    scores: dict[str, Any] = {"main_score": result.get_score()}
    for split, rows in result.scores.items():
        scores[split] = {row.get("hf_subset", "default"): row["main_score"] for row in rows}
    return scores


def meta_facts(meta: Any) -> dict[str, Any]:
    """The ModelMeta fields csekit fills in, as JSON."""
    keys = ("name", "revision", "release_date", "n_parameters", "embed_dim", "max_tokens", "adapted_from")
    facts = {key: getattr(meta, key) for key in keys}
    datasets = meta.training_datasets
    facts["training_datasets"] = None if datasets is None else sorted(datasets)
    return facts


def zero_shot_line(meta: Any, names: Sequence[str], unnamed: Sequence[str]) -> str:
    """Whether the model is zero-shot on these tasks, as mteb judges it from `training_datasets`."""
    seen = overlap(meta, names)
    if seen is None:
        return "mteb: zero-shot unknown (what the model was trained on is not known to csekit or mteb)"
    note = f"; trained also on data without an MTEB name: {', '.join(unnamed)}" if unnamed else ""
    if seen:
        return f"mteb: not zero-shot on {', '.join(seen)} (the model was trained or selected on their data){note}"
    return f"mteb: zero-shot on these tasks{note}"


def encoded_task_names(tasks: Sequence[Any]) -> list[str]:
    """The names mteb encodes the tasks' texts under: an aggregate task's (CQADupstackRetrieval) are its subtasks'."""
    names: list[str] = []
    for task in tasks:
        subtasks = getattr(task, "tasks", None)
        names += [sub.metadata.name for sub in subtasks] if isinstance(subtasks, list) else [task.metadata.name]
    return names


def instruction_facts(instructions: InstructionSet, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The line and the JSON facts of `--instructions`: the set, and each task's instruction ("" where it has none)."""
    missing = [name for name in names if name not in instructions.instructions]
    none = f"; none for {', '.join(missing)} (their texts' tokens pooled alone)" if missing else ""
    line = f"mteb: instructions {instructions.name} ({len(names) - len(missing)} of {len(names)} tasks{none})"
    return line, {"set": instructions.name, "tasks": {name: instructions.instructions.get(name, "") for name in names}}


def run_mteb(
    encode: CommandEncoder,
    model: str,
    tasks: Sequence[Any],
    output: Path | None,
    instructions: InstructionSet | None = None,
) -> MtebRun:
    """Evaluate `tasks` with the command's encoder (each task's texts after its instruction, with `instructions`);
    with `output`, keep mteb's result files beside it."""
    if instructions is not None:
        check_instruction_pooler(encode.encoder.pooler)
    adapter = CsekitMtebEncoder(
        encode.encoder,
        batch_size=encode.batch_size,
        precision=encode.precision,
        source=model,
        instructions=instructions,
    )
    meta = adapter.mteb_model_meta
    results = evaluate_tasks(adapter, tasks)
    run = MtebRun()
    main_scores = {task.metadata.name: task.metadata.main_score for task in tasks}
    for result in results:
        scores = task_scores(result)
        run.tasks[f"{MTEB_PREFIX}{result.task_name}"] = scores
        splits = ", ".join(key for key in scores if key != "main_score")
        metric = main_scores.get(result.task_name, "main score")
        run.lines.append(f"{MTEB_PREFIX}{result.task_name}: {100 * scores['main_score']:.2f} ({metric}, {splits})")
    facts = read_training_facts(model)
    unnamed = training_data(facts).unnamed if facts is not None else ()
    run.lines.append(zero_shot_line(meta, [result.task_name for result in results], unnamed))
    run.facts = {"model_meta": meta_facts(meta), "training_data_without_mteb_name": list(unnamed)}
    if instructions is not None:
        line, run.facts["instructions"] = instruction_facts(instructions, encoded_task_names(tasks))
        run.lines.append(line)
    if output is not None:
        folder = result_folder(output)
        run.facts |= {"results": str(folder), "files": save_results(folder, results, meta)}
        run.lines.append(f"mteb's result files: {folder}")
    return run
