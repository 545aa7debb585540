"""`csekit evaluate`'s options for a user's own files and its printing: the papers' tables of one `EvalResult`,
the file tasks' scores, then what was evaluated and how."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from csekit.commands.options import require_at_least, shown_as_written
from csekit.core.errors import CsekitError

if TYPE_CHECKING:  # the evaluation modules bring scipy and torch: imported when a command runs, not for --help
    from csekit.encoding.representation import Reading, Representation
    from csekit.evaluation.result import EvalResult
    from csekit.evaluation.task_set import TaskSet

PairsOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--pairs",
        help="Score your own sentence pairs: a .tsv, .csv or .jsonl file with sentence1, sentence2, score (named by "
        "a header); Spearman and Pearson x 100 of the cosine. Repeatable; each file is one task, pairs:NAME "
        "(default: none).",
        show_default=False,
    ),
]
PairsColumnsOption = Annotated[
    str | None,
    typer.Option(
        "--pairs-columns",
        help="The --pairs columns for sentence1,sentence2,score: three header names, or three 1-based column "
        "numbers for a file without a header (default: sentence1,sentence2,score).",
        show_default=False,
    ),
]
RetrievalOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--retrieval",
        help="Search a BEIR-layout folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) by exact cosine; nDCG@10, "
        "MRR@10, Recall@10, Recall@100 x 100. Repeatable; each folder is one task, retrieval:NAME (default: none).",
        show_default=False,
    ),
]
SplitOption = Annotated[str, typer.Option("--split", help="The qrels file of --retrieval folders: qrels/SPLIT.tsv.")]
MtebOption = Annotated[
    str | None,
    typer.Option(
        "--mteb",
        help=shown_as_written(
            "MTEB tasks or benchmarks through the mteb package, installed with pip install 'csekit[mteb]': "
            '"STS12,SICK-R", "MTEB(eng, v2)"; main score x 100 per task; mteb\'s result files beside --output '
            "(default: none)."
        ),
        show_default=False,
    ),
]
InstructionsOption = Annotated[
    str | None,
    typer.Option(
        "--instructions",
        help="With --mteb: each task's texts follow its instruction, whose tokens are attended to and not pooled, as "
        "LLM2Vec scored MTEB: llm2vec (its instruction set, shipped) or a JSON file of task -> instruction; a "
        "retrieval task's documents get none (default: none).",
        show_default=False,
    ),
]
SentenceEndOption = Annotated[
    str | None,
    typer.Option(
        "--sentence-end",
        help="Write each sentence's end as an author's evaluation did before encoding: none, promptbert ('.' unless "
        "it ends in . ? \" '), sncse (' .' unless it ends in punctuation) or prompteol (promptbert's, then \" made ' "
        "and a final ? a period) (default: the model's own, else none).",
        show_default=False,
    ),
]
TestTemplateOption = Annotated[
    str | None,
    typer.Option(
        "--test-template",
        help="Tokenise each sentence inside this prompt template as one text, as PromptBERT's and SNCSE's RoBERTa "
        "evaluations did ([X] the sentence, [MASK] the mask token), or none: the training ids, template and sentence "
        "tokenised apart (default: the model's own, else none).",
        show_default=False,
    ),
]
DemonstrationOption = Annotated[
    tuple[str, str] | None,
    typer.Option(
        "--demonstration",
        metavar="SENTENCE WORD",
        help="With --pooler prompteol: PromptEOL's in-context demonstration, a sentence and the one word for it, "
        "written before the template as the authors' README rows were (run_icl.sh; OPT 125M's: --demonstration "
        "'A man is smoking.' Smoking); neither may hold \" or _ (default: the model's own, else none).",
        show_default=False,
    ),
]
WhitenDimOption = Annotated[
    int | None,
    typer.Option("--whiten-dim", help="Keep the first K whitened dimensions; implies --whiten (default: all)."),
]
NJobsOption = Annotated[
    int,
    typer.Option("--n-jobs", help="Classifier fits run at once for transfer tasks, in processes (-1: all cores)."),
]
ClassifierOption = Annotated[
    str,
    typer.Option(
        "--classifier",
        help="SentEval's transfer protocol: sklearn (logistic regression, C grid) or pytorch (Adam, L2 grid "
        "1e-5..1e-2, early stopping: the papers' usepytorch numbers).",
    ),
]


def protocol_label(representation: Representation, tasks: TaskSet) -> str:
    """What the last line adds about how the numbers were computed (`protocol_facts`): a sentence-end rule, a test
    template tokenised whole, PromptEOL's demonstration, the transfer classifier."""
    from csekit.encoding.sentence_end import NO_SENTENCE_END
    from csekit.encoding.whole_template import NO_TEST_TEMPLATE
    from csekit.evaluation.suite import protocol_facts

    facts = protocol_facts(representation, tasks)
    rule, template, shown = representation.sentence_end, representation.test_template, representation.demonstration
    label = "" if rule == NO_SENTENCE_END else f", sentence end {rule}"
    label += "" if template == NO_TEST_TEMPLATE else f", test template {template!r} tokenised whole"
    if shown is not None:
        label += f', demonstration "{shown.sentence}" -> "{shown.word}"'
    return label + (f", transfer classifier {facts['transfer_classifier']}" if "transfer_classifier" in facts else "")


