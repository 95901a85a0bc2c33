"""`precision.mode` as a type, decided once: the dtype matmuls run in, the dtype the compute
parameters are held in, and whether the loss is scaled.

Torch-free (dtype names, not torch dtypes) and in the planner package, so the bridge
(`plan/from_config.py`) reads the same decision the trainer acts on (`train/techniques/precision.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.errors import UserError

MODES = ("fp32", "bf16", "fp16", "bf16-params", "fp16-params", "bf16-true")


@dataclass(frozen=True)
class Precision:
    """One precision mode, typed.

    `param_dtype` is the dtype FSDP2 keeps the unsharded (compute) parameters in: 16 bits
    for the `*-params` modes, else fp32. `master_dtype` is the dtype of the parameters the
    optimizer updates (and of its states): fp32, except `bf16-true`, where parameters,
    gradients and optimizer states are all bf16 with no fp32 copy (torchtune's and litgpt's
    fine-tuning default). `loss_scaling`:
    fp16's 5-bit exponent underflows small gradients; bf16 has fp32's range and needs none
    (Micikevicius et al. 2018, arXiv:1710.03740, sec. 3.2).
    """

    mode: str
    compute_dtype: str
    param_dtype: str
    loss_scaling: bool
    master_dtype: str = "fp32"

    @property
    def pure(self) -> bool:
        """Everything in the compute dtype: no fp32 master copy (`bf16-true`)."""
        return self.master_dtype != "fp32"


def precision_of(mode: str) -> Precision:
    """The typed form of `precision.mode`; one-line error for an unknown name."""
    if mode not in MODES:
        raise UserError(f"precision.mode={mode!r} is not one of: {', '.join(MODES)}")
    compute, _, params = mode.partition("-")
    if params == "true":
        return Precision(mode=mode, compute_dtype=compute, param_dtype=compute, loss_scaling=False,
                         master_dtype=compute)
    return Precision(mode=mode, compute_dtype=compute, param_dtype=compute if params else "fp32",
                     loss_scaling=compute == "fp16")
