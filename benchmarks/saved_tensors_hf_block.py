"""Benchmark: bytes an HF llama keeps for backward, per block and at the ends, under full
training, LoRA and QLoRA (fp32 and bf16, with and without gradient checkpointing).

Why: the planner's LoRA/QLoRA activations (`plan/finetune.py` `activation_delta_bytes`,
`plan/stage_memory.py`) are a delta on full training's; this is the measurement they must match.
Every tensor autograd saves is seen through `torch.autograd.graph.saved_tensors_hooks`, counted
once per storage (parameters, buffers and the NF4 weight's inner tensors excluded) and charged to
the module running when it was first saved: `block` (one transformer block), `embedding`, `head`
(final norm, LM head and the loss). `by_op` names the autograd nodes that saved each block's
bytes. With gradient checkpointing the block's own saves are recomputed in backward; the
figure then is what stays between layers (checkpoint's hooks hide the rest), and
`rebuilt_block_bytes` is what one block saves when its forward runs again (its backward's peak).

Usage: OMP_NUM_THREADS=1 python benchmarks/saved_tensors_hf_block.py [--out PATH] [--tokens 4 32]
Writes JSON (default benchmarks/results/saved_tensors_hf_block.json).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

MODES = ("full", "lora", "qlora")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def tiny_llama(vocab: int = 512):
    """The llama of `tests/hf_fixtures.py` (2 blocks, hidden 64, GQA 4/2, SwiGLU 128), eager fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def prepared(mode: str, dtype: torch.dtype, rank: int, checkpointing: bool):
    """The model as `flopwise train` builds it for `mode`: full training in `dtype`, or PEFT adapters
    (fp32 under mixed precision) on a frozen base in `dtype`, the block linears in NF4 for QLoRA."""
    from flopwise.config.schema import FinetuneConfig
    from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing
    from flopwise.train.techniques.lora import apply_lora

    model = tiny_llama()
    if mode == "full":
        model.to(dtype)
    else:
        apply_lora(model, FinetuneConfig(method=mode, rank=rank), torch.device("cpu"), dtype, torch.float32)
    if checkpointing:
        apply_activation_checkpointing(model, True)
    return model


class Counter:
    """Saved storages by owner (the module running at the first save) and by autograd node."""

    def __init__(self, model: nn.Module):
        from flopwise.train.metrics import _params_and_buffers

        self.excluded = {t.untyped_storage().data_ptr() for t in _params_and_buffers(model)}
        self.owner = "embedding"
        self.seen: dict[int, tuple[str, int]] = {}
        self.by_op: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def pack(self, tensor: torch.Tensor):
        from flopwise.train.metrics import plain_parts

        base = tensor._base if tensor._base is not None else tensor
        if base.is_leaf and base.requires_grad:  # a trainable parameter
            return tensor
        node = torch._C._current_autograd_node()
        op = type(node).__name__ if node is not None else "?"
        for part in plain_parts(tensor):
            storage = part.untyped_storage()
            key = storage.data_ptr()
            if key in self.excluded or key in self.seen or not storage.nbytes():
                continue
            self.seen[key] = (self.owner, storage.nbytes())
            self.by_op[self.owner][f"{op} {tuple(part.shape)} {str(part.dtype)[6:]}"] += storage.nbytes()
        return tensor

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for owner, nbytes in self.seen.values():
            out[owner] += nbytes
        return dict(out)


def measure(mode: str, dtype_name: str, rank: int, checkpointing: bool, batch: int, seq: int) -> dict:
    """Saved bytes per owner for one forward (and, with checkpointing, one block's recompute)."""
    dtype = DTYPES[dtype_name]
    model = prepared(mode, dtype, rank, checkpointing)
    counter = Counter(model)
    blocks = list(model.model.layers)
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda *_, i=i: setattr(counter, "owner", f"block{i}"))
    model.model.norm.register_forward_pre_hook(lambda *_: setattr(counter, "owner", "head"))
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t), autocast:
        logits = model(input_ids=ids).logits
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    totals = counter.totals()
    out = {"embedding": totals.get("embedding", 0), "first_block": totals.get("block0", 0),
           "block": totals.get("block1", 0),
           "head": totals.get("head", 0), "by_op": {k: dict(v) for k, v in counter.by_op.items()}}
    if checkpointing:  # what one block saves when backward runs its forward again
        rebuilt = Counter(model)
        rebuilt.owner = "block1"
        with torch.autograd.graph.saved_tensors_hooks(rebuilt.pack, lambda t: t), autocast:
            # not a leaf: a block's input is another block's output (leaves that need grad count as weights here)
            hidden = torch.randn(batch, seq, model.config.hidden_size, requires_grad=True).to(dtype) * 1.0
            position_ids = torch.arange(seq).unsqueeze(0)
            rotary = model.model.rotary_emb(hidden, position_ids)
            type(blocks[1]).forward(blocks[1], hidden, position_embeddings=rotary, position_ids=position_ids)
        out["rebuilt_block_bytes"] = rebuilt.totals().get("block1", 0)
    loss.backward()
    return out


