"""Model and optimizer through torch.distributed.checkpoint (DCP), for every torch-driven strategy.

`get_state_dict` / `set_state_dict` give keys that are the plain module names whatever the
wrapping (one process, DDP, FSDP2, a pipeline stage with the other stages' layers absent),
so DCP reshards on load and a pipeline stage's keys are the same names the whole model has.
Reading goes through `safe_read.safe_dcp_load`: a file can never name code.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.optim import Optimizer

from flopwise.errors import UserError
from flopwise.train.checkpoint.safe_read import LOAD_ERRORS, safe_dcp_load
from flopwise.train.checkpoint.store import first_line, quiet_single_process_notice

FORMAT = "dcp"


def state_dict_options(per_parameter: bool, frozen: bool = False):
    """`per_parameter`: optimizer hyper-parameters keyed by parameter name (`param_groups.<fqn>.lr`).

    Pipeline stages need it: each stage has its own optimizer, and the default layout's
    `param_groups.0.params` would be written by every stage under the same key.
    `frozen`: the model has frozen parameters (a LoRA/QLoRA base): they are the pretrained
    folder's, rebuilt on resume, so only the trainable ones are written and read.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=per_parameter, ignore_frozen_params=frozen,
                            strict=not frozen)


def has_frozen_parameters(model: nn.Module) -> bool:
    """Whether some parameters take no gradient (a frozen fine-tuning base)."""
    return any(not p.requires_grad for p in model.parameters())


def dcp_state_dict(model: nn.Module, optimizer: Optimizer, per_parameter: bool = False) -> dict:
    """Model + optimizer as DCP saves them (`{"model": ..., "optim": ...}`; live tensors, not copies)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    options = state_dict_options(per_parameter, has_frozen_parameters(model))
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}


def save_dcp(model: nn.Module, optimizer: Optimizer, folder: Path, per_parameter: bool = False) -> None:
    """Write this rank's part of model + optimizer into `folder` (collective; files fsynced)."""
    with quiet_single_process_notice():
        dcp.save(dcp_state_dict(model, optimizer, per_parameter), storage_writer=FileSystemWriter(folder, sync_files=True))


def load_dcp(model: nn.Module, optimizer: Optimizer, folder: Path, per_parameter: bool = False) -> None:
    """Fill model + optimizer from `folder`, resharded by DCP; one line when it does not fit (collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = state_dict_options(per_parameter, has_frozen_parameters(model))
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    try:
        with quiet_single_process_notice():
            safe_dcp_load({"model": model_sd, "optim": optim_sd}, folder)
    except UserError:
        raise
    except LOAD_ERRORS as exc:  # a shape or key mismatch: a different model than the one saved
        raise UserError(f"checkpoint {folder} does not fit this model/optimizer: {first_line(exc)}") from None
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=options)
