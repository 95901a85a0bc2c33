"""What is being compressed: a trained float model plus its data, loss and quality metric.

Built-in tasks (`digits-cnn`, `digits-mlp`) train in seconds on scikit-learn's digits;
the language-model task reads an exported run (`RUN_DIR/export/model.safetensors` +
`RUN_DIR/config.yaml`) and measures validation loss / perplexity on its held-out split.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn
import torch.nn.functional as F

from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir


@dataclass
class Task:
    """A trained model and everything needed to calibrate, fine-tune and score it."""

    name: str
    model: nn.Module
    make_input: Callable[[int], torch.Tensor]  # batch size -> a realistic input batch
    train_batches: Callable[[int, int], Iterator[tuple[torch.Tensor, torch.Tensor]]]  # (batch, seed) -> endless (x, y)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    quality: Callable[[nn.Module], dict]  # model -> {metric: value, ...}
    quality_metric: str
    higher_is_better: bool
    rebuild: dict = field(default_factory=dict)  # how load_compressed rebuilds the float architecture
    quality_basis: str = ""  # what the quality figure is measured on, in words, for the report
    files: dict = field(default_factory=dict)  # file name -> text written next to the compressed model


def relative_quality_loss(task: Task, before: float, after: float) -> float:
    """Quality lost as a fraction of the float model's (positive = worse), for either metric direction."""
    lost = (before - after) if task.higher_is_better else (after - before)
    return lost / abs(before) if before else 0.0


def task_for(cfg, source, *, trust_remote_code: bool = False, accept_run: bool = False) -> Task:
    """The Task a compress config names: a built-in digits task, or the LM of an exported run at `source`."""
    if cfg.task not in (None, "lm"):
        return digits_task(cfg.task)
    return lm_task(Path(source), eval_batches=cfg.eval_batches, batch_size=min(cfg.batch_size, 8),
                   trust_remote_code=trust_remote_code, accept_run=accept_run)


