"""flopwise.compress.qat: fake-quant fine-tuning converts to a working INT8 graph."""

import copy

import torch

from flopwise.compress.models import digits_accuracy, load_digits_data
from flopwise.compress.qat import quantize_aware_train


def test_qat_trains_and_converts_to_int8_close_to_float(cnn_task):
    graph, losses = quantize_aware_train(copy.deepcopy(cnn_task.model), cnn_task, steps=20, lr=1e-3, batch_size=32)
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))
    weights = [t for n, t in graph.named_buffers() if n.startswith("_frozen_param")]
    assert weights and all(t.dtype == torch.int8 for t in weights)
    data = load_digits_data()
    float_acc = digits_accuracy(cnn_task.model, data)
    assert digits_accuracy(graph, data) > float_acc - 0.05


def test_low_bit_qat_converted_graph_keeps_what_training_learned(cnn_task):
    """2-bit per-tensor weights: PTQ loses accuracy; the converted QAT graph must win it back.

    Guards the qparam pinning in qat.py: without it convert_pt2e re-derived different scales.
    """
    from flopwise.compress.quantize import quantize_static

    batches = cnn_task.train_batches(32, 0)
    calib = [next(batches)[0] for _ in range(4)]
    data = load_digits_data()
    ptq = quantize_static(copy.deepcopy(cnn_task.model), cnn_task.make_input(8), calib, per_channel=False, weight_bits=2)
    qat, _ = quantize_aware_train(copy.deepcopy(cnn_task.model), cnn_task, steps=150, lr=1e-3, batch_size=32, per_channel=False, weight_bits=2)
    ptq_acc, qat_acc = digits_accuracy(ptq, data), digits_accuracy(qat, data)
    assert qat_acc > ptq_acc and qat_acc > 0.85
