"""Rotary position embedding (RoPE): the tables and the rotation, shared by the built-in model
and the calibration micro-benchmark that times the same operator (`measure/calibrate.py`)."""

from __future__ import annotations

import torch


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [T, head_dim/2] for RoPE (Su et al. 2021, eq. 34), in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [B, H, T, D] by position; computed in fp32, returned in x's dtype."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)
