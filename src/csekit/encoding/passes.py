"""How one encoder pass is executed: one padded pass, in length groups, or padding-free.

The three give the same vectors and gradients up to float rounding (dropout masks are drawn in other
shapes); which is fastest depends on the device. `SentenceEncoder.forward` runs one padded pass unless it
is handed a `PassPlan`; a training run's plan is decided once, per device kind, by
`csekit.training.execution` from the recipe's `run:` section, and reaches every training pass (the model's
own and those a part makes through `StepState.encoder`) through `PlannedEncoder`. Evaluation and the
momentum encoder's passes run the one padded pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.encoding.packed import BACKBONE_INPUTS
from csekit.encoding.packed_fixed import LayerStack

EMBEDDING_MASK = "embedding_mask"
"""Input key for a mask multiplied into the embedding layer's output ([B, L, 1], [B, 1, d] or [B, L, d])."""

POOLING_MASK = "pooling_mask"
"""Input key for the tokens the pooler reads [B, L] when they are fewer than those attended to (an instruction's
tokens are attended to, not pooled: `csekit.encoding.instruction`); absent: the attention mask."""


@dataclass(frozen=True)
class PassPlan:
    """How training passes run on this device (decided by `csekit.training.execution`).

    `packed`: padding-free (`csekit.encoding.packed`) wherever the inputs allow; `packed_required`: and an input
    the padding-free pass does not know is an error (`run.packed: true`) instead of a padded pass (`auto`).
    `length_group_size` > 0: rows in groups of that many of similar length, each cut to its own longest (the
    padded pass), or the packed pass's attention in such groups.
    `fused_qkv`: a packed pass's query, key and value as one product (`csekit.encoding.fused_qkv`).
    `token_bucket` > 0: a packed pass on fixed shapes (`csekit.encoding.packed_fixed`), its tokens padded to a
    multiple of this and its rows bounded by `width_bound`; `layer_stack`: its layers as compiled (None: eager).
    """

    packed: bool = False
    packed_required: bool = False
    length_group_size: int = 0
    fused_qkv: bool = False
    token_bucket: int = 0
    width_bound: int = 0
    layer_stack: LayerStack | None = None

    def packs(self, inputs: dict[str, Tensor]) -> bool:
        """Whether a pass on `inputs` runs padding-free."""
        if not self.packed:
            return False
        unknown = sorted(set(inputs) - BACKBONE_INPUTS - {EMBEDDING_MASK})
        if unknown and self.packed_required:
            raise CsekitError(
                f"recipe key run.packed: true: the padding-free pass does not know the input {unknown[0]}; "
                "use run.packed: auto or false"
            )
        return not unknown

    def groups(self, rows: int) -> bool:
        """Whether a padded pass of `rows` rows runs in length groups."""
        return 0 < self.length_group_size < rows


ONE_PADDED_PASS = PassPlan()
"""The plan of every pass that is not a training run's: evaluation, inference, the momentum encoder."""


class PlannedEncoder:
    """The trained encoder as a run's training passes call it: each call runs with the run's `plan`.

    Parts reach the encoder through `StepState.encoder`, which is this; any other attribute (`backbone`,
    `tokenizer`, `register_forward_pre_hook`, ...) is the encoder's own. A call in eval mode runs one padded pass.
    """

    def __init__(self, encoder: nn.Module, plan: PassPlan) -> None:
        self.encoder = encoder
        self.plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def __call__(self, inputs: dict[str, Tensor], token_states: bool = True) -> Any:
        return self.encoder(inputs, token_states=token_states, plan=plan_of(self))


def plan_of(encoder: Any) -> PassPlan:
    """The plan an encoder (a `PlannedEncoder`, or a bare encoder: one padded pass) runs training passes with."""
    plan = getattr(encoder, "plan", None)
    return plan if isinstance(plan, PassPlan) and encoder.training else ONE_PADDED_PASS
