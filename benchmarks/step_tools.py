"""Helpers the GPU and step benchmarks share (gpu_throughput.py, profile_step.py, gpu_check_stages.py).

They live here, not in one of the scripts, so that no script imports another that imports it back.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU): a timed window starts and ends with it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def random_bert(tokenizer_dir: Path, folder: Path, **config: Any) -> Path:
    """A randomly initialised BERT (BertConfig's defaults: BERT-base, unless `config` says otherwise), saved."""
    from transformers import AutoConfig, AutoTokenizer

    from csekit.encoding.encoder import SentenceEncoder

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    bert = AutoConfig.for_model("bert", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **config)
    SentenceEncoder.from_config(bert, tokenizer, pooler="cls").save(folder)
    return folder


def random_bert_base(assets: Path, folder: Path) -> Path:
    """A random BERT-base with the WordPiece tokenizer in the GPU check's assets (`ASSETS/tokenizer-bert`)."""
    return random_bert(assets / "tokenizer-bert", folder)


HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__")
"""The Tensor methods that copy a value to the host (on a GPU, each waits for the device)."""


@contextlib.contextmanager
def counting_syncs(device: torch.device) -> Iterator[list[str]]:
    """Inside the block, every host read of a tensor value (and on CUDA, every synchronising call torch reports)."""
    seen: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name: str) -> Callable[..., Any]:
        def read(self: torch.Tensor, *args: Any) -> Any:
            seen.append(name)
            return originals[name](self, *args)

        return read

    for name in HOST_READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield seen
            finally:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        seen.extend("cuda sync" for warning in caught if "synchroniz" in str(warning.message))
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
