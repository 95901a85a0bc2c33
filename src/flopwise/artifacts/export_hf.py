"""Usable models out: a HuggingFace folder for every model kind, with its tokenizer.

`write_hf_folder` turns the model `flopwise export` rebuilt from a checkpoint into a folder
that `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` read:

- `model.kind=hf`: the model's own class and config (`save_pretrained`);
- built-in llama -> `LlamaForCausalLM`. The built-in rotary embedding rotates adjacent pairs
  (Meta's LLaMA layout); transformers rotates the two halves of each head, so the query and
  key rows are permuted as transformers' `convert_llama_weights_to_hf.py` does (`permute`);
- built-in gpt2 -> `GPT2LMHeadModel` (fused `c_attn`, Conv1D weights stored transposed).

Next to the weights: tokenizer.json + tokenizer_config.json (the pretrained model's own
tokenizer files when the run used them), and a generation config whose end-of-text id is
the run's document separator. Files get ordinary permissions (0644).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import nn

from flopwise.errors import UserError

FILE_MODE = 0o644


def write_hf_folder(model: nn.Module, cfg, tokenizer_path: Path | None, folder: Path) -> Path:
    """Write `model` (built by `build_model(cfg.model, ...)`) and its tokenizer as an HF folder."""
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    tokenizer = hf_tokenizer(cfg, tokenizer_path)
    hf_model = to_transformers(model, cfg)
    if tokenizer is not None:
        _set_special_ids(hf_model, tokenizer)
    hf_model.save_pretrained(str(folder), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    for path in folder.rglob("*"):
        if path.is_file():
            os.chmod(path, FILE_MODE)
    return folder


def to_transformers(model: nn.Module, cfg) -> nn.Module:
    """The transformers model holding `model`'s weights (the model itself for kind=hf)."""
    if cfg.model.kind == "hf":
        return model.hf
    if cfg.model.kind == "llama":
        return llama_to_transformers(model)
    if cfg.model.kind == "gpt2":
        return gpt2_to_transformers(model)
    raise UserError(f"model.kind: {cfg.model.kind} has no HuggingFace export")


