"""Which floating-point precision to compute in, chosen to fit the hardware.

bf16 halves memory traffic and runs matrix products up to twice as fast where the hardware has bf16
units (CUDA GPUs from Ampere on; CPUs with AVX512-BF16 or AMX). Where it has none, as on AVX2-only
CPUs (many AMD EPYC and older Intel parts), PyTorch emulates bf16 and a training step runs about 100x
slower than in fp32. `auto` (training's default) picks bf16 only where it is native, and says why.
The commands that encode (evaluate, encode, probe, diagnose) default to fp32, so that their numbers agree
with sentence-transformers' and SentEval's to fp32 rounding unless speed is asked for.

`CSEKIT_NATIVE_BF16=1` or `0` overrides the CPU check, for a CPU that oneDNN misjudges and for tests
that must take both branches on any machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from csekit.core.bounded_read import read_bounded_bytes
from csekit.core.errors import CsekitError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The precisions csekit computes in; with `auto`, what `train.precision` and the commands' `--precision` take (the
list of choices is the recipe schema's, `csekit.training.recipe_schema.PRECISIONS`)."""


NATIVE_BF16_VARIABLE = "CSEKIT_NATIVE_BF16"
"""Environment variable that overrides the CPU's native-bf16 check: 1 (native) or 0 (emulated)."""


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 matrix products natively on this CPU (AVX512-BF16 or AMX), unless overridden."""
    forced = os.environ.get(NATIVE_BF16_VARIABLE)
    if forced is not None:
        if forced not in ("0", "1"):
            raise CsekitError(f"{NATIVE_BF16_VARIABLE} must be 1 (native bf16) or 0 (emulated), got {forced!r}")
        return forced == "1"
    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags from /proc/cpuinfo ("unknown CPU" and none elsewhere).

    What the benchmarks print beside every timing and what decides float rounding (the loss-trace lock).
    """
    name, flags = "unknown CPU", set()
    try:
        text = read_bounded_bytes("/proc/cpuinfo", 2**24).decode("utf-8", errors="replace")
    except (OSError, CsekitError):
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "unknown CPU":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, flags


def bf16_is_native(device: torch.device | str) -> bool:
    """Whether `device` computes in bf16 natively (not by emulation)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if kind == "cpu":
        return cpu_has_native_bf16()
    return False  # MPS, XPU, ...: not assumed


def resolve_precision(requested: str, device: torch.device | str) -> tuple[str, str]:
    """The precision to use on `device` for `requested` (auto, fp32, bf16, fp16), and a reason for auto."""
    if requested != "auto" and requested not in DTYPES:
        raise CsekitError(f'unknown precision "{requested}"; choose one of auto, {", ".join(DTYPES)}')
    kind = torch.device(device).type
    if requested != "auto":
        return requested, "asked for"
    if bf16_is_native(kind):
        return "bf16", "this GPU runs bf16 natively" if kind == "cuda" else "this CPU runs bf16 natively (oneDNN)"
    if kind == "cpu":
        return "fp32", "this CPU has no native bf16; emulated bf16 is many times slower"
    return "fp32", f"no native bf16 known for {kind}"


def slow_bf16_warning(chosen: str, device: torch.device | str, what: str = "precision") -> str | None:
    """The warning for a half precision the CPU only emulates (bf16 without native support, fp16), else None.

    `what` names the setting.
    """
    if torch.device(device).type != "cpu":
        return None
    if chosen == "bf16" and not cpu_has_native_bf16():
        return (
            f"csekit: warning: {what} bf16 on a CPU without native bf16 (AVX2 only) is emulated and runs "
            "many times slower than fp32; use auto or fp32"
        )
    if chosen == "fp16":
        return (
            f"csekit: warning: {what} fp16 is meant for GPUs; on a CPU it runs several times slower than fp32 "
            "(about 6x on all-MiniLM-L6-v2 on a 2-core Zen 4); use fp32, or auto for bf16 where it is native"
        )
    return None


def choose_precision(
    requested: str, device: torch.device | str, what: str = "precision", say: Callable[[str], None] | None = None
) -> str:
    """`resolve_precision`, telling the user in one line what `auto` chose, or that an explicit bf16 will be slow.

    `what` names the setting in the message (`train.precision`, `--precision`).
    """
    say = say or (lambda line: print(line, file=sys.stderr))
    chosen, reason = resolve_precision(requested, device)
    line = (
        f"csekit: {what} auto -> {chosen}: {reason}" if requested == "auto" else slow_bf16_warning(chosen, device, what)
    )
    if line is not None:
        say(line)
    return chosen
