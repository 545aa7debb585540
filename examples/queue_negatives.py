"""A new negative source in one file: earlier batches' sentence vectors as extra negatives.

A queue of the last `size` anchor vectors (MoCo's and ESimCSE's idea, without a momentum encoder):
every anchor also contrasts them, so each step sees more negatives than the batch holds. The queue
holds constants (no gradient flows into earlier steps) and is not saved with the model.

Register it, then name it in a recipe (the one recipe line):

    negatives: [{name: queue, size: 256}]

    import csekit, queue_negatives  # registers "queue"
    csekit.train(csekit.load_recipe("my-recipe.yaml"), "runs/queue")

For the `csekit` command, declare it in your package's pyproject.toml instead:
    [project.entry-points."csekit.parts"]
    "negatives.queue" = "queue_negatives:QueueNegatives"
"""

from __future__ import annotations

import torch
from torch import nn

import csekit
from csekit.parts.step_state import StepState


class QueueNegatives(nn.Module):
    """The last `size` (detached) anchor vectors of earlier steps, as negatives shared by every anchor."""

    def __init__(self, size: int = 256) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"option size must be at least 1 (got {size})")
        self.size = size
        self.register_buffer("queue", torch.empty(0), persistent=False)

    def forward(self, state: StepState) -> None:
        if self.queue.numel():
            state.extra_negatives.append(self.queue)
        latest = state.global_view(0).detach().float()  # every process's anchors: the queue stays the same everywhere
        self.queue = torch.cat([latest, self.queue])[: self.size]


csekit.register_part("negatives", "queue", QueueNegatives)
