"""DeepSpeed ZeRO as a trainer strategy (`parallel.strategy: deepspeed`).

ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) partitions the optimizer states (stage 1),
the gradients (stage 2) and the parameters (stage 3) over the data-parallel ranks;
ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840) moves optimizer states, and with stage 3
the parameters, to CPU memory. flopwise does not re-implement any of it: it writes a
DeepSpeed config from the RunConfig, hands the model, its own AdamW/SGD and its own LR
schedule to `deepspeed.initialize`, and supplies the engine's forward / `backward` /
`step` to the trainer's one step (`step.train_step`). DeepSpeed itself scales the loss by the accumulation
count, reduces (or reduce-scatters) gradients on the boundary micro-step, clips, steps
the optimizer and the LR schedule, and keeps the fp16 loss scale.

On CPU (gloo, `DS_ACCELERATOR=cpu`, set here when no GPU is visible) this runs fp32 and
bf16; the optimizer is the torch one (`zero_force_ds_cpu_optimizer: false`), so no C++
Adam build is needed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from flopwise.errors import UserError
from flopwise.config.precision import Precision
from flopwise.config.resolve import ResolvedRun
from flopwise.train.checkpoint import deepspeed_state
from flopwise.config.schema import RunConfig
from flopwise.train.parallel.distributed import DistEnv, all_reduce_mean
from flopwise.library_noise import library_prints_to_log
from flopwise.train.metrics import MemoryBytes, _unique_storage_bytes
from flopwise.train.step import StepHooks, loss_fn

NEVER_PRINT = 2**31 - 1  # DeepSpeed's own step log; flopwise logs the steps itself


def deepspeed_config(cfg: RunConfig, precision: Precision, grad_accum: int, device_type: str) -> dict:
    """The DeepSpeed config (a dict, as `deepspeed.initialize(config=...)` takes) for this run.

    `precision` is the run's resolved one (`ResolvedRun.precision`); `cfg.precision` gives the loss scaler's settings.

    Keys follow DeepSpeed's config reference: `zero_optimization.stage`,
    `offload_optimizer` / `offload_param` with `device: cpu`, `bf16` / `fp16` (dynamic loss
    scale starting at 2^`initial_scale_power`, Micikevicius et al. 2018), `gradient_clipping`
    and `gradient_accumulation_steps`. The optimizer and LR schedule are passed as objects.
    """
    p, compute = cfg.parallel, precision.compute_dtype
    zero: dict = {"stage": p.zero_stage}
    if p.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": device_type == "cuda"}
    if p.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": device_type == "cuda"}
    if p.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = p.zero3_persistence_threshold
    config: dict = {
        "train_micro_batch_size_per_gpu": cfg.training.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": cfg.training.grad_clip or 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the trainer's own torch AdamW / SGD
        "zero_force_ds_cpu_optimizer": False,  # no DeepSpeedCPUAdam (a C++ build) for offload
        "steps_per_print": NEVER_PRINT,
        "wall_clock_breakdown": False,
    }
    if compute == "bf16":
        config["bf16"] = {"enabled": True}
    elif compute == "fp16":
        initial_power = round(math.log2(cfg.precision.initial_scale))
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": initial_power,
                          "loss_scale_window": cfg.precision.growth_interval}
    return config


def select_cpu_accelerator() -> None:
    """Tell DeepSpeed to use its CPU accelerator when no GPU is visible (before it is imported)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


