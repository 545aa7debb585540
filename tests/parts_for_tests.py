"""Objectives used only by tests. Recipes name them once they are registered: in-process through
`csekit.register_part` (the `test_parts` fixture), in a `csekit train` subprocess through the
`csekit.parts` entry points of a made-up installed package (`write_entry_points`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import torch
from torch import Tensor, nn

from csekit.parts.step_state import StepState


class KillOnce(nn.Module):
    """Contributes nothing; on its `at_call`-th call it SIGKILLs the process, once (a marker file remembers)."""

    def __init__(self, at_call: int, marker: str) -> None:
        super().__init__()
        self.at_call = at_call
        self.marker = Path(marker)
        self.calls = 0

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        if self.calls == self.at_call and not self.marker.exists():
            self.marker.write_text("killed", encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"kill_once": torch.zeros((), device=state.embeddings[0].device)}


class RaiseOnce(KillOnce):
    """Like `KillOnce`, but raises an exception (an in-process crash) instead of killing the process."""

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        if self.calls == self.at_call and not self.marker.exists():
            self.marker.write_text("raised", encoding="utf-8")
            raise RuntimeError("crash for the test")
        return {"raise_once": torch.zeros((), device=state.embeddings[0].device)}


class InterruptOnce(KillOnce):
    """Like `KillOnce`, but sends SIGINT (what Ctrl-C sends; or `signal_name`, e.g. SIGTERM) to its own process:
    training goes on to the step's end."""

    def __init__(self, at_call: int, marker: str, signal_name: str = "SIGINT", to_group: bool = False) -> None:
        super().__init__(at_call, marker)
        self.signal_number = signal.Signals[signal_name]
        self.to_group = to_group  # the whole process group, as a terminal's Ctrl-C or `timeout` sends it

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        if self.calls == self.at_call and not self.marker.exists():
            self.marker.write_text("interrupted", encoding="utf-8")
            if self.to_group:  # from another process, as a terminal or `timeout` sends it (not the loader's parent)
                group = str(-os.getpgid(0))
                subprocess.run(["kill", "-s", self.signal_number.name.removeprefix("SIG"), "--", group], check=False)
            else:
                os.kill(os.getpid(), self.signal_number)
        return {"interrupt_once": torch.zeros((), device=state.embeddings[0].device)}


class NanAfter(nn.Module):
    """A loss that becomes NaN from its `after`-th call on (to exercise the non-finite guard)."""

    def __init__(self, after: int, gradient_only: bool = False) -> None:
        super().__init__()
        self.after = after
        self.gradient_only = gradient_only
        self.calls = 0

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        anchors = state.embeddings[0]
        if self.calls < self.after:
            return {"nan_after": anchors.sum() * 0.0}
        if self.gradient_only:  # a finite loss whose gradient is NaN: sqrt'(0) * 0 = inf * 0
            return {"nan_after": torch.sqrt(anchors.sum() * 0.0)}
        return {"nan_after": anchors.sum() * float("nan")}


class NanAt(nn.Module):
    """A loss that is NaN at the listed calls only (poisoned batches), else 0 with a gradient of 0."""

    def __init__(self, calls: list[int], gradient_only: bool = False, only_rank: int | None = None) -> None:
        super().__init__()
        self.poisoned = set(calls)
        self.gradient_only = gradient_only
        self.only_rank = only_rank  # with several processes, poison only this process's batches
        self.calls = 0

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        anchors = state.embeddings[0]
        other_rank = self.only_rank is not None and torch.distributed.get_rank() != self.only_rank
        if self.calls not in self.poisoned or other_rank:
            return {"nan_at": anchors.sum() * 0.0}
        if self.gradient_only:
            return {"nan_at": torch.sqrt(anchors.sum() * 0.0)}
        return {"nan_at": anchors.sum() * float("nan")}


class NanWeightsAfter(nn.Module):
    """Contributes nothing; from its `after`-th call on its own weight is NaN (a diverged model, its loss fine)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.calls = 0
        self.weight = nn.Parameter(torch.zeros(3), requires_grad=False)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        self.calls += 1
        if self.calls >= self.after:
            with torch.no_grad():
                self.weight.fill_(float("nan"))
        return {"nan_weights_after": torch.zeros((), device=state.embeddings[0].device)}


class RecordBatches(nn.Module):
    """Contributes nothing; appends each step's sentences as a JSON line to `path`.RANK (the process's rank)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, state: StepState) -> dict[str, Tensor]:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(f"{self.path}.{rank}", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(state.sentences) + "\n")
        return {"record_batches": torch.zeros((), device=state.embeddings[0].device)}


TEST_PARTS = {
    "kill_once": KillOnce,
    "raise_once": RaiseOnce,
    "interrupt_once": InterruptOnce,
    "nan_after": NanAfter,
    "nan_at": NanAt,
    "nan_weights_after": NanWeightsAfter,
    "record_batches": RecordBatches,
}


def write_entry_points(folder: Path) -> Path:
    """A package's metadata declaring the test parts as `csekit.parts` entry points; put `folder` on the path."""
    info = folder / "csekit_test_parts-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: csekit-test-parts\nVersion: 0\n", encoding="utf-8")
    lines = [f"objective.{name} = parts_for_tests:{part.__name__}" for name, part in TEST_PARTS.items()]
    (info / "entry_points.txt").write_text("[csekit.parts]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return folder
