"""The strategy a run with `parallel.strategy` unset uses on this device (`plan/default_strategy.py`'s rule).

Chosen once, before any process starts (`launch`), and written into the config the ranks and the
run's config.yaml receive, so every rank, a resume and `plan --config` on that config agree. A rank
started by an outside launcher (torchrun, srun) chooses the same from the same inputs.
"""

from __future__ import annotations

from flopwise.plan.default_strategy import StrategyChoice, memory_only_hardware, settle_strategy
from flopwise.train.launch.machine_fit import machine_memory_bytes


def strategy_of_run_directory(cfg) -> str | None:
    """The strategy recorded in the config.yaml of the run this config resumes, or None."""
    import yaml

    from flopwise.runrecord.run_dir import RunDir

    if not (cfg.checkpoint.resume or cfg.checkpoint.resume_from):
        return None
    try:
        saved = yaml.safe_load(RunDir(cfg.logging.run_dir).config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    strategy = (saved.get("parallel") or {}).get("strategy") if isinstance(saved, dict) else None
    return strategy if strategy in ("single", "ddp", "fsdp", "deepspeed", "pipeline") else None


def this_device(cfg, processes_per_node: int):
    """(memory-only HardwareSpec of one process's share of this machine, "cpu" or "cuda")."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return memory_only_hardware("cuda", float(props.total_memory), props.name), "cuda"
    memory = machine_memory_bytes()
    share = memory / max(1, processes_per_node) if memory else None
    return memory_only_hardware("cpu", share, "this CPU"), "cpu"


def settle_for_this_device(cfg, processes: int | None = None) -> StrategyChoice | None:
    """Choose `parallel.strategy` for this device when the config leaves it unset and write it into
    `cfg`; the choice (to print), or None when the config named the strategy. `processes`: the world
    actually joined (a rank), else the config's."""
    if cfg.parallel.strategy is not None:
        return None
    recorded = strategy_of_run_directory(cfg)
    if recorded is not None:  # a resume keeps what the run was trained with, whatever this machine would pick
        cfg.parallel.strategy = recorded
        return StrategyChoice(recorded, f"the strategy {cfg.logging.run_dir} was trained with (its config.yaml)")
    per_node = max(1, processes // cfg.parallel.nnodes) if processes is not None else cfg.parallel.nproc_per_node
    hardware, kind = this_device(cfg, per_node)
    return settle_strategy(cfg, hardware, kind, processes)
