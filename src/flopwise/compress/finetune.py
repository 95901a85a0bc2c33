"""A short single-process fine-tuning loop shared by QAT, gradual pruning and 2:4 recovery.

It is deliberately small (AdamW, constant LR, no distribution): compression fine-tunes
are a few hundred steps on one process. A `before_step(step)` hook lets pruning raise
its sparsity on schedule.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from flopwise.compress.tasks import Task


def finetune(
    model: nn.Module,
    task: Task,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 1,
    before_step: Callable[[int], None] | None = None,
) -> list[float]:
    """Train `model` on the task's train split for `steps` steps; returns the loss of each step."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    batches = task.train_batches(batch_size, seed)
    losses = []
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        inputs, targets = next(batches)
        loss = task.loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
