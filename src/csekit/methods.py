"""The one list of csekit's methods, and what each shipped recipe has been checked against.

`csekit --help`, `csekit recipes`, the README's methods table, pyproject.toml's description and
docs/architecture.md are tested against this module (tests/methods/test_methods.py), so no two of them can name
different methods. Pure data (its table rows escaped by csekit.core.report_cells): the command line reads it without
a model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from csekit.core.report_cells import markdown_row, markdown_rule


@dataclass(frozen=True)
class Method:
    """A method as a user meets it: its name, its paper, and the recipe to start from."""

    name: str
    paper: str
    recipe: str | None
    usage: str = ""
    """How to use a method that ships no recipe of its own (its parts beside another method's)."""
    measured_in: str = ""
    """Where a method without a recipe of its own was measured (a recipe's status says it for the others)."""


METHODS: tuple[Method, ...] = (
    Method("SimCSE", "Gao et al., 2021", "simcse-bert-base.yaml"),
    Method("DCLR", "Zhou et al., 2022", "dclr-bert-base.yaml"),
    Method("WhitenedCSE", "Zhuo et al., 2023", "whitenedcse-bert-base.yaml"),
    Method("SLT-FAI", "Wang et al., 2023", "slt-fai-simcse.yaml"),
    Method("OssCSE", "Shi et al., 2023", "osscse-bert-base.yaml"),
    Method("ESimCSE", "Wu et al., 2022", "esimcse-bert-base.yaml"),
    Method("SNCSE", "Wang et al., 2022", "sncse-bert-base.yaml"),
    Method("PromptBERT", "Jiang et al., 2022", "promptbert-bert-base.yaml"),
    Method("MixCSE", "Zhang et al., 2022", "mixcse-bert-base.yaml"),
    Method("RankCSE", "Liu et al., 2023", "rankcse-bert-base.yaml"),
    Method("DiffCSE", "Chuang et al., 2022", "diffcse-bert-base.yaml"),
    Method("TSDAE", "Wang et al., 2021", "tsdae-bert-base.yaml"),
    Method("Contrastive Tension", "Carlsson et al., 2021", "ct-bert-base.yaml"),
    Method("Matryoshka", "Kusupati et al., 2022", "matryoshka-simcse-minilm.yaml"),
    Method("Cropping views", "González-Márquez et al., 2026", "cropping-bert-base.yaml"),
    Method(
        "MLM auxiliary",
        "Gao et al., 2021",
        None,
        "objective `{name: mlm, weight: 0.1}` beside `infonce` in any recipe",
        "docs/results.md, The methods of issue 52 (the controlled suite's simcse-mlm-minilm)",
    ),
    Method("LLM2Vec", "BehnamGhader et al., 2024", "llm2vec-simcse-sheared-llama.yaml"),
)
"""csekit's methods, in the order every list of them shows."""

STATUSES: Mapping[str, str] = {
    "reproduced": "trained here at the paper's settings over seeds and compared with its published numbers "
    "(csekit bench's papers suites)",
    "measured": "trained here to a measured score (its source says where and on what); not a paper reproduction",
    "never-run": "never trained to a score here: only its steps are checked, on tiny models "
    "(tests/invariants/test_recipe_losses.py); nothing yet says how well it trains",
}
"""What a recipe has been checked against, from the strongest to the weakest claim."""


@dataclass(frozen=True)
class RecipeCheck:
    """What one shipped recipe is for and what it has been checked against."""

    methods: tuple[str, ...]
    status: str
    source: str
    """Where the measurement is (a docs page and section), or why there is none."""


_CONTROLLED = "docs/results.md, Table (2026-11-24): the controlled suite's shared settings (50 steps, 3 seeds)"
_CONTROLLED_52 = "docs/results.md, The methods of issue 52: the controlled suite's shared settings (50 steps, 3 seeds)"
_PAPER = "no GPU run at the paper's settings yet; benchmarks/suites/papers-*.yaml compare it with the published row"
_ABLATION = "an ablation of the paper's; no GPU run at the paper's settings yet"
_OFFLINE = "no run beyond its steps yet"
_LLM = "no LLM weights could be used here; tested on tiny random decoders only (docs/decoders.md)"
_UNPUBLISHED = "a composition no paper published; no run beyond its steps yet"


def _check(methods: str, status: str, source: str) -> RecipeCheck:
    return RecipeCheck(tuple(methods.split(" + ")), status, source)


RECIPE_CHECKS: Mapping[str, RecipeCheck] = {
    "quickstart": _check("SimCSE", "measured", "docs/quickstart.md: 73.69 -> 77.06 STS Avg. on a 2-core CPU"),
    "domain-adapt": _check("SimCSE", "measured", "docs/evaluation.md, Your own domain: no step beat the start"),
    "simcse-bert-base": _check("SimCSE", "never-run", _PAPER),
    "simcse-roberta-base": _check("SimCSE", "never-run", _PAPER),
    "dclr-bert-base": _check("DCLR", "never-run", _PAPER),
    "dclr-roberta-base": _check("DCLR", "never-run", _PAPER),
    "dclr-bert-base-authors-code": _check("DCLR", "never-run", _PAPER),
    "dclr-ablation-no-noise": _check("DCLR", "never-run", _ABLATION),
    "dclr-ablation-no-weighting": _check("DCLR", "never-run", _ABLATION),
    "dclr-ablation-random-noise": _check("DCLR", "never-run", _ABLATION),
    "dclr-ablation-self-weighting": _check("DCLR", "never-run", _ABLATION),
    "dclr-minilm": _check("DCLR", "measured", _CONTROLLED),
    "whitenedcse-bert-base": _check("WhitenedCSE", "never-run", _PAPER),
    "whitenedcse-roberta-base": _check("WhitenedCSE", "never-run", _PAPER),
    "whitenedcse-bert-base-group": _check("WhitenedCSE", "never-run", _ABLATION),
    "whitenedcse-bert-base-pca": _check("WhitenedCSE", "never-run", _ABLATION),
    "whitenedcse-bert-base-zca": _check("WhitenedCSE", "never-run", _ABLATION),
    "whitenedcse-bert-base-positives": _check("WhitenedCSE", "never-run", _ABLATION),
    "whitenedcse-minilm": _check("WhitenedCSE", "measured", _CONTROLLED),
    "slt-fai-simcse": _check("SLT-FAI", "never-run", _PAPER),
    "slt-fai-simcse-no-at": _check("SLT-FAI", "never-run", _ABLATION),
    "slt-fai-simcse-no-isf": _check("SLT-FAI", "never-run", _ABLATION),
    "slt-fai-consert-sts": _check("SLT-FAI", "never-run", _PAPER),
    "slt-fai-minilm": _check("SLT-FAI", "measured", _CONTROLLED),
    "consert-views-minilm": _check("SLT-FAI", "never-run", "ConSERT's views and loss, SLT-FAI's base; " + _OFFLINE),
    "osscse-bert-base": _check("OssCSE", "never-run", _PAPER),
    "osscse-roberta-base": _check("OssCSE", "never-run", _PAPER),
    "osscse-bert-base-no-margin": _check("OssCSE", "never-run", _ABLATION),
    "osscse-bert-base-no-recall": _check("OssCSE", "never-run", _ABLATION),
    "osscse-roberta-base-no-margin": _check("OssCSE", "never-run", _ABLATION),
    "osscse-roberta-base-no-recall": _check("OssCSE", "never-run", _ABLATION),
    "osscse-minilm": _check("OssCSE", "measured", _CONTROLLED),
    "esimcse-bert-base": _check("ESimCSE", "never-run", _PAPER),
    "esimcse-roberta-base": _check("ESimCSE", "never-run", _PAPER),
    "esimcse-minilm": _check("ESimCSE", "measured", _CONTROLLED),
    "sncse-bert-base": _check("SNCSE", "never-run", _PAPER),
    "sncse-roberta-base": _check("SNCSE", "never-run", _PAPER),
    "sncse-minilm": _check("SNCSE", "measured", _CONTROLLED),
    "promptbert-bert-base": _check("PromptBERT", "never-run", _PAPER),
    "promptbert-roberta-base": _check("PromptBERT", "never-run", _PAPER),
    "promptbert-minilm": _check("PromptBERT", "measured", _CONTROLLED),
    "mixcse-bert-base": _check("MixCSE", "never-run", _PAPER),
    "mixcse-minilm": _check("MixCSE", "measured", _CONTROLLED),
    "rankcse-bert-base": _check("RankCSE", "never-run", _PAPER),
    "rankcse-listnet-bert-base": _check("RankCSE", "never-run", _PAPER),
    "rankcse-minilm": _check("RankCSE", "measured", _CONTROLLED),
    "diffcse-bert-base": _check("DiffCSE", "never-run", _PAPER),
    "diffcse-roberta-base": _check("DiffCSE", "never-run", _PAPER),
    "diffcse-minilm": _check(
        "DiffCSE",
        "never-run",
        "never run as shipped (its DistilBERT generator needs the hub); docs/results.md, The methods of issue 52: "
        "measured with a stand-in generator made here, not the recipe's",
    ),
    "tsdae-bert-base": _check("TSDAE", "never-run", _PAPER),
    "tsdae-minilm": _check("TSDAE", "measured", _CONTROLLED_52),
    "ct-bert-base": _check("Contrastive Tension", "never-run", _PAPER),
    "ct-minilm": _check("Contrastive Tension", "measured", _CONTROLLED_52),
    "matryoshka-simcse-minilm": _check("Matryoshka + SimCSE", "measured", _CONTROLLED_52),
    "cropping-bert-base": _check("Cropping views", "never-run", _PAPER),
    "cropping-minilm": _check("Cropping views", "measured", _CONTROLLED_52),
    "llm2vec-mntp-mistral-7b": _check("LLM2Vec", "never-run", _LLM),
    "llm2vec-mntp-sheared-llama": _check("LLM2Vec", "never-run", _LLM),
    "llm2vec-simcse-sheared-llama": _check("LLM2Vec + SimCSE", "never-run", _LLM),
    "llm2vec-simcse-mistral-7b": _check("LLM2Vec + SimCSE", "never-run", _LLM),
    "llm2vec-dclr-sheared-llama": _check("LLM2Vec + DCLR", "never-run", _LLM),
    "combined-bert-base": _check("WhitenedCSE + DCLR + SLT-FAI + OssCSE", "never-run", _UNPUBLISHED),
    "combined-minilm": _check("WhitenedCSE + DCLR + SLT-FAI + OssCSE", "measured", _CONTROLLED),
    "dclr+whitened-bert-base": _check("DCLR + WhitenedCSE", "never-run", _UNPUBLISHED),
    "dclr+whitened-minilm": _check("DCLR + WhitenedCSE", "never-run", _UNPUBLISHED),
    "mixcse+dclr-minilm": _check("MixCSE + DCLR", "never-run", _UNPUBLISHED),
    "sncse+dclr-minilm": _check("SNCSE + DCLR", "never-run", _UNPUBLISHED),
}
"""Every shipped recipe (its file's stem in recipes/) -> its methods and what it has been checked against."""


def method_names() -> list[str]:
    """The methods' names, in order."""
    return [method.name for method in METHODS]


def recipes_of(method: str) -> list[str]:
    """The shipped recipes (stems) that use `method`'s parts, in RECIPE_CHECKS' order."""
    return [name for name, check in RECIPE_CHECKS.items() if method in check.methods]


def status_summary(method: str) -> str:
    """How far `method`'s recipes have been checked: `2 measured, 3 never-run` (strongest first)."""
    found = next(entry for entry in METHODS if entry.name == method)
    if found.measured_in:
        return f"measured: {found.measured_in}"
    counts = Counter(RECIPE_CHECKS[name].status for name in recipes_of(method))
    return ", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status])


def methods_table() -> str:
    """The README's methods table (Markdown): method, paper, the recipe to start from, the recipes' status."""
    lines = [markdown_row(["method", "paper", "recipe", "status of its recipes"]), markdown_rule(4)]
    for method in METHODS:
        recipe = f"`{method.recipe}`" if method.recipe else method.usage
        lines.append(markdown_row([method.name, method.paper, recipe, status_summary(method.name)]))
    return "\n".join(lines)
