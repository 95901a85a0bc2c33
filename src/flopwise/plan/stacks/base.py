"""The `Stack` record: what a training software stack decides that the planner must know.

A stack (the trainer and the kernels it calls) sets kernel rates (attention kernel
generation, fp8 recipe), what overlaps with what, and memory conventions (gradient
buffer dtype, distributed optimizer, bytes a saved fp8 activation takes, what the loss
keeps, allocator slack). Each stack module fills one record and cites, per value, the
source file of that stack or the kernel micro-benchmark it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")
"""fp8 scaling recipes: delayed (per-tensor amax history, TE `DelayedScaling`), tensorwise
(per-tensor, current scaling), rowwise (per-row scales, torchao `Float8LinearConfig.from_recipe_name
("rowwise")`), blockwise (1x128 scales for activations and gradients, 128x128 for weights, TE
`Float8BlockScaling`, DeepSeek-V3's fine-grained recipe), mxfp8 (32-element blocks with an 8-bit
exponent scale, Blackwell)."""
FP8_RECIPE_ALIASES = {
    "current": "tensorwise", "hybrid": "delayed", "tensor": "tensorwise", "row": "rowwise",
    # NVIDIA NeMo's performance scripts (scripts/performance/argument_parser.py --fp8_recipe): ds, cs, ss
    "ds": "delayed", "cs": "tensorwise", "ss": "blockwise", "subchannel": "blockwise", "block": "blockwise",
    "pertensordelayed": "delayed", "pertensorcurrent": "tensorwise", "pertensor": "tensorwise",
    # Transformer Engine's recipe classes (transformer_engine/common/recipe/__init__.py)
    "float8current": "tensorwise", "float8block": "blockwise",
    "mxfp8block": "mxfp8", "mx": "mxfp8",
}
"""Names the stacks use for the same recipes: Transformer Engine's `Float8CurrentScaling` (NeMo
`fp8_recipe: current`, its scripts' `cs`) scales per tensor from the current amax, as tensorwise does;
NeMo's `fp8: hybrid` is the e4m3-forward / e5m2-backward format of its default delayed scaling
(`ds`); its scripts' `ss` (sub-channel) is TE's `Float8BlockScaling`. Names are compared lower-case
without spaces, `-`, `_` or the word "scaling"."""

def spelled_fp8_recipe(text: str) -> str:
    """A recipe as a source prints it ("Row-wise", "current scaling", "MXFP8", "cs",
    "Float8BlockScaling") as its canonical name; a name that is none raises one line naming them."""
    from flopwise.errors import UserError

    word = "".join(text.lower().replace("scaling", " ").replace("_", " ").replace("-", " ").split())
    word = FP8_RECIPE_ALIASES.get(word, word)
    if word not in FP8_RECIPES:
        raise UserError(f"--fp8-recipe {word!r} is not one of: {', '.join(FP8_RECIPES)} (or current, "
                        "hybrid, row; NeMo's ds, cs, ss; Transformer Engine's Float8CurrentScaling ...)")
    return word


ATTENTION_KERNELS = ("fa2", "fa3", "cudnn")
CROSS_ENTROPY_KERNELS = ("single-pass", "compiled", "megatron-fused", "megatron", "eager")
"""How a stack runs the loss over the logits (plan/ops.py `CROSS_ENTROPY_BYTES_PER_LOGIT` counts
each one's memory traffic from its code)."""


@dataclass(frozen=True)
class Stack:
    """One stack's decisions. `framework` is the memory-convention family the planner's
    formulas know (fsdp / megatron / deepspeed); the other fields refine it.

    Memory fields are per parameter or per element: `grad_bytes` the gradient buffer's
    dtype (4: fp32 `main_grad`, 2: the parameters' bf16), `fp8_gemm_input_bytes` what a
    saved GEMM input takes under fp8 (1 when the fp8 copy is saved, 2 when the bf16 input
    is), `loss_bytes_per_logit` the loss's peak per logit beyond the bf16 matmul output,
    `allocator_reserve` the caching allocator's slack over the allocated peak.
    """

    name: str
    title: str
    framework: str
    attention_kernel: str
    fp8_recipe: str
    fused_optimizer: bool
    cross_entropy: str  # one of CROSS_ENTROPY_KERNELS
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    grad_bytes: float
    reduce_bytes: float
    distributed_optimizer: bool
    fp8_gemm_input_bytes: float
    loss_bytes_per_logit: float
    allocator_reserve: float
    fused_norm: bool = False  # the norm saves only its input (TE LayerNormLinear / fused RMSNorm), not its output
    fused_swiglu: bool = False  # SwiGLU saves only its input (Megatron-Core fused_bias_swiglu.py)
    bf16_optimizer_full_fp32_master: bool = False  # the 2022 BF16_Optimizer: a whole fp32 master on every rank
    bf16_optimizer_fp32_grads: bool = False  # DeepSpeed BF16_Optimizer: a full fp32 gradient buffer at ZeRO <= 1
    activations_sharded_over_tp: bool = False  # every saved activation split over the model axis (GSPMD)
    zero3_gathers_modules: bool = False  # ZeRO-3 fetches one module at a time (DeepSpeed), not a block (FSDP)
    sequence_parallel: bool = False  # its recipes run sequence parallelism whenever tp > 1
    overlap_p2p_comm: bool = False  # interleaved pipeline sends/receives posted ahead and overlapped with compute
    # offloaded activations copied on a stream of their own beside the compute (Transformer Engine's CPU
    # offload), not on the compute stream (torch's save_on_cpu / offload_wrapper); plan/activation_offload.py
    activation_offload_stream: bool = False
    # its layer-level CPU offload refuses pipeline parallelism, any recompute and offloading every layer
    # (Megatron-Core transformer_config.py: cpu_offloading checks); plan/activation_offload.check
    layer_offload_limits: bool = False
    # the loss, then the embedding, may take a decoder layer's place in the pipeline split when the layers
    # are one or two fewer than the chunks (Megatron's --account-for-{loss,embedding}-in-pipeline-split)
    ends_in_pipeline_split: bool = False
    compiles_loss: bool = False  # `--compile` compiles the loss as well (torchtitan's build_cross_entropy_loss)
    # what the stack's users mean by "selective" recompute: Megatron's attention core (Korthikanti et al.
    # 2022), or another policy the stack names so (torchtitan: per-op, "op")
    selective_recompute: str = "selective"
    lora_rank: int = 16  # the adapter rank its LoRA recipes default to (PEFT / torchtune / litgpt / flopwise: 8-16)
    # MoE token dispatch (plan/expert_comm.py): the device families (`gemm.DeviceCurve.family`) on which its
    # recipes dispatch a DeepSeek-family MoE with DeepEP rather than all-to-all, and the dispatchers with
    # which its recipes run the shared expert beside the dispatch and combine (moe_shared_expert_overlap)
    deepep_families: tuple[str, ...] = ()
    shared_expert_overlap: tuple[str, ...] = ()
    # bytes per gradient element an fp8 run's data-parallel reduction moves, when the stack's fp8 recipes
    # reduce in another dtype than its bf16 runs (None: `reduce_bytes`); conventions.gradient_reduce_bytes
    fp8_reduce_bytes: float | None = None
    # its 16-bit training is AMP with fp32 parameters (torch.autocast): memory.autocast_copy_bytes
    fp32_params: bool = False
    # bytes of each norm's saved input when the stack keeps the residual stream in another dtype than its
    # activations (None: the activations'); its models train with dropout unless a run says otherwise
    norm_input_bytes: float | None = None
    dropout: bool = False
    # its block recompute is PyTorch's non-reentrant checkpoint with early stop: the backward's recompute
    # stops once the tensors the block's backward needs are rebuilt, so a dense block's down projection and
    # last residual add are not run again (torch/utils/checkpoint.py `_enable_checkpoint_early_stop`)
    recompute_early_stop: bool = False
    # its loss runs over this many chunks of the tokens (torchtune's LinearCrossEntropyLoss): only one chunk's
    # logits and fp32 copy exist at a time, every chunk's fp32 log-softmax stays for the backward
    loss_chunks: int = 1
    # the --finetune modes (full, lora, qlora) its recipes train in pure bf16, no fp32 master copy
    # (torchtune's `dtype: bf16`, litgpt's fine-tune recipes' `precision: bf16-true`): for those, an unstated
    # or plain "bf16" --precision plans as bf16-true (a mixed name, "bf16-mixed", stays AMP)
    pure_bf16: tuple[str, ...] = ()
    # the loss's bytes per logit beyond the matmul output under pure bf16, when it computes in the compute
    # dtype there rather than in fp32 (litgpt: F.cross_entropy on bf16 logits keeps a bf16 log-softmax);
    # None: the framework's convention
    bf16_true_loss_bytes_per_logit: float | None = None
    # the training step holds the logits themselves until the backward ends (litgpt's fit keeps the list of
    # lm_head chunks it passes to the loss), so they are kept, not a transient
    loss_keeps_logits: bool = False
    lora_targets: str = "all-linear"  # the matrices its LoRA recipes adapt (finetune.named_targets)
    lora_dropout: float = 0.0  # its LoRA recipes' adapter dropout (litgpt: 0.05)
    # the recompute its LoRA recipes run on more than one device (litgpt's parallelize_fn wraps every block
    # in checkpoint_wrapper), None: the planner's own choice
    distributed_lora_recompute: str | None = None
    # the ZeRO stage its recipes shard with whenever there is more than one data-parallel rank (litgpt: FSDP's
    # full sharding, 3), None: the fastest stage that fits, or the distributed optimizer's (Megatron)
    zero_stage: int | None = None
    # the recompute policies its recipes offer, None: every one the planner knows (litgpt: none or every block)
    recompute_policies: tuple[str, ...] | None = None
    model_parallel: bool = True  # it runs tensor / pipeline parallelism (litgpt's recipes: data parallelism only)
    qlora_max_devices: int = 0  # the most devices it runs a QLoRA on (litgpt: 1); 0, no limit
    fp8_training: bool = True  # it trains with fp8 GEMMs (litgpt has no fp8 recipe)
    memory_options: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
