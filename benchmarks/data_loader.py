"""How fast the data pipeline is, next to how fast the default run consumes tokens.

Measures on the default corpus (the standard library's sources, or --max-bytes of it):
tokenizer training time, cold `prepare_data` time and tokens/s, warm (cached) load time;
then TokenLoader throughput with and without prefetch, both flat out and while a consumer
"computes" for one measured default-model step per batch (the time `next()` then blocks
is what the training loop would lose). The default model's step time comes from a few
timed forward/backward/AdamW steps of `flopwise.train.model` on this machine's CPU.

    python benchmarks/data_loader.py [--out benchmarks/results/data_loader.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from flopwise.config.schema import DataConfig, RunConfig  # noqa: E402
from flopwise.train.data.corpus import resolve_inputs  # noqa: E402
from flopwise.train.data.files import tokenizer_sample  # noqa: E402
from flopwise.train.data.loader import TokenLoader  # noqa: E402
from flopwise.train.data.prepare import prepare_data  # noqa: E402
from flopwise.train.data.tokenizer import train_bpe  # noqa: E402


def time_preparation(cfg: DataConfig) -> tuple[dict, object]:
    """Tokenizer training alone, then a cold and a warm `prepare_data`."""
    inputs = resolve_inputs(list(cfg.paths), cfg.format)
    t0 = time.perf_counter()
    sample_chars = 0

    def counted():
        nonlocal sample_chars
        for text in tokenizer_sample(inputs, cfg):
            sample_chars += len(text)
            yield text

    train_bpe(counted(), cfg.vocab_size)
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepared = prepare_data(cfg)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = prepare_data(cfg)
    warm_s = time.perf_counter() - t0
    assert again.cache_hit
    tokens = prepared.train_tokens + prepared.val_tokens
    return {
        "input_files": prepared.input_files,
        "input_bytes": prepared.input_bytes,
        "train_tokens": prepared.train_tokens,
        "val_tokens": prepared.val_tokens,
        "bytes_per_token": round(prepared.input_bytes / tokens, 3),
        "vocab_size": prepared.vocab_size,
        "tokenizer_sample_chars": sample_chars,
        "tokenizer_train_s": round(tokenizer_s, 3),
        "prepare_cold_s": round(cold_s, 3),
        "prepare_cold_tokens_per_s": round(tokens / cold_s),
        "prepare_cached_s": round(warm_s, 4),
    }, prepared


def default_step_seconds(vocab_size: int, seq_len: int, batch: int, steps: int) -> dict:
    """Seconds per forward+backward+AdamW step of the default model (one process, CPU)."""
    from flopwise.train.model import build_model

    run = RunConfig()
    model = build_model(run.model, vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.training.lr)
    inputs = torch.randint(0, vocab_size, (batch, seq_len))
    times = []
    for _ in range(steps + 1):  # the first step warms allocator and kernels; not counted
        t0 = time.perf_counter()
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), inputs.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    step_s = sorted(times[1:])[len(times[1:]) // 2]
    return {
        "model": run.model.model_dump(mode="json"),
        "micro_batch_size": batch,
        "seq_len": seq_len,
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(batch * seq_len / step_s),
    }


def loader_throughput(prepared, seq_len: int, batch: int, prefetch: int, batches: int) -> dict:
    """Batches/s and tokens/s with nothing else to do."""
    loader = TokenLoader(prepared, "train", seq_len, batch, seed=0, prefetch=prefetch)
    next(loader)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(loader)
    elapsed = time.perf_counter() - t0
    loader.close()
    return {
        "prefetch": prefetch,
        "batches": batches,
        "batches_per_s": round(batches / elapsed, 1),
        "tokens_per_s": round(batches * batch * seq_len / elapsed),
    }


def wait_while_computing(prepared, seq_len: int, batch: int, prefetch: int, compute_s: float, batches: int) -> dict:
    """Mean time `next()` blocks when the consumer spends `compute_s` per batch (a sleep stands in for the step)."""
    loader = TokenLoader(prepared, "train", seq_len, batch, seed=0, prefetch=prefetch)
    next(loader)
    waited = 0.0
    for _ in range(batches):
        t0 = time.perf_counter()
        next(loader)
        waited += time.perf_counter() - t0
        time.sleep(compute_s)
    loader.close()
    return {
        "prefetch": prefetch,
        "compute_s_per_batch": round(compute_s, 4),
        "mean_wait_ms": round(1000 * waited / batches, 4),
        "wait_fraction_of_step": round(waited / (waited + compute_s * batches), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "data_loader.json")
    parser.add_argument("--max-bytes", type=int, default=None, help="cap on the corpus (default: all of it)")
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--model-steps", type=int, default=3)
    args = parser.parse_args()

    run = RunConfig()
    seq_len, batch = run.data.seq_len, run.training.micro_batch_size
    with tempfile.TemporaryDirectory() as cache:
        cfg = run.data.model_copy(update={"cache_dir": Path(cache), "max_bytes": args.max_bytes})
        preparation, prepared = time_preparation(cfg)
        flat_out = [loader_throughput(prepared, seq_len, batch, p, args.batches) for p in (0, 4)]
        step = default_step_seconds(prepared.vocab_size, seq_len, batch, args.model_steps)
        waits = [
            wait_while_computing(prepared, seq_len, batch, p, step["median_step_s"], 20) for p in (0, 4)
        ]
    result = {
        "benchmark": "data_loader",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "corpus": "python stdlib sources" + (f" (first {args.max_bytes} bytes)" if args.max_bytes else ""),
        "preparation": preparation,
        "loader": flat_out,
        "default_training_step": step,
        "loader_wait_during_training": waits,
        "loader_to_training_speed_ratio": round(flat_out[0]["tokens_per_s"] / step["tokens_per_s"], 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
