"""The `csekit` command line: train, evaluate, bench, encode, probe, diagnose, augment, freq, download-data, recipes.

Every input mistake is a `CsekitError`: printed as one line on stderr, exit status 2, no traceback.
Nothing heavy is imported at the top: `--help`, `--version` and the mistakes found before a model loads answer
without torch, transformers or scipy (a command imports what it runs; benchmarks/cli_startup.py times it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from csekit.commands.augment import check_augment_options, paraphrase_engine
from csekit.commands.diagnose import diagnose_models
from csekit.commands.evaluate import (
    ClassifierOption,
    DemonstrationOption,
    InstructionsOption,
    MtebOption,
    NJobsOption,
    PairsColumnsOption,
    PairsOption,
    RetrievalOption,
    SentenceEndOption,
    SplitOption,
    TestTemplateOption,
    WhitenDimOption,
    check_evaluate_numbers,
    evaluation_tasks,
    model_reading,
    print_evaluation,
    protocol_label,
    warn_skipped,
)
from csekit.commands.options import (
    BatchSizeOption,
    Command,
    DataDirOption,
    Group,
    PoolerOption,
    PrecisionOption,
    check_output_file,
    require_at_least,
    saving_output,
    warn,
)
from csekit.commands.recipes import recipes_command
from csekit.commands.startup import VersionOption, quiet_transformers
from csekit.core.errors import CsekitError, message_line
from csekit.core.json_text import json_text
from csekit.core.run_lock import locks_output
from csekit.methods import method_names

app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help=f"Unsupervised contrastive sentence embeddings: {', '.join(method_names())}. "
    "`csekit recipes` lists the shipped recipes.",
)


@app.callback()
def _options(version: VersionOption = False) -> None:
    """The options of `csekit` itself, before a command."""


@app.command(cls=Command)
def train(
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder for the run.")],
    recipe: Annotated[
        Path | None,
        typer.Argument(help="Recipe YAML file (see recipes/); with --resume, default: the run's saved recipe."),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a recipe key: dotted.key=value; repeatable (default: the recipe as written)."
        ),
    ] = None,
    data_dir: DataDirOption = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue the run in --output from its checkpoint (default: start a new run)."),
    ] = False,
    allow_changes: Annotated[
        bool,
        typer.Option(
            "--allow-changes",
            help="With --resume: accept a recipe that differs from the saved one, logged (default: refuse it).",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a model from a recipe; writes best/, last/, checkpoint/, metrics.jsonl and recipe.yaml."""
    from csekit.training.interrupt import TrainingInterrupted
    from csekit.training.recipe import SAVED_RECIPE, load_recipe

    if recipe is None:
        if not resume:
            raise CsekitError("a recipe file is needed (csekit train RECIPE --output DIR), or --resume")
        if not (output / SAVED_RECIPE).is_file():
            raise CsekitError(f"nothing to resume in {output}: no run there (no {SAVED_RECIPE})")
    if allow_changes and not resume:
        raise CsekitError("--allow-changes goes with --resume")
    if not resume:  # a new run: a mistake in its recipe is one line, before torch is imported
        config = load_recipe(recipe, overrides or [])
    elif recipe is None:  # the run's own recipe (a relative path an older csekit recorded gets a hint)
        from csekit.training.run_folder import load_saved_recipe

        config = load_saved_recipe(output / SAVED_RECIPE, overrides or [], note_legacy_keys=True)
    else:  # on --resume, its relative paths name the files the run recorded
        from csekit.training.run_folder import load_run_recipe

        config = load_run_recipe(recipe, overrides or [], output, resume)
    from csekit.training.trainer import train as run_training  # a mistake in the recipe: one line, before torch

    try:
        result = run_training(
            config, output, data_dir=data_dir, resume=resume, show_progress=progress, allow_changes=allow_changes
        )
    except TrainingInterrupted as stop:  # Ctrl-C or SIGTERM: the step is checkpointed; say how to go on (130, 143)
        by = " by SIGTERM" if stop.signal_number == signal.SIGTERM else ""
        typer.echo(
            f"csekit: interrupted{by} at step {stop.step}; resume with: {stop.resume_command(data_dir)}", err=True
        )
        raise typer.Exit(128 + stop.signal_number) from None
    lines = result.summary()  # none on a process other than the main one, which reports the run
    if lines:
        typer.echo("\n".join(lines))


