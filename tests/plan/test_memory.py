"""plan/memory.py: ZeRO, DeepSpeed, Megatron and Korthikanti figures, plus measured torch activations."""

import pytest

from flopwise.catalog.models import ModelSpec
from flopwise.plan import memory as mem
from tests.plan.saved_tensors import saved_storage_bytes

GPT = ModelSpec(key="gpt", name="gpt", n_layers=96, hidden=12288, n_heads=96, ffn_hidden=4 * 12288,
                vocab_size=51200, mlp="gelu", norm="layernorm")


# ZeRO paper (Rajbhandari et al. 2020) Table 1 grid, GB = 1e9 bytes (published.md).
ZERO_TABLE = {
    7.5e9: {"os": [120, 52.5, 35.6, 31.4, 30.4, 30.1], "os+g": [120, 41.3, 21.6, 16.6, 15.4, 15.1],
            "os+g+p": [120, 30, 7.5, 1.88, 0.47, 0.12]},
    128e9: {"os": [2048, 896, 608, 536, 518, 513], "os+g": [2048, 704, 368, 284, 263, 257],
            "os+g+p": [2048, 512, 128, 32, 8, 2]},
    1e12: {"os": [16000, 7000, 4750, 4187, 4046, 4011], "os+g": [16000, 5500, 2875, 2218, 2054, 2013],
           "os+g+p": [16000, 4000, 1000, 250, 62.5, 15.6]},
}
N_D = [1, 4, 16, 64, 256, 1024]


@pytest.mark.parametrize("psi", list(ZERO_TABLE))
def test_zero_paper_table_1(psi):
    assert mem.zero_model_state_bytes(psi, 1, "baseline") / 1e9 == pytest.approx(16 * psi / 1e9)
    for stage, row in ZERO_TABLE[psi].items():
        for n_d, expected in zip(N_D, row):
            got = mem.zero_model_state_bytes(psi, n_d, stage) / 1e9
            assert got == pytest.approx(expected, rel=6e-3, abs=0.006), (psi, stage, n_d)


def test_zero_figure_1_example_and_planner_states_agree():
    # 7.5B params, N_d = 64: 120 GB -> 31.4 -> 16.6 -> 1.9 GB.
    figure = [120, 31.4, 16.6, 1.9]
    sb = mem.state_bytes("bf16", "adamw")
    assert sb.weight + sb.grad + sb.master + sb.optimizer == 16  # 2 + 2 + 12
    for stage, expected in enumerate(figure):
        s = mem.model_states(7.5e9, sb, stage if stage < 3 else 3, 64, "none")
        total = (s.weights + s.gradients + s.optimizer_states + s.master_weights) / 1e9
        assert total == pytest.approx(expected, rel=0.03)
        name = ["baseline", "os", "os+g", "os+g+p"][stage]
        assert total * 1e9 == pytest.approx(mem.zero_model_state_bytes(7.5e9, 64, name))


GIB = 2**30


def test_deepspeed_zero2_estimator_t5_3b():
    # deepspeed 0.19.8 re-run (published.md): offload 127.45 / 5.31, none 127.45 / 11.28 GiB.
    cpu, gpu = mem.deepspeed_estimate_zero2(2851e6, 8, 1, cpu_offload=True)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == (127.45, 5.31)
    cpu, gpu = mem.deepspeed_estimate_zero2(2851e6, 8, 1, cpu_offload=False)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == (127.45, 11.28)


@pytest.mark.parametrize("offload_params, offload_opt, zero_init, cpu_gib, gpu_gib", [
    (True, True, True, 71.69, 0.12), (True, True, False, 127.45, 0.12),
    (False, True, True, 63.72, 0.78), (False, True, False, 127.45, 0.78),
    (False, False, True, 1.43, 6.09), (False, False, False, 127.45, 6.09),
])
def test_deepspeed_zero3_estimator_t5_3b(offload_params, offload_opt, zero_init, cpu_gib, gpu_gib):
    cpu, gpu, _ = mem.deepspeed_estimate_zero3(2851e6, 32e6, 8, 1, cpu_offload=offload_opt,
                                               cpu_offload_params=offload_params, zero_init=zero_init)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == (cpu_gib, gpu_gib)


