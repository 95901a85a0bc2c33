"""JAX with GSPMD sharding on TPU (T5X / Pathways, as PaLM was trained): fully sharded data
parallelism over one mesh axis, model parallelism over the other, activations sharded too."""

from flopwise.plan.stacks.base import Stack

STACK = Stack(
    name="jax", title="JAX / GSPMD (T5X, Pathways; PaLM on TPU v4)", framework="fsdp",
    attention_kernel="fa2",  # XLA's fused attention: planned with the family curve (no Hopper kernel choice)
    fp8_recipe="tensorwise",
    fused_optimizer=True,  # optax updates are fused by XLA into a few kernels per parameter shard
    cross_entropy="compiled",  # XLA fuses the softmax cross-entropy like any jitted graph
    overlap_grad_reduce=True, overlap_param_gather=True,  # XLA's async collectives (latency-hiding scheduler)
    tp_comm_overlap=False,
    grad_bytes=2.0, reduce_bytes=4.0,
    distributed_optimizer=True,
    fp8_gemm_input_bytes=2.0,
    loss_bytes_per_logit=8.0,
    allocator_reserve=0.0,  # XLA plans buffers ahead of time: no caching allocator on top of the peak
    # "2D finalized" sharding: activations split over the model axis as well as the batch (Xu et al. 2021,
    # GSPMD, sec. 3.3 and Fig. 7; PaLM, Chowdhery et al. 2022, sec. 4: 12-way model x 256-way data)
    activations_sharded_over_tp=True,
    memory_options=("recompute",),
    sources=("Xu et al. 2021, 'GSPMD' (arXiv 2105.04663), 2D sharding of activations and weights",
             "Chowdhery et al. 2022, 'PaLM' (arXiv 2204.02311) sec. 4",
             "google/jax XLA buffer assignment (no caching allocator)"),
)
