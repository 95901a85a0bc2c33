"""The built-in decoder and HF models: shapes, causality, tying, GQA, parameter counts, errors."""

import json

import pytest
import torch

from flopwise.errors import UserError
from flopwise.plan.params import count_params
from flopwise.config.schema import ModelConfig
from flopwise.config.model_shape import llama_ffn_hidden
from flopwise.plan.from_config import model_spec_from_config as model_spec
from flopwise.train.model import build_model, transformer_blocks

VOCAB = 97


def tiny(kind="llama", **overrides) -> ModelConfig:
    fields = dict(kind=kind, n_layers=2, hidden=32, n_heads=4, max_seq_len=16)
    fields.update(overrides)
    return ModelConfig(**fields)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_forward_returns_logits_per_position(kind):
    torch.manual_seed(0)
    model = build_model(tiny(kind), VOCAB)
    logits = model(torch.randint(0, VOCAB, (3, 16)))
    assert logits.shape == (3, 16, VOCAB)
    assert logits.dtype == torch.float32
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_changing_a_future_token_leaves_earlier_logits_unchanged(kind):
    torch.manual_seed(0)
    model = build_model(tiny(kind, n_kv_heads=2), VOCAB).eval()
    ids = torch.randint(0, VOCAB, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % VOCAB
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_same_seed_builds_the_same_weights():
    torch.manual_seed(7)
    first = build_model(tiny(), VOCAB).state_dict()
    torch.manual_seed(7)
    second = build_model(tiny(), VOCAB).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_tied_embeddings_share_one_tensor_and_its_gradient(kind):
    model = build_model(tiny(kind, tie_embeddings=True), VOCAB)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.lm_head.weight.data_ptr() == model.tok_emb.weight.data_ptr()
    untied = build_model(tiny(kind), VOCAB)
    assert n_params(untied) - n_params(model) == VOCAB * 32
    model(torch.randint(0, VOCAB, (2, 8))).sum().backward()
    assert model.tok_emb.weight.grad is not None


def test_grouped_query_attention_has_fewer_key_value_weights():
    model = build_model(tiny(n_heads=4, n_kv_heads=1), VOCAB)
    attn = model.blocks[0].attn
    assert attn.wq.weight.shape == (32, 32)
    assert attn.wk.weight.shape == (8, 32) and attn.wv.weight.shape == (8, 32)
    assert model(torch.randint(0, VOCAB, (2, 8))).shape == (2, 8, VOCAB)


def test_grouped_query_attention_equals_multi_head_with_repeated_kv_weights():
    """GQA is MHA whose key/value heads are copies: build both and compare outputs."""
    torch.manual_seed(0)
    gqa = build_model(tiny(n_kv_heads=2), VOCAB).eval()
    mha = build_model(tiny(), VOCAB).eval()
    state = gqa.state_dict()
    head_dim = 8
    for key, value in list(state.items()):
        if key.endswith(("attn.wk.weight", "attn.wv.weight")):
            heads = value.view(2, head_dim, 32)
            state[key] = heads.repeat_interleave(2, dim=0).reshape(32, 32)
    mha.load_state_dict(state)
    ids = torch.randint(0, VOCAB, (2, 10))
    torch.testing.assert_close(gqa(ids), mha(ids))


def test_llama_uses_rmsnorm_swiglu_and_no_biases():
    model = build_model(tiny(), VOCAB)
    assert isinstance(model.blocks[0].attn_norm, torch.nn.RMSNorm)
    assert not [name for name, _ in model.named_parameters() if name.endswith("bias")]
    assert model.blocks[0].mlp.w1.out_features == llama_ffn_hidden(32) == 128  # int(8*32/3)=85 -> 128
    assert llama_ffn_hidden(4096, multiple_of=256) == 11008  # LLaMA-7B, with Meta's multiple_of
    assert model.pos_emb is None


def test_gpt2_uses_layernorm_learned_positions_and_4h_mlp():
    model = build_model(tiny("gpt2"), VOCAB)
    assert isinstance(model.blocks[0].attn_norm, torch.nn.LayerNorm)
    assert model.blocks[0].attn_norm.bias is not None
    assert model.pos_emb.weight.shape == (16, 32)
    assert model.blocks[0].mlp.c_fc.out_features == 4 * 32
    assert model.blocks[0].attn.wq.bias is not None


CASES = [
    dict(kind="llama"),
    dict(kind="llama", tie_embeddings=True),
    dict(kind="llama", n_kv_heads=2),
    dict(kind="llama", n_kv_heads=1, ffn_hidden=40, tie_embeddings=True),
    dict(kind="gpt2"),
    dict(kind="gpt2", tie_embeddings=True),
    dict(kind="gpt2", n_kv_heads=2, ffn_hidden=48),
]


@pytest.mark.parametrize("fields", CASES, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_parameter_count_matches_the_planner_exactly(fields):
    cfg = tiny(**fields)
    model = build_model(cfg, VOCAB)
    spec = model_spec(cfg, VOCAB, seq_len=16)
    assert n_params(model) == count_params(spec).total


def test_transformer_blocks_of_the_built_in_model():
    model = build_model(tiny(n_layers=3), VOCAB)
    assert transformer_blocks(model) is model.blocks
    assert len(model.blocks) == 3


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(hidden=30, n_heads=4), "model.hidden"),
        (dict(n_heads=4, n_kv_heads=3), "model.n_kv_heads"),
    ],
)
def test_bad_head_layout_is_a_one_line_user_error(fields, words):
    with pytest.raises(UserError, match=words):
        build_model(tiny(**fields), VOCAB)


