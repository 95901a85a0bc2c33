"""plan/finetune.py: LoRA and QLoRA planned against hand arithmetic from the cited formulas."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from flopwise.catalog.models import ModelSpec, get_model
from flopwise.errors import UserError
from flopwise.plan import finetune as ft
from flopwise.plan.hybrid import Site, plan_hybrid
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan
from tests.plan.saved_tensors import saved_storage_bytes

LLAMA2_7B = get_model("llama2-7b")
H, F, L = 4096, 11008, 32  # Llama 2 7B: hidden, SwiGLU width, layers


def with_workload(spec, **changes):
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, **changes))


def with_layout(spec, **changes):
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, **changes))


def test_nf4_bytes_are_data_plus_both_levels_of_block_constants():
    # 4 bits + one int8 constant per 64 weights + one second-level constant per 64·256 weights
    assert ft.nf4_bytes_per_param(2.0) == pytest.approx(0.5 + 1 / 64 + 2 / 16384, abs=1e-12)  # torchao, bf16 factor
    assert ft.nf4_bytes_per_param(4.0) == pytest.approx(0.5 + 1 / 64 + 4 / 16384, abs=1e-12)  # QLoRA paper, fp32
    assert ft.nf4_bytes_per_param(4.0) * 8 == pytest.approx(4.127, abs=1e-3)  # the paper's 4.127 bits
    assert ft.NF4_BYTES_PER_PARAM == pytest.approx(0.515747, abs=1e-6)


def test_adapter_count_for_llama2_7b_is_r_times_d_in_plus_d_out_per_target():
    per_layer = 16 * (4 * (H + H) + 2 * (H + F) + (F + H))  # q k v o, gate up, down
    assert ft.adapter_params_per_layer(LLAMA2_7B, 16, "all-linear") == per_layer == 1_249_280
    split = ft.finetune_split(LLAMA2_7B, count_params(LLAMA2_7B), "lora", 16, "all-linear", "bf16")
    assert split.trainable_params == L * per_layer == 39_976_960  # what PEFT prints for this model
    assert ft.adapter_params_per_layer(LLAMA2_7B, 8, "qkvo") * L == 8 * 4 * 2 * H * L == 8_388_608


def test_gqa_adapters_use_the_kv_width():
    llama3 = get_model("llama3-8b")
    kv = llama3.n_kv_heads * (llama3.head_dim or llama3.hidden // llama3.n_heads)
    assert ft.adapter_params_per_layer(llama3, 1, "qkvo") == 2 * (llama3.hidden + llama3.hidden) + 2 * (
        llama3.hidden + kv)


def test_qlora_frozen_bytes_quantize_the_block_linears_only():
    pc = count_params(LLAMA2_7B)
    quantized = L * (4 * H * H + 3 * H * F)
    rest = pc.total - quantized  # embedding, head, norms stay bf16
    assert rest == 2 * 32_000 * H + (2 * L + 1) * H
    split = ft.finetune_split(LLAMA2_7B, pc, "qlora", 16, "all-linear", "bf16")
    assert split.quantized_params == quantized
    assert split.frozen_bytes == pytest.approx(rest * 2 + quantized * (0.5 + 1 / 64 + 2 / 16384))
    assert split.largest_dequantized_bytes == H * F * 2  # one bf16 copy of an MLP weight
    lora = ft.finetune_split(LLAMA2_7B, pc, "lora", 16, "all-linear", "bf16")
    assert lora.frozen_bytes == pc.total * 2


def test_model_states_are_the_frozen_base_plus_adapter_states():
    spec = build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="qlora", recompute="full")
    split = ft.split_of(spec)
    memory = plan(spec).memory
    a = split.trainable_params
    # bf16 mixed precision: the adapters are fp32 (PEFT), 4-byte weight and gradient, 8-byte Adam, no master
    assert memory.weights == pytest.approx(split.frozen_bytes + 4 * a)
    assert memory.gradients == pytest.approx(4 * a)
    assert memory.optimizer_states == pytest.approx(8 * a)
    assert memory.master_weights == 0


def test_pure_bf16_adapters_are_bf16_with_bf16_adam_states():
    spec = build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="lora", recompute="full",
                         precision="bf16-true")
    split = ft.split_of(spec)
    memory = plan(spec).memory
    a = split.trainable_params
    assert memory.weights == pytest.approx(split.frozen_bytes + 2 * a)
    assert memory.gradients == pytest.approx(2 * a)
    assert memory.optimizer_states == pytest.approx(4 * a)
    assert memory.master_weights == 0


def test_fsdp_qlora_shards_the_frozen_base():
    spec = build_runspec(model="llama2-70b", hardware="rtx4090", gpus=4, zero=3, finetune="qlora", recompute="full")
    split = ft.split_of(spec)
    memory = plan(spec).memory
    a = split.trainable_params
    assert memory.weights == pytest.approx(split.frozen_bytes / 4 + 4 * a / 4)


def test_lora_dropout_keeps_a_copy_and_mask_of_each_adapted_input_instead_of_the_input():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, finetune="lora", recompute="none",
                         seq_len=1024, global_batch=1)
    base = plan(spec).memory.activations
    dropped = plan(with_workload(spec, lora_dropout=0.1)).memory.activations
    tokens = 1024
    d_in = 6 * H + F  # q k v o gate up take h, down takes f
    # fp32 adapters under bf16 autocast keep their own bf16 copy of each input with or without dropout
    # (PEFT casts it to fp32, autocast back for the matmul); dropout adds its 1-byte mask per element
    assert dropped - base == pytest.approx(L * tokens * 1 * d_in)


def test_adapters_in_the_activation_dtype_read_their_input_as_it_is():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, finetune="lora", recompute="none",
                         seq_len=1024, global_batch=1, precision="bf16-true")
    base = plan(spec).memory.activations
    dropped = plan(with_workload(spec, lora_dropout=0.1)).memory.activations
    tokens = 1024
    d_in = 6 * H + F
    # bf16 adapters: a dropped bf16 copy and a 1-byte mask per adapted input; the undropped inputs of
    # q/k/v, of the MLP and of the down projection are then kept by nobody
    assert dropped - base == pytest.approx(L * tokens * ((2 + 1) * d_in - 2 * (H + H + F)))


def test_adapter_paths_add_the_rank_r_intermediate_per_target():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="none", seq_len=1024,
                         global_batch=1)
    full = plan(spec).memory.activations
    lora = plan(with_workload(spec, finetune="lora", lora_rank=64)).memory.activations
    split = ft.split_of(with_workload(spec, finetune="lora", lora_rank=64))
    t, d_in = 1024, 6 * H + F
    # per block: 7 targets' rank-r intermediates and a bf16 copy of each adapter's input (fp32 adapters
    # under bf16 autocast), autocast's bf16 copies of the adapter weights; the frozen linears' own inputs
    # (q/k/v, MLP, down) and the 2 frozen RMSNorms' normalised copies are kept by nobody
    per_block = 7 * 2 * t * 64 + 2 * t * d_in + 2 * split.adapters_per_layer - 2 * t * (2 * H + F) - 2 * 2 * t * H
    # each RMSNorm's input kept in fp32 (HF's upcast), 2 bytes more than planned for full training
    per_block += 2 * 2 * t * H
    # the frozen embedding keeps no token ids and the first block's first norm nothing (its fp32 input)
    assert lora - full == pytest.approx(L * per_block - 8 * t - 4 * t * H)


def test_attention_only_targets_drop_the_frozen_mlp_down_input():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="none", seq_len=1024,
                         global_batch=1, precision="bf16-true")
    full = plan(spec).memory.activations
    qkvo = plan(with_workload(spec, finetune="lora", lora_rank=8, lora_targets="qkvo")).memory.activations
    # bf16 adapters read their input as it is: rank-8 intermediates; no saved input for the frozen down
    # projection (T x f) nor the MLP (T x h); no normalised copy in the 2 frozen RMSNorms; the frozen
    # embedding keeps no token ids and the first block's first norm nothing
    per_block = 4 * 2 * 1024 * 8 - 2 * 1024 * F - 2 * 1024 * H - 2 * 2 * 1024 * H
    per_block += 2 * 2 * 1024 * H  # the RMSNorms' inputs kept in fp32 (HF's upcast)
    assert qkvo - full == pytest.approx(L * per_block - 8 * 1024 - 4 * 1024 * H)


def test_flops_drop_the_base_weight_gradients():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="none")
    full = plan(spec).flops
    tuned = plan(with_workload(spec, finetune="lora")).flops
    a = ft.split_of(with_workload(spec, finetune="lora")).trainable_params
    attention = full.attention_per_unit
    assert full.model_per_unit == pytest.approx(6 * full.matmul_params + attention)
    assert tuned.model_per_unit == pytest.approx(4 * full.matmul_params + 6 * a + attention)
    assert tuned.model_per_unit < full.model_per_unit
    recomputed = plan(with_layout(with_workload(spec, finetune="lora"), recompute="full")).flops
    assert recomputed.hardware_per_unit - recomputed.model_per_unit == pytest.approx(
        2 * full.matmul_params + 2 * a + attention / 3)


def test_step_time_lora_below_full_and_qlora_pays_for_dequantisation():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="full", global_batch=8)
    full = plan(spec).time.step_seconds
    lora = plan(with_workload(spec, finetune="lora")).time.step_seconds
    qlora = plan(with_workload(spec, finetune="qlora")).time.step_seconds
    assert lora < full
    assert qlora > lora


def test_fit_verdicts_on_one_rtx4090():
    qlora = plan(build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="qlora"))
    assert qlora.fits
    assert qlora.memory.weights < 4.5 * 2**30  # NF4 base + bf16 ends: ~3.9 GB
    full = plan(build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="full", recompute="full"))
    assert not full.fits  # 16 bytes per parameter is 108 GB
    lora = plan(build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="lora"))
    assert lora.memory.weights > 13.4e9  # the bf16 base alone is 13.5 GB
    assert lora.fits and lora.spec.layout.recompute == "full"
    assert any(d.startswith("recompute full: without recompute") for d in lora.spec.cluster.extra["defaults"])
    no_recompute = plan(build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="lora",
                                      recompute="none"))
    assert not no_recompute.fits  # 4096-token sequences keep too much without recompute


def test_a_finetune_defaults_to_1b_tokens_and_small_batches():
    spec = build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, finetune="qlora")
    assert spec.workload.total_tokens == 1e9
    assert spec.layout.global_batch_size * spec.workload.seq_len == ft.DEFAULT_FINETUNE_BATCH_TOKENS


def test_bad_finetune_inputs_are_one_line():
    with pytest.raises(UserError, match="--finetune 'dora'"):
        build_runspec(model="llama2-7b", finetune="dora")
    with pytest.raises(UserError, match="--lora-targets"):
        build_runspec(model="llama2-7b", finetune="lora", lora_targets="mlp")
    with pytest.raises(UserError, match="data parallelism only"):
        build_runspec(model="llama2-7b", gpus=8, tp=2, finetune="lora")
    with pytest.raises(UserError, match="planned for transformers"):
        build_runspec(model="resnet50", finetune="qlora")


def test_compare_local_answers_qlora_on_4090s():
    for model, gpus in (("llama2-7b", 1), ("llama2-13b", 2), ("llama2-70b", 4)):
        result = plan_hybrid(model, "1B", Site("rtx4090", gpus, 128.0), sweep=False,
                             finetune_options={"finetune": "qlora"})
        local = result.job.local
        assert local is not None, model
        assert local.plan.spec.workload.finetune == "qlora"
        assert local.plan.spec.layout.tp == local.plan.spec.layout.pp == 1
        assert local.plan.spec.workload.total_tokens == 1e9 and local.days > 0
    full = plan_hybrid("llama2-70b", "1B", Site("rtx4090", 4, 128.0), sweep=False)
    assert full.job.local is None or full.job.local.plan.spec.layout.offload == "params"


def test_plan_cli_qlora_on_one_rtx4090(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--hardware", "rtx4090", "--gpus", "1",
            "--finetune", "qlora"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Fine-tune" in out.stdout and "qlora (rank 16, targets all-linear)" in out.stdout
    assert "trainable parameters" in out.stdout and "40.0M (0.59%" in out.stdout
    assert "Memory per device (fsdp conventions; fits)" in out.stdout and "whole job" in out.stdout
    data = json.loads(subprocess.run(argv + ["--json"], capture_output=True, text=True, env=env, timeout=60).stdout)
    assert data["fits"] is True
    assert data["finetune"]["method"] == "qlora" and data["finetune"]["trainable_params"] == 39_976_960
    assert data["time"]["total_seconds"] > 0
    bad = subprocess.run(argv[:-1] + ["lorax"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--finetune 'lorax'" in bad.stderr


def test_a_config_finetune_section_becomes_the_workload():
    assert ft.config_fields(None) == {}
    assert ft.config_fields({"method": "full"}) == {}
    fields = ft.config_fields({"method": "qlora", "rank": 8, "alpha": 16, "dropout": 0.05,
                               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    assert fields == {"finetune": "qlora", "lora_rank": 8, "lora_targets": "q,k,v,o", "lora_dropout": 0.05}
    assert ft.config_fields({"method": "lora", "target_modules": ["q_proj", "gate_proj"]})["lora_targets"] == "q,gate"
    assert ft.config_fields({"method": "lora", "target_modules": "qkvo"})["lora_targets"] == "qkvo"


@pytest.mark.parametrize("modules", [["q_proj", "v_proj"], ["gate_proj", "down_proj"], ["o_proj", "up_proj", "k_proj"]])
def test_named_targets_plan_the_adapters_peft_builds(modules):
    """A target list is planned as the matrices its names adapt: the planned trainable count is what
    PEFT's get_peft_model builds on a Llama with those target_modules (GQA, SwiGLU)."""
    pytest.importorskip("peft")
    import transformers
    from peft import LoraConfig, get_peft_model

    h, f, r = 64, 160, 4
    cfg = transformers.LlamaConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    peft_model = get_peft_model(transformers.LlamaForCausalLM(cfg), LoraConfig(r=r, target_modules=modules))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    spec = ModelSpec(key="tiny-llama", name="tiny", n_layers=2, hidden=h, n_heads=4, n_kv_heads=2, ffn_hidden=f,
                     vocab_size=100, mlp="swiglu", norm="rmsnorm", position="rope")
    split = ft.finetune_split(spec, count_params(spec), "lora", r, ft.named_targets(modules), "bf16")
    assert split.trainable_params == trainable


