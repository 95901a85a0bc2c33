"""Quantization-aware training: fake-quantized fine-tuning, then the same INT8 graph as static PTQ.

Static PTQ runs first with the same settings, so the record can say how much of its quality
loss QAT wins back (`qat_recovery` in the summary). The training itself is
`compress/qat.py: quantize_aware_train` (PT2E `prepare_qat_pt2e`).
"""

from __future__ import annotations

import copy

from flopwise.compress.methods.int8_static import static_ptq
from flopwise.compress.methods.model_flow import ModelMethod


def quantize_aware(task, cfg, backend: str):
    """The QAT graph of `task.model`, with the PTQ quality and the first and last training losses."""
    from flopwise.compress.qat import quantize_aware_train

    ptq, details = static_ptq(task, cfg, backend)
    ptq_quality = task.quality(ptq)
    qat_model, losses = quantize_aware_train(
        copy.deepcopy(task.model), task, cfg.qat_steps, cfg.lr, cfg.batch_size,
        per_channel=cfg.per_channel, weight_bits=cfg.weight_bits,
    )
    details.update(qat_steps=cfg.qat_steps, ptq_quality=ptq_quality, qat_first_loss=losses[0], qat_last_loss=losses[-1])
    return qat_model, details


def recovery(task, before: dict, after: dict, details: dict) -> dict:
    """Share of the PTQ quality loss that QAT wins back: (qat - ptq) / (float - ptq), in the metric's direction."""
    from flopwise.compress.tasks import relative_quality_loss

    metric = task.quality_metric
    float_q, ptq_q, qat_q = before["quality"], details["ptq_quality"], after["quality"]
    ptq_loss = relative_quality_loss(task, float_q[metric], ptq_q[metric])
    qat_loss = relative_quality_loss(task, float_q[metric], qat_q[metric])
    recovered = (ptq_loss - qat_loss) / ptq_loss if ptq_loss > 0 else None
    return {"qat_recovery": {"ptq_relative_loss": ptq_loss, "qat_relative_loss": qat_loss, "recovered_fraction": recovered}}


METHOD = ModelMethod(
    name="qat",
    summary="quantization-aware training, then the INT8 graph of static PTQ (PT2E prepare_qat_pt2e)",
    apply=quantize_aware,
    quantizes=True,
    pt2e_only=True,
    extra_summary=recovery,
)
