"""flopwise.compress.artifact: save -> load_compressed round trips."""

import copy

import pytest
import torch

from flopwise.compress import load_compressed, prune, quantize
from flopwise.compress.artifact import dense_state_dict, save_compressed, sparse_state_dict
from flopwise.errors import UserError


def test_sparse_state_dict_round_trip_is_exact():
    weight = torch.randn(64, 64)
    weight[torch.rand(64, 64) < 0.6] = 0
    state = {"w": weight, "b": torch.randn(64)}
    tensors, meta = sparse_state_dict(state)
    assert "w.__mask__" in tensors and "b.__mask__" not in tensors
    restored = dense_state_dict(tensors, meta)
    assert torch.equal(restored["w"], weight) and torch.equal(restored["b"], state["b"])


def test_pruned_model_keeps_sparsity_and_outputs_after_save_load(mlp_task, tmp_path):
    model = copy.deepcopy(mlp_task.model)
    prune.prune_to(model, 0.6)
    prune.make_permanent(model)
    manifest = {"method": "prune", "backend": "torch.nn.utils.prune", "format": "safetensors", "rebuild": mlp_task.rebuild}
    x = mlp_task.make_input(8)
    weights = save_compressed(tmp_path, model, manifest=manifest, example=x[:2])
    loaded = load_compressed(tmp_path)
    assert prune.sparsity_by_layer(loaded)["overall"] == pytest.approx(0.6, abs=1e-3)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    # The standard layout: the module's own keys, dense with zeros, readable without flopwise.
    from safetensors.torch import load_file

    plain = load_file(str(weights))
    assert set(plain) == set(model.state_dict())
    assert all(torch.equal(plain[k], v) for k, v in model.state_dict().items())


def test_int8_graph_round_trip_gives_identical_outputs(cnn_task, tmp_path):
    x = cnn_task.make_input(16)
    graph = quantize.quantize_static(copy.deepcopy(cnn_task.model), x[:4], [x])
    manifest = {"method": "int8-static", "backend": "pt2e-x86", "format": "pt2", "rebuild": cnn_task.rebuild}
    save_compressed(tmp_path, graph, manifest=manifest, example=x[:2])
    loaded = load_compressed(tmp_path)
    with torch.no_grad():
        assert torch.allclose(loaded(x), graph(x), atol=1e-6)


def test_folder_without_manifest_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a compressed model folder"):
        load_compressed(tmp_path)