TASK_GROUPS_HELP = "sts, dev, transfer, align, all (sts + transfer + align), or a comma list of task names."


@app.command(cls=Command)
@locks_output("output")
def evaluate(
    model: Annotated[str, typer.Argument(help="Model folder, hub name, or alias (minilm-l6).")],
    tasks: Annotated[
        str | None, typer.Option(help=TASK_GROUPS_HELP + " Default: sts; none with --pairs/--retrieval.")
    ] = None,
    pooler: PoolerOption = None,
    data_dir: DataDirOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the results as JSON here (default: print them only).")
    ] = None,
    precision: PrecisionOption = "fp32",
    batch_size: BatchSizeOption = 128,
    whiten: Annotated[
        bool,
        typer.Option("--whiten", help="BERT-whiten the embeddings, kernel from each task's sentences (default: off)."),
    ] = False,
    whiten_dim: WhitenDimOption = None,
    n_jobs: NJobsOption = -1,
    pairs: PairsOption = None,
    pairs_columns: PairsColumnsOption = None,
    retrieval: RetrievalOption = None,
    split: SplitOption = "test",
    mteb: MtebOption = None,
    instructions: InstructionsOption = None,
    sentence_end: SentenceEndOption = None,
    test_template: TestTemplateOption = None,
    demonstration: DemonstrationOption = None,
    classifier: ClassifierOption = "sklearn",
) -> None:
    """Evaluate a model SentEval's way: STS (Spearman x 100), transfer tasks (accuracy x 100), alignment/uniformity;
    on your own files: sentence pairs (--pairs), retrieval sets (--retrieval); and on MTEB (--mteb)."""
    from csekit.core.atomic import atomic_write_text
    from csekit.evaluation.file_tasks import file_paths, read_file_tasks, skipped_report
    from csekit.evaluation.instructions import read_instruction_set

    whitened = whiten or whiten_dim is not None
    check_evaluate_numbers(batch_size, n_jobs, whiten_dim)
    check_output_file(output)
    own_files = read_file_tasks(pairs or (), pairs_columns, retrieval or (), split)  # bad files: one line, now
    instruction_set = read_instruction_set(instructions, mteb)
    from csekit.data.data_dir import resolve_data_dir  # the rest imports torch (and mteb), after the cheap checks
    from csekit.encoding.instruction import check_instruction_pooler
    from csekit.evaluation.command_encoder import command_encoder
    from csekit.evaluation.mteb_run import resolve_tasks, run_mteb
    from csekit.evaluation.suite import protocol_facts

    mteb_tasks = resolve_tasks(mteb, whitened)  # an unknown name: one line, before the model is loaded
    own = bool(pairs or retrieval or mteb)
    senteval = evaluation_tasks(tasks, own, whitened, bool(retrieval), classifier, n_jobs)
    reading = model_reading(sentence_end, test_template, demonstration, pooler)  # None: the model's own
    root = resolve_data_dir(data_dir) if senteval else None
    task_set = senteval.joined(own_files)
    encode = command_encoder(model, pooler, precision, batch_size, warn=warn, reading=reading)
    if instruction_set is not None:  # a pooler that cannot leave the instruction out: one line before any task runs
        check_instruction_pooler(encode.encoder.pooler)
    started = time.perf_counter()
    result = task_set.run(encode, root, whitened, whiten_dim)
    mteb_run = run_mteb(encode, model, mteb_tasks, output, instruction_set) if mteb_tasks else None
    result.tasks.update(mteb_run.tasks if mteb_run else {})
    elapsed = time.perf_counter() - started
    print_evaluation(result, task_set)
    for line in mteb_run.lines if mteb_run else []:
        typer.echo(line)
    skipped = skipped_report(own_files)
    warn_skipped(skipped, file_paths(own_files))
    whitening = f", whitened{'' if whiten_dim is None else f' to {whiten_dim} dims'}" if whitened else ""
    how = (encode.representation, task_set)
    typer.echo(f"({model}, pooler {encode.pooler}, {encode.label}{whitening}{protocol_label(*how)}, {elapsed:.1f} s)")
    if output is not None:
        facts: dict[str, Any] = {"model": model, "pooler": encode.pooler, "precision": encode.precision}
        facts.update(protocol_facts(*how))
        if whitened:
            facts["whiten"] = {"dim": whiten_dim}
        if skipped:
            facts["skipped_lines"] = skipped
        if mteb_run:
            facts["mteb"] = mteb_run.facts
        report = {**result.report(facts), "seconds": round(elapsed, 2)}
        with saving_output(output):
            atomic_write_text(output, json_text(report, indent=2) + "\n")