def test_sequence_longer_than_max_seq_len_is_a_user_error():
    model = build_model(tiny(max_seq_len=8), VOCAB)
    with pytest.raises(UserError, match="model.max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def write_config(tmp_path, content) -> ModelConfig:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return ModelConfig(kind="hf", hf_config=path)


def test_hf_tiny_llama_builds_fp32_and_returns_logits(tmp_path):
    torch.manual_seed(0)
    model = build_model(write_config(tmp_path, TINY_LLAMA), vocab_size=100)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    logits = model(torch.randint(0, 100, (2, 8)))
    assert logits.shape == (2, 8, 128)
    blocks = transformer_blocks(model)
    assert len(blocks) == 2 and type(blocks[0]).__name__ == "LlamaDecoderLayer"
    logits.sum().backward()


def test_hf_config_folder_is_accepted(tmp_path):
    write_config(tmp_path, TINY_LLAMA)
    model = build_model(ModelConfig(kind="hf", hf_config=tmp_path), vocab_size=128)
    assert model.vocab_size == 128


def test_tokenizer_larger_than_hf_vocab_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="vocab_size"):
        build_model(write_config(tmp_path, TINY_LLAMA), vocab_size=129)


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "not valid JSON"),
        ({"hidden_size": 8}, "model_type"),
        ({"model_type": "no-such-model"}, "cannot be read"),
        ({"model_type": "custom-thing", "auto_map": {"AutoConfig": "x.Config"}}, "trust_remote_code=true"),
    ],
)
def test_corrupt_hf_config_is_a_user_error(tmp_path, content, words):
    with pytest.raises(UserError, match=words) as info:
        build_model(write_config(tmp_path, content), vocab_size=10)
    assert "\n" not in str(info.value)


def test_missing_hf_config_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        build_model(ModelConfig(kind="hf", hf_config=tmp_path / "absent.json"), vocab_size=10)
    with pytest.raises(UserError, match="model.hf_config is required"):
        build_model(ModelConfig(kind="hf"), vocab_size=10)


TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}


@pytest.mark.parametrize("config", [TINY_LLAMA, TINY_GPT2], ids=["llama", "gpt2"])
def test_hf_parameter_count_matches_the_planner_exactly(tmp_path, config):
    cfg = write_config(tmp_path, config)
    model = build_model(cfg, vocab_size=100)
    assert n_params(model) == count_params(model_spec(cfg, 100, seq_len=16)).total


REMOTE_CONFIG = """from transformers import LlamaConfig
class TinyConfig(LlamaConfig):
    model_type = "tiny-custom"
"""
REMOTE_MODEL = """from transformers import LlamaForCausalLM
from .configuration_tiny import TinyConfig
class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
"""
REMOTE_CHECK = """
import sys, torch
from flopwise.errors import UserError
from flopwise.config.schema import ModelConfig
from flopwise.train.model import build_model
try:
    build_model(ModelConfig(kind="hf", hf_config=sys.argv[1]), 64)
except UserError as err:
    print("refused:", err)
model = build_model(ModelConfig(kind="hf", hf_config=sys.argv[1], trust_remote_code=True), 64)
print(type(model.hf).__name__, tuple(model(torch.zeros(1, 5, dtype=torch.long)).shape))
"""


def test_hf_custom_code_runs_only_when_trusted(tmp_path):
    """In a fresh process: transformers reads HF_MODULES_CACHE once, at import."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny.py").write_text(REMOTE_MODEL)
    config = dict(TINY_LLAMA, model_type="tiny-custom", vocab_size=64)
    config["auto_map"] = {
        "AutoConfig": "configuration_tiny.TinyConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_CHECK, str(folder / "config.json")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused: model.hf_config" in result.stdout and "trust_remote_code=true" in result.stdout
    assert "TinyForCausalLM (1, 5, 64)" in result.stdout
