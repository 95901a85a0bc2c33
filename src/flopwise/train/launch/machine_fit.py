"""Refuse, before any process starts, a run this machine cannot even build or host.

Processes: without CUDA, more than 8 ranks per CPU core only thrash the machine (each
rank is a full Python process with its own model copy and threads).

Two lower bounds, so a run that would fit is never refused: every process builds the whole
model in fp32 before it is sharded (4 bytes per parameter, counted as the planner counts
them; 2 for a LoRA/QLoRA base read in a 16-bit compute dtype), and the loss reads fp32
logits of `micro_batch_size x seq_len x vocab_size`. Their sum times the processes on this
node must fit in the machine's memory; otherwise the ranks die later in the allocator
with a traceback each.
"""

from __future__ import annotations

import os

from flopwise.config.resolve import ResolvedRun
from flopwise.errors import UserError

GIB = 2**30


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def parameter_count(cfg) -> int | None:
    """Parameters of the model, as the planner counts them (`plan/params.py`); None for an HF model
    whose family only transformers knows."""
    if cfg.model.kind == "hf":
        return hf_parameters(cfg)
    from flopwise.plan.from_config import model_spec_from_config
    from flopwise.plan.params import count_params

    return count_params(model_spec_from_config(cfg.model, cfg.data.vocab_size, cfg.data.seq_len)).total


RANKS_PER_CORE = 8


def check_process_count(cfg, run: ResolvedRun) -> None:
    """On a machine without CUDA, at most RANKS_PER_CORE processes per CPU core."""
    import torch

    cores = os.cpu_count() or 1
    most = RANKS_PER_CORE * cores
    if not torch.cuda.is_available() and run.processes_per_node > most:
        raise UserError(f"parallel.nproc_per_node: {cfg.parallel.nproc_per_node} processes on {cores} CPU core(s) "
                        f"without a GPU (allowed here: at most {most}, {RANKS_PER_CORE} per core)")


def hf_parameters(cfg) -> int | None:
    """Parameters of the `model.kind: hf` model, from its config.json read as plain JSON (catalog/models.py).

    A config the catalog reads is checked here, before any process starts (heads, sizes: one
    line naming the file); one of a family only transformers knows is left to transformers
    (None), whose errors `train/model.py: load_hf_config` turns into one line.
    """
    import json

    from flopwise.catalog.models import from_hf_config, reads_hf_model_type
    from flopwise.config.model_shape import hf_config_path
    from flopwise.plan.params import count_params

    path = hf_config_path(cfg.model)
    try:
        model_type = json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None  # train/model.py says what is wrong with the file
    if not reads_hf_model_type(model_type):
        return None
    return count_params(from_hf_config(path, seq_len=cfg.data.seq_len)).total


def weight_bytes_per_parameter(cfg, run: ResolvedRun) -> int:
    """Bytes each process holds per parameter while it builds the model: 4 (fp32), or 2 for a LoRA/QLoRA
    base read in a 16-bit compute dtype (`train/build.py` reads a frozen base straight into it)."""
    adapters = cfg.finetune is not None and cfg.finetune.adapters
    return 2 if adapters and run.precision.compute_dtype != "fp32" else 4


def check_fits_this_machine(cfg, run: ResolvedRun) -> None:
    """One UserError line when the processes, or the lower bound of their memory, exceed this machine."""
    check_process_count(cfg, run)
    parameters = parameter_count(cfg)
    total = machine_memory_bytes()
    if total is None or parameters is None:
        return
    procs = run.processes_per_node
    weights = weight_bytes_per_parameter(cfg, run) * parameters
    logits = 4 * cfg.training.micro_batch_size * cfg.data.seq_len * cfg.data.vocab_size
    need = procs * (weights + logits)
    if need > total:
        raise UserError(
            f"model/training: this run needs at least {need / GIB:,.1f} GiB on this machine ({procs} process(es) x "
            f"({weights / GIB:,.1f} GiB of weights + {logits / GIB:,.1f} GiB of fp32 logits for "
            f"micro_batch_size x seq_len x vocab_size)), more than its {total / GIB:,.1f} GiB; make "
            f"{'the model in model.hf_config' if cfg.model.kind == 'hf' else 'model.hidden/n_layers'}, "
            "training.micro_batch_size or data.seq_len smaller")