@app.command(cls=Command)
@locks_output("output")
def bench(
    suite: Annotated[Path, typer.Argument(help="Suite YAML file: recipes x seeds (see benchmarks/suites/).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the runs, tables and plots.")],
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a key in every recipe: dotted.key=value; repeatable (default: the recipes as written).",
        ),
    ] = None,
    data_dir: DataDirOption = None,
    progress: Annotated[bool, typer.Option(help="Show training progress bars.")] = True,
    summary_only: Annotated[
        bool,
        typer.Option(
            "--summary-only",
            help="Train nothing: write results.md, results.csv and plots from the runs finished so far (default: off).",
        ),
    ] = False,
) -> None:
    """Train and evaluate every recipe of a suite with every seed; write results.md, results.csv and plots.

    Finished runs are skipped and interrupted ones resume, so a suite can be stopped and started again.
    """
    from csekit.bench.suite import load_suite

    loaded = load_suite(suite)  # a mistake in the suite file is refused before torch and the training modules load
    from csekit.bench import run_suite, summarise
    from csekit.bench.run import continue_command
    from csekit.training.trainer import TrainingInterrupted

    if summary_only:
        if not output.is_dir():
            raise CsekitError(f"{output}: no such folder; run the suite into it first (without --summary-only)")
        summary = summarise(output, loaded)
        typer.echo(summary["table"])
        typer.echo(f"{summary['finished']} finished runs summarised; results in {output}")
        return
    try:
        summary = run_suite(
            suite,
            output,
            data_dir=data_dir,
            overrides=overrides or [],
            show_progress=progress,
            log=lambda line: typer.echo(line, err=True),
        )
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: a training is checkpointed; the same command continues
        trained = isinstance(stop, TrainingInterrupted)
        where = f" at step {stop.step} of {stop.output_dir}" if trained else ""
        command = continue_command(suite, output, overrides or [], data_dir)
        typer.echo(f"csekit: interrupted{where}; continue the suite with: {command}", err=True)
        raise typer.Exit(128 + stop.signal_number if trained else 130) from None
    typer.echo(summary["table"])
    typer.echo(f"ran {len(summary['ran'])}, skipped {len(summary['skipped'])} finished; results in {output}")