def test_deepspeed_memory_doc_t5_large_cases():
    # memory.rst: 737.67M params, 32.90M largest layer, 4 GPUs -> 3291 / 125 / 477 MB (MiB, >> 20).
    total, largest = 737.67e6, 32.90e6
    case1 = mem.deepspeed_estimate_zero3(total, largest, 4, 1, cpu_offload=False)[1]
    case2 = mem.deepspeed_estimate_zero3(total, largest, 4, 1, cpu_offload=True, cpu_offload_params=True)[1]
    case3 = mem.deepspeed_estimate_zero3(total, largest, 4, 1, cpu_offload=True, cpu_offload_params=False)[1]
    assert [case1 >> 20, case2 >> 20, case3 >> 20] == [3291, 125, 477]


@pytest.mark.parametrize("params, grads, plain, kept, sharded", [
    ("fp16", "fp16", 20, 4, 16), ("bf16", "fp32", 18, 6, 12), ("fp32", "fp32", 16, 8, 8)])
def test_megatron_distributed_optimizer_bytes_per_param(params, grads, plain, kept, sharded):
    assert mem.megatron_bytes_per_param(params, grads, 8, distributed=False) == plain
    assert mem.megatron_bytes_per_param(params, grads, 8, distributed=True) == kept + sharded / 8


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table_2_all_rows(t):
    s, b, h, a = 2048, 4, 12288, 96
    terms = mem.activation_terms(GPT, s, b, dtype_bytes=2, dropout=True, flash_attention=False)
    sbh = s * b * h
    rows = {
        ("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): sbh / t * (34 + 5 * a * s / h),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): sbh * 34 / t,
    }
    for (recompute, sp), expected in rows.items():
        got = mem.activation_bytes_per_layer(terms, t, sp, recompute)
        assert got == pytest.approx(expected, rel=1e-12), (recompute, sp)
    assert mem.activation_bytes_per_layer(terms, 1, False, "full") == 2 * sbh
    if t == 1:
        assert mem.activation_bytes_per_layer(terms) == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)


def test_flash_attention_removes_the_score_term():
    s, b, h, a = 2048, 1, 12288, 96
    plain = mem.activation_terms(GPT, s, b, 2, True, flash_attention=False)
    flash = mem.activation_terms(GPT, s, b, 2, True, flash_attention=True)
    diff = mem.activation_bytes_per_layer(plain) - mem.activation_bytes_per_layer(flash)
    assert diff == pytest.approx(5 * a * s * s * b - 4 * a * s * b)  # scores out, fp32 log-sum-exp in


def test_pipeline_inflight_microbatches():
    assert mem.inflight_layer_factor(96, 1, 16, "1f1b", 1) == 96
    assert mem.inflight_layer_factor(96, 8, 16, "1f1b", 1) == 96  # p micro-batches of L/p layers
    assert mem.inflight_layer_factor(96, 8, 4, "1f1b", 1) == 48  # fewer micro-batches than stages
    assert mem.inflight_layer_factor(96, 8, 16, "gpipe", 1) == 12 * 16
    assert mem.inflight_layer_factor(96, 8, 16, "interleaved", 2) == pytest.approx(96 * (1 + 7 / 16))


def test_optimizer_bytes_and_offload():
    assert mem.state_bytes("bf16", "sgd").optimizer == 4
    assert mem.state_bytes("bf16", "adam8bit").optimizer == 2
    assert mem.state_bytes("fp32", "adamw") == mem.StateBytes(4, 4, 0, 8)
    sb = mem.state_bytes("bf16", "adamw")
    off = mem.model_states(1e9, sb, 2, 4, "optimizer")
    assert (off.weights, off.gradients, off.optimizer_states, off.master_weights) == (2e9, 0, 0, 0)
    assert off.cpu_bytes == pytest.approx(14e9 / 4)
    assert mem.model_states(1e9, sb, 3, 4, "params").weights == 0


