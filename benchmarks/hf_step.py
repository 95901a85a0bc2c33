"""Benchmark: flopwise's training step against the Hugging Face Trainer's, paired in one torchrun job.

Run under torchrun on 2 gloo processes. Both sides train the same HF `LlamaForCausalLM` shape
(benchmarks/startup.py's: 4 layers, hidden 192, 6 heads, intermediate 512, vocab 4096, untied
embeddings), on the same token windows (the embedded default corpus as flopwise prepares it,
sequence 128), micro-batch 8 per process, fp32, AdamW (betas 0.9/0.95, weight decay 0.1),
gradient clipping at 1.0, warm-up then cosine:

- `flopwise`: the strategy the default run picks on this device (`settle_for_this_device`: DDP on
  this CPU), `train_step` with the run's hooks (meters on the steps its `MeterSchedule` picks,
  sync-wait probe), and the loop's per-step work: the metrics line and the checkpoint boundary's
  agreement over ranks (`StepBoundary.after_step`, no save due);
- `hf_trainer`: `Trainer.train()` itself (DDP through accelerate, its own dataloader, callbacks,
  the inner loop's clip, optimizer and scheduler steps), no logging, saving or evaluation. The
  Trainer's DDP searches for unused parameters every step by default (`ddp_find_unused_parameters`
  None means True for a model without gradient checkpointing); `--hf-ddp-find-unused false` turns
  that off, HF at its fastest.

The Trainer drives the job; a callback at the end of its steps hands the processes to flopwise
for a block of steps, so blocks alternate (HF, flopwise, then flopwise, HF, ...: the order is
reversed every other round) and a busy machine slows both alike. An HF step's time runs from
the end of the previous step's callback to this step's `on_step_end` (its batch fetch included);
a flopwise step's from the start of `train_step` to the end of the boundary. Reported: the median
over rounds of the per-round ratio flopwise tokens/s / HF tokens/s, with quartiles (rank 0's clock;
DDP keeps the ranks in step). Target >= 0.95.

Usage: torchrun --nproc-per-node 2 benchmarks/hf_step.py [--rounds 24] [--steps 4] [--out PATH]
       [key=value ...]   (flopwise config overrides, e.g. training.measure_every=1)
Writes JSON (default benchmarks/results/hf_step.json) from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from machine import cpu_name

SHAPE = dict(vocab_size=4096, hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
             max_position_embeddings=256, tie_word_embeddings=False)
SEQ, MICRO_BATCH, LR, WARMUP = 128, 8, 3e-3, 15
WARMUP_STEPS = 3  # per side, before the first timed block: allocator, optimizer state, DDP's bucket rebuild


def block_order(rounds: int, steps: int) -> list[tuple[str, int]]:
    """(side, round) for every block: warm-ups, then HF/flopwise pairs with the order reversed every other round."""
    blocks = [("hf_trainer", -1), ("flopwise", -1)]
    for r in range(rounds):
        pair = ["hf_trainer", "flopwise"] if r % 2 == 0 else ["flopwise", "hf_trainer"]
        blocks += [(side, r) for side in pair]
    return blocks


def main() -> None:
    """Build both sides in the same processes, let the Trainer run with flopwise blocks in between, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=4, help="steps per block")
    parser.add_argument("--out", default="benchmarks/results/hf_step.json")
    parser.add_argument("--hf-ddp-find-unused", choices=("default", "false"), default="default",
                        help="the Trainer's ddp_find_unused_parameters: its default (True for a PreTrainedModel "
                             "without gradient checkpointing: one extra autograd-graph walk per step) or false")
    parser.add_argument("overrides", nargs="*", help="flopwise config overrides (dotted key=value)")
    args = parser.parse_args()

    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.runrecord.records import StepRecord
    from flopwise.train.checkpoint.policy import StepBoundary
    from flopwise.train.data.loader import TokenLoader
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.launch.strategy_choice import settle_for_this_device
    from flopwise.train.loop import build_state, measure_sync_wait
    from flopwise.train.meter_schedule import MeterSchedule
    from flopwise.train.metrics import MetricsWriter
    from flopwise.train.parallel.distributed import barrier, init_distributed
    from flopwise.train.step import StepHooks, train_step

    work = Path(tempfile.mkdtemp(prefix="flopwise-hf-step-"))  # this rank's: the HF config.json, metrics lines
    hf_json = work / "config.json"
    LlamaConfig(**SHAPE).to_json_file(hf_json)
    total_steps = WARMUP_STEPS + args.rounds * args.steps + 8  # both sides' schedules span the whole benchmark
    overrides = ["model.kind=hf", f"model.hf_config={hf_json}", f"data.seq_len={SEQ}",
                 f"data.vocab_size={SHAPE['vocab_size']}", f"training.micro_batch_size={MICRO_BATCH}",
                 f"training.lr={LR}", f"training.warmup_steps={WARMUP}", f"training.max_steps={total_steps}",
                 "training.weight_decay=0.1", "training.grad_clip=1.0", "precision.mode=fp32",
                 "logging.progress=false", *args.overrides]
    cfg = load_config(None, [*overrides, f"logging.run_dir={work / 'run'}"])
    env = init_distributed(cfg.parallel)
    choice = settle_for_this_device(cfg, env.world_size)
    prepared = prepare_data(cfg.data) if env.is_main else None
    barrier(env)
    if prepared is None:
        prepared = prepare_data(cfg.data)
    run = resolve_run(cfg, processes=env.world_size)

    # flopwise: the default run's step, hooks and per-step loop work
    torch.manual_seed(cfg.training.seed)
    state = build_state(cfg, env, prepared, run)
    writer = MetricsWriter(work / f"run-{env.rank}", env.rank)
    boundary = StepBoundary(cfg, env, prepared.vocab_size, run, report=lambda line: None)
    meters = MeterSchedule(first_step=0, every=cfg.training.measure_every, max_steps=cfg.training.max_steps)
    sync_wait = measure_sync_wait(cfg.training, env)
    hooks = StepHooks()

    def flopwise_step() -> float:
        t0 = time.perf_counter()
        hooks.measure = meters.due(state.step + 1)
        hooks.sync_wait = sync_wait and hooks.measure
        step = train_step(state, env, run.grad_accum, hooks)
        state.tokens_seen += run.tokens_per_step
        writer.write(StepRecord(
            step=state.step, rank=env.rank, loss=step.loss, lr=step.lr, grad_norm=step.grad_norm,
            tokens_per_second=run.tokens_per_step / step.step_seconds, step_seconds=step.step_seconds,
            data_seconds=step.data_seconds, compute_seconds=step.compute_seconds,
            optimizer_seconds=step.optimizer_seconds, tokens_seen=state.tokens_seen, memory=step.memory,
            skipped=step.skipped, sync_wait_seconds=step.sync_wait_seconds).to_dict())
        boundary.after_step(state, step.loss, step.skipped, step.loss_scale)
        return time.perf_counter() - t0

    # HF: the same token windows, one row per window (the model shifts the labels itself)
    windows = TokenLoader(prepared, "train", seq_len=SEQ, micro_batch_size=1, prefetch=0)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return windows.num_windows

        def __getitem__(self, i):
            ids = windows.batch_at(i)[0][0]
            return {"input_ids": ids, "labels": ids}

    blocks = block_order(args.rounds, args.steps)
    times: dict[tuple[str, int], list[float]] = {block: [] for block in blocks}

    class Alternate(TrainerCallback):
        """Times each HF step; after an HF block, runs the flopwise blocks that follow it in `blocks`."""

        def __init__(self):
            self.index = 0
            self.resumed = 0.0

        def _run_flopwise_blocks(self):
            while self.index < len(blocks) and blocks[self.index][0] == "flopwise":
                times[blocks[self.index]] += [flopwise_step() for _ in range(self._length(self.index))]
                self.index += 1

        def _length(self, index: int) -> int:
            return WARMUP_STEPS if blocks[index][1] < 0 else args.steps

        def on_train_begin(self, args_, state_, control, **kwargs):
            self._run_flopwise_blocks()
            self.resumed = time.perf_counter()

        def on_step_end(self, args_, state_, control, **kwargs):
            now = time.perf_counter()
            block = blocks[self.index]
            times[block].append(now - self.resumed)
            if len(times[block]) == self._length(self.index):
                self.index += 1
                self._run_flopwise_blocks()
            if self.index >= len(blocks):
                control.should_training_stop = True
            self.resumed = time.perf_counter()

    torch.manual_seed(cfg.training.seed)
    hf_args = TrainingArguments(
        output_dir=str(work / "hf"), max_steps=total_steps, per_device_train_batch_size=MICRO_BATCH,
        learning_rate=LR, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=1.0,
        lr_scheduler_type="cosine", warmup_steps=WARMUP, save_strategy="no", report_to=[], use_cpu=True,
        ddp_backend="gloo", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=cfg.training.seed,
        ddp_find_unused_parameters=False if args.hf_ddp_find_unused == "false" else None)
    trainer = Trainer(model=LlamaForCausalLM(LlamaConfig(**SHAPE)), args=hf_args, train_dataset=Windows(),
                      callbacks=[Alternate()])
    trainer.train()
    boundary.close()
    writer.close()
    state.train_loader.close()
    if not env.is_main:
        return

    rounds = range(args.rounds)
    seconds = {side: {r: sum(times[(side, r)]) for r in rounds} for side in ("flopwise", "hf_trainer")}
    ratios = [seconds["hf_trainer"][r] / seconds["flopwise"][r] for r in rounds]  # tokens/s ratio: same tokens
    step_times = {side: [t for r in rounds for t in times[(side, r)]] for side in ("flopwise", "hf_trainer")}
    tokens_per_step = run.tokens_per_step
    quartiles = statistics.quantiles(ratios, n=4)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    result = {
        "benchmark": "hf_step",
        "what": "training-step speed, flopwise's default run (DDP on this CPU) vs the HF Trainer's DDP step, "
                "same model, data, batch and precision, alternating blocks in one torchrun job",
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "processes": env.world_size, "backend": "gloo",
                    "threads_per_process": torch.get_num_threads(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "load_1min_after": round(os.getloadavg()[0], 2)},
        "settings": {"model": {**SHAPE, "parameters": n_params}, "seq_len": SEQ, "micro_batch_per_process": MICRO_BATCH,
                     "tokens_per_step": tokens_per_step, "precision": "fp32", "rounds": args.rounds,
                     "steps_per_block": args.steps, "warm_up_steps_per_side": WARMUP_STEPS,
                     "flopwise_strategy": cfg.parallel.strategy,
                     "flopwise_strategy_reason": choice.line() if choice is not None else "named in the overrides",
                     "flopwise_measure_every": cfg.training.measure_every, "overrides": args.overrides,
                     "hf_ddp_find_unused_parameters": args.hf_ddp_find_unused},
        "paired_ratio_median": statistics.median(ratios),
        "paired_ratio_quartiles": quartiles,
        "paired_ratios": ratios,
        "median_step_seconds": {side: statistics.median(v) for side, v in step_times.items()},
        "tokens_per_second_of_median_steps": {side: tokens_per_step / statistics.median(v)
                                              for side, v in step_times.items()},
        "target": 0.95,
        "meets_target": statistics.median(ratios) >= 0.95,
        "note": "paired ratio = per round, HF block seconds / flopwise block seconds (= flopwise tokens/s over HF's); "
                "other workers share the CPU, so the figure is paired, not absolute",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("paired_ratio_median", "paired_ratio_quartiles", "median_step_seconds",
                                             "meets_target")}, indent=2), flush=True)


if __name__ == "__main__":
    main()