@app.command(cls=Command)
@locks_output("output")
def encode(
    model: Annotated[str, typer.Argument(help="Model folder, hub name, or alias (minilm-l6).")],
    input: Annotated[Path, typer.Option("--input", "-i", help="Text file, one sentence per line.")],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Where to write: .npy (float32 matrix) or .txt/.tsv (tab-separated text)."),
    ],
    pooler: PoolerOption = None,
    precision: PrecisionOption = "fp32",
    batch_size: BatchSizeOption = 128,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize",
            help="Scale each embedding to length 1, so that a dot product is the cosine (default: the model's own "
            "vectors, as evaluate scores them).",
        ),
    ] = False,
) -> None:
    """Write one embedding row per input line (a float32 .npy matrix, or tab-separated text for .txt/.tsv)."""
    import numpy as np

    from csekit.commands.encode import check_embedding_format, read_sentences, unit_length
    from csekit.core.atomic import write_file

    require_at_least("--batch-size", batch_size)
    check_output_file(output)
    check_embedding_format(output)
    sentences = read_sentences(input)
    from csekit.evaluation.command_encoder import command_encoder  # torch: only once the input is known good

    encode = command_encoder(model, pooler, precision, batch_size, warn=warn)
    embeddings = encode(sentences, progress_label=f"encoding {input}")
    if normalize:
        embeddings = unit_length(embeddings)
    with saving_output(output):
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.suffix.lower() == ".npy":
            write_file(output, lambda handle: np.save(handle, embeddings))
        else:  # 9 significant digits: a float32 read back is the same float32
            write_file(output, lambda handle: np.savetxt(handle, embeddings, fmt="%.9g", delimiter="\t"))
    unit = ", unit length" if normalize else ""
    typer.echo(f"wrote {embeddings.shape[0]} x {embeddings.shape[1]} embeddings{unit} to {output} ({encode.label})")


@app.command(cls=Command)
@locks_output("output")
def probe(
    model: Annotated[str, typer.Argument(help="Model folder, hub name, or alias (minilm-l6).")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the probe results as JSON here (default: print them only)."),
    ] = None,
    pooler: PoolerOption = None,
    data_dir: DataDirOption = None,
    datasets: Annotated[
        str, typer.Option(help="rule: median gold score in [2, 3.5] (the paper's rule); paper: its Table 2's 16.")
    ] = "rule",
    transformations: Annotated[
        Path | None, typer.Option(help="A .jsonl probe set of your own (default: the one shipped with csekit).")
    ] = None,
    precision: PrecisionOption = "fp32",
    batch_size: BatchSizeOption = 128,
) -> None:
    """OssCSE's bias probes: Spearman on Cont./Oppn. STS splits (by MER) and a sentence-transformation probe."""
    require_at_least("--batch-size", batch_size)
    check_output_file(output)
    from csekit.core.atomic import atomic_write_text
    from csekit.evaluation.command_encoder import command_encoder
    from csekit.evaluation.probes import (
        bias_probe,
        format_bias_table,
        format_transformation_table,
        load_probe_datasets,
        load_transformation_probe,
        select_datasets,
        transformation_probe,
    )

    chosen = select_datasets(load_probe_datasets(data_dir), datasets)
    rows = load_transformation_probe(transformations)
    encode = command_encoder(model, pooler, precision, batch_size, warn=warn)
    started = time.perf_counter()
    report = {
        "model": model,
        "pooler": encode.pooler,
        "precision": encode.precision,
        "datasets": datasets,
        "bias": bias_probe(encode, chosen),
        "transformations": transformation_probe(encode, rows),
    }
    typer.echo(format_bias_table(report["bias"]))
    typer.echo("")
    typer.echo(format_transformation_table(report["transformations"]))
    typer.echo(f"({model}, pooler {encode.pooler}, {encode.label}, {time.perf_counter() - started:.1f} s)")
    if output is not None:
        with saving_output(output):
            atomic_write_text(output, json_text(report, indent=2) + "\n")


DEFAULT_COUNTS = "freq/bookcorpus_bert-base-uncased/labels.json"