def test_named_targets_read_every_spelling_and_refuse_unknown_ones():
    assert ft.named_targets("q_proj,v_proj") == ft.named_targets(["model.layers.0.self_attn.v_proj", "q_proj"]) == "q,v"
    assert ft.named_targets("wq wv") == ft.named_targets("Q,V") == "q,v"  # flopwise / torchtune, the planner's own
    assert ft.named_targets("linear_qkv,linear_fc1") == "q,k,v,gate,up"  # NeMo's Megatron-Core names
    assert ft.named_targets("All-Linear") == "all-linear"
    with pytest.raises(UserError, match=r"^--lora-targets: unknown module 'attn'; .*wq,wv \(torchtune"):
        ft.named_targets("attn")
    # from a config's finetune: section (the trainer's prediction, `plan --config`): the config key, and
    # the names `flopwise train` needs (the model's own) told apart from those only the planner reads
    with pytest.raises(UserError, match=r"^finetune.target_modules: unknown module 'foo_proj'; .*the model's own "
                                        r"module names, as `flopwise train` adapts them"):
        ft.config_fields({"method": "lora", "target_modules": ["q_proj", "foo_proj"]})
    with pytest.raises(UserError, match="has no such linear"):  # GPT-3 has a GELU MLP: no gate
        build_runspec(model="gpt3-1.3b", finetune="lora", lora_targets="gate_proj")


