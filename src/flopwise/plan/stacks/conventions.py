"""A stack's memory conventions as the planner's memory formulas take them, with or without
the stack's own memory options.

Memory options are switches the stack offers that change memory and not the step's work,
tried in the stack's order when the layout does not fit at its defaults, so a layout that a
published run used is judged "fits with <option>" rather than discarded:
- `bf16-grad-reduce`: Megatron-Core `DistributedDataParallelConfig.grad_reduce_in_fp32=False`,
  the `main_grad` buffer in the parameters' bf16 (2 bytes/param instead of 4).
- `fp8-params`: Transformer Engine `fp8_model_init` (Megatron `--fp8-param-gather`): weights
  kept as fp8 (1 byte) with their fp8 transpose (1 byte) instead of bf16 weights (2) plus a
  cached fp8 copy and transpose (2).
- `fp8-activation-store`: Megatron-Core `--activation-func-fp8-input-store`, the fused
  SwiGLU's input saved in fp8 (`fusions/fused_bias_swiglu.py`).
- `torch-compile`: the blocks under `torch.compile` (torchtitan `compile.enable`, on in its
  405B config; flopwise `training.compile`). Inductor's min-cut partitioner saves an RMSNorm's
  input and rstd, not its normalised output, and SwiGLU's two projections and product, not the
  SiLU output: the fused-kernel conventions (`fused_norm`, `fused_swiglu`), as
  tests/plan/test_memory.py measures on the partitioned graph. It also fuses the pointwise
  kernels, which the time model does not credit (a conservative time).
`recompute` changes the step's work as well: `planner.plan` tries it as a layout change,
timed with its recompute, after these.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.plan.stacks.base import Stack

MEMORY_ONLY_OPTIONS = ("bf16-grad-reduce", "fp8-params", "fp8-activation-store", "torch-compile")


@dataclass(frozen=True)
class MemoryConventions:
    """Bytes the memory formulas use, for one stack, precision and set of options. None:
    the framework's own convention (plan/memory.py)."""

    grad_bytes: float | None
    weight_bytes: float | None
    fp8_cache_bytes_per_param: float | None
    gemm_input_bytes: float | None
    loss_bytes_per_logit: float | None
    options: tuple[str, ...] = ()
    fused_norm: bool = False
    fused_swiglu: bool = False
    act_input_bytes: float | None = None
    zero3_gathers_modules: bool = False
    grad_partition_bytes: float | None = None
    activations_sharded_over_tp: bool = False
    master_unsharded: bool = False
    fp32_params: bool = False  # AMP: fp32 parameters under torch.autocast (Stack.fp32_params)
    norm_input_bytes: float | None = None  # a residual stream kept in another dtype (Stack.norm_input_bytes)
    loss_chunks: int = 1  # the loss runs chunk by chunk (Stack.loss_chunks): its transient is one chunk's
    loss_keeps_logits: bool = False  # the step holds the logits through the backward (Stack.loss_keeps_logits)
    pure_states: bool = False  # fp8 GEMMs over pure-bf16 parameters: no fp32 master, bf16 optimizer states


FRAMEWORK_DEFAULTS = MemoryConventions(None, None, None, None, None)
"""The flopwise stack: the framework conventions plan/memory.py states, unchanged."""


STATED_REDUCE_BYTES = {"bf16": 2.0, "fp32": 4.0}
"""`--grad-reduce` as the bytes per gradient element it moves."""


def gradient_reduce_bytes(stack: Stack, precision: str, options: tuple[str, ...] = (),
                          stated: str | None = None) -> float:
    """Bytes per gradient element the data-parallel reduction moves (reduce-scatter or all-reduce),
    as the stack runs it at `precision` with memory `options`, or as the run `stated` it (`--grad-reduce`
    bf16 / fp32); the time model sends this many and Megatron's gradient buffer holds it.

    - a stated dtype, at any 16-bit or fp8 precision (fp32 and bf16-true runs have one dtype);
    - fp32 / tf32 runs reduce fp32 gradients, `bf16-true` bf16 ones;
    - `bf16-grad-reduce` (Megatron `--grad-reduce-in-bf16`, NeMo `grad_reduce_in_fp32=False`): bf16;
    - Megatron (either stack) at fp16: the gradient buffer and its reduction stay 16-bit, since
      Megatron-LM forces fp32 accumulation and reduction for bf16 only (megatron/training/arguments.py,
      `if args.bf16: ... accumulate_allreduce_grads_in_fp32 = True`);
    - fp8 runs of a stack whose fp8 recipes reduce in another dtype (`Stack.fp8_reduce_bytes`);
    - otherwise the stack's `reduce_bytes` (FSDP2's `MixedPrecisionPolicy.reduce_dtype`, DDP's
      gradient dtype, Megatron's `grad_reduce_in_fp32`)."""
    if stated is not None and precision not in ("fp32", "tf32", "bf16-true"):
        return STATED_REDUCE_BYTES[stated]
    if precision in ("fp32", "tf32") or (stack.fp32_params and precision in ("bf16", "fp16")):
        return 4.0
    if precision == "bf16-true" or "bf16-grad-reduce" in options:
        return 2.0
    if precision == "fp16" and stack.framework == "megatron":
        return 2.0
    if precision == "fp8" and stack.fp8_reduce_bytes is not None:
        return stack.fp8_reduce_bytes
    return stack.reduce_bytes


