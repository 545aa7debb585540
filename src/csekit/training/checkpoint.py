"""The resumable training state, in formats that load without running code.

A run folder may come from someone else, so `checkpoint/` holds no pickled objects: the weights of
every part are safetensors, the optimizer, scheduler, gradient scaler and random-generator states
are tensors and plain values that `torch.load(weights_only=True)` reads (its unpickler rebuilds
only tensors, numbers, strings and containers), and the trainer's position is JSON. Every process
writes its own generator states (`rng_state_<rank>.pt`), since each process draws its own dropout.

Any file that is missing, damaged or holds something other than what csekit wrote gives one
`CsekitError` naming the file, before the first training step.

`write_checkpoint` writes the whole folder (into a held staging folder, swapped in) and `read_checkpoint`
reads it back into a resumed run; the trainer calls them.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from safetensors.torch import load_model, save_model

from csekit.core.atomic import (
    HeldFolder,
    atomic_write_text,
    recover_directory,
    staging_folder,
    swap_in,
    write_by_name,
    write_file,
)
from csekit.core.bounded_read import read_by_name, read_with
from csekit.core.errors import CsekitError
from csekit.encoding.model_folder import non_finite_parameters
from csekit.encoding.weight_files import read_safetensors_header, stores_floating_point
from csekit.training.interrupt import resume_command
from csekit.training.run_folder import (
    CHECKPOINT_STAGING,
    SAVED_RECIPE,
    STATE_FILE,
    TrainerState,
    check_checkpoint,
    read_trainer_state,
)
from csekit.training.state_checks import StateMismatch, check_state

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
LEGACY_FILES = ("custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin", "scheduler.bin")
"""What accelerate's save_state wrote (csekit before this format): pickles, never loaded."""


def rng_file(process: int) -> str:
    return f"rng_state_{process}.pt"


RNG_FILE = re.compile(r"rng_state_(0|[1-9][0-9]{0,5})\.pt")
"""The names `rng_file` gives, one a process."""


def save_shared_state(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any | None = None,
) -> None:
    """What every process has in common (written by the main process): weights, optimizer, scheduler."""
    # save_model drops the second name of a tensor shared by two modules (a head kept at test time).
    write_by_name(
        folder / MODEL_FILE, lambda name: save_model(model, name, metadata={"format": "pt"}, force_contiguous=True)
    )
    write_file(folder / OPTIMIZER_FILE, lambda handle: torch.save(optimizer.state_dict(), handle))
    write_file(folder / SCHEDULER_FILE, lambda handle: torch.save(scheduler.state_dict(), handle))
    if scaler is not None:
        write_file(folder / SCALER_FILE, lambda handle: torch.save(scaler.state_dict(), handle))


def save_rng_state(folder: Path, process: int) -> None:
    """This process's Python, NumPy, torch and CUDA generator states, as tensors and plain values."""
    version, mt_state, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(mt_state), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    write_file(folder / rng_file(process), lambda handle: torch.save(state, handle))


def _require_entry(path: Path, missing: str) -> None:
    """`missing` (a CsekitError) when nothing is at `path`; a link, a FIFO, a device or a folder there is left to the
    bounded reader, which names what it is (`is_file()` called a link to /dev/zero "missing": the wrong fix)."""
    if not os.path.lexists(path):
        raise CsekitError(missing)


def _load_tensors(path: Path, device: torch.device | str = "cpu") -> Any:
    """A file of tensors and plain values; anything else (a pickled object, damage) is a CsekitError."""
    _require_entry(path, f"checkpoint file {path} is missing; the checkpoint is incomplete")
    try:
        state = read_with(
            path, lambda handle: torch.load(handle, map_location=device, weights_only=True), "checkpoint file"
        )
    except CsekitError as error:
        reason = str(error)
    except pickle.UnpicklingError:
        reason = "it holds objects other than tensors and plain values"
    except Exception as error:  # any failure to read the file means it is unusable
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    else:
        return state
    raise CsekitError(f"checkpoint file {path} is damaged or not written by csekit ({reason[:200]}); it was not loaded")


def check_format(folder: Path) -> None:
    """Refuse a checkpoint in accelerate's pickle format before touching any of its files."""
    if not (folder / OPTIMIZER_FILE).exists() and any((folder / name).exists() for name in LEGACY_FILES):
        raise CsekitError(
            f"checkpoint {folder} is in an older format that stores pickles (accelerate's save_state), "
            "which csekit no longer loads because unpickling can run code; start a new run"
        )


