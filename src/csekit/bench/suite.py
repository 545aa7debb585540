"""A bench suite: its YAML file read and checked (mistakes name the file and line), and its runs' folders."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from csekit.core.bounded_read import parse_yaml, read_bounded_text
from csekit.core.errors import CsekitError, absolute, at
from csekit.core.safe_names import check_label, check_name, child_path
from csekit.evaluation.published import load_published
from csekit.evaluation.tasks import TRANSFER_CLASSIFIERS, FileTask
from csekit.training.recipe_schema import MAX_SEED

if TYPE_CHECKING:
    from csekit.evaluation.task_set import TaskSet

SUITE_KEYS = {
    "name",
    "seeds",
    "tasks",
    "recipes",
    "sample_sentences",
    "baseline",
    "published",
    "paper_comparison",
    "transfer_classifier",
}
PAPER_COMPARISONS = ("scores", "deltas")
"""What a suite compares with its published file: `scores`, each task's number with the paper's (and the deltas);
`deltas` alone, each method's paired difference from the baseline with its paper's (a backbone not the paper's)."""
RECIPE_KEYS = {"recipe", "name", "set", "control", "paper"}


@dataclass
class SuiteRecipe:
    name: str
    path: Path
    overrides: list[str] = field(default_factory=list)
    control: str | None = None  # a recipe name: the summary also compares this recipe with it, seed by seed
    paper: str | None = None  # the entry of the suite's published file this recipe is compared with (default: name)

    @property
    def published_as(self) -> str:
        return self.paper or self.name


@dataclass
class Suite:
    name: str
    seeds: list[int]
    tasks: str
    recipes: list[SuiteRecipe]
    sample_sentences: int = 1000
    baseline: str | None = None  # a recipe name: the summary compares every other one with it, seed by seed
    published: Path | None = None  # the papers' numbers (benchmarks/published/*.yaml), compared task by task
    # The user's own files among `tasks` (pairs:PATH, retrieval:PATH, {pairs: PATH, columns: [...]}, {retrieval:
    # DIR, split: NAME}), relative to the suite and held absolute; `tasks` the rest.
    files: list[FileTask] = field(default_factory=list)
    transfer_classifier: str = "sklearn"  # SentEval's transfer protocol: sklearn or pytorch (the papers')
    paper_comparison: str = "scores"  # one of PAPER_COMPARISONS

    @property
    def pairs(self) -> list[Path]:
        """The pairs files among the suite's tasks."""
        return [task.path for task in self.files if task.kind == "pairs"]

    @property
    def retrieval(self) -> list[Path]:
        """The retrieval folders among the suite's tasks."""
        return [task.path for task in self.files if task.kind == "retrieval"]


def _line_of(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip(" -").startswith(f"{key}:"):
            return number
    return None


def _line_naming(text: str, key: str, value: str) -> int | None:
    """The line that sets `key` to `value`, in block or flow style (`{..., key: value}`)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if f"{key}: {value}" in line or f"{key}: '{value}'" in line or f'{key}: "{value}"' in line:
            return number
    return _line_of(text, key)


def _item_lines(node: Any, key: str, field: str | None = None) -> list[int]:
    """The line of each item of the top-level list `key` (none when the suite has no such list); with `field`, the
    line of that key inside an item that is a mapping (else the item's)."""
    if not isinstance(node, yaml.MappingNode):
        return []
    for key_node, value_node in node.value:
        if key_node.value == key and isinstance(value_node, yaml.SequenceNode):
            return [_field_line(item, field) for item in value_node.value]
    return []


def _field_line(item: yaml.Node, field: str | None) -> int:
    if field is not None and isinstance(item, yaml.MappingNode):
        for key_node, _ in item.value:
            if key_node.value == field:
                return int(key_node.start_mark.line) + 1
    return int(item.start_mark.line) + 1


def name_text(value: Any, where: str, what: str) -> str:
    """A name a suite gives (the suite's, a recipe's, a baseline or control): text, or a number YAML read from
    text that names it (`name: 2024` is "2024"). A list, a mapping, a boolean or null is one line, never its
    Python spelling written into results.md as a name."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise CsekitError(f"{where}: {what} must be text, found {type(value).__name__} {value!r}"[:300])
    return str(value)


def is_seed(value: Any) -> bool:
    """A seed a suite may give (and a run's results.json records): an integer in [0, MAX_SEED], not true/false."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; mistakes are CsekitErrors naming the file and line."""
    path = Path(path)
    text = read_bounded_text(path, "suite file", limit=2**20)
    raw, node = parse_yaml(text, str(path), "suite")
    raw = raw or {}
    if not isinstance(raw, dict):
        raise CsekitError(f"{path}: a suite is a mapping with keys {', '.join(sorted(SUITE_KEYS))}")
    for key in raw:
        if key not in SUITE_KEYS:
            raise CsekitError(
                f"{at(path, _line_of(text, key))}: unknown suite key {key!r}; expected {sorted(SUITE_KEYS)}"
            )
    seeds = raw.get("seeds", [42])
    if not isinstance(seeds, list) or not seeds or not all(is_seed(s) for s in seeds):
        raise CsekitError(
            f"{at(path, _line_of(text, 'seeds'))}: seeds must be a non-empty list of integers in [0, {MAX_SEED}]"
        )
    seed_lines = _item_lines(node, "seeds")
    for index, seed in enumerate(seeds):  # a repeated seed trained one run and counted it twice
        if seed in seeds[:index]:
            raise CsekitError(
                f"{at(path, seed_lines[index] if seed_lines else _line_of(text, 'seeds'))}: seed {seed} is given "
                "twice in seeds; each seed is one run of every recipe: remove the repeat"
            )
    tasks, files = _suite_tasks(path, text, raw.get("tasks", "sts"))
    entries = raw.get("recipes")
    if not isinstance(entries, list) or not entries:
        raise CsekitError(f"{at(path, _line_of(text, 'recipes'))}: recipes must be a non-empty list")
    recipes: list[SuiteRecipe] = []
    lines = zip(_item_lines(node, "recipes"), _item_lines(node, "recipes", "name"), strict=True)
    for entry, (line, name_line) in zip(entries, lines, strict=True):
        recipes.append(_suite_recipe(path, text, entry, [r.name for r in recipes], (line, name_line)))
    sample = raw.get("sample_sentences", 1000)
    if not isinstance(sample, int) or sample < 2:
        raise CsekitError(f"{at(path, _line_of(text, 'sample_sentences'))}: sample_sentences must be an integer >= 2")
    baseline = raw.get("baseline")
    if baseline is not None:
        baseline = name_text(baseline, at(path, _line_of(text, "baseline")), "baseline")
    if baseline is not None and baseline not in [r.name for r in recipes]:
        raise CsekitError(
            f"{at(path, _line_of(text, 'baseline'))}: baseline {baseline!r} is not a recipe name of this suite; "
            f"expected one of {[r.name for r in recipes]}"
        )
    _check_controls(path, text, recipes)
    classifier = raw.get("transfer_classifier", "sklearn")
    if classifier not in TRANSFER_CLASSIFIERS:
        raise CsekitError(
            f"{at(path, _line_of(text, 'transfer_classifier'))}: transfer_classifier must be one of "
            f"{', '.join(TRANSFER_CLASSIFIERS)}, found {classifier!r}"
        )
    comparison = _paper_comparison(path, text, raw, baseline)
    name = (
        path.stem if raw.get("name") in (None, "") else name_text(raw["name"], at(path, _line_of(text, "name")), "name")
    )
    check_label(name, f"{at(path, _line_of(text, 'name'))}: suite name", table_cell=False)  # results.md's heading
    return Suite(
        name,
        seeds,
        tasks,
        recipes,
        sample,
        None if baseline is None else str(baseline),
        _published_file(path, text, raw.get("published"), recipes),
        files,
        classifier,
        comparison,
    )


def _paper_comparison(path: Path, text: str, raw: dict[str, Any], baseline: Any) -> str:
    """The suite's `paper_comparison`; `deltas` needs the published file and the baseline its deltas are taken from."""
    value = raw.get("paper_comparison", "scores")
    where = at(path, _line_of(text, "paper_comparison"))
    if value not in PAPER_COMPARISONS:
        raise CsekitError(f"{where}: paper_comparison must be one of {', '.join(PAPER_COMPARISONS)}, found {value!r}")
    if value == "deltas" and (raw.get("published") is None or baseline is None):
        raise CsekitError(
            f"{where}: paper_comparison: deltas compares each method's difference from the baseline with its "
            "paper's: the suite needs both `published:` and `baseline:`"
        )
    return str(value)


def _suite_tasks(path: Path, text: str, value: Any) -> tuple[str, list[FileTask]]:
    """The suite's `tasks` (a comma list, or a YAML list of names and file tasks): SentEval's tasks as `--tasks`
    names them, and the user's files (`pairs:PATH`, `retrieval:PATH`, or mappings with `columns` and `split`, as
    `train.dev_task` takes them), relative to the suite and held absolute, each read and checked now."""
    from csekit.evaluation.file_tasks import file_task_set, split_file_entries
    from csekit.evaluation.suite import parse_tasks

    listed = value if isinstance(value, list) else [value]
    entries = [
        name.strip() for entry in listed for name in (str(entry).split(",") if not isinstance(entry, dict) else [])
    ]
    entries = [name for name in entries if name] + [entry for entry in listed if isinstance(entry, dict)]
    text_of_tasks = ",".join(str(entry) for entry in listed if not isinstance(entry, dict))
    try:
        others, files = split_file_entries(entries, base=Path(absolute(path)).parent, given_by="tasks")
        if others or not files:
            parse_tasks(",".join(others) if others else text_of_tasks)  # nothing named: the text as written
        file_task_set(files).read()
    except CsekitError as error:
        raise CsekitError(f"{at(path, _line_of(text, 'tasks'))}: {error}") from None
    return ",".join(others), files


def _suite_recipe(path: Path, text: str, entry: Any, taken: list[str], lines: tuple[int, int]) -> SuiteRecipe:
    """One entry of a suite's `recipes:` list, checked (`taken`: the names of the entries before it; `lines`: the
    entry's line and the line of its name, the entry's when the name is its recipe's file name)."""
    line, name_line = lines
    if isinstance(entry, str):
        entry = {"recipe": entry}
    if not isinstance(entry, dict) or "recipe" not in entry:
        raise CsekitError(f"{at(path, line)}: each recipe needs a `recipe:` path")
    unknown = set(entry) - RECIPE_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise CsekitError(
            f"{at(path, _line_of(text, key))}: unknown recipe key {key!r}; expected {sorted(RECIPE_KEYS)}"
        )
    recipe_path = (path.parent / str(entry["recipe"])).resolve()
    if not os.path.exists(recipe_path):  # Path.exists raised for a name too long (ENAMETOOLONG): a traceback
        raise CsekitError(f"{at(path, _line_of(text, 'recipe'))}: recipe {recipe_path} does not exist")
    overrides = entry.get("set") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise CsekitError(
            f"{at(path, _line_of(text, 'set'))}: set must be a list of key=value strings "
            "(`- train.lr=1e-4`, not `- train.lr: 1e-4`)"
        )
    raw_name = entry.get("name")
    name = recipe_path.stem if raw_name in (None, "") else name_text(raw_name, at(path, name_line), "a recipe name")
    # The name becomes the run folder OUTPUT/NAME-seedK: it must stay one folder inside OUTPUT.
    where = at(path, name_line)
    check_name(name, f"{where}: recipe name", folder="--output")
    check_label(name, f"{where}: recipe name")  # written into results.md's tables and results.csv as it is
    if name in taken:
        raise CsekitError(
            f"{where}: two recipes are named {name!r} (entries {taken.index(name) + 1} and "
            f"{len(taken) + 1}); a run would be trained and counted once for both: give one another name"
        )
    control = entry.get("control")
    if control is not None:
        control = name_text(control, at(path, _line_of(text, "control")), "control")
    paper = entry.get("paper")
    if paper is not None and (not isinstance(paper, str) or not paper):
        raise CsekitError(
            f"{at(path, _line_of(text, 'paper'))}: paper must name an entry of the suite's published file"
        )
    return SuiteRecipe(name, recipe_path, list(overrides), control, paper)


def _published_file(path: Path, text: str, value: Any, recipes: list[SuiteRecipe]) -> Path | None:
    """The suite's `published:` file (relative to the suite), read and checked now; each `paper:` names an entry."""
    if value is None:
        for recipe in recipes:
            if recipe.paper is not None:
                line = _line_naming(text, "paper", recipe.paper)
                raise CsekitError(f"{at(path, line)}: paper needs a `published:` file in the suite")
        return None
    if not isinstance(value, str) or not value:
        raise CsekitError(f"{at(path, _line_of(text, 'published'))}: published must be a path to a YAML file")
    published = (path.parent / value).resolve()
    try:
        rows = load_published(published)
    except CsekitError as error:
        raise CsekitError(f"{at(path, _line_of(text, 'published'))}: {error}") from None
    for recipe in recipes:
        if recipe.paper is not None and recipe.paper not in rows:
            raise CsekitError(
                f"{at(path, _line_naming(text, 'paper', recipe.paper))}: paper {recipe.paper!r} of {recipe.name!r} "
                f"is not an entry of {published}"
            )
    return published


def _check_controls(path: Path, text: str, recipes: list[SuiteRecipe]) -> None:
    """Each `control:` names another recipe of the suite."""
    names = [r.name for r in recipes]
    for recipe in recipes:
        if recipe.control is not None and (recipe.control not in names or recipe.control == recipe.name):
            raise CsekitError(
                f"{at(path, _line_naming(text, 'control', recipe.control))}: control {recipe.control!r} of "
                f"{recipe.name!r} is not another recipe name of this suite; "
                f"expected one of {[n for n in names if n != recipe.name]}"
            )


def suite_tasks(suite: Suite, n_jobs: int | None = 1) -> TaskSet:
    """The tasks the suite evaluates (not read yet): SentEval's as `tasks` names them, with its transfer classifier
    (`n_jobs` fits at once), then the user's files."""
    from csekit.evaluation.file_tasks import file_task_set
    from csekit.evaluation.suite import parse_tasks
    from csekit.evaluation.task_set import TaskSet

    senteval = parse_tasks(suite.tasks, suite.transfer_classifier, n_jobs) if suite.tasks else TaskSet()
    return senteval.joined(file_task_set(suite.files))


def run_dir(output: Path, recipe: SuiteRecipe, seed: int) -> Path:
    """`OUTPUT/NAME-seedK`, never outside OUTPUT (the name comes from the suite file, see `child_path`)."""
    return child_path(output, f"{recipe.name}-seed{seed}", f"suite recipe name {recipe.name!r}")
