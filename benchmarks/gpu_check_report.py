"""benchmarks/gpu_check.py's markdown: summary.md (every stage's figures) and profiles.md (the profiles' text).

Plain Python on the results dictionary (no torch), so the run's parent process writes them after each stage.
"""

from __future__ import annotations

import json
from typing import Any


def table(results: dict[str, Any]) -> str:
    """The throughput table: each batch's variants, their rates on the common FLOP count, against ST MNRL."""
    lines = ["| batch | variant | ms/step | sentences/s | TFLOP/s | of the bound | syncs/step | vs ST MNRL |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for batch, row in results.get("batches", {}).items():
        mnrl = row.get("variants", {}).get("ST MNRL", {}).get("seconds")
        for name, f in row.get("variants", {}).items():
            if "seconds" not in f:
                lines.append(f"| {batch} | {name} | {f.get('error', 'not run')} | | | | | |")
                continue
            speedup = f"{mnrl / f['seconds']:.2f}x" if mnrl else ""
            lines.append(
                f"| {batch} | {name} | {f['seconds'] * 1e3:.1f} | {f['sentences_per_second']:,.0f} | "
                f"{f['tflops']:.3g} | {f['of_bound']:.1%} | {f.get('syncs_per_step', float('nan')):.1f} | {speedup} |"
            )
    return "\n".join(lines)


def summary_markdown(results: dict[str, Any]) -> str:
    stages = results.get("stages", {})
    lines = [f"# gpu_check: {results.get('device')}{' (tiny)' if results.get('tiny') else ''}", ""]
    if results.get("wheels"):
        lines += [f"wheels: {', '.join(f'{k} {v}' for k, v in results['wheels'].items())}", ""]
    lines += ["| stage | status | seconds | limit |", "|---|---|---|---|"]
    for name, stage in stages.items():
        lines.append(f"| {name} | {stage.get('status')} | {stage.get('seconds', '')} | {stage.get('limit_s', '')} |")
    for name, stage in stages.items():
        lines += ["", f"## {name}", ""]
        lines += SECTIONS.get(name, generic)(stage)
    return "\n".join(lines) + "\n"


def generic(stage: dict[str, Any]) -> list[str]:
    shown = {k: v for k, v in stage.items() if k not in ("status", "seconds", "limit_s")}
    return ["```", json.dumps(shown, indent=1, default=str)[:6000], "```"] if shown else []


def environment(stage: dict[str, Any]) -> list[str]:
    facts = {k: v for k, v in stage.items() if k not in ("status", "seconds", "limit_s", "versions")}
    lines = [f"- {k}: {v}" for k, v in facts.items()]
    return [*lines, f"- versions: {', '.join(f'{k} {v}' for k, v in stage.get('versions', {}).items())}"]


def tests(stage: dict[str, Any]) -> list[str]:
    return [f"- {name}: exit {run['exit']}, {run['summary']}" for name, run in stage.items() if isinstance(run, dict)]


def checks(stage: dict[str, Any]) -> list[str]:
    lines = []
    if "bound_tflops" in stage:
        lines.append(f"- bf16 matrix-product bound: {stage['bound_tflops']:.4g} TFLOP/s")
    if "adamw" in stage:
        lines.append(f"- adamw: {json.dumps(stage['adamw'], default=str)}")
    lines += paths(stage.get("paths", {}))
    for path, names in stage.get("kernels", {}).items():
        lines.append(f"- attention kernels, {path}: {', '.join(names) if isinstance(names, list) else names}")
    return lines


def paths(checked: dict[str, Any]) -> list[str]:
    """Each path's drift from the fp32 padded pass against its tolerance (benchmarks/gpu_paths.py)."""
    lines = []
    for group in ("bert", "decoder"):
        for name, f in checked.get(group, {}).items():
            if name == "facts":
                lines.append(f"- {group}: {json.dumps(f, default=str)}")
            elif "error" in f:
                lines.append(f"- {group}, {name}: FAILED to run: {f['error']}")
            else:
                verdict = "within" if f["within"] else "OUT OF TOLERANCE"
                bounds = f["tolerance"]
                lines.append(
                    f"- {group}, {name} ({f['precision']}): pooled {f['pooled_max_relative']:.2e} of "
                    f"{f['pooled_scale']:.3g} (<= {bounds['pooled_max_relative']:g}), gradients "
                    f"{f['grad_relative']:.2e} (<= {bounds['grad_relative']:g}): {verdict}"
                )
    return lines


def loop(stage: dict[str, Any]) -> list[str]:
    lines = [f"bound: {stage.get('bound_tflops', float('nan')):.4g} TFLOP/s; keys: {stage.get('keys')}", ""]
    flops = {b: row.get("common_flops") for b, row in stage.get("batches", {}).items()}
    lines += [f"common FLOPs a step (csekit's padded step): {flops}", "", table(stage)]
    return lines


def quickstart(stage: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("before", "after"):
        if name in stage:
            lines += [f"{name} training ({stage[name]['seconds']} s):", "", stage[name]["table"], ""]
    if "training" in stage:
        lines.append(f"training: {json.dumps(stage['training'], default=str)}")
    return lines


def compile_section(stage: dict[str, Any]) -> list[str]:
    lines = [f"backend: {stage.get('backend')}", ""]
    for name, figures in stage.get("runs", {}).items():
        if "seconds" in figures:
            rate = f", {figures['tflops']:.3g} TFLOP/s ({figures['of_bound']:.1%})" if "tflops" in figures else ""
            lines.append(
                f"- {name}: {figures['seconds'] * 1e3:.1f} ms/step{rate}, "
                f"{figures['syncs_per_step']:.1f} syncs/step, first steps {figures['first_steps_seconds']:.1f} s"
            )
        else:
            lines.append(f"- {name}: {figures.get('error')}")
    return lines


def decoder(stage: dict[str, Any]) -> list[str]:
    """The LLM2Vec-shape step (benchmarks/decoder_step.py): each pass beside LLM2Vec's reported A100 step."""
    if "parameters" not in stage:
        return generic(stage)
    lines = [
        f"- {stage['device_name']}: {stage['parameters'] / 1e9:.2f}B parameters ({stage['lora_parameters'] / 1e6:.1f}M"
        f" LoRA), built in {stage['build_seconds']:.1f} s; shape {stage['shape']}; tokenizer {stage['tokenizer']}",
        f"- bound {stage['bound_tflops']:.4g} TFLOP/s ({stage['bound_source']}); FLOP a step: {stage['formula']}",
        "",
        "| pass | s/step | peak GiB | real / padded tokens | FLOP/step (real) | bound s | of the bound | computed, of "
        "the bound | first layer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, run in stage.get("runs", {}).items():
        if "flop_per_step" not in run:
            lines.append(f"| {kind} | {run.get('error', 'no step timed')} | | | | | | | |")
            continue
        tokens = run["tokens"]
        lines.append(
            f"| {kind} | {run['seconds_per_step']:.3f} | {run['peak_bytes'] / 2**30:.2f} | {tokens['real']:,.0f} / "
            f"{tokens['padded']:,.0f} | {run['flop_per_step']:.3g} | {run['bound_seconds']:.3f} | "
            f"{run['bound_fraction']:.1%} | {run['computed_bound_fraction']:.1%} | {run['first_layer_tokens']} |"
        )
    if "llm2vec" in stage:
        reported = stage["llm2vec"]
        lines.append(
            f"| LLM2Vec, {reported['device']} (reported, rated on {reported['bound_tflops']:g}) | "
            f"{reported['seconds_per_step']} | | | | {reported['bound_seconds']:.3f} | "
            f"{reported['bound_fraction']:.1%} | {reported['padded_bound_fraction']:.1%} (padded) | |"
        )
    timed = [run["seconds_per_step"] for run in stage.get("runs", {}).values() if run.get("seconds_per_step")]
    if timed and "H200" in stage["device_name"]:
        verdict = "met" if min(timed) <= stage["target_seconds"] else "NOT met"
        lines += ["", f"target: at most {stage['target_seconds']} s a step on an H200: {verdict} ({min(timed):.3f} s)"]
    return lines


SECTIONS = {
    "environment": environment,
    "tests": tests,
    "checks": checks,
    "loop": loop,
    "quickstart": quickstart,
    "compile": compile_section,
    "decoder": decoder,
}


def profiles_markdown(results: dict[str, Any]) -> str:
    """The loop stage's torch.profiler tables and the CUDA tests' output tails."""
    stages = results.get("stages", {})
    lines = ["# gpu_check profiles", ""]
    for title, text in stages.get("loop", {}).get("profiles", {}).items():
        lines += [f"## {title}", "", "```", text, "```", ""]
    for name, run in stages.get("tests", {}).items():
        if isinstance(run, dict) and "tail" in run:
            lines += [f"## tests: {name} (exit {run['exit']})", "", "```", run["tail"], "```", ""]
    return "\n".join(lines)