class DeepSpeedStrategy:
    """Supplies a DeepSpeed engine's forward, backward and step to the trainer's one step."""

    memory_before_step = True  # DeepSpeed's step frees the gradient partitions it reduced
    checkpoint_format = deepspeed_state.FORMAT

    def __init__(self, state, cfg: RunConfig, env: DistEnv, run: ResolvedRun):
        precision = run.precision
        if precision.compute_dtype == "fp16" and env.device.type == "cpu":
            raise UserError("precision.mode: fp16 with parallel.strategy=deepspeed runs on GPUs only "
                            "(DeepSpeed's CPU fp16 needs oneDNN fp16 hardware; allowed on CPU: fp32, bf16)")
        select_cpu_accelerator()
        # DeepSpeed reads torchrun's variables; a single process started without torchrun has none.
        for name, value in (("LOCAL_RANK", env.local_rank), ("RANK", env.rank), ("WORLD_SIZE", env.world_size)):
            os.environ.setdefault(name, str(value))
        import deepspeed  # heavy; only a DeepSpeed run pays for it

        self.env = env
        self.zero_stage = cfg.parallel.zero_stage
        self.loss_scaling = precision.loss_scaling
        self.config = deepspeed_config(cfg, precision, run.grad_accum, env.device.type)
        self.built = built = state.built
        with library_prints_to_log():  # DeepSpeed prints its op builds on every rank
            self.engine, self.optimizer, _, _ = deepspeed.initialize(
                model=built.module, optimizer=state.optimizer, lr_scheduler=state.scheduler,
                config=self.config, dist_init_required=False,
            )
        deepspeed_state.use_safe_reader(self.engine)  # its stock reader unpickles with weights_only=False
        built.model = self.engine
        built.notes.append(
            f"DeepSpeed ZeRO-{self.zero_stage}, offload {cfg.parallel.offload}, "
            f"{precision.compute_dtype} "
            f"({type(self.optimizer).__name__})"
        )
        self._skipped_before = 0
        self._memory = MemoryBytes()

    def begin_step(self, state) -> float:
        """Training mode; the LR the engine's schedule gives this step."""
        self.engine.train()
        self._skipped_before = self.engine.skipped_steps
        self._memory = MemoryBytes()
        return self.engine.get_lr()[0]

    def fetch(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch on this rank's device."""
        inputs, targets = next(loader)
        return inputs.to(self.env.device), targets.to(self.env.device)

    def forward_backward(self, batch, micro: int, grad_accum: int, hooks: StepHooks) -> float:
        """Engine forward and `backward` (DeepSpeed divides by gradient_accumulation_steps and
        reduces on the boundary micro-step); the engine's `step` is a no-op before it."""
        inputs, targets = batch
        last = micro == grad_accum - 1
        with hooks.around_forward(self.built.module, micro, last, self.built.forward_context,
                                  self.built.saved_tensor_hooks):
            loss = loss_fn(self.engine(inputs), targets)
        hooks.before_backward(self.env, last)
        self.engine.backward(loss)
        if not last:
            self.engine.step()
        return loss.detach().item() / grad_accum

    def clip_and_step(self, state) -> tuple[bool, float, float | None]:
        """The engine's boundary step: it clips, steps the optimizer and the LR schedule, keeps the fp16 scale."""
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        scale = getattr(self.optimizer, "cur_scale", None) if self.loss_scaling else None
        return (self.engine.skipped_steps > self._skipped_before, grad_norm,
                float(scale) if scale is not None else None)

    def end_step(self, state, skipped: bool) -> None:
        """Nothing: the engine zeroes gradients and advances the schedule in its step (not on an overflow)."""

    def save_state(self, state, folder: Path) -> None:
        """The engine's own checkpoint (model, ZeRO partitions, optimizer, schedule) into `folder/deepspeed/`."""
        deepspeed_state.save_engine(self.engine, folder)

    def load_state(self, state, folder: Path) -> None:
        """The engine's own load, reading every file weights-only."""
        deepspeed_state.load_engine(self.engine, folder)

    @torch.no_grad()
    def evaluate(self, loader, batches: int) -> float:
        """Mean validation loss through the engine (ZeRO-3 gathers parameters as it goes), over ranks."""
        self.engine.eval()
        total = 0.0
        for inputs, targets in loader.val_batches(batches):
            total += loss_fn(self.engine(inputs.to(self.env.device)), targets.to(self.env.device)).item()
        self.engine.train()
        return all_reduce_mean([total / batches], self.env)[0]

    def memory(self, state, saved_activation_bytes: int) -> MemoryBytes:
        """This rank's bytes after the last backward of a step, before DeepSpeed's optimizer step.

        Parameters: ZeRO-3 keeps this rank's partition in `param.ds_tensor` (plus whole
        copies of parameters under `zero3_persistence_threshold`); stages 0-2 hold whole
        parameters. Gradients: stage 3's flat partition buffer, stage 2's partition
        buffer, stage 1/2's averaged partitions, the fp32 partitions' `.grad` under offload,
        and any `.grad` still on parameters. Optimizer: the torch optimizer's
        state plus DeepSpeed's fp32 master partitions where it keeps them.
        """
        params = list(self.built.module.parameters())
        held = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")]
        held += [p.data for p in params if p.data.numel() > 0]
        zero_opt = self.optimizer
        grads = [p.grad for p in params if p.grad is not None]
        for name in ("grad_partitions_flat_buffer", "grads_in_partition"):  # stage 3, stage 2 (contiguous)
            flat = getattr(zero_opt, name, None)
            if isinstance(flat, torch.Tensor):
                grads.append(flat)
        averaged = getattr(zero_opt, "averaged_gradients", None)
        if isinstance(averaged, dict):
            grads += [g for group in averaged.values() for g in (group or []) if isinstance(g, torch.Tensor)]
        inner = getattr(zero_opt, "optimizer", zero_opt)
        states = [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
            masters = getattr(zero_opt, name, None)
            if isinstance(masters, list):
                states += [t for t in masters if isinstance(t, torch.Tensor)]
                grads += [t.grad for t in masters if isinstance(t, torch.Tensor) and t.grad is not None]  # offload
        param_storages = {t.untyped_storage().data_ptr() for t in held}
        states = [t for t in states if t.untyped_storage().data_ptr() not in param_storages]
        return MemoryBytes(
            parameters=_unique_storage_bytes(held),
            gradients=_unique_storage_bytes(grads),
            optimizer=_unique_storage_bytes(states),
            saved_activations=saved_activation_bytes,
            cuda_peak_allocated=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        )