def test_fp32_gpt_block_saved_tensors_match_the_formula():
    """A real torch block (fp32, no dropout, explicit attention): saved-for-backward bytes = formula."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    torch.manual_seed(0)
    s, b, h, a = 64, 2, 64, 4
    spec = ModelSpec(key="tiny", name="tiny", n_layers=1, hidden=h, n_heads=a, ffn_hidden=4 * h, vocab_size=10)
    ln1, ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
    qkv, out = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
    fc1, fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)
    params = {p.data_ptr() for m in (ln1, ln2, qkv, out, fc1, fc2) for p in m.parameters()}
    x = torch.randn(b, s, h, requires_grad=True)
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q, k, v = qkv(ln1(x)).split(h, dim=-1)
        q, k, v = (z.view(b, s, a, h // a).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (h // a) ** 0.5, dim=-1)
        y = x + out((att @ v).transpose(1, 2).reshape(b, s, h))
        y = y + fc2(F.gelu(fc1(ln2(y))))
    measured = sum(storages.values())
    terms = mem.activation_terms(spec, s, b, dtype_bytes=4, dropout=False, flash_attention=False)
    predicted = mem.activation_bytes_per_layer(terms)
    # The formula ignores LayerNorm mean/rstd and the softmax scaling's O(s*b) extras.
    assert measured == pytest.approx(predicted, rel=0.02)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_fp32_llama_block_saved_tensors_match_the_formula(kv_heads):
    """RMSNorm + SDPA (flash, causal) + GQA via repeat_interleave + SwiGLU, fp32 on CPU, no dropout."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    torch.manual_seed(0)
    s, b, h, a, f = 64, 2, 64, 4, 160
    hd = h // a
    spec = ModelSpec(key="tiny-llama", name="tiny", n_layers=1, hidden=h, n_heads=a, n_kv_heads=kv_heads,
                     ffn_hidden=f, vocab_size=10, mlp="swiglu", norm="rmsnorm", position="rope")
    n1, n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
    wq, wk, wv, wo = (torch.nn.Linear(h, a * hd, bias=False), torch.nn.Linear(h, kv_heads * hd, bias=False),
                      torch.nn.Linear(h, kv_heads * hd, bias=False), torch.nn.Linear(a * hd, h, bias=False))
    w1, w2, w3 = (torch.nn.Linear(h, f, bias=False), torch.nn.Linear(f, h, bias=False), torch.nn.Linear(h, f, bias=False))
    modules = (n1, n2, wq, wk, wv, wo, w1, w2, w3)
    params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    x = torch.randn(b, s, h, requires_grad=True)
    with saved_storage_bytes(params) as storages:
        y = n1(x)
        # RoPE (as in the built-in decoder) leaves q and k contiguous in [b, a, s, d]; then torch's CPU
        # flash kernel writes its output in that layout and the reshape for the out-projection copies.
        q = wq(y).view(b, s, a, hd).transpose(1, 2).contiguous()
        k = wk(y).view(b, s, kv_heads, hd).transpose(1, 2).contiguous().repeat_interleave(a // kv_heads, dim=1)
        v = wv(y).view(b, s, kv_heads, hd).transpose(1, 2).repeat_interleave(a // kv_heads, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x2 = x + wo(att.transpose(1, 2).reshape(b, s, h))
        z = n2(x2)
        x2 + w2(F.silu(w1(z)) * w3(z))
    measured = sum(storages.values())
    predicted = mem.layer_activation_bytes(spec, s, b, "fp32", dropout=False, flash_attention=True,
                                           kv_repeated=True, attn_output_copy=True)
    assert measured == pytest.approx(predicted, rel=0.01)  # the gap is RMSNorm's O(s*b) rstd


def _saved_by_compiled_block(kind: str, dtype_name: str, kv_heads: int, s: int = 64, b: int = 2):
    """Bytes the forward graph of the built-in block hands to its backward under `torch.compile`:
    the graph partitioned by AOT autograd's min-cut partitioner (the one inductor uses), every saved
    tensor that is not a parameter (the block's input included), counted from its metadata."""
    torch = pytest.importorskip("torch")
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_compiler
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from flopwise.config.schema import ModelConfig
    from flopwise.rotary import rotary_tables
    from flopwise.train.model import Block

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    h, a, f = 64, 4, 160
    cfg = ModelConfig(kind=kind, hidden=h, n_heads=a, n_kv_heads=kv_heads, n_layers=1, ffn_hidden=f,
                      max_seq_len=s, dropout=0.0)
    torch.manual_seed(0)
    block = Block(cfg).to(dtype)
    saved = []

    def partition(joint, inputs, num_fwd_outputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        params = {n.name for n in fw.graph.nodes if n.op == "placeholder"} - {_input_placeholder(fw)}
        for node in outputs[num_fwd_outputs:]:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and node.name not in params:
                saved.append(value.numel() * value.element_size())
        return fw, bw

    _boxed = make_boxed_compiler(lambda graph, _: graph)  # run the partitioned graphs as they are

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=_boxed, bw_compiler=_boxed,
                                     partition_fn=partition)

    torch._dynamo.reset()
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    rope = None
    if kind == "llama":
        cos, sin = rotary_tables(h // a, s, 10000.0)
        rope = (cos.to(dtype), sin.to(dtype))
    torch.compile(block, backend=backend)(x, rope).sum().backward()
    torch._dynamo.reset()
    spec = ModelSpec(key="tiny", name="tiny", n_layers=1, hidden=h, n_heads=a, n_kv_heads=kv_heads,
                     ffn_hidden=f, vocab_size=10,
                     mlp="swiglu" if kind == "llama" else "gelu", norm="rmsnorm" if kind == "llama" else "layernorm")
    return sum(saved), spec, s, b


def _input_placeholder(fw) -> str:
    """The placeholder of the block's input: the one 3-d tensor among the parameters (all 1-d or 2-d)."""
    return next(n.name for n in fw.graph.nodes if n.op == "placeholder" and n.meta["val"].dim() == 3)


@pytest.mark.parametrize("kind,dtype_name,kv_heads", [("llama", "bf16", 2), ("llama", "fp32", 4), ("gpt2", "bf16", 4)])
def test_compiled_block_saves_what_the_fused_convention_counts(kind, dtype_name, kv_heads):
    """`training.compile` / `--compile` plan the partitioned graph's saves: a norm's input and SwiGLU's
    projections and product; never an RMSNorm's normalised copy or the SiLU output (eager saves both)."""
    measured, spec, s, b = _saved_by_compiled_block(kind, dtype_name, kv_heads)
    kwargs = dict(dropout=False, flash_attention=True, kv_repeated=True, attn_output_copy=True)
    compiled = mem.layer_activation_bytes(spec, s, b, dtype_name, compiled=True, **kwargs)
    eager = mem.layer_activation_bytes(spec, s, b, dtype_name, **kwargs)
    # the gap is O(s*b): RMSNorm's rstd, LayerNorm's mean and rstd, attention's log-sum-exp
    assert measured == pytest.approx(compiled, rel=0.05)
    if kind == "llama":
        assert eager > 1.15 * measured  # the eager count would overstate a compiled llama block
    else:
        assert eager == compiled  # LayerNorm and GELU save the same either way


# --------------------------------------------------------------------------- framework conventions


def _states_total(psi, framework, stage, d, precision="bf16"):
    sb = mem.framework_state_bytes(precision, "adamw", framework, stage)
    s = mem.model_states(psi, sb, stage, d, "none")
    return s.weights + s.gradients + s.optimizer_states + s.master_weights


@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_convention_reproduces_readme_bytes_per_param(d):
    # Megatron-LM README: bf16 params + fp32 grads: 18 plain, 6 + 12/d with the distributed optimizer.
    assert _states_total(1.0, "megatron", 0, d) == mem.megatron_bytes_per_param("bf16", "fp32", d, False)
    assert _states_total(1.0, "megatron", 1, d) == pytest.approx(mem.megatron_bytes_per_param("bf16", "fp32", d, True))


def test_fsdp_convention_is_the_zero_paper():
    for stage, name in enumerate(["baseline", "os", "os+g", "os+g+p"]):
        assert _states_total(7.5e9, "fsdp", stage, 64) == pytest.approx(mem.zero_model_state_bytes(7.5e9, 64, name))


def test_deepspeed_convention_reproduces_its_estimators_t5_3b():
    # estimate_zero2 (no offload): 2Ψ + 18Ψ/N; estimate_zero3: 18Ψ/N + 4·largest layer (gathered 16-bit W + G).
    psi, largest, n = 2851e6, 32e6, 8
    assert _states_total(psi, "deepspeed", 2, n) == pytest.approx(mem.deepspeed_estimate_zero2(psi, n, 1, False)[1], rel=1e-9)
    sb = mem.framework_state_bytes("bf16", "adamw", "deepspeed", 3)
    from flopwise.plan.params import ParamCount

    pc = ParamCount(total=int(psi), active=int(psi), embedding=int(largest), output_head=0, attention_per_layer=0,
                    mlp_per_layer=0, mlp_active_per_layer=0, norms_per_layer=0, final_norm=0, other=0,
                    non_embedding=0, n_layers=1)
    gpu = _states_total(psi, "deepspeed", 3, n) + mem.comm_buffer_bytes(pc, sb, 3, n, 1, "none", "deepspeed")
    expected = mem.deepspeed_estimate_zero3(psi, largest, n, 1, cpu_offload=False)[1]
    assert gpu == pytest.approx(expected, rel=1e-9)


def test_fp32_training_is_the_same_in_every_framework():
    assert {_states_total(1.0, f, 0, 1, "fp32") for f in mem.FRAMEWORKS} == {16.0}


def test_loss_logits_dtype_by_framework():
    # Megatron's vocab-parallel loss: 16-bit output + fp32 softmax; torch F.cross_entropy(logits.float()) adds
    # the fp32 log-softmax autograd keeps.
    assert mem.loss_logits_bytes_per_element("megatron", 2.0) == 6.0
    assert mem.loss_logits_bytes_per_element("fsdp", 2.0) == 10.0
    assert mem.loss_logits_bytes_per_element("deepspeed", 4.0) == 8.0


# --------------------------------------------------------------------------- recompute policies


LLAMA = ModelSpec(key="l", name="l", n_layers=32, hidden=4096, n_heads=32, ffn_hidden=11008, vocab_size=32000,
                  mlp="swiglu", norm="rmsnorm")


def _per_layer(recompute, flash=True, spec=LLAMA):
    terms = mem.activation_terms(spec, 4096, 1, 2.0, False, flash)
    return mem.activation_bytes_per_layer(terms, 1, False, recompute)


def test_megatron_selective_saves_nothing_with_flash_attention():
    assert _per_layer("selective") == _per_layer("none")
    assert _per_layer("selective", flash=False) < _per_layer("none", flash=False)


def test_policies_ordered_by_what_they_keep():
    none, op, full = _per_layer("none"), _per_layer("op"), _per_layer("full")
    assert full < op < none
    assert full == 2 * 4096 * 4096  # the block input, 2·sbh


@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_kth_block_averages_full_and_none(k):
    expected = _per_layer("full") / k + _per_layer("none") * (1 - 1 / k)
    assert _per_layer(f"every:{k}") == pytest.approx(expected)
    assert mem.recompute_forward_fraction(f"every:{k}") == 1 / k


@pytest.mark.parametrize("share", [0.25, 0.753, 1.0])
def test_a_share_of_blocks_averages_full_and_none(share):
    expected = _per_layer("full") * share + _per_layer("none") * (1 - share)
    assert _per_layer(f"blocks:{share}") == pytest.approx(expected)
    assert mem.recompute_forward_fraction(f"blocks:{share}") == share


def test_recompute_policy_names():
    assert all(mem.is_recompute_policy(p) for p in ("none", "selective", "op", "full", "every:3", "blocks:0.75"))
    assert not any(mem.is_recompute_policy(p) for p in ("every:0", "every:x", "some", "blocks:0", "blocks:1.5",
                                                        "blocks:x"))


def test_zero3_gather_conventions():
    assert mem.zero3_gathers_per_step("fsdp", 1, 8) == 16 == mem.zero3_gathers_per_step("deepspeed", 1, 8)
    assert mem.zero3_gathers_per_step("fsdp", 4, 8) == 1  # a pipeline stage stays gathered
    assert mem.zero3_gathers_per_step("megatron", 1, 8) == 1


def test_deepspeed_zero_keeps_an_fp32_partition_copy_even_in_fp32():
    """Measured on a 2-rank CPU ZeRO-3 fp32 run: optimizer + master = 12 bytes/param/d, not 8."""
    zero3 = mem.framework_state_bytes("fp32", "adamw", "deepspeed", 3)
    assert (zero3.weight, zero3.grad, zero3.master, zero3.optimizer) == (4.0, 4.0, 4.0, 8.0)
    assert mem.framework_state_bytes("fp32", "adamw", "deepspeed", 0).master == 0.0  # plain torch optimizer
    assert mem.framework_state_bytes("fp32", "adamw", "fsdp", 3).master == 0.0


@pytest.mark.parametrize("q_lora_rank", [48, None])
def test_fp32_deepseek_v3_layer_saved_tensors_match_the_formula(q_lora_rank):
    """transformers' DeepseekV3DecoderLayer (multi-head latent attention, a dense SwiGLU block), fp32
    on CPU: its query/key heads (16 + 8) differ from its value heads (12), so SDPA runs its math
    path and keeps the s×s probabilities, as the formula without flash attention does."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RotaryEmbedding

    torch.manual_seed(0)
    s, b, h, a, f = 64, 2, 64, 4, 160
    mla = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
    config = transformers.DeepseekV3Config(hidden_size=h, num_attention_heads=a, num_key_value_heads=a,
                                           intermediate_size=f, q_lora_rank=q_lora_rank, first_k_dense_replace=1,
                                           num_hidden_layers=1, n_group=1, topk_group=1, **mla)
    config._attn_implementation = "sdpa"
    layer = DeepseekV3DecoderLayer(config, layer_idx=0).float()
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(b, s, h, requires_grad=True)
    rotary = DeepseekV3RotaryEmbedding(config)(x, torch.arange(s)[None].expand(b, s))
    with saved_storage_bytes(params) as storages:
        layer(x, attention_mask=None, position_embeddings=rotary)
    spec = ModelSpec(key="tiny-mla", name="tiny", n_layers=1, hidden=h, n_heads=a, n_kv_heads=a, ffn_hidden=f,
                     vocab_size=10, mlp="swiglu", norm="rmsnorm", position="rope", q_lora_rank=q_lora_rank or 0, **mla)
    predicted = mem.layer_activation_bytes(spec, s, b, "fp32", dropout=False, flash_attention=False)
    # the gap: the norms' rstd and the rotary cos/sin tables, O(s·b)
    assert sum(storages.values()) == pytest.approx(predicted, rel=0.015)


def test_mla_narrows_its_latent_not_the_k_and_v_that_training_keeps():
    """DeepSeek-V3's KV projection writes a 576-wide latent per token (512 + 64 rotary), 57 times
    narrower than K and V of the same 128 heads as multi-head attention of head size 128 (what an
    inference KV cache holds); but training expands the latent to every head before attention and
    keeps those: K of a·192 and V of a·128, more than that MHA's 2·a·128. Only the rotary part of
    each head (64 of 192) takes RoPE."""
    import dataclasses

    from flopwise.catalog.models import get_model
    from flopwise.plan import ops

    v3 = get_model("deepseek-v3")
    mha = dataclasses.replace(v3, kv_lora_rank=0, q_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0,
                              v_head_dim=0, head_dim=128)
    latent = v3.kv_lora_rank + v3.qk_rope_head_dim
    assert (1, latent, v3.hidden, 1.0) in ops.attention_gemms(v3, 1, 1, False)  # kv_a: h -> 576
    mha_kv = ops.attention_gemms(mha, 1, 1, False)[0][1] - 128 * 128  # fused QKV less Q
    assert (latent, mha_kv) == (576, 2 * 128 * 128)

    tokens, e = 4096, 2.0
    keeps = {name: mem.activation_terms(spec, tokens, 1, dropout=False, flash_attention=True).sharded
             for name, spec in (("mla", v3), ("mha", mha))}
    # V and the out-projection input are a·128 in both; Q and K grow from a·128 to a·192
    assert keeps["mla"] - keeps["mha"] == e * tokens * 128 * (192 - 128) * 2
    assert ops.rotary_width(v3, 1) == (128 + 1) * 64 < ops.rotary_width(mha, 1) == 2 * 128 * 128


def test_moe_keeps_the_width_its_experts_pass_and_each_tokens_routed_copies():
    """A token passes through k experts and the shared one: DeepSeek-V3's 8 x 2048 + 2048 is the
    18432 of its dense blocks, so the MLP keeps what the dense MLP would; on top, the k routed copies
    of each token (the experts' input, and their output before the router's weighting), whole on
    every tensor-parallel rank."""
    import dataclasses

    from flopwise.catalog.models import get_model

    v3 = get_model("deepseek-v3")
    dense = dataclasses.replace(v3, n_experts=1, experts_per_token=1, shared_expert_ffn_hidden=0, ffn_hidden=18432,
                                dense_layers=0, dense_ffn_hidden=0)
    assert mem.mlp_width_per_token(v3) == 18432 == mem.mlp_width_per_token(dense)
    moe, flat = (mem.activation_terms(spec, 4096, 1, dropout=False, flash_attention=True) for spec in (v3, dense))
    assert (moe.replicated, moe.sharded) == (flat.replicated, flat.sharded)
    assert moe.routed_copies == 2 * 2.0 * 4096 * 8 * 7168 and flat.routed_copies == 0
    for tp, sp in ((1, False), (8, True)):
        extra = (mem.activation_bytes_per_layer(moe, tp, sp, "selective")
                 - mem.activation_bytes_per_layer(flat, tp, sp, "selective"))
        assert extra == moe.routed_copies
    assert mem.activation_bytes_per_layer(moe, 8, True, "full") == mem.activation_bytes_per_layer(flat, 8, True, "full")
