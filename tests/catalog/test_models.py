"""The model catalog, the HuggingFace config reader and `flopwise models`.

The oracle for `from_hf_config` + `count_params` is transformers itself: each family's
small config is saved with `save_pretrained`, read back offline, and the count compared
with the parameters of the model transformers builds from it on the meta device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flopwise.catalog.models import from_hf_config, get_model, load_models, models_from_yaml
from flopwise.errors import UserError
from flopwise.plan.params import count_params

REQUIRED_KEYS = (
    "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b",
    "gpt3-175b", "gpt2-124m", "gpt2-355m", "gpt2-774m", "gpt2-1.5b", "bert-base", "bert-large",
    "llama-7b", "llama-13b", "llama-33b", "llama-65b", "llama2-7b", "llama2-13b", "llama2-70b",
    "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "mistral-7b",
    "mixtral-8x7b", "bloom-176b", "opt-175b", "resnet50", "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b",
    "mpt-30b", "mpt-70b", "nemotron4-15b", "nemotron4-340b", "mixtral-8x22b", "gpt-neox-20b",
    "llama3.2-1b", "llama3.2-3b", "qwen2.5-7b", "deepseek-v3", "nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b",
)


def test_catalog_has_the_required_models_with_sources():
    models = load_models()
    assert set(REQUIRED_KEYS) <= set(models)
    for key, spec in models.items():
        assert spec.key == key
        assert spec.source and spec.seq_len > 0
        assert spec.reported_params > 0


def test_catalog_sizes_are_near_their_reported_sizes():
    """Computed totals sit within 7 % of the size each source publishes (GPT-2 paper's 117M is the outlier)."""
    for spec in load_models().values():
        total = count_params(spec).total
        assert abs(total - spec.reported_params) / spec.reported_params < 0.07, spec.key


def test_get_model_is_case_insensitive():
    assert get_model("Llama3.1-405B") is get_model("llama3.1-405b")
    assert get_model("  MIXTRAL-8x7B ").n_experts == 8


@pytest.mark.parametrize(("name", "key"), [
    ("Llama-2-7B", "llama2-7b"), ("llama-3-8b", "llama3-8b"), ("Llama 3.1 405B", "llama3.1-405b"),
    ("meta-llama/Llama-2-7b-hf", "llama2-7b"), ("meta-llama/Meta-Llama-3-70B", "llama3-70b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b"), ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("GPT-3 175B", "gpt3-175b"), ("gpt3-xl", "gpt3-1.3b"), ("gpt2", "gpt2-124m"), ("gpt2-xl", "gpt2-1.5b"),
    ("Nemotron-4-340B", "nemotron4-340b"), ("mosaicml/mpt-7b", "mpt-7b"), ("bigscience/bloom", "bloom-176b"),
    ("Qwen/Qwen2.5-7B", "qwen2.5-7b"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3"), ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite"),
    # the GPT-3 paper's size names with their spaces, GPT-2's, flash-attention's experiment names
    ("GPT-3 XL", "gpt3-1.3b"), ("GPT-3 Small", "gpt3-125m"), ("GPT-3 Large", "gpt3-760m"), ("GPT-2 XL", "gpt2-1.5b"),
    ("GPT2-small", "gpt2-124m"), ("gpt3xl", "gpt3-1.3b"), ("gpt3m", "gpt3-350m"), ("gpt2l", "gpt2-774m"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama3.1-70b"),
    # Nemotron-H as its report, the Hub and NeMo's recipes (nemotronh_56b.py) name it
    ("Nemotron-H 8B", "nemotron-h-8b"), ("nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
    ("nvidia/Nemotron-H-47B-Base-8K", "nemotron-h-47b"), ("nemotronh 56b", "nemotron-h-56b")])
def test_a_model_as_papers_and_the_hub_name_it_resolves(name, key):
    assert get_model(name).key == key


def test_unknown_key_suggests_close_matches():
    with pytest.raises(UserError, match="did you mean: .*llama3-8b"):
        get_model("llama-3-8B-turbo")
    with pytest.raises(UserError, match="did you mean: qwen2.5-7b"):  # Qwen2 7B is another model
        get_model("qwen2-7b")


def test_a_hub_id_the_catalog_does_not_hold_is_a_missing_path():
    with pytest.raises(UserError, match="nope/nothing: no such file or folder"):
        get_model("nope/nothing")


def test_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        get_model(str(tmp_path / "nowhere" / "config.json"))


def test_resnet50_catalog_figures_match_a_torch_model():
    """ResNet-50 (He et al. 2016, torchvision layout): params and forward FLOPs at 2 per multiply-add."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    with torch.device("meta"):  # shapes are all that counting needs
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
                cin = mid * 4
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)).eval()
        image = torch.zeros(1, 3, 224, 224)

    spec = get_model("resnet50")
    assert sum(p.numel() for p in model.parameters()) == spec.params
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(image)
    assert counter.get_total_flops() == spec.flops_per_sample


# --- HuggingFace config.json: transformers as the oracle ------------------------------

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=211)

HF_CASES = {
    "llama": ("LlamaConfig", dict(SMALL, intermediate_size=96, num_key_value_heads=2)),
    "llama-bias-headdim-tied": (
        "LlamaConfig",
        dict(SMALL, intermediate_size=96, num_key_value_heads=2, head_dim=24, attention_bias=True,
             mlp_bias=True, tie_word_embeddings=True),
    ),
    "mistral": ("MistralConfig", dict(SMALL, intermediate_size=96, num_key_value_heads=1)),
    "mixtral": (
        "MixtralConfig",
        dict(SMALL, intermediate_size=48, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2": ("Qwen2Config", dict(SMALL, intermediate_size=96, num_key_value_heads=2)),
    "qwen2-tied": ("Qwen2Config", dict(SMALL, intermediate_size=96, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(SMALL, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=80,
             num_experts=6, num_experts_per_tok=2, num_key_value_heads=2),
    ),
    # qwen3: per-head q/k RMSNorms and a head_dim apart from hidden / heads (Qwen3-30B-A3B's 128 at hidden 2048)
    "qwen3": ("Qwen3Config", dict(SMALL, intermediate_size=96, num_key_value_heads=2, head_dim=24)),
    "qwen3-tied-bias": ("Qwen3Config", dict(SMALL, intermediate_size=96, num_key_value_heads=2,
                                            tie_word_embeddings=True, attention_bias=True)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(SMALL, intermediate_size=96, moe_intermediate_size=32, num_experts=6, num_experts_per_tok=2,
             num_key_value_heads=2, head_dim=24),
    ),
    # llama4: top-1 experts plus an ungated shared expert; step 2 alternates dense (intermediate_size_mlp) and MoE
    "llama4_text": ("Llama4TextConfig", dict(SMALL, intermediate_size=32, intermediate_size_mlp=96, num_key_value_heads=2,
                                             head_dim=24, num_local_experts=4, num_experts_per_tok=1,
                                             max_position_embeddings=96)),
    "llama4_text-interleaved": ("Llama4TextConfig", dict(SMALL, num_hidden_layers=4, intermediate_size=32,
                                                         intermediate_size_mlp=64, num_key_value_heads=2, head_dim=16,
                                                         num_local_experts=4, interleave_moe_layer_step=2,
                                                         max_position_embeddings=96)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=211, n_positions=96)),
    "gpt_neox": ("GPTNeoXConfig", dict(SMALL, intermediate_size=160, max_position_embeddings=96)),
    "bert": ("BertConfig", dict(SMALL, intermediate_size=128, max_position_embeddings=96, type_vocab_size=3)),
    "opt": ("OPTConfig", dict(SMALL, ffn_dim=128, max_position_embeddings=96, word_embed_proj_dim=64)),
    "opt-postnorm": (
        "OPTConfig",
        dict(SMALL, ffn_dim=128, max_position_embeddings=96, word_embed_proj_dim=64, do_layer_norm_before=False),
    ),
    "bloom": ("BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=211)),
    "falcon-7b-style": ("FalconConfig", dict(SMALL, multi_query=True, parallel_attn=True, bias=False)),
    "falcon-40b-style": (
        "FalconConfig", dict(SMALL, new_decoder_architecture=True, num_kv_heads=2, ffn_hidden_size=96),
    ),
    "falcon-sequential-bias": (
        "FalconConfig", dict(SMALL, multi_query=False, parallel_attn=False, bias=True, alibi=True),
    ),
    # MPT: no biases anywhere (its LayerNorms' too), ALiBi, tied head; transformers' MptMLP is 4 x d_model
    # whatever expansion_ratio says (llm-foundry, which the reader follows, honours it)
    "mpt": ("MptConfig", dict(d_model=64, n_heads=4, n_layers=2, vocab_size=211, max_seq_len=96, expansion_ratio=4)),
    "nemotron": ("NemotronConfig", dict(SMALL, intermediate_size=96, num_key_value_heads=2)),
    # DeepSeek: multi-head latent attention with head widths apart from hidden / heads, a dense first
    # block of its own width, then MoE blocks of ungated shared experts; transformers builds no
    # multi-token-prediction module, so the configs say so (the reader refuses one)
    "deepseek_v3": ("DeepseekV3Config", dict(
        SMALL, num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=160, moe_intermediate_size=24,
        n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, n_group=2, topk_group=1, q_lora_rank=48,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=128,
        num_nextn_predict_layers=0)),
    "deepseek_v3-no-query-latent-bias-tied": ("DeepseekV3Config", dict(
        SMALL, num_hidden_layers=3, first_k_dense_replace=0, intermediate_size=160, moe_intermediate_size=24,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=None,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=128,
        attention_bias=True, tie_word_embeddings=True, num_nextn_predict_layers=0)),
    "deepseek_v2": ("DeepseekV2Config", dict(
        SMALL, num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=160, moe_intermediate_size=24,
        n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=3, q_lora_rank=None, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=128)),
    # gpt-oss: biased GQA with a sink per head, biased experts behind a biased router, alternating windows
    "gpt_oss": ("GptOssConfig", dict(
        SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=24, intermediate_size=48, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=8, max_position_embeddings=128)),
    # Nemotron-H: Mamba-2, attention and MLP layers by Megatron's pattern (mamba d = 8 x 16 = 2h)
    "nemotron_h": ("NemotronHConfig", dict(
        hidden_size=64, hybrid_override_pattern="M-M*-M", num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, vocab_size=211, mamba_num_heads=8, mamba_head_dim=16,
        ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=32, max_position_embeddings=128)),
    "nemotron_h-mlp-bias-tied": ("NemotronHConfig", dict(
        hidden_size=64, hybrid_override_pattern="*-M-", num_attention_heads=4, num_key_value_heads=4,
        head_dim=8, intermediate_size=48, vocab_size=211, mamba_num_heads=4, mamba_head_dim=8,
        ssm_state_size=8, n_groups=1, mlp_bias=True, tie_word_embeddings=True)),
}


def _hf_reference_count(config) -> int:
    """Unique parameters of the model transformers builds (tied weights counted once)."""
    import torch
    from transformers import AutoModelForCausalLM, BertModel

    with torch.device("meta"):
        if config.model_type == "bert":
            model = BertModel(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_config_count_matches_transformers(case, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    class_name, kwargs = HF_CASES[case]
    config = getattr(transformers, class_name)(**kwargs)
    config.save_pretrained(tmp_path)

    spec = from_hf_config(tmp_path / "config.json")
    assert count_params(spec).total == _hf_reference_count(config)
    assert get_model(str(tmp_path)) == spec  # a folder holding config.json works too


@pytest.mark.parametrize("case, parallel", [("gpt_neox", True), ("falcon-7b-style", True),
                                            ("falcon-sequential-bias", False), ("llama", False)])
def test_hf_config_says_whether_the_block_is_parallel(case, parallel, tmp_path):
    """GPT-NeoX (`use_parallel_residual`, transformers' default True) and Falcon (`parallel_attn`)
    run attention and MLP on the same input; the planner reduces their sum once under TP."""
    transformers = pytest.importorskip("transformers")
    class_name, kwargs = HF_CASES[case]
    getattr(transformers, class_name)(**kwargs).save_pretrained(tmp_path)
    assert from_hf_config(tmp_path / "config.json").parallel_block is parallel


def _write_config(tmp_path, data) -> str:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


LLAMA_JSON = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
    vocab_size=211, max_position_embeddings=128,
)


DEEPSEEK_V3_JSON = dict(
    # the shape keys of HF deepseek-ai/DeepSeek-V3's config.json, as published
    model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
    num_experts_per_tok=8, first_k_dense_replace=3, moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_group=8, topk_group=4, topk_method="noaux_tc",
    max_position_embeddings=163840, tie_word_embeddings=False, attention_bias=False, num_nextn_predict_layers=1,
)


def test_hf_config_defaults_follow_transformers(tmp_path):
    """Keys a config may omit take the family's transformers default (no GQA, untied, no bias)."""
    spec = from_hf_config(_write_config(tmp_path, LLAMA_JSON))
    assert (spec.n_kv_heads, spec.tied_embeddings, spec.attn_bias, spec.mlp) == (4, False, False, "swiglu")


def test_hf_config_seq_len_override(tmp_path):
    path = _write_config(tmp_path, LLAMA_JSON)
    assert from_hf_config(path).seq_len == 128  # max_position_embeddings
    assert from_hf_config(path, seq_len=64).seq_len == 64


def test_hf_unsupported_model_type(tmp_path):
    path = _write_config(tmp_path, dict(LLAMA_JSON, model_type="t5"))
    with pytest.raises(UserError, match=r"config\.json: unsupported model_type 't5' \(supported: .*llama"):
        from_hf_config(path)


def test_hf_missing_key_names_file_and_key(tmp_path):
    data = dict(LLAMA_JSON)
    del data["hidden_size"]
    with pytest.raises(UserError, match=r"config\.json: missing key 'hidden_size'"):
        from_hf_config(_write_config(tmp_path, data))


def test_hf_corrupt_json(tmp_path):
    with pytest.raises(UserError, match=r"config\.json: not valid JSON"):
        from_hf_config(_write_config(tmp_path, '{"model_type": "llama", "hidden_size": '))


def test_hf_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        from_hf_config(tmp_path)  # a folder without config.json


def test_hf_wrong_type_value(tmp_path):
    with pytest.raises(UserError, match="key 'num_hidden_layers' must be a whole number"):
        from_hf_config(_write_config(tmp_path, dict(LLAMA_JSON, num_hidden_layers="two")))


# --- catalog validation ------------------------------------------------------------------

GOOD_ENTRY = """
models:
  tiny:
    n_layers: 2
    hidden: 64
    n_heads: 4
    ffn_hidden: 96
    vocab_size: 211
    seq_len: 128
    mlp: swiglu
    norm: rmsnorm
    position: rope
    source: test
"""


HYBRID = """    norms_per_layer: 1
    hybrid_pattern: M*
    mamba_heads: 8
    mamba_head_dim: 16
    mamba_state: 16
    mamba_groups: 2"""
"""A two-layer hybrid (a Mamba-2 layer, an attention layer) added to GOOD_ENTRY."""


def test_yaml_entry_loads():
    spec = models_from_yaml(GOOD_ENTRY, "t.yaml")["tiny"]
    assert spec.name == "tiny" and spec.mlp == "swiglu"


def test_a_hybrid_entry_loads():
    spec = models_from_yaml(GOOD_ENTRY.replace("n_heads: 4", "n_heads: 4\n" + HYBRID), "t.yaml")["tiny"]
    assert spec.hybrid_pattern == "M*" and spec.mamba_chunk == 128 and spec.mamba_conv == 4


@pytest.mark.parametrize(
    "edit, message",
    [
        (("    seq_len: 128", "    seq_len: 128\n    hiden: 3"), r"model 'tiny': unknown field 'hiden' \(did you mean: hidden"),
        (("mlp: swiglu", "mlp: geglu"), r"model 'tiny': field 'mlp' is 'geglu'; allowed: gelu, relu, swiglu"),
        (("    hidden: 64\n", ""), r"model 'tiny': field 'hidden' is required"),
        (("n_heads: 4", "n_heads: four"), r"model 'tiny': field 'n_heads' must be a whole number"),
        (("    source: test\n", ""), r"model 'tiny': field 'source' is required"),
        (("position: rope", "position: learned"), r"model 'tiny': field 'max_positions' is required"),
        (("n_heads: 4", "n_heads: 4\n    n_kv_heads: 3"), r"not a multiple of n_kv_heads 3"),
        (("models:", "modles:"), r"t\.yaml: expected a top-level 'models:' mapping"),
        (("n_heads: 4", "n_heads: 4\n    v_head_dim: 16"), r"field 'v_head_dim' needs kv_lora_rank > 0"),
        (("n_heads: 4", "n_heads: 4\n    kv_lora_rank: 32\n    v_head_dim: 16"), r"field 'qk_nope_head_dim' is required"),
        (("n_heads: 4", "n_heads: 4\n    dense_layers: 1\n    dense_ffn_hidden: 96"), r"'dense_layers' is for MoE"),
        (("n_heads: 4", "n_heads: 4\n    n_experts: 4\n    dense_layers: 1"), r"'dense_layers' and 'dense_ffn_hidden' go together"),
        (("n_heads: 4", "n_heads: 4\n    n_experts: 4\n    dense_layers: 2\n    dense_ffn_hidden: 96"),
         r"dense_layers 2 leaves no MoE block of 2"),
        (("n_heads: 4", "n_heads: 4\n    mamba_heads: 8"), r"field 'mamba_heads' needs hybrid_pattern"),
        (("n_heads: 4", f"n_heads: 4\n{HYBRID}\n    hybrid_pattern: ME"), r"MoE layers \('E'\)"),
        (("n_heads: 4", f"n_heads: 4\n{HYBRID}\n    hybrid_pattern: M-*"), r"has 3 layers, n_layers says 2"),
        (("n_heads: 4", f"n_heads: 4\n{HYBRID.replace('norms_per_layer: 1', 'norms_per_layer: 2')}"),
         r"norms_per_layer must be 1"),
        (("n_heads: 4", f"n_heads: 4\n{HYBRID.replace('    mamba_state: 16', '')}"),
         r"field 'mamba_state' is required \(> 0\) with Mamba-2 layers"),
        (("n_heads: 4", f"n_heads: 4\n{HYBRID.replace('mamba_groups: 2', 'mamba_groups: 3')}"),
         r"mamba_heads 8 is not a multiple of mamba_groups 3"),
    ],
)
def test_yaml_errors_name_entry_and_field(edit, message):
    with pytest.raises(UserError, match=message):
        models_from_yaml(GOOD_ENTRY.replace(*edit), "t.yaml")


# --- CLI -----------------------------------------------------------------------------------


def _cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "flopwise", "models", *args], capture_output=True, text=True, env=env)


def test_cli_unknown_model_is_one_line_exit_2():
    result = _cli("nope")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown model 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_lists_catalog_as_json():
    result = _cli("--json")
    assert result.returncode == 0, result.stderr
    records = {r["model"]["key"]: r for r in json.loads(result.stdout)}
    assert set(REQUIRED_KEYS) <= set(records)
    assert records["mixtral-8x7b"]["params"]["active"] == 12_879_925_248


def test_cli_shows_a_config_file(tmp_path):
    _write_config(tmp_path, LLAMA_JSON)
    result = _cli(str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["params"]["total"] == count_params(from_hf_config(tmp_path)).total

    table = _cli("llama3.1-405b")
    assert table.returncode == 0 and "405,853,388,800" in table.stdout and "Llama 3 Herd" in table.stdout


@pytest.mark.parametrize(
    "key, config",
    [
        ("llama2-70b", dict(model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                            num_key_value_heads=8, intermediate_size=28672, vocab_size=32000,
                            max_position_embeddings=4096)),
        ("mixtral-8x7b", dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                              num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                              max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2)),
        ("mpt-7b", dict(model_type="mpt", d_model=4096, n_heads=32, n_layers=32, expansion_ratio=4,
                        max_seq_len=2048, vocab_size=50368, no_bias=True,
                        attn_config=dict(attn_type="multihead_attention", alibi=True, kv_n_heads=1))),
        ("nemotron4-15b", dict(model_type="nemotron", hidden_size=6144, num_hidden_layers=32, num_attention_heads=48,
                               num_key_value_heads=8, intermediate_size=24576, vocab_size=256000,
                               max_position_embeddings=4096)),
        ("deepseek-v3", dict(DEEPSEEK_V3_JSON, num_nextn_predict_layers=0)),
        ("deepseek-v2-lite", dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048,
                                  intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
                                  num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
                                  n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1,
                                  q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                  v_head_dim=128, max_position_embeddings=163840, topk_method="greedy")),
        # NeMo's NemotronHConfig56B shapes in transformers' NemotronHConfig keys
        ("nemotron-h-56b", dict(model_type="nemotron_h", hidden_size=8192, num_attention_heads=64,
                                num_key_value_heads=8, head_dim=128, intermediate_size=32768, vocab_size=131072,
                                hybrid_override_pattern=get_model("nemotron-h-56b").hybrid_pattern,
                                mamba_num_heads=256, mamba_head_dim=64, ssm_state_size=256, n_groups=8,
                                conv_kernel=4, chunk_size=128, mlp_hidden_act="relu2", max_position_embeddings=8192)),
    ],
)
def test_hf_config_of_a_catalog_model_gives_the_same_counts(key, config, tmp_path):
    """The published config.json shapes and the catalog entry agree, total and active."""
    from_file = count_params(from_hf_config(_write_config(tmp_path, config)))
    from_catalog = count_params(get_model(key))
    assert (from_file.total, from_file.active) == (from_catalog.total, from_catalog.active)


def test_deepseek_v3_counts_671b_total_and_37b_active():
    """DeepSeek-V3 Technical Report: 671B total (the main model: its 14B multi-token-prediction module
    apart), 37B activated per token; the checkpoint's README_WEIGHTS.md: 36.6B activated, counting
    the output head but not the input embedding."""
    pc = count_params(get_model("deepseek-v3"))
    assert pc.total == 671_026_404_352  # transformers' DeepseekV3ForCausalLM of config.json, MTP off
    assert abs(pc.total / 671e9 - 1) < 0.01
    assert abs(pc.active / 37e9 - 1) < 0.02
    assert abs((pc.active - pc.embedding) / 36.6e9 - 1) < 0.005
    assert (pc.dense_layers, pc.moe_layers) == (3, 58)
    assert pc.dense_mlp_per_layer == 3 * 7168 * 18432
    # 256 routed experts, one ungated shared expert and a 256 x 7168 router per MoE block
    assert pc.mlp_per_layer == 257 * 3 * 7168 * 2048 + 256 * 7168


def test_deepseek_v2_lite_counts_15_7b_total_and_2_4b_active():
    pc = count_params(get_model("deepseek-v2-lite"))
    assert abs(pc.total / 15.7e9 - 1) < 0.01
    assert abs((pc.active - pc.embedding) / 2.4e9 - 1) < 0.03  # the model card's 2.4B activated


def test_deepseek_v3_config_reads_mla_dense_blocks_and_shared_experts(tmp_path):
    # the published file as it is (num_nextn_predict_layers 1): the main model, the MTP module apart
    spec = from_hf_config(_write_config(tmp_path, DEEPSEEK_V3_JSON))
    assert count_params(spec).total == count_params(get_model("deepseek-v3")).total
    mla = (spec.q_lora_rank, spec.kv_lora_rank, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim)
    assert mla == (1536, 512, 128, 64, 128) and spec.head_dim == 0
    assert (spec.dense_layers, spec.dense_ffn_hidden, spec.ffn_hidden) == (3, 18432, 2048)
    assert (spec.shared_expert_ffn_hidden, spec.shared_expert_gate) == (2048, False)
    no_latent = from_hf_config(_write_config(tmp_path, dict(DEEPSEEK_V3_JSON, num_nextn_predict_layers=0,
                                                            q_lora_rank=None)))
    assert no_latent.q_lora_rank == 0


def test_deepseek_configs_read_group_limited_routing(tmp_path):
    """DeepSeek-V3's router always limits a token to its best topk_group of n_group groups
    (transformers' DeepseekV3TopkRouter); DeepSeek-V2's only with topk_method group_limited_greedy
    (V2-Lite's greedy has none). The catalog's entry says the same as the published file."""
    v3 = from_hf_config(_write_config(tmp_path, DEEPSEEK_V3_JSON))
    assert (v3.expert_groups, v3.expert_groups_per_token) == (8, 4)
    catalog = get_model("deepseek-v3")
    assert (catalog.expert_groups, catalog.expert_groups_per_token) == (8, 4)
    v2 = dict(DEEPSEEK_V3_JSON, model_type="deepseek_v2", num_nextn_predict_layers=0, n_group=8, topk_group=3)
    assert from_hf_config(_write_config(tmp_path, dict(v2, topk_method="group_limited_greedy"))).expert_groups == 8
    greedy = from_hf_config(_write_config(tmp_path, dict(v2, topk_method="greedy")))
    assert (greedy.expert_groups, greedy.expert_groups_per_token) == (0, 0)
    assert get_model("deepseek-v2-lite").expert_groups == 0


@pytest.mark.parametrize("edit, message", [
    (dict(expert_groups=8), "'expert_groups' and 'expert_groups_per_token' go together"),
    (dict(expert_groups=3, expert_groups_per_token=1), "expert_groups 3 does not divide the 8 routed experts"),
    (dict(expert_groups=8, expert_groups_per_token=1), "leaves fewer than experts_per_token 2 experts"),
])
def test_group_limited_routing_fields_are_checked(edit, message):
    entry = "\n".join(f"    {k}: {v}" for k, v in dict(n_layers=2, hidden=64, n_heads=4, ffn_hidden=96, vocab_size=211,
                                                         seq_len=128, mlp="swiglu", norm="rmsnorm", position="rope",
                                                         n_experts=8, experts_per_token=2, source="test",
                                                         **edit).items())
    with pytest.raises(UserError, match=message) as caught:
        models_from_yaml(f"models:\n  tiny-moe:\n{entry}\n", origin="test.yaml")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("edit, message", [
    (dict(num_nextn_predict_layers="one"), r"config\.json: key 'num_nextn_predict_layers' must be a whole number"),
    (dict(num_nextn_predict_layers=0, moe_layer_freq=2), r"config\.json: key 'moe_layer_freq' must be 1"),
    (dict(num_nextn_predict_layers=0, q_lora_rank="big"), r"config\.json: key 'q_lora_rank' must be a whole number"),
    (dict(num_nextn_predict_layers=0, kv_lora_rank=None), r"config\.json: missing key 'kv_lora_rank'"),
])
def test_deepseek_config_errors_are_one_line_naming_file_and_key(edit, message, tmp_path):
    with pytest.raises(UserError, match=message) as caught:
        from_hf_config(_write_config(tmp_path, dict(DEEPSEEK_V3_JSON, **edit)))
    assert "\n" not in str(caught.value)


def test_mpt_config_reads_its_attention_and_biases(tmp_path):
    """MPT's attn_config carries kv_n_heads 1 even for multi-head attention: only grouped-query
    attention reads it; ALiBi picks the position scheme; no_bias drops every bias."""
    base = dict(model_type="mpt", d_model=64, n_heads=4, n_layers=2, max_seq_len=96, vocab_size=211)
    mha = from_hf_config(_write_config(tmp_path, dict(base, attn_config=dict(alibi=True, kv_n_heads=1))))
    assert (mha.n_kv_heads or mha.n_heads, mha.position, mha.attn_bias, mha.norm_bias) == (4, "alibi", False, False)
    gqa = from_hf_config(_write_config(tmp_path, dict(base, no_bias=False, attn_config=dict(
        attn_type="grouped_query_attention", kv_n_heads=2))))
    assert (gqa.n_kv_heads, gqa.position, gqa.attn_bias, gqa.norm_bias) == (2, "learned", True, True)
    with pytest.raises(UserError, match="expansion_ratio"):
        from_hf_config(_write_config(tmp_path, dict(base, expansion_ratio="four")))


def test_cli_shows_deepseeks_dense_blocks_apart():
    table = _cli("deepseek-v3")
    assert table.returncode == 0, table.stderr
    assert "671,026,404,352" in table.stdout and "dense mlp per dense layer (x3)" in table.stdout
    assert "mlp per layer (x58)" in table.stdout
    assert "shared_expert_gate" not in _cli("llama2-7b").stdout  # no shared expert, nothing to say


def test_llama4_checkpoint_config_nests_the_text_model(tmp_path):
    """A Llama 4 checkpoint's config.json keeps the text model under `text_config`; the catalog's
    Maverick has Meta's counts (400B total, 17B active) and its dense blocks alternate."""
    text = dict(model_type="llama4_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=32, intermediate_size_mlp=64,
                num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, vocab_size=211,
                max_position_embeddings=96, moe_layers=[1, 3])
    nested = from_hf_config(_write_config(tmp_path, dict(model_type="llama4", text_config=text)))
    assert (nested.dense_layers, nested.moe_layer_step, nested.dense_ffn_hidden) == (2, 2, 64)
    with pytest.raises(UserError, match="key 'moe_layers' \\[0, 3\\] is not every 2-th block"):
        from_hf_config(_write_config(tmp_path, dict(model_type="llama4", text_config=dict(text, moe_layers=[0, 3]))))
    maverick = count_params(get_model("llama4-maverick"))
    assert abs(maverick.total / 400e9 - 1) < 0.005 and abs(maverick.active / 17e9 - 1) < 0.02
    assert [maverick.dense_blocks_in(first, 12) for first in (0, 12, 24, 36)] == [6, 6, 6, 6]


def test_every_display_name_and_its_hub_spelling_resolve():
    """The catalog's own display names ("Llama 4 Scout 17B-16E") name their model, and so does the Hub's
    repository spelling of it (meta-llama/Llama-4-Scout-17B-16E, with a tuned-variant suffix)."""
    from flopwise.catalog.models import catalog_key, get_model, load_models

    models = load_models()
    assert all(catalog_key(spec.name) == key for key, spec in models.items())
    assert get_model("meta-llama/Llama-4-Scout-17B-16E").key == "llama4-scout"
    assert get_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct").key == "llama4-maverick"


# --- sliding-window attention and the 2025 MoE families (gpt-oss, Kimi K2) ---------------------

def test_gpt_oss_config_written_by_transformers_gives_the_windowed_spec(tmp_path):
    """GptOssConfig's layer_types (sliding on blocks 0, 2, ...) become window_layers; the window, the sinks
    and the router's bias are read; its defaults are gpt-oss-120b's, so the file plans as the catalog's."""
    transformers = pytest.importorskip("transformers")
    class_name, kwargs = HF_CASES["gpt_oss"]
    getattr(transformers, class_name)(**kwargs).save_pretrained(tmp_path)
    spec = from_hf_config(tmp_path / "config.json")
    assert (spec.sliding_window, spec.window_layers, spec.n_experts, spec.experts_per_token) == (8, "SFSF", 4, 2)
    assert spec.attn_sinks and spec.router_bias and spec.attn_bias and spec.mlp_bias and not spec.tied_embeddings

    transformers.GptOssConfig().save_pretrained(tmp_path)
    default, catalog = from_hf_config(tmp_path / "config.json", seq_len=4096), get_model("gpt-oss-120b")
    assert count_params(default) == count_params(catalog)
    assert (default.sliding_window, default.window_layers) == (128, catalog.window_layers)


@pytest.mark.parametrize(("layer_types", "window_layers"), [
    (["sliding_attention"] * 4, ""),  # every layer windowed: the empty pattern
    (["full_attention"] * 4, None),  # no layer windowed: no window
    (["full_attention", "sliding_attention", "sliding_attention", "full_attention"], "FSSF"),
])
def test_gpt_oss_layer_types_say_which_layers_are_windowed(layer_types, window_layers, tmp_path):
    base = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16,
                num_key_value_heads=2, sliding_window=16, layer_types=layer_types)
    spec = from_hf_config(_write_config(tmp_path, base))
    assert spec.sliding_window == (0 if window_layers is None else 16)
    assert spec.window_layers == (window_layers or "")


