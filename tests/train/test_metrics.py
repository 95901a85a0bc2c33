"""The saved-activation meter reads the peak alive, not the sum over a pass."""

from __future__ import annotations

import torch
from torch import nn

from flopwise.train.metrics import SavedActivationMeter


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))


def test_one_forward_counts_every_saved_storage_once():
    model = _model()
    meter = SavedActivationMeter(model)
    with meter.measuring():
        out = model(torch.randn(16, 64))
    # the input, and the ReLU output (saved by ReLU and by the second Linear) once; no weights
    assert meter.bytes == 2 * 16 * 64 * 4
    out.sum().backward()
    assert meter.alive_bytes == 0  # autograd released them all after backward


def test_forward_backward_in_turn_peaks_at_one_micro_batch_in_flight():
    """As a pipeline's 1F1B does: each micro-batch's saved tensors are freed by its backward."""
    model = _model()
    single = SavedActivationMeter(model)
    with single.measuring():
        model(torch.randn(16, 64)).sum().backward()
    meter = SavedActivationMeter(model)
    with meter.measuring():
        for _ in range(4):
            model(torch.randn(16, 64)).sum().backward()
    assert meter.bytes == single.bytes
    with meter.measuring():
        outs = [model(torch.randn(16, 64)) for _ in range(2)]  # two in flight
        for out in outs:
            out.sum().backward()
    assert meter.bytes == 2 * single.bytes
