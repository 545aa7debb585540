"""LLM2Vec's computations that csekit's options follow, transcribed as references for tests (issue 65, Fidelity V).

Read at McGill-NLP/llm2vec: `llm2vec/llm2vec.py` (`from_pretrained`: pad with EOS on the left; `_convert_to_str`,
`tokenize`, `get_pooling`), `experiments/run_simcse.py` (its collator tokenises the sentences as they are),
`experiments/run_mntp.py` (`DataCollatorForLanguageModelingWithFullMasking`, and transformers'
`DataCollatorForLanguageModeling` for `data_collator_type: default`; the MNTP model `LlamaBiForMNTP`, whose loss is
`LlamaForCausalLM`'s), and the HF Trainer their scripts train with (transformers 4.40: the schedule's length and
`get_linear_schedule_with_warmup`'s factor). Each function computes what theirs does, on the same inputs, in the
same order of random draws; the names say whose it is.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

SEPARATOR = "!@#$%^&*()"
"""llm2vec.py: what separates an instruction from the text (`tokenize` splits on it)."""


def llm2vec_tokenizer(tokenizer: Any) -> Any:
    """`LLM2Vec.from_pretrained`'s tokenizer: padding with EOS, on the left (a copy: csekit's stays as it is)."""
    theirs = copy.deepcopy(tokenizer)
    theirs.pad_token = theirs.eos_token
    theirs.padding_side = "left"
    return theirs


def llm2vec_encode_text(instruction: str, text: str) -> str:
    """`_convert_to_str` (without its shortening of texts over `doc_max_length`): what `encode` tokenises."""
    return f"{instruction.strip()} {SEPARATOR}{text}" if instruction else f"{SEPARATOR}{text}"


def llm2vec_tokenize(tokenizer: Any, texts: Sequence[str], max_length: int) -> dict[str, Tensor]:
    """`LLM2Vec.tokenize`: the texts without the separator, padded on the left; `embed_mask` per row: ones on its
    last n positions, n the token count of the part after the separator alone (none without one: all zeros)."""
    parts = [text.split(SEPARATOR) for text in texts]
    after = [part[1] if len(part) > 1 else "" for part in parts]
    whole = ["".join(part) for part in parts]
    features = dict(tokenizer(whole, return_tensors="pt", padding=True, truncation=True, max_length=max_length))
    rows = []
    for index, text in enumerate(after):
        ids = tokenizer([text], return_tensors="pt", padding=True, truncation=True, max_length=max_length,
                        add_special_tokens=False)["input_ids"][0]  # fmt: skip
        row = torch.zeros_like(features["attention_mask"][index])
        if len(ids) > 0:
            row[-len(ids) :] = torch.ones(len(ids))
        rows.append(row)
    features["embed_mask"] = torch.stack(rows)
    return features


def llm2vec_mean(features: dict[str, Tensor], last_hidden_states: Tensor) -> Tensor:
    """`get_pooling`, `pooling_mode: mean`, `skip_instruction: True` (the default): the attention mask replaced by
    `embed_mask`, then per row the mean of its last `sum(mask)` positions: `x[-0:]` is the whole row."""
    lengths = features["embed_mask"].sum(dim=-1)
    return torch.stack([last_hidden_states[i, -int(n) :, :].mean(dim=0) for i, n in enumerate(lengths)], dim=0)


@contextlib.contextmanager
def flash_attention_padding(backbone: nn.Module, attention_mask: Tensor) -> Iterator[None]:
    """Inside the block, every attention module's output is zero at the padding queries of `attention_mask`: what
    transformers' flash-attention 2 path does (`_upad_input` keeps the real queries only, `pad_input` puts zeros
    back), the `attn_implementation` of LLM2Vec's configurations. Hooks kept for the backward (checkpointing)."""
    keep = attention_mask[..., None]

    def zero_padding(module: nn.Module, args: Any, output: Any) -> Any:
        return (output[0] * keep.to(output[0].dtype), *output[1:])

    handles = [
        module.register_forward_hook(zero_padding)
        for name, module in backbone.named_modules()
        if name.endswith("self_attn")
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def llm2vec_states(backbone: nn.Module, features: dict[str, Tensor]) -> Tensor:
    """The last layer's states of LLM2Vec's bidirectional model under flash-attention 2 on a left-padded batch: its
    position ids 0..L-1 for every row (transformers 4.40's `cache_position`), padding queries given no attention."""
    mask = features["attention_mask"]
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    with flash_attention_padding(backbone, mask):
        return backbone(input_ids=features["input_ids"], attention_mask=mask, position_ids=positions).last_hidden_state


def hf_mask_tokens(inputs: Tensor, tokenizer: Any, probability: float, all_mask: bool) -> tuple[Tensor, Tensor]:
    """transformers' `DataCollatorForLanguageModeling.torch_mask_tokens` (LLM2Vec's `default` collator), or with
    `all_mask` its subclass `DataCollatorForLanguageModelingWithFullMasking` (100% mask token): the masked inputs and
    the labels (-100 where no token was chosen), drawing from torch's global generator in the collators' order."""
    inputs, labels = inputs.clone(), inputs.clone()
    probability_matrix = torch.full(labels.shape, probability)
    special = torch.tensor(
        [tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True) for row in labels.tolist()],
        dtype=torch.bool,
    )
    probability_matrix.masked_fill_(special, value=0.0)
    masked = torch.bernoulli(probability_matrix).bool()
    labels[~masked] = -100
    mask_id = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    if all_mask:
        inputs[masked] = mask_id
        return inputs, labels
    replaced = torch.bernoulli(torch.full(labels.shape, 0.8)).bool() & masked
    inputs[replaced] = mask_id
    randomised = torch.bernoulli(torch.full(labels.shape, 0.5)).bool() & masked & ~replaced
    words = torch.randint(len(tokenizer), labels.shape, dtype=torch.long)
    inputs[randomised] = words[randomised]
    return inputs, labels


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """`LlamaForCausalLM.forward`'s loss, which `LlamaBiForMNTP` keeps: logits[:, :-1] against labels[:, 1:]."""
    shifted, targets = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
    return nn.functional.cross_entropy(shifted.view(-1, shifted.shape[-1]).float(), targets.view(-1))


def hf_trainer_schedule_steps(examples: int, batch_size: int, epochs: float = 3.0) -> int:
    """The HF Trainer's `max_steps` when only epochs are given (its default 3): len(dataloader) (the last batch
    kept, `dataloader_drop_last` False) per epoch, `math.ceil(epochs * steps_per_epoch)`; the schedule's length."""
    return math.ceil(epochs * math.ceil(examples / batch_size))


def hf_linear_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """`get_linear_schedule_with_warmup`'s factor of the base rate after `step` steps."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))