def conventions(stack: Stack, precision: str, options: tuple[str, ...] = (), zero_stage: int = 0,
                grad_reduce: str | None = None) -> MemoryConventions:
    """The stack's memory conventions at `precision` and ZeRO stage, with `options` applied and
    the gradient reduction in `grad_reduce` (bf16 / fp32) when the run states it."""
    sixteen = precision not in ("fp32", "tf32", "bf16-true")
    grad = None
    if sixteen and stack.framework == "megatron":
        # Megatron's gradient buffer (`main_grad`) is kept in the dtype it is reduced in
        # (param_and_grad_buffer.py: grad_dtype = fp32 if grad_reduce_in_fp32 else the params')
        grad = gradient_reduce_bytes(stack, precision, options, grad_reduce)
    if precision == "bf16" and stack.bf16_optimizer_fp32_grads and zero_stage <= 1:
        grad = 2.0 + 4.0  # the bf16 .grad of the backward and the fp32 accumulation buffer
    fp8 = precision == "fp8"
    fp8_params = fp8 and "fp8-params" in options
    return MemoryConventions(
        grad_bytes=grad,
        grad_partition_bytes=0.0 if (precision == "bf16" and stack.bf16_optimizer_fp32_grads and zero_stage <= 1)
        else None,
        weight_bytes=1.0 if fp8_params else None,
        fp8_cache_bytes_per_param=1.0 if fp8_params else None,
        gemm_input_bytes=stack.fp8_gemm_input_bytes if fp8 else None,
        loss_bytes_per_logit=stack.loss_bytes_per_logit if sixteen else (
            stack.bf16_true_loss_bytes_per_logit if precision == "bf16-true" else None),
        options=options,
        fused_norm=stack.fused_norm or "torch-compile" in options,
        fused_swiglu=stack.fused_swiglu or "torch-compile" in options,
        act_input_bytes=1.0 if (stack.fused_swiglu and "fp8-activation-store" in options) else None,
        zero3_gathers_modules=stack.zero3_gathers_modules,
        activations_sharded_over_tp=stack.activations_sharded_over_tp,
        master_unsharded=(precision == "bf16" and stack.bf16_optimizer_full_fp32_master and zero_stage <= 1),
        fp32_params=stack.fp32_params and precision in ("bf16", "fp16"),
        norm_input_bytes=stack.norm_input_bytes,
        loss_chunks=stack.loss_chunks,
        loss_keeps_logits=stack.loss_keeps_logits,
        # torchtune's fp8 (training/quantization.py, Float8Linear) swaps the linears of a model whose parameters
        # are bf16 (`dtype: bf16`): the states stay pure bf16
        pure_states=fp8 and "full" in stack.pure_bf16,
    )


def option_ladder(stack: Stack, precision: str) -> tuple[tuple[str, ...], ...]:
    """The option sets to try, in order, when the defaults do not fit: each adds the next of
    the stack's memory-only options that applies at this precision."""
    usable = [o for o in stack.memory_options if o in MEMORY_ONLY_OPTIONS
              and (o != "fp8-params" or precision == "fp8")
              and (o != "fp8-activation-store" or stack.fused_swiglu)
              and (o != "torch-compile" or not (stack.fused_norm and stack.fused_swiglu))
              and (o != "bf16-grad-reduce" or (stack.framework == "megatron"
                                               and gradient_reduce_bytes(stack, precision) > 2))]
    return tuple(tuple(usable[: i + 1]) for i in range(len(usable)))