def digits_task(name: str, network_kwargs: dict | None = None, epochs: int | None = None, seed: int = 0) -> Task:
    """Train the built-in digits network `name` for real accuracy (seconds on a CPU core)."""
    from flopwise.compress.models import build_network, digits_accuracy, load_digits_data, train_digits

    kwargs = dict(network_kwargs or {})
    data = load_digits_data()
    torch.manual_seed(seed)
    model = build_network(name, **kwargs)
    default_epochs = 20 if name == "digits-cnn" else 8
    train_digits(model, data, epochs=epochs or default_epochs, seed=seed)

    def make_input(batch: int) -> torch.Tensor:
        reps = math.ceil(batch / len(data.test_x))
        return data.test_x.repeat(reps, 1, 1, 1)[:batch].contiguous()

    def train_batches(batch: int, batch_seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(batch_seed)
        while True:
            idx = torch.randint(len(data.train_y), (batch,), generator=generator)
            yield data.train_x[idx], data.train_y[idx]

    return Task(
        name=name,
        model=model,
        make_input=make_input,
        train_batches=train_batches,
        loss=F.cross_entropy,
        quality=lambda m: {"accuracy": digits_accuracy(m, data)},
        quality_metric="accuracy",
        quality_basis="accuracy: share of the held-out test split of scikit-learn's 8x8 digits classified correctly",
        higher_is_better=True,
        rebuild={"task": name, "network_kwargs": kwargs},
    )


def find_export(source: Path) -> tuple[Path, Path]:
    """(model.safetensors, config.yaml) of a run dir or of a model file next to its config, or a UserError."""
    source = Path(source)
    if not source.exists():
        raise UserError(f"{source}: no such run directory or model file")
    if source.is_dir():
        weights, config = RunDir(source).export / "model.safetensors", RunDir(source).config
        if not weights.exists():
            weights = source / "model.safetensors"
    else:
        weights = source
        config = source.parent / "config.yaml"
        if not config.exists():
            config = source.parent.parent / "config.yaml"
    if weights.suffix != ".safetensors" or not weights.exists():
        raise UserError(f"{source}: no exported checkpoint (expected {source}/export/model.safetensors; run `flopwise export {source}` first)")
    if not config.exists():
        raise UserError(f"{weights}: no config.yaml next to it or in the run directory (needed to rebuild the model)")
    return weights, config


def lm_task(source: Path, eval_batches: int = 8, batch_size: int = 8, model: nn.Module | None = None, run_config=None,
            *, trust_remote_code: bool = False, accept_run: bool = False) -> Task:
    """The trainer's language model from an exported run; quality = held-out validation loss and perplexity.

    `model` and `run_config` let a caller pass an in-memory model instead of an export. The
    run's config.yaml is read only with this user's signature (or `accept_run`), and rebuilds
    the model with remote code only when `trust_remote_code` (`config/signature.py`).
    """
    from flopwise.config.loading import dump_config
    from flopwise.config.signature import read_run_config
    from flopwise.train.data.loader import TokenLoader
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.model import build_model

    config_path = None
    if model is None:
        weights, config_path = find_export(source)
        run_config = read_run_config(config_path, accept_run=accept_run, trust_remote_code=trust_remote_code)
    prepared = prepare_data(run_config.data)
    if model is None:
        from safetensors.torch import load_file

        model = build_model(run_config.model, prepared.vocab_size)
        try:
            missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
        except (RuntimeError, OSError) as err:
            raise UserError(f"{weights}: does not match the model in {config_path} ({str(err).splitlines()[0][:160]})") from None
        if missing or unexpected:
            raise UserError(f"{weights}: missing keys {missing[:3]} / unexpected keys {unexpected[:3]} for the model in {config_path}")
    model.eval()
    seq_len = run_config.data.seq_len

    def loader(split: str, batch: int, seed: int):
        return TokenLoader(prepared, split, seq_len, batch, rank=0, world_size=1, seed=seed, prefetch=0)

    calib = loader("val", batch_size, 0)
    sample_inputs, _ = next(iter(calib))

    def make_input(batch: int) -> torch.Tensor:
        reps = math.ceil(batch / sample_inputs.shape[0])
        return sample_inputs.repeat(reps, 1)[:batch].contiguous()

    def train_batches(batch: int, batch_seed: int):
        yield from loader("train", batch, batch_seed)

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    # The held-out batches the training run itself evaluated (its seed, micro-batch and data-parallel
    # shards), so the fp32 figure here is the run's own last validation loss, not a new sample of it.
    train = run_config.training
    shards = 1 if run_config.parallel.strategy == "pipeline" else run_config.parallel.nproc_per_node * run_config.parallel.nnodes
    basis = (f"val_loss: mean cross-entropy over {shards * eval_batches} held-out batches of {train.micro_batch_size} x "
             f"{seq_len} tokens ({eval_batches} per data-parallel shard x {shards}, seed {train.seed}): the batches "
             f"the training run evaluated{'' if eval_batches == train.eval_batches else ' (first ' + str(eval_batches) + ' per shard)'}; "
             "error bars: standard error over those batches")

    def quality(m: nn.Module) -> dict:
        shard_means, losses = [], []
        with torch.no_grad():
            for shard in range(shards):
                val = TokenLoader(prepared, "val", seq_len, train.micro_batch_size, rank=shard, world_size=shards,
                                  seed=train.seed, prefetch=0)
                mine = [float(lm_loss(m(inputs), targets)) for inputs, targets in val.val_batches(eval_batches)]
                shard_means.append(sum(mine) / len(mine))
                losses += mine
        mean = sum(shard_means) / len(shard_means)  # as the run averages its ranks' means
        spread = statistics.stdev(losses) / math.sqrt(len(losses)) if len(losses) > 1 else 0.0
        return {"val_loss": mean, "perplexity": math.exp(min(mean, 50.0)), "val_loss_stderr": spread}

    return Task(
        name="lm",
        model=model,
        make_input=make_input,
        train_batches=train_batches,
        loss=lm_loss,
        quality=quality,
        quality_metric="val_loss",
        higher_is_better=False,
        rebuild={"task": "lm", "vocab_size": prepared.vocab_size},
        quality_basis=basis,
        files={"config.yaml": dump_config(run_config)},
    )
