"""Compress a trained causal LM into an HF folder transformers loads, and measure before and after.

`flopwise compress RUN_DIR --method int8-weight-only | int4-weight-only | w8a8-dynamic`:

1. the run's HF export (`flopwise export`, made if absent) is the float baseline;
2. transformers loads it with `TorchAoConfig(<the method's torchao config>)`, which quantizes
   every linear weight as it loads, and `save_pretrained` writes safetensors (torchao's
   flattened tensor subclasses; no pickle) with `quantization_config` in config.json, plus
   the tokenizer, into `RUN_DIR/compressed/<method>/`;
3. that folder is loaded again, as a user would, and both models are measured: perplexity on
   the run's held-out split, greedy generation tokens/s (median and IQR,
   `compress/llm_timing.py`), bytes on disk and in memory.

`flopwise generate RUN_DIR/compressed/<method> --prompt ...` samples from the result.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

from flopwise.compress.result import CompressResult
from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir

REPORT_FILE = "compress_report.json"
FILE_MODE = 0o644


def compress_llm_run(method, run_dir: Path, cfg, out: Path, latency_batch: int = 1, new_tokens: int = 32,
                     min_run_time: float = 2.0, report: Callable[[str], None] = print, *,
                     trust_remote_code: bool = False, accept_run: bool = False) -> dict:
    """Quantize the run's model with `method` (an `LLMQuantMethod`), save it in `out`, and return
    the measurements.

    The run's config.yaml is read only with this user's signature (or `accept_run`); the HF
    folders are loaded with remote code only when `trust_remote_code` (the command line's flag).
    """
    from flopwise.compress.llm_timing import pin_threads
    from flopwise.artifacts.generate import load_for_generation, resolve_hf_folder
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    run_dir = Path(run_dir)
    threads = pin_threads(cfg.threads)
    report(f"threads: {threads} (intra-op, pinned for every timing)")
    run_config = run_config_of(run_dir, accept_run=accept_run)
    baseline_folder = resolve_hf_folder(run_dir, trust_remote_code=trust_remote_code, accept_run=accept_run)
    held_out = held_out_tokens(run_config)
    seq_len = run_config.data.seq_len
    device_type = "cpu"  # loaded, quantized and measured on the CPU; a GPU path is not wired yet
    note = method.note(device_type)
    report(f"quantizing {baseline_folder} with {method.name}{f' ({note})' if note else ''} ...")
    group = method.group_size(device_type)
    skipped = ungroupable_linears(baseline_folder, group, trust_remote_code=trust_remote_code) if group else []
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        note = (f"{note}; " if note else "") + (
            f"{len(skipped)} linear(s) left in float: input width not a multiple of the group size {group} ({shown})")
        report(f"note: {len(skipped)} linear(s) keep float weights, their input width is not a multiple of "
               f"{method.name}'s group size {group}: {shown}")
    quantize_folder(baseline_folder, Path(out), method.torchao_config(device_type), skip=skipped,
                    trust_remote_code=trust_remote_code)

    measurements = {}
    for label, folder in (("before", baseline_folder), ("after", Path(out))):
        report(f"measuring {label} ({folder}): perplexity on {_windows(held_out, seq_len, cfg)} held-out windows, "
               f"generation at batch {latency_batch} x {new_tokens} tokens ...")
        model, tokenizer = load_for_generation(folder, trust_remote_code=trust_remote_code)
        measurements[label] = measure_llm(model, tokenizer, folder, held_out, seq_len, cfg, threads,
                                          latency_batch, new_tokens, min_run_time)
        del model
    result = summarize_llm(method.name, note, measurements, threads, latency_batch, new_tokens, Path(out), flow=method.flow)
    path = Path(out) / REPORT_FILE
    path.write_text(json.dumps(result, indent=2))
    os.chmod(path, FILE_MODE)
    return result


def ungroupable_linears(source: Path, group_size: int, *, trust_remote_code: bool = False) -> list[str]:
    """Names of the linears of the HF folder `source` whose input width is not a multiple of
    `group_size`: grouped quantization cannot split their rows (torchao raises), so they stay float.
    The model is built on the meta device: no weight is read."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(source), local_files_only=True, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:  # e.g. an auto_map without --trust-remote-code: transformers refuses to run it
        raise UserError(f"{source}: transformers cannot load the model ({str(exc).splitlines()[0][:200]})") from None
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module.in_features % group_size]