def check_evaluate_numbers(batch_size: int, n_jobs: int, whiten_dim: int | None) -> None:
    """`csekit evaluate`'s numeric options, each refused in one line before anything is loaded."""
    require_at_least("--batch-size", batch_size)
    if n_jobs == 0 or n_jobs < -1:
        raise CsekitError(f"--n-jobs must be -1 (all cores) or at least 1, got {n_jobs}")
    if whiten_dim is not None and whiten_dim < 1:
        raise CsekitError(f"--whiten-dim must be at least 1, got {whiten_dim}")


def model_reading(rule: str | None, template: str | None, pair: tuple[str, str] | None, pooler: str | None) -> Reading:
    """How the model is read beyond its pooler (None: as it was saved): `--sentence-end`, `--test-template` and
    `--demonstration SENTENCE WORD`, checked before the model loads: the demonstration PromptEOL's only (with --pooler
    prompteol, or none given: a model saved with prompteol), a sentence and a word its template can hold."""
    from csekit.encoding.prompteol import PromptEOLPooler, check_demonstration
    from csekit.encoding.representation import Reading
    from csekit.encoding.sentence_end import check_sentence_end
    from csekit.encoding.whole_template import check_test_template

    demonstration = None
    if rule is not None:
        check_sentence_end(rule, "--sentence-end")
    if template is not None:
        check_test_template(template, "--test-template")
    if pair is not None:
        if pooler is not None and pooler != PromptEOLPooler.name:
            raise CsekitError(f"--demonstration is for --pooler prompteol, not {pooler}")
        demonstration = check_demonstration(dict(zip(("sentence", "word"), pair, strict=True)), "--demonstration")
    return Reading(sentence_end=rule, test_template=template, demonstration=demonstration)


def evaluation_tasks(
    tasks: str | None,
    own_files: bool,
    whiten: bool,
    retrieval: bool,
    classifier: str = "sklearn",
    n_jobs: int | None = 1,
) -> TaskSet:
    """The SentEval tasks to run (not read yet): `--tasks`, else `sts`, else none when only the user's files are
    scored (`--classifier` checked here too, before the model loads)."""
    from csekit.evaluation.suite import parse_tasks
    from csekit.evaluation.task_set import TaskSet
    from csekit.evaluation.transfer import check_classifier

    check_classifier(classifier)
    if whiten and retrieval:
        raise CsekitError("--whiten does not go with --retrieval (a whitening kernel from a whole corpus is not built)")
    if tasks is None and own_files:
        return TaskSet()
    return parse_tasks("sts" if tasks is None else tasks, classifier, n_jobs)


def print_evaluation(result: EvalResult, tasks: TaskSet) -> None:
    """The STS table, the dev scores and their mean, the transfer table and alignment/uniformity, as run; then
    each of the user's own tasks."""
    from csekit.evaluation.sts import format_sts_table
    from csekit.evaluation.tasks import AVG_STS
    from csekit.evaluation.transfer import format_transfer_table

    scores, averages = result.tasks, result.averages
    if tasks.of_kind("sts"):
        typer.echo(format_sts_table(result.flat()))
    for task in tasks.names("dev"):
        typer.echo(f"{task}: {100 * scores[task]:.2f}")
    if averages.get(AVG_STS) is not None:
        typer.echo(f"{AVG_STS}: {100 * averages[AVG_STS]:.2f} (the mean of stsb-dev and sick-dev)")
    if tasks.of_kind("transfer"):
        typer.echo(format_transfer_table(result.flat()))
    if tasks.of_kind("align"):
        typer.echo(f"alignment {scores['align']['align']:.4f}, uniformity {scores['align']['uniform']:.4f} (STS-B dev)")
    for name in tasks.names("pairs", "retrieval"):
        typer.echo(format_file_task(name, scores[name]))


def _percent(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.2f}"


def format_file_task(name: str, scores: dict[str, Any]) -> str:
    """One line of a pairs or retrieval task's scores (x 100) and what they were computed on."""
    if name.startswith("pairs:"):
        count = scores["skipped"]
        skipped = f"; {count:,} line{'s' if count > 1 else ''} skipped" if count else ""
        return (
            f"{name}: Spearman {_percent(scores['spearman'])}, Pearson {_percent(scores['pearson'])} "
            f"({scores['pairs']:,} pairs{skipped})"
        )
    return (
        f"{name}: nDCG@10 {_percent(scores['ndcg@10'])}, MRR@10 {_percent(scores['mrr@10'])}, Recall@10 "
        f"{_percent(scores['recall@10'])}, Recall@100 {_percent(scores['recall@100'])} "
        f"({scores['queries']:,} queries, {scores['documents']:,} documents)"
    )


def warn_skipped(skipped: dict[str, list[dict[str, Any]]], paths: dict[str, Path], shown: int = 5) -> None:
    """The first lines each pairs file skipped, with their reasons, on stderr (all of them: --output's JSON)."""
    for name, lines in skipped.items():
        for line in lines[:shown]:
            typer.echo(f"csekit: skipped {paths[name]}:{line['line']}: {line['reason']}", err=True)
        if len(lines) > shown:
            typer.echo(f"csekit: ... more skipped lines of {paths[name]} (see the counts above)", err=True)