def permute_for_rotate_half(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q/k projection rows from adjacent-pair rotary to transformers' half-split rotary.

    Same as `permute` in transformers' models/llama/convert_llama_weights_to_hf.py.
    """
    out_features, in_features = weight.shape
    head_dim = out_features // n_heads
    return weight.view(n_heads, head_dim // 2, 2, in_features).transpose(1, 2).reshape(out_features, in_features)


def llama_to_transformers(model: nn.Module) -> nn.Module:
    """`LlamaForCausalLM` with the built-in llama decoder's weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopwise.config.model_shape import ffn_hidden_of, kv_heads_of

    mc = model.cfg
    n_kv = kv_heads_of(mc)
    config = LlamaConfig(
        vocab_size=model.vocab_size, hidden_size=mc.hidden, intermediate_size=ffn_hidden_of(mc),
        num_hidden_layers=mc.n_layers, num_attention_heads=mc.n_heads, num_key_value_heads=n_kv,
        max_position_embeddings=mc.max_seq_len, rms_norm_eps=mc.norm_eps, tie_word_embeddings=mc.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": mc.rope_theta}, attention_bias=False, mlp_bias=False,
        hidden_act="silu", attention_dropout=0.0, torch_dtype="float32",
    )
    src = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    state = {"model.embed_tokens.weight": src["tok_emb.weight"], "model.norm.weight": src["final_norm.weight"],
             "lm_head.weight": src["lm_head.weight"]}
    for i in range(mc.n_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        state[h + "input_layernorm.weight"] = src[b + "attn_norm.weight"]
        state[h + "post_attention_layernorm.weight"] = src[b + "mlp_norm.weight"]
        state[h + "self_attn.q_proj.weight"] = permute_for_rotate_half(src[b + "attn.wq.weight"], mc.n_heads)
        state[h + "self_attn.k_proj.weight"] = permute_for_rotate_half(src[b + "attn.wk.weight"], n_kv)
        state[h + "self_attn.v_proj.weight"] = src[b + "attn.wv.weight"]
        state[h + "self_attn.o_proj.weight"] = src[b + "attn.wo.weight"]
        state[h + "mlp.gate_proj.weight"] = src[b + "mlp.w1.weight"]
        state[h + "mlp.up_proj.weight"] = src[b + "mlp.w3.weight"]
        state[h + "mlp.down_proj.weight"] = src[b + "mlp.w2.weight"]
    return _filled(LlamaForCausalLM, config, state)


def gpt2_to_transformers(model: nn.Module) -> nn.Module:
    """`GPT2LMHeadModel` with the built-in gpt2 decoder's weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from flopwise.config.model_shape import ffn_hidden_of, kv_heads_of

    mc = model.cfg
    if kv_heads_of(mc) != mc.n_heads:
        raise UserError(f"model.n_kv_heads={mc.n_kv_heads}: GPT-2 has no grouped-query attention, "
                        "so this gpt2 model has no GPT2LMHeadModel export")
    config = GPT2Config(
        vocab_size=model.vocab_size, n_positions=mc.max_seq_len, n_embd=mc.hidden, n_layer=mc.n_layers,
        n_head=mc.n_heads, n_inner=ffn_hidden_of(mc), activation_function="gelu_new",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=mc.norm_eps,
        tie_word_embeddings=mc.tie_embeddings, torch_dtype="float32",
    )
    src = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    state = {"transformer.wte.weight": src["tok_emb.weight"], "transformer.wpe.weight": src["pos_emb.weight"],
             "transformer.ln_f.weight": src["final_norm.weight"], "transformer.ln_f.bias": src["final_norm.bias"],
             "lm_head.weight": src["lm_head.weight"]}
    for i in range(mc.n_layers):
        b, h = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            state[h + theirs + ".weight"] = src[b + ours + ".weight"]
            state[h + theirs + ".bias"] = src[b + ours + ".bias"]
        # Conv1D keeps weights as [in, out]: the transpose of nn.Linear's [out, in].
        qkv = [src[b + f"attn.{name}.weight"] for name in ("wq", "wk", "wv")]
        state[h + "attn.c_attn.weight"] = torch.cat(qkv, dim=0).t().contiguous()
        state[h + "attn.c_attn.bias"] = torch.cat([src[b + f"attn.{n}.bias"] for n in ("wq", "wk", "wv")])
        state[h + "attn.c_proj.weight"] = src[b + "attn.wo.weight"].t().contiguous()
        state[h + "attn.c_proj.bias"] = src[b + "attn.wo.bias"]
        state[h + "mlp.c_fc.weight"] = src[b + "mlp.c_fc.weight"].t().contiguous()
        state[h + "mlp.c_fc.bias"] = src[b + "mlp.c_fc.bias"]
        state[h + "mlp.c_proj.weight"] = src[b + "mlp.c_proj.weight"].t().contiguous()
        state[h + "mlp.c_proj.bias"] = src[b + "mlp.c_proj.bias"]
    return _filled(GPT2LMHeadModel, config, state)


def _filled(cls, config, state: dict) -> nn.Module:
    """An instance of `cls` holding exactly `state` (every weight accounted for)."""
    hf_model = cls(config).float().eval()
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"export to {cls.__name__}: weights do not map (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model


def hf_tokenizer(cfg, tokenizer_path: Path | None):
    """The run's tokenizer as a transformers tokenizer: the pretrained folder's own when the run
    used it, else the run's tokenizer.json with its end-of-text token as eos/bos/pad."""
    if tokenizer_path is None or not Path(tokenizer_path).is_file():
        return None
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from flopwise.train.data.tokenizer import end_of_text_id, load_tokenizer

    pretrained = cfg.model.pretrained
    used = cfg.data.tokenizer
    own = pretrained is not None and used is not None and (
        _same_path(used, pretrained) or (_same_path(used, Path(pretrained) / "tokenizer.json") and Path(used).is_file()))
    if own:
        # the run used the model's own tokenizer: keep its config (special tokens, chat template)
        return AutoTokenizer.from_pretrained(str(pretrained), local_files_only=True,
                                             trust_remote_code=cfg.model.trust_remote_code)  # the command line's
    raw = load_tokenizer(Path(tokenizer_path))
    eot = raw.id_to_token(end_of_text_id(raw, str(tokenizer_path)))
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eot, bos_token=eot, pad_token=eot)


def _same_path(a: Path, b: Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _set_special_ids(hf_model: nn.Module, tokenizer) -> None:
    """Make `generate` stop at the run's end-of-text token and pad with it."""
    eos = tokenizer.eos_token_id
    if eos is None:
        return
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    for config in (hf_model.config, getattr(hf_model, "generation_config", None)):
        if config is None:
            continue
        config.eos_token_id = eos
        config.pad_token_id = pad
        if tokenizer.bos_token_id is not None:
            config.bos_token_id = tokenizer.bos_token_id