def test_plan_config_plans_the_finetune_section():
    from flopwise.catalog.hardware import get_hardware
    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config

    cfg = load_config(None, [])
    # the trainer's validation wants model.pretrained for lora; the bridge reads the section as it is
    from flopwise.config.schema import FinetuneConfig

    tuned = cfg.model_copy(update={"finetune": FinetuneConfig(method="lora", rank=4)})
    spec = runspec_from_config(tuned, resolve_run(tuned), get_hardware("h100-sxm"))
    assert (spec.workload.finetune, spec.workload.lora_rank) == ("lora", 4)
    full = runspec_from_config(cfg, resolve_run(cfg), get_hardware("h100-sxm"))
    assert plan(spec).memory.gradients < plan(full).memory.gradients


def test_qlora_dequantises_each_base_weight_once_per_pass():
    from flopwise.plan.gemm import device_rates
    from flopwise.plan.ops import layer_times as base_layer_times

    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="full", global_batch=8,
                         finetune="lora", compiled=True)  # compiled: the fused pass
    hw = spec.cluster.hardware
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"), None, None)
    base = base_layer_times(spec.model, spec.workload.seq_len, 1, 1, False, True, False, "full", "bf16", rates)
    lora = ft.layer_times(base, spec, rates)
    qlora = ft.layer_times(base, with_workload(spec, finetune="qlora"), rates)
    dequant = rates.memory_seconds((4 * H * H + 3 * H * F) * (ft.NF4_BYTES_PER_PARAM + 2.0), 7)
    for field in ("forward", "backward", "recompute"):  # full recompute runs the forward again
        assert getattr(qlora, field) - getattr(lora, field) == pytest.approx(dequant)
    # only the adapters' weight gradients are left: skinny rank-r GEMMs, memory-bound on the T x d inputs
    assert lora.wgrad < base.wgrad / 4
    assert lora.backward < base.backward