def quantize_folder(source: Path, out: Path, torchao_config, skip: list[str] = (), *,
                    trust_remote_code: bool = False) -> Path:
    """Load `source` quantized by torchao (leaving the linears named in `skip` in float) and save it
    (safetensors + quantization_config) with its tokenizer."""
    import re
    import shutil

    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    keep = [re.escape(name) for name in skip] or None  # transformers reads these as anchored patterns
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(source), quantization_config=TorchAoConfig(torchao_config, modules_to_not_convert=keep),
            local_files_only=True, trust_remote_code=trust_remote_code,
        )
    except ValueError as exc:  # e.g. an auto_map without --trust-remote-code: transformers refuses to run it
        raise UserError(f"{source}: transformers cannot load the model ({str(exc).splitlines()[0][:200]})") from None
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(source), local_files_only=True,
                                  trust_remote_code=trust_remote_code).save_pretrained(str(out))
    for path in Path(out).rglob("*"):
        if path.is_file():
            os.chmod(path, FILE_MODE)
    if any(Path(out).glob("*.bin")) or not any(Path(out).glob("*.safetensors")):
        raise UserError(f"{out}: transformers did not write safetensors for this method")
    return Path(out)


def run_config_of(run_dir: Path, *, accept_run: bool = False):
    """The run's recorded config (signature checked: `config/signature.py`)."""
    from flopwise.config.signature import read_run_config

    config_path = RunDir(run_dir).config
    if not config_path.is_file():
        raise UserError(f"{run_dir}: no config.yaml; compress an LLM from a run directory written by flopwise train")
    return read_run_config(config_path, accept_run=accept_run, trust_remote_code=False)


def held_out_tokens(cfg):
    """The run's validation-split token ids (numpy), read from its data cache (built again if gone).

    A chat run (`data.mix`): its held-out conversations, chat template included and padding left out,
    one after another, so the perplexity is over every token of them (not only the answers)."""
    import numpy as np

    from flopwise.train.data.chat_rows import PreparedChat
    from flopwise.train.data.files import open_shard
    from flopwise.train.data.packing import PAD_SEGMENT
    from flopwise.train.data.prepare import prepare_data

    prepared = prepare_data(cfg.data)
    if isinstance(prepared, PreparedChat):
        arrays = [row.input_ids[row.segment_ids != PAD_SEGMENT] for row in prepared.val_rows]
    else:
        arrays = [np.asarray(open_shard(p, prepared.token_dtype)) for p in prepared.val_shards]
    return np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, dtype=np.int64)


