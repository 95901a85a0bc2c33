"""flopwise.compress.quantize: INT8 outputs stay close to the float model's."""

import copy

import pytest
import torch

from flopwise.compress import quantize
from flopwise.compress.evaluate import bytes_in_memory


def _relative_error(a, b):
    return float((a - b).norm() / b.norm())


def _calibration(task, n=4, batch=32):
    batches = task.train_batches(batch, 0)
    return [next(batches)[0] for _ in range(n)]


@pytest.mark.parametrize("observer", ["minmax", "histogram", "percentile"])
def test_static_int8_cnn_outputs_close_to_float(cnn_task, observer):
    x = cnn_task.make_input(64)
    graph = quantize.quantize_static(copy.deepcopy(cnn_task.model), x[:8], _calibration(cnn_task), observer=observer)
    with torch.no_grad():
        reference, quantized = cnn_task.model(x), graph(x)
    assert _relative_error(quantized, reference) < 0.05
    assert float((quantized.argmax(-1) == reference.argmax(-1)).float().mean()) > 0.95
    weights = [t for n, t in graph.named_buffers() if n.startswith("_frozen_param")]
    assert weights and all(t.dtype == torch.int8 for t in weights)


def test_static_int8_weights_are_four_times_smaller(mlp_task):
    x = mlp_task.make_input(16)
    graph = quantize.quantize_static(copy.deepcopy(mlp_task.model), x, _calibration(mlp_task))
    ratio = bytes_in_memory(mlp_task.model) / bytes_in_memory(graph)
    assert 3.0 < ratio < 4.1  # int8 weights; fp32 biases and per-channel scales remain


def test_per_tensor_low_bit_weights_lose_more_than_per_channel_int8(cnn_task):
    x = cnn_task.make_input(64)
    calib = _calibration(cnn_task)
    good = quantize.quantize_static(copy.deepcopy(cnn_task.model), x[:8], calib)
    coarse = quantize.quantize_static(copy.deepcopy(cnn_task.model), x[:8], calib, per_channel=False, weight_bits=4)
    with torch.no_grad():
        reference = cnn_task.model(x)
        assert _relative_error(coarse(x), reference) > _relative_error(good(x), reference)


@pytest.mark.parametrize("backend", ["pt2e-x86", "eager"])
def test_dynamic_int8_outputs_close_to_float(mlp_task, backend):
    x = mlp_task.make_input(32)
    model = quantize.quantize_dynamic(copy.deepcopy(mlp_task.model), x[:4], backend)
    with torch.no_grad():
        assert _relative_error(model(x), mlp_task.model(x)) < 0.05


def test_dynamic_int8_torchao_outputs_close_to_float(mlp_task):
    x = mlp_task.make_input(32)
    model = quantize.quantize_dynamic(copy.deepcopy(mlp_task.model), x[:4], "torchao")
    with torch.no_grad():
        assert _relative_error(model(x), mlp_task.model(x)) < 0.05


@pytest.mark.slow
def test_compiled_int8_graph_matches_eager_graph_and_leaves_input_alone():
    """A residual on the graph input: Inductor's fused sum post-op would write into the caller's tensor."""
    from flopwise.compress.models import ResidualMLPBlock

    torch.manual_seed(0)
    model = ResidualMLPBlock(64, 128).eval()
    calibration = [torch.randn(16, 64) for _ in range(4)]
    graph = quantize.quantize_static(model, calibration[0], calibration)
    compiled = quantize.compile_for_cpu(graph)
    x = torch.randn(16, 64)
    x_copy = x.clone()
    with torch.no_grad():
        eager_out = graph(x)
        for _ in range(2):  # the second call would see an overwritten input
            assert _relative_error(compiled(x), eager_out) < 0.02
    assert torch.equal(x, x_copy)