def test_moe_adapters_train_on_every_expert_but_a_token_visits_k():
    mixtral = get_model("mixtral-8x7b")
    h, f, k, experts = mixtral.hidden, mixtral.ffn_hidden, mixtral.experts_per_token, mixtral.n_experts
    attention = ft.adapter_params_per_layer(mixtral, 8, "qkvo")
    assert ft.adapter_params_per_layer(mixtral, 8, "all-linear") == attention + experts * 8 * 3 * (h + f)
    assert ft.active_adapter_params_per_layer(mixtral, 8, "all-linear") == pytest.approx(attention + k * 8 * 3 * (h + f))
    spec = build_runspec(model="mixtral-8x7b", hardware="h100-sxm", gpus=1, recompute="none", seq_len=1024,
                         global_batch=1, precision="bf16-true")
    full = plan(spec).memory.activations
    lora = plan(with_workload(spec, finetune="lora", lora_rank=8)).memory.activations
    # bf16 adapters: rank-8 intermediates of 4 + 3k matrices a token passes; 2 normalised copies fewer;
    # no token ids, nothing kept by the first block's first norm
    # + the RMSNorms' inputs kept in fp32 (HF's upcast, 2 bytes more each)
    per_block = 2 * 1024 * (8 * (4 + 3 * k) - 2 * h) + 2 * 2 * 1024 * h
    assert lora - full == pytest.approx(mixtral.n_layers * per_block - 8 * 1024 - 4 * 1024 * h)


def test_a_frozen_linear_keeps_only_its_weight_for_backward():
    """The planner counts no saved input for a frozen linear without an adapter (qkvo targets);
    this is torch's autograd behaviour it relies on."""
    torch = pytest.importorskip("torch")
    linear = torch.nn.Linear(64, 32, bias=False).requires_grad_(False)
    adapter = torch.nn.Linear(64, 4, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        h = x * 2.0
        saved.clear()
        linear(h)
    assert [tuple(t.shape) for t in saved] == [(64, 32)]  # the weight (transposed view), not the 8 x 64 input
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        saved.clear()
        adapter(h)
    assert any(t.shape == h.shape for t in saved)  # a trainable adapter keeps the input for its weight gradient


def test_buffers_ddp_buckets_adapter_gradients_and_qlora_adds_one_bf16_weight():
    def loss_peak(p):  # the loss's transient: bf16 logits and their fp32 copy, beside the kept fp32 log-softmax
        return (2 + 4) * p.spec.workload.seq_len * p.spec.layout.micro_batch_size * 32_000

    one = plan(build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, finetune="qlora", recompute="full"))
    assert one.memory.comm_buffers == H * F * 2 + loss_peak(one)  # no collectives; the dequantised MLP weight
    ddp = plan(build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=2, zero=0, finetune="lora",
                             recompute="full"))
    assert ddp.memory.comm_buffers == 2 * 25 * 2**20 + loss_peak(ddp)  # adapter gradients fill DDP's two buckets
    small = plan(build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=2, zero=0, finetune="lora",
                               lora_rank=1, lora_targets="qkvo", recompute="full"))
    # rank-1 attention adapters' fp32 gradients
    assert small.memory.comm_buffers == 4 * 2 * H * L * 4 + loss_peak(small)