def load_shared_state(
    folder: Path,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    scaler: Any | None,
    device: torch.device,
) -> None:
    """Load what `save_shared_state` wrote into the freshly built model, optimizer and scheduler.

    Without a model and optimizer (the processes other than the main one under FSDP, which receive the weights
    and optimizer state from it: csekit.training.sharding) only the scheduler and scaler are read.
    """
    check_format(folder)
    if model is not None and optimizer is not None:
        _load_model_and_optimizer(folder, model, optimizer, device)
    _load_state_dict(folder / SCHEDULER_FILE, scheduler, device)
    if scaler is not None:
        _load_state_dict(folder / SCALER_FILE, scaler, device)


def _load_model_and_optimizer(
    folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    model_path = folder / MODEL_FILE
    _require_entry(model_path, f"checkpoint file {model_path} is missing; the checkpoint is incomplete")
    _check_stored_weights(model_path, model)
    try:
        read_by_name(
            model_path, lambda name: load_model(model, name, strict=True, device=str(device)), "checkpoint file"
        )
    except Exception as error:  # safetensors raises its own error type for a bad header
        reason = str(error).strip().splitlines()[0][:200]
        raise CsekitError(
            f"checkpoint file {model_path} is damaged or does not fit this recipe's model ({reason})"
        ) from None
    bad = non_finite_parameters(model)
    if bad:
        raise CsekitError(f"checkpoint file {model_path} holds weights that are NaN or infinite (e.g. {bad[0]})")
    for name, module in model.named_modules():  # a part's own counters (ESimCSE's queue): `check_loaded_state`
        check = getattr(module, "check_loaded_state", None)
        if callable(check):
            try:
                check()
            except ValueError as error:
                raise CsekitError(f"checkpoint file {model_path} ({name}): {error}") from None
    _load_state_dict(folder / OPTIMIZER_FILE, optimizer, device)


def _check_stored_weights(path: Path, model: torch.nn.Module) -> None:
    """Each weight the checkpoint's header lists for a tensor of the model: the model's shape, and floating point
    where the model's is (before a byte is loaded: safetensors named no weight, "Error(s) in loading state_dict",
    and an integer copy of a float weight loaded as its integer part). Missing and extra names stay safetensors'
    strict check, which knows the weights it stored once for two tied names."""
    header = read_safetensors_header(path)
    for name, tensor in model.state_dict().items():
        entry = header.get(name)
        if entry is None:
            continue
        if entry.get("shape") != list(tensor.shape):
            raise CsekitError(
                f"checkpoint file {path} does not fit this recipe's model: {name} is {str(entry.get('shape'))[:60]}, "
                f"the model's is {list(tensor.shape)}"
            )
        dtype = entry.get("dtype")  # any JSON value in a crafted header
        if tensor.is_floating_point() and not stores_floating_point(dtype):
            raise CsekitError(
                f"checkpoint file {path}: {name} is stored as {str(dtype)[:20]}, not floating point "
                "(an integer copy of a weight is its integer part); it was not loaded"
            )


def _load_state_dict(path: Path, target: Any, device: torch.device) -> None:
    state = _load_tensors(path, device)
    if not isinstance(state, Mapping):
        raise CsekitError(f"checkpoint file {path} does not hold a state (found {type(state).__name__})")
    try:
        check_state(state, target)  # before torch sees it: a wrong shape crashes the fused AdamW kernel
    except StateMismatch as error:
        raise CsekitError(f"checkpoint file {path} does not fit this run: {str(error)[:200]}") from None
    try:
        target.load_state_dict(state)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as error:
        raise CsekitError(f"checkpoint file {path} does not fit this run ({str(error)[:200]})") from None


def saved_processes(folder: Path) -> int:
    """How many processes wrote the checkpoint `folder`: each writes its own generator states (`rng_file`)."""
    return sum(1 for name in os.listdir(folder) if RNG_FILE.fullmatch(name))


def check_processes(folder: Path, processes: int) -> None:
    """A checkpoint resumes only with as many processes as wrote it: with fewer, the first processes' states loaded
    and the run trained on with other batches (each process takes its share of a batch) and other random draws."""
    saved = saved_processes(folder)
    if saved not in (0, processes):  # 0: no generator state at all, which `load_rng_state` names
        raise CsekitError(
            f"checkpoint {folder} was written by {saved} process{'es' if saved > 1 else ''} and this resume runs "
            f"{processes}: the batches and random draws would differ from the run's. Resume with: "
            f"{resume_command(folder.parent, saved)}"
        )


def load_rng_state(folder: Path, process: int) -> None:
    """Restore this process's generators; a missing or wrong file stops the run (the resume would not be exact)."""
    path = folder / rng_file(process)
    _require_entry(
        path,
        f"checkpoint file {path} is missing: the run was saved by fewer processes, or the checkpoint "
        "is incomplete; resume with as many processes as the run had",
    )
    state = _load_tensors(path)
    try:
        version, mt_state, gauss = state["python"]
        name, keys, position, has_gauss, cached = state["numpy"]
        python_state = (int(version), tuple(int(value) for value in mt_state), gauss)
        numpy_state = (str(name), keys.numpy().astype(np.uint32), int(position), int(has_gauss), float(cached))
        torch_state = state["torch"]
        cuda_states = state.get("cuda") if torch.cuda.is_available() else None
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError) as error:
        raise CsekitError(f"checkpoint file {path} does not hold generator states ({str(error)[:200]})") from None


