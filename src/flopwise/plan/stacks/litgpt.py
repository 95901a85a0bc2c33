"""litgpt: Lightning Fabric's LoRA / QLoRA / full fine-tuning and pretraining recipes, SDPA attention, a
chunked output head and loss; fine-tunes in pure bf16 as its recipes set it."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="litgpt", title="litgpt (Lightning Fabric, FSDP, SDPA, chunked head and loss)", framework="fsdp",
    attention_kernel="fa2",  # litgpt/model.py CausalSelfAttention: F.scaled_dot_product_attention (flash backend)
    fp8_recipe="tensorwise",  # unused: fp8_training is off
    fp8_training=False,  # no fp8 recipe anywhere in litgpt/ (no Float8Linear, no Transformer Engine)
    fused_optimizer=True,  # pretrain.py: AdamW(fused=True) on CUDA (the fine-tunes' adapters are too few to matter)
    cross_entropy="eager",  # utils.py chunked_cross_entropy: F.cross_entropy per 128-token chunk, not compiled
    overlap_grad_reduce=True, overlap_param_gather=True,  # FSDP (pretrain.py, finetune/full.py), FSDP2 (lora.py)
    tp_comm_overlap=False,
    # pretraining's default precision is Lightning's bf16-mixed (utils.get_default_supported_precision): fp32
    # parameters under torch.autocast, fp32 gradients reduced in fp32
    grad_bytes=2.0, reduce_bytes=4.0,
    fp32_params=True,
    distributed_optimizer=True,  # FSDP shards the optimizer states with the parameters
    # FSDPStrategy's default FULL_SHARD (finetune/full.py), fully_shard (finetune/lora.py), HYBRID_SHARD (pretrain.py:
    # full sharding within a node)
    zero_stage=3,
    fp8_gemm_input_bytes=2.0,  # unused: fp8_training is off
    # finetune/lora.py fit(): `logits = model(input_ids, lm_head_chunk_size=128)` stays referenced through
    # fabric.backward, so every chunk's bf16 logits are kept; chunked_cross_entropy's F.cross_entropy saves its
    # log-softmax, fp32 under autocast (bf16-mixed: + the fp32 copy autocast makes of one chunk) ...
    loss_bytes_per_logit=8.0, loss_keeps_logits=True, loss_chunks=16,  # 16 chunks of 128 tokens at seq 2,048
    # ... and bf16 under bf16-true (no autocast: the log-softmax runs in the logits' dtype)
    bf16_true_loss_bytes_per_logit=2.0,
    allocator_reserve=0.10,  # litgpt sets no PYTORCH_CUDA_ALLOC_CONF: the caching allocator's usual slack
    # finetune/lora.py parallelize_fn(activation_checkpointing=True): checkpoint_wrapper on every block (non-
    # reentrant: torch's early stop) whenever devices x num_nodes > 1; one device runs no recompute
    distributed_lora_recompute="full",
    recompute_policies=("none", "full"),  # checkpoint_wrapper / activation_checkpointing_policy={Block}: all or none
    recompute_early_stop=True,
    # config_hub/finetune/*/{lora,qlora,full}.yaml: `precision: bf16-true` in every fine-tune recipe (its CLI
    # without --precision and its pretraining recipes use bf16-mixed)
    pure_bf16=("lora", "qlora"),
    # finetune/lora.py setup(): lora_r 8, lora_alpha 16, lora_dropout 0.05, lora_query and lora_value on
    lora_rank=8, lora_targets="q,v", lora_dropout=0.05,
    # finetune/lora.py: `quantize` with devices * num_nodes > 1 raises NotImplementedError
    qlora_max_devices=1,
    # finetune/lora.py ModelParallelStrategy(tensor_parallel_size=1); full.py and pretrain.py FSDPStrategy
    model_parallel=False,
    memory_options=("torch-compile", "recompute"),  # pretrain.py compiles the model; every recipe can checkpoint
    sources=("Lightning-AI/litgpt litgpt/finetune/lora.py, litgpt/finetune/full.py, litgpt/pretrain.py, "
             "litgpt/utils.py (chunked_cross_entropy, get_default_supported_precision, instantiate_bnb_optimizer), "
             "litgpt/model.py, config_hub/finetune/*.yaml at 26857050 (2026-06-29)",),
)