def test_compare_local_cli_says_it_planned_a_finetune():
    env = {**os.environ, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "flopwise", "compare", "--local", "--model", "llama2-13b", "--hardware", "rtx4090",
            "--gpus", "2", "--finetune", "qlora"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "1e+09 tokens (qlora fine-tune, rank 16, all-linear)" in out.stdout
    assert "numbers: llama2-13b fits on 2 x rtx4090" in out.stdout


def test_a_frozen_rmsnorm_keeps_no_normalised_copy():
    """The planner takes e·T·h per norm off a fine-tune's activations; this is torch's behaviour it relies on."""
    torch = pytest.importorskip("torch")

    def saved_elements(norm):
        h = torch.randn(8, 64, requires_grad=True) * 2.0
        sizes = []

        def pack(tensor):
            sizes.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            norm(h)
        return sizes.count(8 * 64)

    assert saved_elements(torch.nn.RMSNorm(64)) - saved_elements(torch.nn.RMSNorm(64).requires_grad_(False)) == 1


@pytest.mark.parametrize("targets, lora_dropout", [("all-linear", 0.0), ("qkvo", 0.0), ("all-linear", 0.1)])
def test_lora_llama_block_saved_tensors_match_the_formula(targets, lora_dropout):
    """A frozen RMSNorm + GQA + SwiGLU block (fp32, CPU) with LoRA as PEFT's `Linear.forward` computes it
    (base(x) + B(A(dropout(x))) · scale): saved-for-backward bytes = full training's formula + the delta."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from flopwise.catalog.models import ModelSpec
    from flopwise.plan import memory as mem

    torch.manual_seed(0)
    s, b, h, a, kv, f, r = 64, 2, 64, 4, 2, 160, 4
    hd = h // a
    spec = ModelSpec(key="tiny-llama", name="tiny", n_layers=1, hidden=h, n_heads=a, n_kv_heads=kv, ffn_hidden=f,
                     vocab_size=10, mlp="swiglu", norm="rmsnorm", position="rope")
    n1, n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
    base = {"q": torch.nn.Linear(h, a * hd, bias=False), "k": torch.nn.Linear(h, kv * hd, bias=False),
            "v": torch.nn.Linear(h, kv * hd, bias=False), "o": torch.nn.Linear(a * hd, h, bias=False),
            "gate": torch.nn.Linear(h, f, bias=False), "down": torch.nn.Linear(f, h, bias=False),
            "up": torch.nn.Linear(h, f, bias=False)}
    for module in (n1, n2, *base.values()):
        module.requires_grad_(False)
    adapted = {m.name for m in ft.target_matrices(spec, targets)}
    adapters = {name: (torch.nn.Linear(lin.in_features, r, bias=False), torch.nn.Linear(r, lin.out_features, bias=False),
                       torch.nn.Dropout(lora_dropout) if lora_dropout else torch.nn.Identity())
                for name, lin in base.items() if name in adapted}
    weights = {p.untyped_storage().data_ptr() for m in (n1, n2, *base.values()) for p in m.parameters()}
    weights |= {p.untyped_storage().data_ptr() for A, B, _ in adapters.values() for p in (*A.parameters(), *B.parameters())}

    def linear(name, x):
        out = base[name](x)
        if name in adapters:
            A, B, drop = adapters[name]
            out = out + B(A(drop(x))) * 2.0
        return out

    x = torch.randn(b, s, h, requires_grad=True)
    with saved_storage_bytes(weights) as storages:
        y = n1(x)
        q = linear("q", y).view(b, s, a, hd).transpose(1, 2).contiguous()
        k = linear("k", y).view(b, s, kv, hd).transpose(1, 2).contiguous().repeat_interleave(a // kv, dim=1)
        v = linear("v", y).view(b, s, kv, hd).transpose(1, 2).repeat_interleave(a // kv, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x2 = x + linear("o", att.transpose(1, 2).reshape(b, s, h))
        z = n2(x2)
        x2 + linear("down", F.silu(linear("gate", z)) * linear("up", z))
    measured = sum(storages.values())
    full = mem.layer_activation_bytes(spec, s, b, "fp32", dropout=False, flash_attention=True, kv_repeated=True,
                                      attn_output_copy=True)
    split = ft.finetune_split(spec, count_params(spec), "lora", r, targets, "fp32")
    # on a CPU: the dropout keeps an fp32 noise tensor, the out-projection's input is a copy
    predicted = full + ft.activation_delta_bytes(spec, split, s, b, 4.0, lora_dropout, mask_bytes=4.0,
                                                 attn_output_copy=True)
    assert measured == pytest.approx(predicted, rel=0.01)  # the gap is RMSNorm's O(s*b) rstd


def test_dropout_mask_is_one_byte_on_gpus_and_input_sized_on_cpus():
    from flopwise.catalog.hardware import get_hardware

    h100 = get_hardware("h100-sxm")
    assert ft.dropout_mask_bytes(h100, 2.0) == 1.0
    assert ft.dropout_mask_bytes(dataclasses.replace(h100, key="cpu-test", vendor="cpu"), 4.0) == 4.0


@pytest.mark.parametrize("fp32_adapters", [False, True])
def test_peft_lora_llama_layer_saved_tensors_match_the_formula(fp32_adapters):
    """Hugging Face's LlamaDecoderLayer in bf16 with PEFT's LoRA on all linears: saved-for-backward
    bytes = full training's (measured) + the planned delta; PEFT's default fp32 adapters cast and keep
    an fp32 copy of each adapted input (`input_copy_bytes=4`)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from peft import LoraConfig, get_peft_model

    from flopwise.catalog.models import ModelSpec

    torch.manual_seed(0)
    s, b, h, f, r = 64, 2, 64, 160, 4
    cfg = transformers.LlamaConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, attn_implementation="sdpa")

    def saved_bytes(model):
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
        positions = torch.arange(s).unsqueeze(0)
        rotary = inner.model.rotary_emb(x, positions)
        with saved_storage_bytes(weights) as storages:
            inner.model.layers[0](x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
        return sum(storages.values())

    full = saved_bytes(transformers.LlamaForCausalLM(cfg).to(torch.bfloat16))
    lora = get_peft_model(transformers.LlamaForCausalLM(cfg).to(torch.bfloat16),
                          LoraConfig(r=r, target_modules="all-linear", lora_dropout=0.0),
                          autocast_adapter_dtype=fp32_adapters)
    spec = ModelSpec(key="tiny-llama", name="tiny", n_layers=1, hidden=h, n_heads=4, n_kv_heads=2, ffn_hidden=f,
                     vocab_size=100, mlp="swiglu", norm="rmsnorm", position="rope")
    split = ft.finetune_split(spec, count_params(spec), "lora", r, "all-linear", "bf16")
    delta = ft.activation_delta_bytes(spec, split, s, b, 2.0, 0.0, input_copy_bytes=4.0 if fp32_adapters else 0.0)
    assert saved_bytes(lora) - full == delta


def _torchao_nf4():
    """torchao's NF4 module (it moved between releases)."""
    pytest.importorskip("torchao")
    import importlib

    for name in ("torchao.quantization.quantize_.workflows.nf4.nf4_tensor", "torchao.dtypes.nf4tensor"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    pytest.skip("this torchao has no NF4Tensor")


def test_torchao_nf4_tensor_holds_the_planned_bytes_and_keeps_only_itself_for_backward():
    torch = pytest.importorskip("torch")
    nf4 = _torchao_nf4()
    weight = nf4.to_nf4(torch.randn(512, 1024, dtype=torch.bfloat16))  # block 64, scaler block 256
    per_block = sum(getattr(weight, name).untyped_storage().nbytes()
                    for name in ("quantized_data", "quantized_scalers", "quantization_factor"))
    assert per_block / (512 * 1024) == ft.NF4_BYTES_PER_PARAM  # + one scaler mean and the 16-entry table per tensor
    x = torch.randn(8, 1024, dtype=torch.bfloat16, requires_grad=True) * 1.0
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        nf4.linear_nf4(x, weight)
    assert len(saved) == 1 and saved[0] is weight  # no input kept; dequantised again in backward


def test_qlora_plan_says_what_its_dequantisation_costs_and_what_eager_torchao_would():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="full", global_batch=8,
                         finetune="qlora", compiled=True)  # torchao under torch.compile: the fused pass
    qlora = plan(spec)
    lora = plan(with_workload(spec, finetune="lora"))
    from flopwise.plan.gemm import device_rates

    hw = spec.cluster.hardware
    fused = ft.dequant_seconds_per_step(spec, device_rates(hw, "bf16", hw.peak_flops("bf16"), None, None))
    assert qlora.time.step_seconds - lora.time.step_seconds == pytest.approx(fused, rel=1e-6)  # 3 passes x 32 x 8
    warning = next(w for w in qlora.warnings if w.startswith("QLoRA time assumes a fused NF4"))
    assert f"would add {(ft.EAGER_NF4_DEQUANT_FACTOR - 1) * fused:,.1f} s per step" in warning
    assert not any("NF4" in w for w in lora.warnings)


def test_flopwise_qlora_without_compile_is_timed_with_torchaos_eager_dequantisation():
    """flopwise train runs torchao's NF4Tensor eagerly unless training.compile is on: its plan's time
    carries the measured eager cost and says what a fused pass would save; other stacks fuse it."""
    eager_spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=1, recompute="full", global_batch=8,
                               finetune="qlora")
    eager, fused = plan(eager_spec), plan(dataclasses.replace(
        eager_spec, layout=dataclasses.replace(eager_spec.layout, compiled=True)))
    from flopwise.plan.gemm import device_rates

    hw = eager_spec.cluster.hardware
    one_pass = ft.dequant_seconds_per_step(eager_spec, device_rates(hw, "bf16", hw.peak_flops("bf16"), None, None),
                                           fused=True)
    assert eager.time.step_seconds - fused.time.step_seconds == pytest.approx(
        (ft.EAGER_NF4_DEQUANT_FACTOR - 1) * one_pass, rel=0.02)
    assert any(w.startswith("QLoRA time assumes torchao's eager NF4") for w in eager.warnings)
    assert not ft.eager_dequant(dataclasses.replace(eager_spec, stack="torchtune"))


