"""Generation speed of a ~100M-parameter llama-architecture decoder: fp32, bf16, and the LLM
compression methods (INT8 weight-only by default), on this CPU.

The model has random weights (speed does not depend on their values); it is written with
`save_pretrained`, quantized by `flopwise.compress.llm.quantize_folder` exactly as
`flopwise compress RUN --method ...` does, and loaded back with `AutoModelForCausalLM`.
Each variant generates `--new-tokens` tokens greedily (KV cache) after a 16-token prompt at
batch `--latency-batch`; times are torch.utils.benchmark `blocked_autorange` medians with
quartiles, at a pinned thread count. A speed-up is stated only when the interquartile
ranges do not overlap. Results go to benchmarks/results/compress_llm.json.

    OMP_NUM_THREADS=1 python benchmarks/compress_llm.py [--threads 1] [--latency-batch 1] [--new-tokens 32]
        [--methods int8-weight-only] [--min-run-time 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from flopwise.compress.evaluate import bytes_in_memory
from flopwise.compress.llm import quantize_folder
from flopwise.compress.llm_timing import pin_threads, rate, speedup_text, time_call
from flopwise.compress.methods import get_method
from flopwise.hf_logging import quiet_hf_libraries

try:
    from machine import machine_info
except ImportError:  # run from another directory
    from benchmarks.machine import machine_info

# ~110M parameters: 12 layers x 768 (GPT-2 small's depth and width), SwiGLU 2048, vocab 16384.
MODEL = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=12, vocab_size=16384, max_position_embeddings=512)
PROMPT_TOKENS = 16


def write_model(folder: Path) -> int:
    """save_pretrained the random ~100M decoder with a byte-level tokenizer; returns its parameter count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**MODEL, tie_word_embeddings=False, eos_token_id=0, pad_token_id=0))
    model.save_pretrained(str(folder), safe_serialization=True)
    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|endoftext|>").save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def measure(model, threads: int, batch: int, new_tokens: int, min_run_time: float) -> dict:
    """Greedy generation time (median, quartiles) and tokens/s for one loaded model."""
    prompt = torch.randint(1, MODEL["vocab_size"], (batch, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))

    def generate() -> None:
        with torch.inference_mode():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0)

    generate()  # warm-up
    timing = time_call(generate, threads, min_run_time)
    return {**timing.as_dict(), "tokens_per_second": rate(timing, batch * new_tokens),
            "memory_bytes": bytes_in_memory(model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--latency-batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--methods", default="int8-weight-only", help="comma-separated LLM methods")
    parser.add_argument("--min-run-time", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "compress_llm.json")
    args = parser.parse_args()
    quiet_hf_libraries()
    from transformers import AutoModelForCausalLM

    threads = pin_threads(args.threads)
    print(f"threads: {threads} (pinned)", flush=True)
    variants = {}
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "fp32"
        parameters = write_model(base)
        print(f"model: {parameters / 1e6:.1f}M parameters ({MODEL})", flush=True)
        folders = {"fp32": (base, torch.float32), "bf16": (base, torch.bfloat16)}
        for name in args.methods.split(","):
            print(f"quantizing: {name} ...", flush=True)
            start = time.perf_counter()
            folders[name] = (quantize_folder(base, Path(scratch) / name, get_method(name).torchao_config("cpu")), None)
            print(f"  {time.perf_counter() - start:.1f} s", flush=True)
        for name, (folder, dtype) in folders.items():
            print(f"timing {name}: batch {args.latency_batch} x {args.new_tokens} new tokens ...", flush=True)
            kwargs = {"dtype": dtype} if dtype is not None else {}
            model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs).eval()
            variants[name] = measure(model, threads, args.latency_batch, args.new_tokens, args.min_run_time)
            variants[name]["disk_bytes"] = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
            if dtype == torch.bfloat16:
                variants[name]["disk_bytes"] //= 2  # a bf16 save_pretrained holds half the fp32 bytes
            tps = variants[name]["tokens_per_second"]
            print(f"  {tps['median']:.2f} tokens/s [IQR {tps['low']:.2f}-{tps['high']:.2f}], "
                  f"{variants[name]['blocks']} blocks", flush=True)
            del model
    from flopwise.compress.llm_timing import Timing

    def timing(name: str) -> Timing:
        v = variants[name]
        return Timing(v["median_s"], v["q1_s"], v["q3_s"], v["blocks"], v["threads"])

    comparisons = {}
    for name in args.methods.split(","):
        for reference in ("fp32", "bf16"):
            ratio, words = speedup_text(timing(reference), timing(name))
            comparisons[f"{name} vs {reference}"] = {"speedup": ratio, "words": words}
            print(f"{name} vs {reference}: {words}", flush=True)
    result = {
        "benchmark": "compress_llm",
        "machine": machine_info(),
        "torch": torch.__version__,
        "model": {**MODEL, "parameters": parameters, "weights": "random"},
        "threads": threads,
        "latency_batch": args.latency_batch,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": args.new_tokens,
        "timer": "torch.utils.benchmark.Timer.blocked_autorange, median and quartiles of block times",
        "variants": variants,
        "comparisons": comparisons,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
