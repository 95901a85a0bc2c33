"""Model and optimizer of a DeepSpeed engine, saved and loaded by the engine itself, read as data.

DeepSpeed writes its own layout (`mp_rank_00_model_states.pt`, one
`zero_pp_rank_R_mp_rank_00_optim_states.pt` per rank) with `engine.save_checkpoint` into a
sub-folder of the checkpoint being written; the store then hashes, publishes and verifies
it like any other. DeepSpeed 0.19.8 reads those files with `torch.load(weights_only=False)`
(`runtime/checkpoint_engine/torch_checkpoint_engine.py`), i.e. a forged file would run code.
`SafeCheckpointEngine` replaces the engine's reader: `torch.load(weights_only=True)` with
exactly the DeepSpeed classes its checkpoints hold allow-listed (`ALLOWED_GLOBALS`), so a
file can construct plain data only and never call anything else.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from flopwise.errors import UserError
from flopwise.train.checkpoint.confined_open import CheckpointPathRefused, open_in_checkpoint
from flopwise.train.checkpoint.safe_read import REFUSED

FORMAT = "deepspeed"
TAG = "deepspeed"  # the engine's sub-folder inside checkpoints/step-N


def allowed_globals() -> list:
    """The non-torch classes DeepSpeed 0.19.8 pickles into its checkpoints (ZeRO 0-3, fp32/bf16/fp16).

    Each is an enum or a plain-data holder, harmless to construct: torch's weights-only
    unpickler rebuilds them from their fields and never calls their methods.
    """
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # found with torch.serialization.get_unsafe_globals_in_checkpoint on checkpoints of
    # ZeRO-1 (bf16), ZeRO-2 (fp32) and ZeRO-3 (fp32, bf16): fragment_address is a
    # (numel, start) dataclass of stages 1-2; DynamicLossScaler is LossScaler's fp16 twin
    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def make_safe_checkpoint_engine(config):
    """A `TorchCheckpointEngine` whose `load` reads weights-only; built lazily (DeepSpeed is optional)."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    class SafeCheckpointEngine(TorchCheckpointEngine):
        """DeepSpeed's torch engine, reading with `torch.load(weights_only=True)` and an allow-list."""

        def load(self, path: str, map_location=None):
            return safe_weights_only_load(path, map_location)

    return SafeCheckpointEngine(config)


def safe_weights_only_load(path: str, map_location=None, *, _load=torch.load):
    """`torch.load(weights_only=True)` with DeepSpeed's data classes allowed; one line on a refused or bad file."""
    try:
        handle = open_in_checkpoint(Path(path).parent, Path(path).name, "DeepSpeed's loader")
    except CheckpointPathRefused as exc:  # a link, a FIFO (which would block the read forever), a device
        raise UserError(f"checkpoint file {path}: {exc}; a checkpoint is data and may not name code") from None
    except OSError as exc:
        raise UserError(f"checkpoint file {path}: unreadable ({exc.strerror})") from None
    try:
        with handle, torch.serialization.safe_globals(allowed_globals()):
            return _load(handle, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UserError(f"checkpoint file {path}: {REFUSED}: {weights_only_reason(exc)}; "
                        "a checkpoint is data and may not name code") from None
    except Exception as exc:  # truncated, not a torch file at all, ...
        lines = str(exc).strip().splitlines()
        raise UserError(f"checkpoint file {path}: unreadable ({type(exc).__name__}: "
                        f"{lines[0][:160] if lines else ''})") from None


def weights_only_reason(exc: Exception) -> str:
    """The unpickler's own reason out of torch's long weights-only message (e.g. `Unsupported global: GLOBAL os.system`)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    parts = [" ".join(part.split()) for part in text.split("\n\n")]
    generic = ("Weights only load failed", "Check the documentation", "Please file an issue")
    useful = [part for part in parts if part and not part.startswith(generic)]
    reason = useful[0] if useful else type(exc).__name__
    return reason.split(" was not an allowed global")[0][:160]


def use_safe_reader(engine) -> None:
    """Replace the engine's checkpoint reader by the weights-only one (call right after `deepspeed.initialize`)."""
    engine.checkpoint_engine = make_safe_checkpoint_engine(engine._config)


def save_engine(engine, folder: Path) -> None:
    """Every rank writes its part through `engine.save_checkpoint` into `folder/deepspeed/` (collective), fsynced."""
    engine.save_checkpoint(str(folder), tag=TAG, save_latest=False)
    for file in (Path(folder) / TAG).glob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


def refuse_linked_tag(folder: Path) -> None:
    """DeepSpeed opens `folder/deepspeed/<file>`: that folder must be the checkpoint's own, not a link out of it."""
    if (Path(folder) / TAG).is_symlink():
        raise UserError(f"checkpoint {folder}: {REFUSED}: {TAG}/ is a symbolic link (never followed); "
                        "a checkpoint's files stay inside its folder")


def load_engine(engine, folder: Path) -> None:
    """Model, ZeRO partitions, optimizer and LR schedule from `folder/deepspeed/` (collective)."""
    refuse_linked_tag(folder)
    if not (Path(folder) / TAG).is_dir():
        raise UserError(f"checkpoint {folder}: no {TAG}/ folder; it was not written by "
                        "parallel.strategy=deepspeed (resume it with the strategy that wrote it)")
    saved_ranks = len(list((Path(folder) / TAG).glob("*_optim_states.pt")))  # ZeRO 1-3: one file per rank
    if saved_ranks and saved_ranks != engine.dp_world_size:
        raise UserError(f"checkpoint {folder} was written by {saved_ranks} DeepSpeed ranks and this run has "
                        f"{engine.dp_world_size}; DeepSpeed's own layout does not reshard (resume with "
                        f"{saved_ranks} processes)")
    try:
        load_path, _ = engine.load_checkpoint(str(folder), tag=TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
    except UserError:
        raise
    except Exception as exc:  # DeepSpeed asserts and raises what it likes on a mismatch
        first = str(exc).strip().splitlines()
        raise UserError(f"checkpoint {folder} does not fit this model/optimizer: "
                        f"{first[0][:200] if first else type(exc).__name__}") from None
    if load_path is None:
        raise UserError(f"checkpoint {folder}: DeepSpeed found no model states in {TAG}/")


def consolidated_fp32_state(folder: Path) -> dict:
    """The full fp32 model state of a DeepSpeed checkpoint (any ZeRO stage), on the CPU, in this process.

    DeepSpeed's own `zero_to_fp32` merges the per-rank ZeRO partitions; its reader calls
    `torch.load(weights_only=False)`, so it runs here with every load made weights-only with
    the same allow-list as resuming (`safe_weights_only_load`): the checkpoint stays data.
    """
    from deepspeed.utils import zero_to_fp32

    refuse_linked_tag(folder)
    if not (Path(folder) / TAG).is_dir():
        raise UserError(f"checkpoint {folder}: no {TAG}/ folder; it was not written by parallel.strategy=deepspeed")
    original = zero_to_fp32.torch.load  # the torch module's own: restored below
    zero_to_fp32.torch.load = lambda path, map_location=None, **_: safe_weights_only_load(path, map_location)
    try:
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=TAG)
    except UserError:
        raise
    except Exception as exc:  # DeepSpeed raises what it likes on a partial or foreign layout
        first = str(exc).strip().splitlines()
        raise UserError(f"checkpoint {folder}: DeepSpeed could not merge its ZeRO partitions: "
                        f"{first[0][:200] if first else type(exc).__name__}") from None
    finally:
        zero_to_fp32.torch.load = original
    return {name: tensor.float() for name, tensor in state.items()}