def write_checkpoint(
    accelerator: Accelerator,
    output: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainerState,
    recipe_yaml: str,
) -> None:
    """The run's checkpoint/ (every process takes part): every file into `.checkpoint.tmp`, a folder each process
    holds open (a link put at its name is never written through), then swapped in (core/atomic.py).

    The caller guards it (`guarded_save`): a failed write leaves the previous checkpoint/ whole.
    """
    main = accelerator.is_main_process
    held = staging_folder(output / "checkpoint", CHECKPOINT_STAGING) if main else None
    try:
        accelerator.wait_for_everyone()
        held = held or HeldFolder(output / CHECKPOINT_STAGING)
        staging = held.path
        if main:
            save_shared_state(staging, model, optimizer, scheduler, accelerator.scaler)
        save_rng_state(staging, accelerator.process_index)
        accelerator.wait_for_everyone()
        if main:
            atomic_write_text(staging / STATE_FILE, json.dumps(state.__dict__))
            atomic_write_text(staging / SAVED_RECIPE, recipe_yaml)  # what a --resume must continue
            swap_in(held, output / "checkpoint")
    except BaseException:
        if main and held is not None:  # a half-written staging folder takes the space a full disk lacks
            held.remove()
        raise
    finally:
        if held is not None:
            held.close()
    accelerator.wait_for_everyone()


def read_checkpoint(
    accelerator: Accelerator,
    output: Path,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    total_steps: int,
) -> TrainerState | None:
    """Weights, optimizer, schedule and RNG states from the run's checkpoint/ into the freshly built ones, and
    the position it holds; None when the run stopped before its first checkpoint. Folders a killed swap left
    half-renamed (checkpoint/, best/, last/) are recovered first."""
    checkpoint_dir = output / "checkpoint"
    for folder in (checkpoint_dir, output / "best", output / "last"):
        recover_directory(folder)
    if not check_checkpoint(checkpoint_dir):
        if accelerator.is_main_process:  # the run stopped before its first checkpoint: say what --resume does
            print(f"csekit: no checkpoint in {output}: starting over from step 0", file=sys.stderr)
        return None
    check_processes(checkpoint_dir, accelerator.num_processes)
    state = read_trainer_state(checkpoint_dir / STATE_FILE)
    if state.step > total_steps:  # the loop ends at total_steps: it would never stop
        raise CsekitError(
            f"checkpoint file {checkpoint_dir / STATE_FILE}: step {state.step} is beyond this run's "
            f"{total_steps} steps (train.max_steps / train.epochs)"
        )
    # Not "cpu:0", accelerate's device on CPU processes (gloo): safetensors and torch.load refuse that name, which
    # failed every resume of a run on several CPU processes.
    device = torch.device("cpu") if accelerator.device.type == "cpu" else accelerator.device
    load_shared_state(checkpoint_dir, model, optimizer, scheduler, accelerator.scaler, device)
    load_rng_state(checkpoint_dir, accelerator.process_index)
    return state
