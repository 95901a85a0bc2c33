"""Tensor parallelism (Megatron-style, Shoeybi et al. 2019) with DTensor, applied from outside.

The model knows nothing of it: `apply_tp` rewrites the built-in decoder's (and HF
llama-family models') linear layers into column/row-wise sharded DTensors over a 1-D
`tp` mesh, following torchtitan's `parallelize_llama.apply_tp`:

- attention: wq/wk/wv column-wise (each rank owns n_heads/tp query and n_kv_heads/tp
  key/value heads), wo row-wise; MLP: w1/w3 (or c_fc) column-wise, w2 (or c_proj) row-wise.
  One all-reduce per block half in the forward (Megatron's f/g operators).
- sequence parallelism (Korthikanti et al. 2022, §4.2.2), when asked: norms and dropout run
  on a 1/tp slice of the sequence, and each all-reduce becomes an all-gather before the
  column-wise layers plus a reduce-scatter after the row-wise ones (same bytes, 1/tp of
  the norm/dropout activations kept).
- embeddings row-wise (vocabulary-sharded), the output head column-wise with a replicated
  output, so the loss code is unchanged.

Gradients of replicated parameters (norms) are reduced across the tp mesh by DTensor
itself; no hand-written collective.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module,
)

from flopwise.errors import UserError

_ATTENTION = {"llama": ("wq", "wk", "wv", "wo"), "hf": ("q_proj", "k_proj", "v_proj", "o_proj")}
_MLP = {"llama": (("w1", "w3"), "w2"), "gpt2": (("c_fc",), "c_proj"), "hf": (("gate_proj", "up_proj"), "down_proj")}


def check_tp_shape(n_heads: int, n_kv_heads: int, ffn_hidden: int, vocab_size: int, tp: int) -> None:
    """Reject sizes that tensor parallelism of degree `tp` cannot split evenly, naming the key."""
    for what, value in (("model.n_heads", n_heads), ("model.n_kv_heads", n_kv_heads),
                        ("the MLP width (model.ffn_hidden)", ffn_hidden)):
        if value % tp:
            raise UserError(f"parallel.tp={tp} must divide {what}={value}")
    if vocab_size % tp:
        raise UserError(f"parallel.tp={tp} must divide the vocabulary size {vocab_size} (set data.vocab_size to a multiple)")


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = True) -> nn.Module:
    """Shard `model` (built-in Decoder or an HF llama-family model) over `tp_mesh`, in place."""
    if tp_mesh.size() == 1:
        return model
    if hasattr(model, "blocks"):
        _apply_tp_builtin(model, tp_mesh, sequence_parallel)
    elif hasattr(model, "hf"):
        _apply_tp_hf_llama(model.hf, tp_mesh, sequence_parallel)
    else:
        raise UserError(f"parallel.tp: no tensor-parallel plan for {type(model).__name__}")
    return model


def _block_plan(attn: tuple[str, ...], mlp_in: tuple[str, ...], mlp_out: str, sp: bool,
                attn_name: str, mlp_name: str, norms: tuple[str, str], attn_inputs: int) -> dict:
    seq, rep = Shard(1), Replicate()
    residual = seq if sp else rep
    extra = (None,) * (attn_inputs - 1)
    plan = {
        attn_name: PrepareModuleInput(input_layouts=(residual, *extra), desired_input_layouts=(rep, *extra)),
        f"{attn_name}.{attn[3]}": RowwiseParallel(output_layouts=residual),
        mlp_name: PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(rep,)),
        f"{mlp_name}.{mlp_out}": RowwiseParallel(output_layouts=residual),
    }
    for name in attn[:3]:
        plan[f"{attn_name}.{name}"] = ColwiseParallel()
    for name in mlp_in:
        plan[f"{mlp_name}.{name}"] = ColwiseParallel()
    if sp:
        plan[norms[0]] = SequenceParallel()
        plan[norms[1]] = SequenceParallel()
    return plan


def _apply_tp_builtin(model: nn.Module, mesh: DeviceMesh, sp: bool) -> None:
    """The built-in decoder: llama (RMSNorm, SwiGLU, RoPE) or gpt2 (LayerNorm, GELU, learned positions)."""
    cfg = model.cfg
    tp = mesh.size()
    from flopwise.config.model_shape import ffn_hidden_of, kv_heads_of

    check_tp_shape(cfg.n_heads, kv_heads_of(cfg), ffn_hidden_of(cfg), model.vocab_size, tp)
    if cfg.tie_embeddings:
        raise UserError("parallel.tp > 1 needs model.tie_embeddings=false (the embedding is sharded by rows, the head by columns)")
    seq, rep = Shard(1), Replicate()
    top = {
        # Vocabulary-sharded embedding; its output stays replicated, then block 0 takes its slice.
        "tok_emb": RowwiseParallel(input_layouts=rep, output_layouts=rep),
        "lm_head": ColwiseParallel(input_layouts=seq if sp else rep, output_layouts=rep),
    }
    if sp:
        top["final_norm"] = SequenceParallel()
        top["blocks.0"] = PrepareModuleInput(input_layouts=(rep, None), desired_input_layouts=(seq, None),
                                            use_local_output=True)
    parallelize_module(model, mesh, top)
    mlp_in, mlp_out = _MLP[cfg.kind]
    attn = _ATTENTION["llama"]  # the built-in attention uses wq/wk/wv/wo for both kinds
    for block in model.blocks:
        plan = _block_plan(attn, mlp_in, mlp_out, sp, "attn", "mlp", ("attn_norm", "mlp_norm"), attn_inputs=2)
        parallelize_module(block, mesh, plan)


def _apply_tp_hf_llama(hf: nn.Module, mesh: DeviceMesh, sp: bool) -> None:
    """HF llama-family models (LlamaForCausalLM, Qwen2, Mistral: q/k/v/o_proj, gate/up/down_proj)."""
    config = hf.config
    layers = getattr(getattr(hf, "model", None), "layers", None)
    if layers is None or not hasattr(layers[0], "self_attn") or not hasattr(layers[0].mlp, "gate_proj"):
        raise UserError(f"parallel.tp: {type(hf).__name__} is not a llama-family model (q/k/v/o_proj, gate/up/down_proj)")
    tp = mesh.size()
    check_tp_shape(config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads),
                   config.intermediate_size, config.vocab_size, tp)
    if getattr(config, "tie_word_embeddings", False):
        raise UserError("parallel.tp > 1 needs an HF model with tie_word_embeddings=false")
    if sp:
        raise UserError("parallel.sequence_parallel=true is supported on the built-in models only; set it to false for HF models")
    rep = Replicate()
    parallelize_module(hf, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=rep, output_layouts=rep),
        "lm_head": ColwiseParallel(input_layouts=rep, output_layouts=rep),
    })
    for layer in layers:
        plan = {f"self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
        plan["self_attn.o_proj"] = RowwiseParallel()
        plan.update({f"mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan["mlp.down_proj"] = RowwiseParallel()
        parallelize_module(layer, mesh, plan)
    # HF attention reshapes with config head counts; give each rank its local share.
    for layer in layers:
        attn = layer.self_attn
        for name in ("num_heads", "num_key_value_heads"):
            if hasattr(attn, name):
                setattr(attn, name, getattr(attn, name) // tp)