@app.command(cls=Command)
@locks_output("output")
def diagnose(
    models: Annotated[list[str], typer.Argument(help="Model folders, hub names or aliases (minilm-l6), side by side.")],
    data_dir: DataDirOption = None,
    pooler: PoolerOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report as JSON here (default: print it only).")
    ] = None,
    complementary: Annotated[
        str | None,
        typer.Option(help="DCLR's complementary model, which judges false negatives (default: each model itself)."),
    ] = None,
    phi: Annotated[
        float, typer.Option(help="Cosine (-1 to 1) at or above which an in-batch pair is a false negative.")
    ] = 0.9,
    counts: Annotated[
        str,
        typer.Option(help="Token counts for SLT-FAI's frequency labels (a path, or one under the data folder)."),
    ] = DEFAULT_COUNTS,
    sentences: Annotated[
        int,
        typer.Option(
            help="Random pairs for anisotropy; sentences sampled for the frequency probe and false negatives."
        ),
    ] = 10_000,
    precision: PrecisionOption = "fp32",
    batch_size: BatchSizeOption = 128,
    seed: Annotated[int, typer.Option(help="Seed of the random pairs, samples, batches and probe folds.")] = 0,
) -> None:
    """The biases the papers study, one encoding pass per model: anisotropy, alignment/uniformity, frequency
    probe (SLT-FAI), Cont./Oppn. gap (OssCSE), false-negative rate (DCLR). See docs/diagnose.md."""
    require_at_least("--batch-size", batch_size)
    check_output_file(output)
    if not -1.0 <= phi <= 1.0:
        raise CsekitError(f"--phi is a cosine, between -1 and 1, got {phi}")
    from csekit.core.atomic import atomic_write_text
    from csekit.data.data_dir import resolve_data_dir
    from csekit.evaluation.diagnose import DCLR_BATCH_SIZE, DiagnoseSettings, format_diagnose_table, load_diagnose_data
    from csekit.prep.frequency import read_counts, resolve_counts_path

    require_at_least("--sentences", sentences, DCLR_BATCH_SIZE)
    root = resolve_data_dir(data_dir)
    counts_path = resolve_counts_path(counts, root)
    data = load_diagnose_data(root)
    settings = DiagnoseSettings(sentences=sentences, phi=phi, seed=seed)
    reports = diagnose_models(
        list(dict.fromkeys(models)),
        pooler,
        data,
        settings,
        read_counts(counts_path),
        str(counts_path),
        complementary,
        precision,
        batch_size,
    )
    typer.echo(format_diagnose_table(reports))
    report = {
        "data_dir": str(root),
        "sts_sentences": len(data.sentences),
        "counts": str(counts_path),
        "complementary": complementary,
        "phi": phi,
        "sentences": sentences,
        "seed": seed,
        "batch_for_false_negatives": DCLR_BATCH_SIZE,
        "models": reports,
    }
    if output is not None:
        with saving_output(output):
            atomic_write_text(output, json_text(report, indent=2) + "\n")


@app.command(cls=Command)
@locks_output("output")
def augment(
    corpus: Annotated[Path, typer.Option("--corpus", help="Text corpus, one sentence per line.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The .jsonl to write (appended to on restart).")],
    engine: Annotated[
        str,
        typer.Option(
            help="Paraphrases from: apertium (offline, EN-ES-EN), fsmt (the paper's WMT19 models, network), "
            "marian (opus-mt, network), file, none."
        ),
    ] = "apertium",
    paraphrases: Annotated[
        Path | None,
        typer.Option(help="With --engine file: .jsonl (text, paraphrase) or sentence<TAB>paraphrase (default: none)."),
    ] = None,
    pivots: Annotated[
        str | None,
        typer.Option(help="With --engine fsmt or marian: pivot languages, comma separated (default: ru,de / de,ru)."),
    ] = None,
    chunk_size: Annotated[int, typer.Option(help="Sentences per chunk (each chunk is written at once).")] = 1000,
    limit: Annotated[
        int | None, typer.Option(help="Stop after this many sentences in all (default: the whole corpus).")
    ] = None,
    min_mer: Annotated[
        float, typer.Option(help="Keep a paraphrase whose match error rate (0-1) to its sentence is at least this.")
    ] = 0.15,
    max_mer: Annotated[
        float, typer.Option(help="Keep a paraphrase whose match error rate (0-1) to its sentence is at most this.")
    ] = 0.6,
    can: Annotated[str, typer.Option(help='Negation of "can": cannot or "can not".')] = "cannot",
) -> None:
    """Write a negation and a back-translated paraphrase of every sentence (OssCSE's training corpus)."""
    from csekit.prep.augment import augment_corpus, load_spacy

    check_augment_options(corpus, output, engine, paraphrases, chunk_size, limit, (min_mer, max_mer), can)
    chosen = paraphrase_engine(engine, paraphrases, pivots)

    def progress(report: object) -> None:
        typer.echo(f"  {report.resumed + report.written:,} sentences written", err=True)  # type: ignore[attr-defined]

    report = augment_corpus(
        corpus, output, chosen, load_spacy(), chunk_size, (min_mer, max_mer), limit, can, progress=progress
    )
    typer.echo(report.summary())


