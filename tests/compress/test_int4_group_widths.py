"""int4-weight-only on a model whose MLP width (80) is not a multiple of the CPU group size (32):
those linears stay float, named in a note, the rest is int4, and the folder loads and generates.
Without the skip torchao refuses the model, so the test shows the skip is what makes it work."""

from __future__ import annotations

import pytest
import torch

from flopwise.compress.llm import quantize_folder, ungroupable_linears
from flopwise.compress.methods import get_method


@pytest.fixture(scope="module")
def odd_width(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.hf_fixtures import write_pretrained

    folder = write_pretrained(tmp_path_factory.mktemp("odd") / "model")  # for its tokenizer
    config = LlamaConfig(hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder), safe_serialization=True)
    return folder


def test_linears_that_cannot_be_grouped_stay_float(odd_width, tmp_path):
    from transformers import AutoModelForCausalLM

    method = get_method("int4-weight-only")
    group = method.group_size("cpu")
    skipped = ungroupable_linears(odd_width, group)
    assert skipped == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    out = quantize_folder(odd_width, tmp_path / "int4", method.torchao_config("cpu"), skip=skipped)
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    down = model.model.layers[0].mlp.down_proj.weight
    up = model.model.layers[0].mlp.up_proj.weight
    assert type(down.data) is torch.Tensor and down.dtype == torch.float32  # left in float
    assert type(up.data) is not torch.Tensor  # a torchao int4 tensor
    ids = torch.arange(1, 17).view(1, 16)
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == 19


def test_without_the_skip_torchao_refuses(odd_width, tmp_path):
    with pytest.raises(Exception):
        quantize_folder(odd_width, tmp_path / "int4", get_method("int4-weight-only").torchao_config("cpu"))