def test_window_keys_of_other_families_are_read_only_where_the_model_uses_them(tmp_path):
    llama_shape = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                       vocab_size=211, max_position_embeddings=8192)
    mistral = from_hf_config(_write_config(tmp_path, dict(llama_shape, model_type="mistral", sliding_window=4096)))
    assert (mistral.sliding_window, mistral.window_layers) == (4096, "")  # Mistral 7B v0.1: every layer
    for off in (dict(model_type="mistral", sliding_window=None), dict(model_type="mixtral", num_local_experts=4,
                                                                       num_experts_per_tok=2),
                dict(model_type="qwen2", sliding_window=131072, use_sliding_window=False)):  # Qwen2.5's files
        assert from_hf_config(_write_config(tmp_path, dict(llama_shape, **off))).sliding_window == 0
    qwen3 = from_hf_config(_write_config(tmp_path, dict(llama_shape, model_type="qwen3", use_sliding_window=True,
                                                        sliding_window=512, max_window_layers=1)))
    assert (qwen3.sliding_window, qwen3.window_layers) == (512, "FSS")  # windowed from max_window_layers on


@pytest.mark.parametrize(("edit", "message"), [
    (dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types' has chunked_attention"),
    (dict(layer_types=["sliding_attention"]), "one type for each of the 2 layers"),
    (dict(sliding_window="128"), "key 'sliding_window' must be a whole number"),
])
def test_gpt_oss_config_errors_name_the_key(edit, message, tmp_path):
    base = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16)
    with pytest.raises(UserError, match=message):
        from_hf_config(_write_config(tmp_path, dict(base, **edit)))