def planned(mode: str, dtype_name: str, rank: int, checkpointing: bool, batch: int, seq: int) -> dict:
    """The planner's bytes for the same model and run: blocks (+ token ids, + the recomputed block),
    and what the head's end keeps for backward (the logits less the loss's transient peak)."""
    from flopwise.catalog.models import ModelSpec
    from flopwise.measure.device_peak import cpu_hardware
    from flopwise.plan import memory as mem
    from flopwise.plan import stage_memory
    from flopwise.plan.params import count_params
    from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

    model = ModelSpec(key="tiny-llama", name="tiny llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                      ffn_hidden=128, vocab_size=512, seq_len=seq, mlp="swiglu", norm="rmsnorm", position="rope")
    spec = RunSpec(model=model, layout=Layout(micro_batch_size=batch, recompute="full" if checkpointing else "none",
                                              flash_attention=True),
                   workload=Workload(precision=dtype_name, seq_len=seq, total_tokens=1e6, finetune=mode, lora_rank=rank),
                   cluster=Cluster(hardware=cpu_hardware({"fp32": 1e11, "bf16": 1e11}, 1, "nominal"),
                                   allocator_reserve=0.0))
    memory = stage_memory.estimate_memory(spec, count_params(model), [])
    e = mem.activation_dtype_bytes(dtype_name)
    transient = 0.0
    if mode == "full":  # full training counts the loss's transient in `logits`; a fine-tune in `other`
        transient = (mem.loss_logits_bytes_per_element("fsdp", e) - 4.0) * batch * seq * model.vocab_size
    return {"blocks_and_embedding": memory.activations, "head": memory.logits - transient,
            "per_layer": memory.activation_bytes_per_layer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "saved_tensors_hf_block.json")
    parser.add_argument("--tokens", nargs=2, type=int, default=(4, 32), metavar=("BATCH", "SEQ"))
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    batch, seq = args.tokens
    results = {"model": "llama, hidden 64, 4 heads (2 kv), SwiGLU 128, vocab 512", "batch": batch, "seq_len": seq,
               "lora_rank": args.rank, "torch": torch.__version__, "runs": {}}
    for dtype_name in DTYPES:
        for checkpointing in (False, True):
            for mode in MODES:
                name = f"{mode} {dtype_name}" + (" checkpointed" if checkpointing else "")
                results["runs"][name] = run = measure(mode, dtype_name, args.rank, checkpointing, batch, seq)
                plan = planned(mode, dtype_name, args.rank, checkpointing, batch, seq)
                # the peak of saved bytes: everything a forward saves; with checkpointing the layer inputs and
                # the larger of the head's end and one rebuilt block (the loss's backward frees the first
                # before the last block is recomputed)
                measured = run["embedding"] + run["first_block"] + run["block"] \
                    + max(run["head"], run.get("rebuilt_block_bytes", 0))
                run["planned"] = plan
                run["measured_total"] = measured
                run["planned_total"] = plan["blocks_and_embedding"] + plan["head"]
                run["measured_over_planned"] = measured / run["planned_total"]
                print(f"{name:28s} embedding {run['embedding']:>8,} block0 {run['first_block']:>9,} block {run['block']:>9,} head {run['head']:>9,}"
                      + (f" rebuilt {run['rebuilt_block_bytes']:>9,}" if checkpointing else "")
                      + f"  measured/planned {run['measured_over_planned']:.3f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
