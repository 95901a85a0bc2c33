"""LoRA on one Hugging Face llama layer on a GPU: saved-for-backward bytes and forward+backward time,
measured, beside what the planner says (plan/finetune.py).

Checks the planner's GPU assumptions that the CPU tests cannot: CUDA's fused dropout keeps a 1-byte
mask, flash attention's output is the out-projection's input (no copy), and a backward without the
base's weight gradients takes the time the operator model gives. Needs torch with CUDA,
transformers and peft (a lent H200's image has them); writes JSON to $OUT or benchmarks/results/.

    PYTHONPATH=src python3 benchmarks/lora_layer_gpu.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers
from peft import LoraConfig, get_peft_model

from flopwise.catalog.hardware import get_hardware
from flopwise.catalog.models import ModelSpec
from flopwise.plan import finetune as ft
from flopwise.plan import memory as mem
from flopwise.plan.gemm import device_rates
from flopwise.plan.ops import layer_times
from flopwise.plan.params import count_params
from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, F, HEADS, KV, S, B, RANK, LAYERS = (4096, 11008, 32, 32, 2048, 1, 16, 4) if DEVICE == "cuda" else (
    64, 160, 4, 2, 64, 2, 4, 2)


def config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=KV, vocab_size=128,
                                    attn_implementation="sdpa")


def spec_of() -> ModelSpec:
    return ModelSpec(key="llama-layer", name="llama layer", n_layers=LAYERS, hidden=H, n_heads=HEADS, n_kv_heads=KV,
                     ffn_hidden=F, vocab_size=128, mlp="swiglu", norm="rmsnorm", position="rope")


def build(lora: dict | None, fp32_adapters: bool = False):
    torch.manual_seed(0)
    with torch.device(DEVICE):  # initialise on the device: four 7B-sized layers take minutes on a CPU
        model = transformers.LlamaForCausalLM(config()).to(dtype=torch.bfloat16)
    if lora is not None:
        model = get_peft_model(model, LoraConfig(r=RANK, target_modules=lora["targets"],
                                                 lora_dropout=lora.get("dropout", 0.0)),
                               autocast_adapter_dtype=fp32_adapters)
        model.to(DEVICE)
    return model.train()


def inner(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def saved_bytes_one_layer(model) -> int:
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(B, S, H, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    positions = torch.arange(S, device=DEVICE).unsqueeze(0)
    rotary = inner(model).model.rotary_emb(x, positions)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        inner(model).model.layers[0](x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
    return sum(storages.values())


def layers_seconds(model, micro_batch: int, repeats: int = 10) -> float:
    """Forward + backward of the model's layers (embedding and head left out) per micro-batch."""
    layers = inner(model).model.layers
    x = torch.randn(micro_batch, S, H, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    positions = torch.arange(S, device=DEVICE).unsqueeze(0)
    rotary = inner(model).model.rotary_emb(x, positions)

    def once():
        h = x
        for layer in layers:
            out = layer(h, position_embeddings=rotary, attention_mask=None, position_ids=positions)
            h = out[0] if isinstance(out, tuple) else out
        h.float().pow(2).mean().backward()

    for _ in range(3):
        once()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def planned_layer_seconds(method: str, micro_batch: int) -> float:
    hw = get_hardware("h200" if DEVICE == "cuda" else "h100-sxm")
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"), None, None)
    model = spec_of()
    spec = RunSpec(model, Layout(micro_batch_size=micro_batch), Workload(seq_len=S, finetune=method, lora_rank=RANK),
                   Cluster(hardware=hw))
    base = layer_times(model, S, micro_batch, 1, False, True, False, "none", "bf16", rates)
    return ft.layer_times(base, spec, rates).total * LAYERS


def main() -> None:
    model = spec_of()
    split = ft.finetune_split(model, count_params(model), "lora", RANK, "all-linear", "bf16")
    full_layer = mem.layer_activation_bytes(model, S, B, "bf16", dropout=False, flash_attention=True)
    mask = 1.0 if DEVICE == "cuda" else 2.0
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
              "shape": {"hidden": H, "ffn": F, "heads": HEADS, "kv_heads": KV, "seq": S, "micro_batch": B,
                        "rank": RANK, "layers_timed": LAYERS},
              "saved_bytes_per_layer": {}, "seconds_layers": {}}
    measured_full = saved_bytes_one_layer(build(None))
    result["saved_bytes_per_layer"]["full"] = {"measured": measured_full, "planned": full_layer}
    for name, lora, fp32, dropout in (("lora_bf16", {"targets": "all-linear"}, False, 0.0),
                                      ("lora_fp32_adapters", {"targets": "all-linear"}, True, 0.0),
                                      ("lora_dropout", {"targets": "all-linear", "dropout": 0.1}, False, 0.1),
                                      ("lora_qkvo", {"targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}, False, 0.0)):
        measured = saved_bytes_one_layer(build(lora, fp32))
        targets = "qkvo" if name == "lora_qkvo" else "all-linear"
        split_t = ft.finetune_split(model, count_params(model), "lora", RANK, targets, "bf16")
        delta = ft.activation_delta_bytes(model, split_t, S, B, 2.0, dropout, mask_bytes=mask,
                                          input_copy_bytes=4.0 if fp32 else 0.0)
        result["saved_bytes_per_layer"][name] = {"measured_delta": measured - measured_full, "planned_delta": delta}
    if DEVICE == "cuda":  # bring the clocks up before timing (an idle H200 sits at a few hundred MHz)
        a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
        for _ in range(200):
            a @ a
    for micro_batch in (1, 4):  # full training timed before and after LoRA: the spread shows the noise
        for method, lora in (("full", None), ("lora", {"targets": "all-linear"}), ("full_again", None)):
            result["seconds_layers"][f"{method}_micro_batch_{micro_batch}"] = {
                "measured": layers_seconds(build(lora), micro_batch),
                "planned": planned_layer_seconds("lora" if lora else "full", micro_batch)}
    result["trainable_params_per_layer"] = split.adapters_per_layer
    text = json.dumps(result, indent=2)
    print(text)
    out = Path(os.environ.get("OUT") or "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "lora_layer_gpu.json").write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
