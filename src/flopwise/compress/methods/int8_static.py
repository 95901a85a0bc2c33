"""INT8 static post-training quantization: activation ranges fixed by calibration.

PT2E flow (`compress/quantize.py: quantize_static`): torch.export, X86InductorQuantizer,
an observer (minmax / histogram / percentile) over `compress.calib_batches` batches, then
`convert_pt2e`. The INT8 graph is saved as `model.pt2` and measured through torch.compile.
"""

from __future__ import annotations

from flopwise.compress.methods.model_flow import ModelMethod, int8_start


def static_ptq(task, cfg, backend: str):
    """The calibrated INT8 graph of `task.model`, with the details of how it was calibrated."""
    from flopwise.compress.quantize import quantize_static

    model, example, calibration, details = int8_start(task, cfg, backend)
    details.update(observer=cfg.observer, calib_batches=cfg.calib_batches)
    ptq = quantize_static(
        model, example, calibration, observer=cfg.observer, percentile=cfg.percentile,
        per_channel=cfg.per_channel, weight_bits=cfg.weight_bits,
    )
    return ptq, details


METHOD = ModelMethod(
    name="int8-static",
    summary="int8 weights and activations, activation ranges calibrated (PT2E, X86InductorQuantizer)",
    apply=static_ptq,
    quantizes=True,
    pt2e_only=True,
)