def _windows(tokens, seq_len: int, cfg) -> int:
    return min(max(0, (len(tokens) - 1) // seq_len), cfg.eval_batches * cfg.batch_size)


def perplexity(model, tokens, seq_len: int, cfg) -> float:
    """exp(mean next-token cross-entropy) over non-overlapping held-out windows of `seq_len + 1` tokens."""
    import torch
    import torch.nn.functional as F

    windows = _windows(tokens, seq_len, cfg)
    if windows == 0:
        raise UserError(f"the held-out split has {len(tokens)} tokens, fewer than seq_len+1 = {seq_len + 1}")
    rows = torch.as_tensor(tokens[: windows * seq_len + 1])
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, windows, cfg.batch_size):
            batch = [rows[i * seq_len: i * seq_len + seq_len + 1] for i in range(start, min(windows, start + cfg.batch_size))]
            batch = torch.stack(batch)
            logits = model(input_ids=batch[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
            total += float(loss)
            count += batch[:, 1:].numel()
    return math.exp(total / count)


def measure_llm(model, tokenizer, folder: Path, held_out, seq_len: int, cfg, threads: int,
                latency_batch: int, new_tokens: int, min_run_time: float) -> dict:
    """Perplexity, greedy generation tokens/s (median, quartiles), bytes on disk and in memory."""
    import torch

    from flopwise.compress.evaluate import bytes_in_memory
    from flopwise.compress.llm_timing import rate, time_call

    prompt = torch.as_tensor(held_out[:8]).unsqueeze(0).repeat(latency_batch, 1)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate() -> None:
        with torch.inference_mode():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=pad)

    generate()  # warm-up: first-call allocations and lazy initialisation stay out of the timing
    timing = time_call(generate, threads, min_run_time)
    return {
        "perplexity": perplexity(model, held_out, seq_len, cfg),
        "generation": {**timing.as_dict(), "tokens_per_second": rate(timing, latency_batch * new_tokens)},
        "disk_bytes": sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")),
        "memory_bytes": bytes_in_memory(model),
        "parameters_dtype": str(next(model.parameters()).dtype),
    }


def summarize_llm(method: str, note: str, measured: dict, threads: int, batch: int, new_tokens: int, out: Path,
                  flow: str = "llm") -> dict:
    """The before/after record: ratios, and a speed-up only where the timing intervals are apart."""
    from flopwise.compress.llm_timing import Timing, speedup_text

    def timing(side: str) -> Timing:
        g = measured[side]["generation"]
        return Timing(g["median_s"], g["q1_s"], g["q3_s"], g["blocks"], g["threads"])

    ratio, words = speedup_text(timing("before"), timing("after"))
    before, after = measured["before"], measured["after"]
    return {
        "method": method,
        "flow": flow,
        "note": note,
        "out": str(out),
        "threads": threads,
        "latency_batch": batch,
        "new_tokens": new_tokens,
        "before": before,
        "after": after,
        "perplexity_change": after["perplexity"] / before["perplexity"] - 1.0,
        "disk_ratio": after["disk_bytes"] / before["disk_bytes"],
        "memory_ratio": after["memory_bytes"] / before["memory_bytes"],
        "speedup": ratio,
        "speedup_text": words,
    }


def llm_result(result: dict, out: Path) -> CompressResult:
    """The record with its before/after table for the terminal (printed by `result.print_result`)."""
    b, a = result["before"], result["after"]

    def tps(side: dict) -> str:
        r = side["generation"]["tokens_per_second"]
        return f"{r['median']:.1f} [{r['low']:.1f}-{r['high']:.1f}]"

    rows = (
        ("perplexity (held-out)", f"{b['perplexity']:.3f}", f"{a['perplexity']:.3f}", f"{a['perplexity'] / b['perplexity']:.4f}"),
        ("tokens/s median [IQR]", tps(b), tps(a), result["speedup_text"]),
        ("disk (MiB)", f"{b['disk_bytes'] / 2**20:.2f}", f"{a['disk_bytes'] / 2**20:.2f}", f"{result['disk_ratio']:.3f}"),
        ("memory (MiB)", f"{b['memory_bytes'] / 2**20:.2f}", f"{a['memory_bytes'] / 2**20:.2f}", f"{result['memory_ratio']:.3f}"),
    )
    return CompressResult(
        record=result,
        title=(f"{result['method']}: batch {result['latency_batch']} x {result['new_tokens']} new tokens, "
               f"{result['threads']} thread(s)"),
        columns=tuple((column, "right") for column in ("", "before", "after", "after / before")),
        rows=rows,
        notes=(f"note: {result['note']}",) if result["note"] else (),
        next_step=f"compressed model: {out} (transformers loads it; try `flopwise generate {out} --prompt ...`)",
    )
