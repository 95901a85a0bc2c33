"""Benchmark: seconds from launch to the end of the first training step, `flopwise train` vs the
Hugging Face Trainer, on the same model and the same machine.

- `flopwise`: `python -m flopwise train` with the embedded default config (2 processes on a CPU,
  strategy chosen at start, no step-0 evaluation), `training.max_steps=1`; the first step is done
  when rank 0 writes its first metrics line.
- `hf_trainer`: `torchrun --nproc-per-node 2` of this file's `--hf-worker`: a `LlamaForCausalLM`
  of the same shape (4 layers, hidden 192, 6 heads, vocab 4096, untied embeddings, sequence 128,
  micro-batch 8 per process, AdamW, fp32, gloo DDP), `Trainer.train()` for one step; the first
  step is done when a callback on rank 0 writes its time.

What each pays before step 1 is what a user pays on a second run in the same place: a warm-up
run first fills flopwise's caches (tokenized data, device profile) and the OS page cache for both;
the Trainer's data are token ids made in memory (it tokenizes nothing). Runs alternate
(flopwise, HF, flopwise, ...) so a busy machine slows both alike; medians are compared.
Writes JSON (default benchmarks/results/startup.json).

Usage: python benchmarks/startup.py [--rounds 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

SEQ, VOCAB, MICRO_BATCH, PROCESSES = 128, 4096, 8, 2


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 900.0) -> float:
    """Wall time (time.time) at which `path` first holds a line, or an error when `proc` ends without it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and path.stat().st_size > 0:
            return time.time()
        if proc.poll() is not None:
            if path.is_file() and path.stat().st_size > 0:
                return time.time()
            raise RuntimeError(f"{proc.args[:4]} ended with {proc.returncode} before its first step")
        time.sleep(0.02)
    raise RuntimeError(f"no first step within {timeout} s")


def flopwise_run(work: Path, env: dict, index: int) -> float:
    """Seconds from launch to rank 0's first metrics line."""
    run_dir = work / f"flopwise-{index}"
    cmd = [sys.executable, "-m", "flopwise", "train", "training.max_steps=1", "logging.progress=false",
           f"data.cache_dir={work / 'data-cache'}", f"logging.run_dir={run_dir}"]
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = wait_for(run_dir / "metrics.rank0.jsonl", proc)
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"flopwise train failed: {out[-2000:]}")
    return first - start


def hf_run(work: Path, env: dict, index: int) -> float:
    """Seconds from launch to the HF Trainer's first `on_step_end` on rank 0."""
    marker = work / f"hf-{index}.first_step"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={PROCESSES}",
           str(Path(__file__).resolve()), "--hf-worker", str(marker), str(work / f"hf-{index}")]
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = wait_for(marker, proc)
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"HF Trainer failed: {out[-2000:]}")
    return first - start


def hf_worker(marker: str, output_dir: str) -> None:
    """One rank of the HF Trainer run (started by torchrun)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class FirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1 and int(os.environ.get("RANK", "0")) == 0:
                Path(marker).write_text(f"{time.time()}\n")

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int):
            self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=6, max_position_embeddings=256, tie_word_embeddings=False)
    args = TrainingArguments(output_dir=output_dir, max_steps=1, per_device_train_batch_size=MICRO_BATCH,
                             learning_rate=3e-3, save_strategy="no", report_to=[], use_cpu=True,
                             ddp_backend="gloo", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Tokens(256), callbacks=[FirstStep()]).train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (flopwise, HF), alternating")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "startup.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flopwise-startup-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(work / "xdg"), HF_HUB_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        warm = {"flopwise": flopwise_run(work, env, -1), "hf_trainer": hf_run(work, env, -1)}
        runs: dict[str, list[float]] = {"flopwise": [], "hf_trainer": []}
        for i in range(args.rounds):
            runs["flopwise"].append(flopwise_run(work, env, i))
            runs["hf_trainer"].append(hf_run(work, env, i))
            print(f"round {i + 1}: flopwise {runs['flopwise'][-1]:.1f} s, HF Trainer {runs['hf_trainer'][-1]:.1f} s",
                  flush=True)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    result = {
        "what": "seconds from launch to the end of the first training step, 2 CPU processes (gloo), warm caches",
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min_after": round(os.getloadavg()[0], 2)},
        "model": {"layers": 4, "hidden": 192, "heads": 6, "vocab": VOCAB, "seq_len": SEQ, "micro_batch": MICRO_BATCH},
        "warm_up_seconds": warm,
        "seconds": runs,
        "median_seconds": medians,
        "flopwise_over_hf": medians["flopwise"] / medians["hf_trainer"],
        "notes": ["flopwise: embedded default config, training.max_steps=1 (strategy chosen at start, no step-0 "
                  "evaluation, tokenized data and device profile from the warm-up's cache)",
                  "HF Trainer: same LLaMA shape, token ids made in memory, DDP over gloo, no saving or logging"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"median: flopwise {medians['flopwise']:.1f} s, HF Trainer {medians['hf_trainer']:.1f} s -> {args.out}")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--hf-worker":
        hf_worker(sys.argv[2], sys.argv[3])
    else:
        main()