@pytest.mark.parametrize(("fields", "message"), [
    ("sliding_window: 8\n    window_layers: SX", "window_layers has 'X'"),
    ("sliding_window: 8\n    window_layers: SFS", "window_layers has 3 layers, n_layers says 2"),
    ("window_layers: SF", "window_layers' needs sliding_window > 0"),
])
def test_catalog_window_fields_are_validated(fields, message):
    text = ("models:\n  tiny:\n    name: Tiny\n    n_layers: 2\n    hidden: 64\n    n_heads: 4\n"
            "    ffn_hidden: 96\n    vocab_size: 211\n    seq_len: 64\n    position: rope\n    source: test\n"
            f"    reported_params: 1.0e5\n    {fields}\n")
    with pytest.raises(UserError, match=message):
        models_from_yaml(text, origin="test.yaml")


KIMI_K2_JSON = dict(  # moonshotai/Kimi-K2-Instruct's shapes (Megatron-Bridge KimiK2Provider) as config.json keys
    model_type="kimi_k2", hidden_size=7168, num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64,
    intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=384, n_shared_experts=1,
    num_experts_per_tok=8, first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=163840, max_position_embeddings=131072,
    tie_word_embeddings=False, num_nextn_predict_layers=0)


def test_kimi_k2_is_deepseek_v3_with_its_own_widths(tmp_path):
    """Kimi K2's config.json (model_type kimi_k2) reads as DeepSeek-V3's architecture and plans as the catalog's
    entry: 1.026T parameters (the model card's "1T"), 32.9B active (31.7B without the input embedding; "32B")."""
    from_file = count_params(from_hf_config(_write_config(tmp_path, KIMI_K2_JSON)))
    catalog = get_model("kimi-k2")
    pc = count_params(catalog)
    assert (from_file.total, from_file.active) == (pc.total, pc.active)
    assert pc.total == 1_026_408_209_408 and abs(pc.total / 1.0e12 - 1) < 0.03
    assert abs((pc.active - pc.embedding) / 32e9 - 1) < 0.01
    assert (pc.dense_layers, pc.moe_layers, catalog.expert_groups) == (1, 60, 0)  # n_group 1: no group limit
    assert get_model("moonshotai/Kimi-K2-Instruct").key == "kimi-k2"
    assert get_model("openai/gpt-oss-120b").key == "gpt-oss-120b"