def test_compare_local_json_carries_the_finetune_split():
    result = plan_hybrid("llama2-7b", "1B", Site("rtx4090", 1, 128.0), sweep=False,
                         finetune_options={"finetune": "qlora", "lora_rank": 8})
    data = result.to_dict()
    assert data["finetune"]["method"] == "qlora" and data["finetune"]["rank"] == 8
    assert plan_hybrid("gpt3-125m", "1B", Site("rtx4090", 1, 128.0), sweep=False).to_dict()["finetune"] == {
        "method": "full"}


@pytest.mark.parametrize("mode, dtype, checkpointing", [("lora", "fp32", False), ("qlora", "bf16", True),
                                                        ("lora", "bf16", False)])
def test_hf_llama_saved_bytes_under_a_fine_tune_are_the_planned_bytes(mode, dtype, checkpointing):
    """The whole model's saved-for-backward bytes (blocks, first block, ends; with checkpointing the larger
    of the head's end and a rebuilt block) as `benchmarks/saved_tensors_hf_block.py` counts them, within
    1 % of the plan (the rest: RMSNorm's per-token statistic and the rotary tables, left out)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    if mode == "qlora":
        _torchao_nf4()
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "saved_tensors_hf_block.py"
    module_spec = importlib.util.spec_from_file_location("saved_tensors_hf_block", path)
    bench = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(bench)
    run = bench.measure(mode, dtype, 8, checkpointing, 4, 32)
    planned = bench.planned(mode, dtype, 8, checkpointing, 4, 32)
    measured = run["embedding"] + run["first_block"] + run["block"] + max(run["head"], run.get("rebuilt_block_bytes", 0))
    assert measured == pytest.approx(planned["blocks_and_embedding"] + planned["head"], rel=0.01)
    # and the plan is tight enough that a missing term shows: the head's end alone is 20 % of it
    assert run["head"] > 0.2 * measured


# --------------------------------------------------------------------------- LoRA under Megatron-Core's TP / PP

NEMO_70B_LORA = dict(model="llama3-70b", hardware="h100-sxm", gpus=8, tp=2, pp=4, schedule="interleaved",
                     virtual_stages=20, micro_batch=1, global_batch=32, seq_len=4096, stack="nemo", finetune="lora")
"""NeMo's H100 recommended LoRA layout for Llama 3 70B (scripts/performance/recommended_model_configs/
model_configs_h100.csv): tp 2, pp 4, virtual pipeline 20, micro-batch 1, global batch 32, seq 4096."""


def test_megatron_lora_is_one_adapter_per_fused_linear():
    llama3 = get_model("llama3-70b")
    h, f = llama3.hidden, llama3.ffn_hidden
    d = llama3.head_dim or h // llama3.n_heads
    qkv = (llama3.n_heads + 2 * llama3.n_kv_heads) * d
    per_layer = 16 * ((h + qkv) + (llama3.n_heads * d + h) + (h + 2 * f) + (f + h))  # qkv, proj, fc1, fc2
    assert ft.adapter_params_per_layer(llama3, 16, "all-linear", fused=True) == per_layer == 2_195_456
    split = ft.split_of(build_runspec(**NEMO_70B_LORA, precision="bf16"))
    # --stack nemo plans NeMo's own default rank, 32 (nemo/collections/llm/peft/lora.py, dim 32)
    assert split.adapters == "megatron" and split.rank == 32 and split.trainable_params == 80 * 2 * per_layer
    # PEFT puts an A on each of q, k, v and of gate, up: three r x h matrices more per block
    assert ft.adapter_params_per_layer(llama3, 16, "all-linear") - per_layer == 3 * 16 * h
    assert [m.name for m in ft.target_matrices(llama3, "qkvo", fused=True)] == ["qkv", "o"]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_nemo_llama3_70b_lora_layout_plans_and_fits_on_8_h100(precision):
    p = plan(build_runspec(**NEMO_70B_LORA, precision=precision))
    lay, pc = p.spec.layout, count_params(p.spec.model)
    assert (lay.tp, lay.pp, lay.virtual_stages, lay.grad_accum) == (2, 4, 20, 32)
    assert p.memory.fits and p.time.step_seconds > 0
    split = ft.split_of(p.spec)
    stages = p.memory.stages  # the plan lists the stages that can be the busiest: the first and the last
    assert [s.stage for s in stages] == [0, 3]
    per_device = pc.total / (2 * 4)  # 70.55B base parameters over tp x pp
    # under fp8 it fits with TE's fp8 parameters (1 byte), a Megatron-Core memory option; its main grads are
    # bf16 already, as NeMo's fp8 recipes reduce them
    assert p.memory.fits_with == (() if precision == "bf16" else ("fp8-params",))
    # NVIDIA's performance recipes keep the main grads in bf16 at every precision (stacks/nemo.py)
    weight_bytes, grad_bytes = (2.0, 2.0) if precision == "bf16" else (1.0, 2.0)
    for s in stages:
        adapters = split.adapters_per_layer * s.layers / 2  # a tp-th of each adapter of the stage's blocks
        # the stage's frozen base (its blocks, the embedding or the head) plus its bf16 adapters
        assert s.weights == pytest.approx(s.params * weight_bytes + adapters * 2.0)
        assert s.weights == pytest.approx(per_device * weight_bytes, rel=0.04)  # the embedding / head aside
        assert s.gradients == pytest.approx(adapters * grad_bytes)  # main_grad for the adapters only
        assert s.optimizer_states == pytest.approx(adapters * 8.0)  # dp 1: Adam's m and v, unsharded
    full = plan(build_runspec(**{**NEMO_70B_LORA, "finetune": "full"}, precision=precision))
    assert not full.memory.fits  # full fine-tuning at this layout would need ~200 GiB per device
    assert p.time.step_seconds < full.time.step_seconds  # no weight-gradient GEMMs for the frozen base
    assert p.flops.model_per_unit < full.flops.model_per_unit


def test_lora_under_tp_2_holds_less_per_device_than_under_tp_1():
    tp2 = plan(build_runspec(**NEMO_70B_LORA, precision="bf16", recompute="none"))
    tp1 = plan(build_runspec(**{**NEMO_70B_LORA, "tp": 1}, precision="bf16", recompute="none"))  # dp 2
    assert tp2.spec.layout.dp == 1 and tp1.spec.layout.dp == 2
    assert tp2.memory.weights == pytest.approx(tp1.memory.weights / 2, rel=0.01)
    assert tp2.memory.activations < tp1.memory.activations  # sequence parallelism shards the block inputs
    assert tp2.memory.total_bytes < tp1.memory.total_bytes
    assert tp1.time.tp_exposed_seconds == 0 < tp2.time.tp_exposed_seconds


def test_adapter_gemms_split_over_tp_and_the_frozen_base_loses_its_weight_gradients():
    from flopwise.plan.gemm import device_rates
    from flopwise.plan.ops import layer_times as base_layer_times

    spec = build_runspec(**NEMO_70B_LORA, precision="bf16", recompute="none")
    hw, model = spec.cluster.hardware, spec.model
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"), None, None)
    adapter_gemms = {}
    for tp in (1, 2):
        at = with_layout(spec, tp=tp, sequence_parallel=tp > 1)
        base = base_layer_times(model, 4096, 1, tp, tp > 1, True, False, "none", "bf16", rates)
        lora = ft.layer_times(base, at, rates)
        assert lora.backward < base.backward - 0.8 * base.wgrad  # the base's wgrad GEMMs are gone
        assert lora.forward > base.forward  # the frozen base still runs its forward, plus the adapters
        adapter_gemms[tp] = lora.gemm - (base.gemm - base.wgrad)
    # each adapter GEMM has one dimension split over tp (ParallelLinearAdapter): about half the time
    assert adapter_gemms[2] < 0.75 * adapter_gemms[1]


def test_megatron_adapter_collectives_gather_the_row_parallel_outputs():
    spec = build_runspec(**NEMO_70B_LORA, precision="bf16")
    T, h, r, e = 4096, 8192, 32, 2.0  # NeMo's default rank
    forward, backward = ft.adapter_tp_collectives(spec, e)
    # proj and fc2: A's partial T x r all-reduced, B's T x h/t output all-gathered; qkv and fc1: A's T x r/t gathered
    assert sorted(forward) == sorted([("all_reduce", T * r * e), ("all_gather", T * h * e)] * 2
                                     + [("all_gather", T * r * e)] * 2)
    # B's input gradients all-reduced (4), the scattered outputs' gradients all-gathered (2, sequence parallel)
    assert sorted(backward) == sorted([("all_reduce", T * r * e)] * 4 + [("all_gather", T * h * e)] * 2)
    assert ft.adapter_tp_collectives(with_layout(spec, tp=1, dp=2), e) == ((), ())
    lora, full = plan(spec), plan(build_runspec(**{**NEMO_70B_LORA, "finetune": "full"}, precision="bf16"))
    assert lora.time.tp_exposed_seconds > full.time.tp_exposed_seconds  # outside TE's userbuffers: exposed
    assert lora.comm.tp_bytes > full.comm.tp_bytes


def test_megatron_lora_block_activations_under_sequence_parallelism():
    spec = build_runspec(**NEMO_70B_LORA, precision="bf16", recompute="none")
    split = ft.split_of(spec)
    T, h, r, e = 4096, 8192, 32, 2.0  # NeMo's default rank
    # four adapters keep their rank-r intermediate whole; the qkv and fc1 adapters keep the norm's output
    # gathered over the sequence (e·T·h) where full training keeps its tp-th; TE's fused norms and bf16
    # adapters keep nothing more
    delta = ft.block_activation_delta_bytes(spec, split, T, e, None, fused_norm=True)
    assert delta == 4 * e * T * r + 2 * (e * T * h - e * T * h / 2)
    # under fp8 full training keeps TE's fp8 copy of each GEMM input (1 byte), the adapters the bf16 output
    fp8 = ft.block_activation_delta_bytes(spec, split, T, e, 1.0, fused_norm=True)
    assert fp8 == 4 * e * T * r + 2 * (e * T * h - T * h / 2) + (e - 1.0) * T * 28672 / 2


def test_model_parallel_refusals_are_one_line():
    with pytest.raises(UserError, match="--stack nemo") as lora:
        build_runspec(model="llama3-70b", gpus=8, tp=2, finetune="lora")
    with pytest.raises(UserError, match="qlora is planned with data parallelism only") as qlora:
        build_runspec(**{**NEMO_70B_LORA, "finetune": "qlora"})
    with pytest.raises(UserError, match="qlora"):
        build_runspec(**{**NEMO_70B_LORA, "finetune": "qlora", "tp": 1})  # pp 4 alone
    for err in (lora, qlora):
        assert len(str(err.value).splitlines()) == 1
    assert ft.model_parallel_refusal("lora", "megatron-bridge") is None  # NeMo's own engine, by another name


def test_plan_cli_plans_the_nemo_lora_layout():
    env = {**os.environ, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "flopwise", "plan", "--model", "llama3-70b", "--stack", "nemo", "--finetune",
            "lora", "--gpus", "8", "--tp", "2", "--pp", "4", "--vp", "20", "--mbs", "1", "--gbs", "32",
            "--seq-length", "4096", "--precision", "bf16", "--hardware", "h100-sxm"]
    out = subprocess.run(argv + ["--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["fits"] is True and data["finetune"]["adapters"] == "megatron"
    refused = subprocess.run(argv[:argv.index("--stack")] + argv[argv.index("--stack") + 2:], capture_output=True,
                             text=True, env=env, timeout=60)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1


def test_layout_search_tries_tp_and_pp_for_megatron_lora_only():
    from flopwise.plan.search import parallel_shapes

    spec = build_runspec(**NEMO_70B_LORA, precision="bf16")
    assert (2, 4) in parallel_shapes(spec, 8)[0]
    assert parallel_shapes(with_workload(spec, finetune="qlora"), 8)[0] == [(1, 1)]
    assert parallel_shapes(dataclasses.replace(spec, stack="flopwise"), 8)[0] == [(1, 1)]


def test_mla_adapters_and_qlora_follow_deepseeks_own_linears():
    """`qkvo` adapts MLA's q_a, q_b, kv_a, kv_b and o; QLoRA quantizes every block's linears, the
    three leading dense blocks with their dense MLP rather than 256 experts."""
    v3 = get_model("deepseek-v3")
    h, a = 7168, 128
    attention = {(m.name, m.d_in, m.d_out) for m in ft.target_matrices(v3, "qkvo")}
    assert attention == {("q_a", h, 1536), ("q_b", 1536, a * 192), ("kv_a", h, 576), ("kv_b", 512, a * 256),
                         ("o", a * 128, h)}
    pc = count_params(v3)
    split = ft.finetune_split(v3, pc, "qlora", 16, "all-linear", "bf16")
    attention_weights = h * 1536 + 1536 * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h
    moe_linears = 3 * h * 2048 * 257  # the routed and shared experts (the router stays out)
    assert split.quantized_params == 61 * attention_weights + 58 * moe_linears + 3 * 3 * h * 18432
    assert split.quantized_params < pc.total


def test_a_stated_full_fine_tune_takes_a_fine_tunes_defaults():
    """`--finetune full` is a fine-tune of a pretrained model: 1B tokens, 128Ki-token batches and the
    model's context capped at 2048 as `flopwise train` windows it; unstated, the run trains from scratch."""
    tuned = build_runspec(model="llama3.1-8b", hardware="h100-sxm", gpus=8, finetune="full")
    scratch = build_runspec(model="llama3.1-8b", hardware="h100-sxm", gpus=8)
    assert (tuned.workload.finetune, scratch.workload.finetune) == ("full", "full")
    assert tuned.workload.seq_len == ft.FINETUNE_SEQ_LEN_CAP and scratch.workload.seq_len == 8192
    assert tuned.workload.total_tokens == ft.DEFAULT_FINETUNE_TOKENS and scratch.workload.total_tokens > 1e12
    assert tuned.layout.global_batch_size * tuned.workload.seq_len == ft.DEFAULT_FINETUNE_BATCH_TOKENS
    notes = " | ".join(tuned.cluster.extra["defaults"])
    assert "seq 2048: a fine-tune's default" in notes and "tokens 1B" in notes
    assert "defaults" not in scratch.cluster.extra or "seq 2048" not in " ".join(scratch.cluster.extra["defaults"])
    assert build_runspec(model="llama3.1-8b", finetune="lora", seq_len=8192).workload.seq_len == 8192  # stated wins


def test_lora_flags_without_a_fine_tune_are_named_as_ignored():
    warnings = build_runspec(model="llama3-8b", lora_rank=8, lora_targets="q_proj").cluster.extra["warnings"]
    assert any(w.startswith("--lora-rank, --lora-targets apply to adapters only") for w in warnings)


@pytest.mark.parametrize(("options", "says"), [
    ({"finetune": "qlora"}, "no stack runs a QLoRA in fp8"),
    ({"finetune": "lora"}, "fine-tunes adapters in 16 bits"),
    ({"finetune": "lora", "stack": "torchtune"}, "the torchtune stack fine-tunes adapters in 16 bits"),
])
def test_an_fp8_fine_tune_no_stack_runs_is_refused_in_one_line(options, says):
    with pytest.raises(UserError) as err:
        build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=8, precision="fp8", **options)
    assert says in str(err.value) and "\n" not in str(err.value)
    # Megatron-Core's LoRA runs the frozen base's GEMMs in fp8
    assert build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=8, precision="fp8", finetune="lora",
                         stack="nemo").workload.precision == "fp8"