@app.command(cls=Command)
@locks_output("output")
def freq(
    corpus: Annotated[Path, typer.Option("--corpus", help="Text file, one sentence per line (any size).")],
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Model folder, hub name, or alias (minilm-l6).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write {token: count} JSON.")],
    chunk_lines: Annotated[int, typer.Option(help="Lines tokenised per batch.")] = 10_000,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Count token frequencies over a corpus with a model's tokenizer (SLT-FAI's frequency labels)."""
    require_at_least("--chunk-lines", chunk_lines)
    check_output_file(output)
    from csekit.core.atomic import atomic_write_text
    from csekit.prep.frequency import count_tokens, counts_by_token, load_counting_tokenizer

    try:
        loaded = load_counting_tokenizer(tokenizer)
    except CsekitError as error:
        raise CsekitError(f"--tokenizer: {error}") from None
    counts = count_tokens(corpus, loaded, chunk_lines=chunk_lines, show_progress=progress)
    with saving_output(output):
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(output, json.dumps(counts_by_token(counts, loaded), indent=0, ensure_ascii=False) + "\n")
    typer.echo(f"counted {int(counts.sum())} tokens of {int((counts > 0).sum())} types; wrote {output}")


@app.command("download-data", cls=Command)
@locks_output("dest")
def download_data(
    dest: Annotated[Path, typer.Argument(help="Folder to create (then set CSEKIT_DATA to it).")],
    corpus: Annotated[
        str | None,
        typer.Option(
            "--corpus",
            help="Fetch this training corpus instead (wiki1m: SimCSE's 1M Wikipedia sentences, ~120 MB, into "
            "DIR/corpus/; resumes an interrupted download; checks its line count and first lines). "
            "Default: none, SentEval's data.",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Download SentEval's STS, STS-B and SICK data, or with --corpus a papers' training corpus (needs a network)."""
    from csekit.core.save_guard import guarded_save

    if corpus is not None:
        from csekit.data.corpus_download import corpus_source, download_corpus

        with guarded_save("the corpus", dest, "a partial download is kept for resuming; run the command again"):
            written = download_corpus(dest, corpus_source(corpus), show_progress=progress)
        typer.echo(f"corpus {written} checked; recipes find it with --data-dir {dest} or CSEKIT_DATA={dest}")
        return
    from csekit.data.data_dir import download_senteval_data

    with guarded_save("the data", dest, "the files already in it are kept; run csekit download-data again"):
        path = download_senteval_data(dest)
    typer.echo(f"data in {path}; export CSEKIT_DATA={path}")


app.command("recipes", cls=Command)(recipes_command)


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit status 2."""
    quiet_transformers()
    for stream in (sys.stdout, sys.stderr):  # a path whose bytes are not UTF-8 is printed escaped, not a traceback
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    try:
        app()
    except CsekitError as error:
        print(f"csekit: error: {message_line(error)}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:  # a path given longer than the OS takes: Path.exists raises it (Python < 3.12)
        if error.errno != errno.ENAMETOOLONG:
            raise
        print(
            f"csekit: error: {message_line(CsekitError(f'{error.filename!s:.80}...: {error.strerror}'))}",
            file=sys.stderr,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        print("csekit: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
