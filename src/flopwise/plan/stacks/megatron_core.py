"""Megatron-Core + Transformer Engine (what NeMo 2 and Megatron-Bridge run)."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="megatron-core", title="Megatron-Core + Transformer Engine (NeMo, Megatron-Bridge)", framework="megatron",
    # TE DotProductAttention picks FusedAttention (cuDNN) on Hopper with bf16 and head dim <= 256
    # (transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend)
    attention_kernel="cudnn",
    fp8_recipe="delayed",  # megatron/training/arguments.py --fp8-recipe default 'delayed' (TE DelayedScaling)
    fused_optimizer=True,  # megatron/core/optimizer: TE/apex FusedAdam
    # NeMo 2 GPTConfig cross_entropy_loss_fusion=True: megatron/core/fusions/fused_cross_entropy.py
    cross_entropy="megatron-fused",
    overlap_grad_reduce=True, overlap_param_gather=True,  # DistributedDataParallelConfig, on in the recipes
    tp_comm_overlap=True,  # TE userbuffers (--tp-comm-overlap)
    # megatron/core/distributed/distributed_data_parallel_config.py: grad_reduce_in_fp32 (default False
    # there; Megatron-LM's arguments.py and NeMo's MegatronMixedPrecision turn it on for bf16): an fp32
    # main_grad buffer by default, bf16 as the memory option `bf16-grad-reduce`
    grad_bytes=4.0, reduce_bytes=4.0,
    # fp8: NeMo's performance scripts set grad_reduce_in_fp32=False with bf16_with_fp8_mixed()
    # (scripts/performance/llm/*.py), its launcher's fp8 examples grad_sync_dtype=bf16
    # (NeMo-Framework-Launcher examples/training/llama/h100/*_fp8.sh), Megatron-Bridge's performance
    # configs ddp.grad_reduce_in_fp32=False: bf16 gradient buffer and reduction
    fp8_reduce_bytes=2.0,
    distributed_optimizer=True,  # --use-distributed-optimizer, on in the recipes
    # TE Linear / LayerNormLinear save their input as a Float8Tensor under fp8_autocast
    # (transformer_engine/pytorch/module/linear.py, layernorm_linear.py: saved inputmat / ln_out)
    fp8_gemm_input_bytes=1.0,
    # fused vocab-parallel cross-entropy keeps the fp32 softmax (exp_logits) and no fp32 logits copy
    loss_bytes_per_logit=4.0,
    # NeMo/Megatron-Bridge launch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which maps
    # pages into one segment instead of keeping per-size cached blocks (PyTorch CUDA semantics docs)
    allocator_reserve=0.02,
    # TE LayerNormLinear saves the norm's input and its fp8/bf16 output as the GEMM input
    # (module/layernorm_linear.py); --bias-swiglu-fusion saves only the SwiGLU input
    fused_norm=True, fused_swiglu=True,
    # NeMo 2 / Megatron-Bridge recipes set sequence_parallel whenever tensor parallelism is on
    # (MegatronStrategy(sequence_parallel=True); TransformerConfig requires tp > 1 for it)
    sequence_parallel=True,
    # megatron/training/arguments.py: --no-overlap-p2p-communication (store_false) leaves
    # overlap_p2p_comm on, forced off for non-interleaved schedules; schedules.py then posts the
    # next chunk's isend/irecv before computing and waits after
    overlap_p2p_comm=True,
    # Transformer Engine's CPU offload (cpu_offloading_num_layers; NeMo activation_offload_layers) copies on its
    # own stream, double-buffered (transformer_engine/pytorch/cpu_offload.py; megatron/core/transformer/transformer_block.py)
    activation_offload_stream=True,
    # megatron/core/transformer/transformer_config.py (d98e8a64): cpu_offloading with pipeline parallelism,
    # with recompute_granularity set, or with cpu_offloading_num_layers >= num_layers raises ValueError
    layer_offload_limits=True,
    # TransformerConfig.account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split: the
    # embedding (loss) counts as one more layer of the split and the first (last) chunk builds one decoder
    # layer fewer, none at all allowed (megatron/core/transformer/transformer_block.py get_num_layers_to_build);
    # NeMo's DeepSeek-V3 SFT recipe runs 61 layers in 62 chunks so, the loss alone in the last
    # (scripts/performance/llm/finetune_deepseek_v3.py)
    ends_in_pipeline_split=True,
    lora_rank=32,  # NeMo nemo/collections/llm/peft/lora.py LoRA: dim 32, alpha 32, the four linears of a block
    # NeMo's DeepSeek recipes (recipes/deepseek_v2.py, deepseek_v2_lite.py, deepseek_v3.py) add DeepEPCallback
    # (nemo/lightning/pytorch/callbacks/deepep.py): on compute capability 8 or 9 it sets the flex dispatcher with
    # moe_enable_deepep and turns moe_shared_expert_overlap off; scripts/performance/llm/pretrain_deepseek_v3.py
    # does the same on H100 ("not supported for deepEP") and keeps alltoall elsewhere. No other MoE recipe
    # (Mixtral, Qwen3, Llama 4) touches the dispatcher: their configs' moe_token_dispatcher_type "alltoall"
    deepep_families=("ampere", "hopper"),
    # NeMo's only configs with a shared expert, DeepSeekConfig (gpt/model/deepseek.py) and Llama4Config
    # (gpt/model/llama.py), both set moe_shared_expert_overlap=True with the alltoall dispatcher
    shared_expert_overlap=("alltoall",),
    memory_options=("bf16-grad-reduce", "fp8-params", "fp8-activation-store", "recompute"),
    sources=("NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel_config.py",
             "NVIDIA/Megatron-LM megatron/training/arguments.py at f2e5db40 and d98e8a64 (bf16 forces fp32 gradient accumulation and reduction; --grad-reduce-in-bf16 since d165a8548b, 2025-02-26); NVIDIA/NeMo nemo/collections/llm/recipes/precision/mixed_precision.py (bf16_mixed_plugin grad_reduce_in_fp32=True), scripts/performance/llm (fp8: grad_reduce_in_fp32=False); NVIDIA/NeMo-Framework-Launcher examples/training/llama/h100/*.sh (grad_sync_dtype=bf16)",
             "NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel.py (bucket_size: max(40M, "
             "1M x dp) parameters), param_and_grad_buffer.py, megatron/core/optimizer/distrib_optimizer.py "
             "(param all-gather one bucket at a time in the forward pre-hooks), at f2e5db40 (2024-07-15)",
             "NVIDIA/Megatron-LM megatron/training/arguments.py (--fp8-recipe, --use-distributed-optimizer, "
             "--no-overlap-p2p-communication), megatron/core/pipeline_parallel/schedules.py",
             "NVIDIA/Megatron-LM megatron/core/fusions/fused_cross_entropy.py",
             "NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py, layernorm_linear.py",
             "NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/utils.py",
             "NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher, "
             "MoEFlexTokenDispatcher), shared_experts.py, moe_layer.py, fused_a2a.py, transformer_config.py "
             "(moe_shared_expert_overlap, moe_token_dispatcher_type, moe_enable_deepep), at d98e8a64",
             "NVIDIA/NeMo nemo/lightning/pytorch/callbacks/deepep.py, nemo/collections/llm/recipes/deepseek_v2.py, "
             "deepseek_v2_lite.py, deepseek_v3.py, gpt/model/deepseek.py, gpt/model/llama.py, "
             "scripts/performance/llm/pretrain_deepseek_v3.py, at 8cfedd72 (settings only)",
             "deepseek-ai/DeepEP docs/legacy.md (the V1 README's normal-kernel benchmark on H800: NVLink and RDMA "
             "bottleneck bandwidths), tests/legacy/test_internode.py (how they count bytes), at dd758caf"),
)
