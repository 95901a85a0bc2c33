"""What a run measures and where it goes: memory, per-rank JSONL, progress bar, TensorBoard, W&B.

Metrics files: ONE FILE PER RANK, `runs/<name>/metrics.rank<R>.jsonl`, one `runrecord.StepRecord`
per optimizer step. Per-rank files need no lock, never interleave, and work unchanged
across nodes on a shared file system; readers glob `metrics.rank*.jsonl`.

Memory on CPU is counted exactly, per rank: bytes of this rank's parameters, gradients
and optimizer state (the local shards under FSDP2), and the peak bytes of tensors saved for
backward, measured with `torch.autograd.graph.saved_tensors_hooks` over unique storages
(parameters and buffers excluded). On CUDA the allocator's peak is recorded as well.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from flopwise.runrecord.records import MemoryBytes, json_line, metrics_path
from flopwise.runrecord.run_dir import RunDir
from flopwise.safe_write import WriteFailed, make_folder, open_for_append, write_through_descriptor
from flopwise.train.parallel.distributed import local_tensor


def plain_parts(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors holding a tensor's bytes: this rank's shard of a DTensor, and the inner
    tensors of a wrapper subclass (a QLoRA NF4Tensor keeps its 4-bit codes and scales in five),
    which have no storage of their own."""
    local = local_tensor(tensor)
    if isinstance(local, nn.Parameter):
        local = local.data
    if type(local) is not torch.Tensor and hasattr(local, "__tensor_flatten__"):
        names, _ = local.__tensor_flatten__()
        for name in names:
            yield from plain_parts(getattr(local, name))
    else:
        yield local


def _unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for local in (part for tensor in tensors for part in plain_parts(tensor)):
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds (FSDP2: its shards; tied weights counted once)."""
    return _unique_storage_bytes(p for p in model.parameters())


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradients this rank holds right now (FSDP2: sharded after reduce-scatter)."""
    return _unique_storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state tensors (AdamW exp_avg/exp_avg_sq, SGD momentum), local shards."""
    return _unique_storage_bytes(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )


class _Saved:
    """What the meter hands autograd for one saved tensor; its release marks the tensor's release."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value):
        self.value = value


class SavedActivationMeter:
    """The PEAK bytes autograd keeps alive for backward while the hooks are installed.

    A saved tensor is counted when it is packed and subtracted when autograd releases it
    (after the backward that used it): each pack returns a small holder whose finaliser
    subtracts, and storages are reference-counted so a storage saved twice counts once.
    A plain forward then reads its whole saved set; a pipeline schedule, which runs
    forwards and backwards of several micro-batches inside the hooks, reads the most it
    keeps in flight at once (1F1B: at most the stages ahead), not the sum over the pass.
    Storages of parameters and buffers (and views of them, such as a transposed weight)
    are not activations and are skipped. Activation checkpointing's own hooks run inside
    checkpointed regions, so what it drops is not seen here, which is exactly what makes
    the saving measurable. `inner` is an optional (pack, unpack) pair to compose with,
    such as int8 activation compression; then the packed form is what is counted.
    """

    def __init__(self, model: nn.Module, inner: tuple[Callable, Callable] | None = None):
        self._excluded = {t.untyped_storage().data_ptr() for t in _params_and_buffers(model)}
        self._inner = inner
        self._alive: dict[int, list[int]] = {}  # storage key -> [holders alive, bytes]
        self.alive_bytes = 0
        self.bytes = 0  # the peak of `alive_bytes`

    def _hold(self, packed, counted) -> _Saved:
        """Wrap `packed`; count the activation storages in `counted` until the holder is released."""
        holder = _Saved(packed)
        tensors = counted if isinstance(counted, (tuple, list)) else (counted,)
        keys = [key for key in (self._storage_key(t) for t in tensors) if key is not None]
        for key, nbytes in keys:
            entry = self._alive.setdefault(key, [0, nbytes])
            if entry[0] == 0:
                self.alive_bytes += nbytes
            entry[0] += 1
        if keys:
            weakref.finalize(holder, self._release, [key for key, _ in keys])
            self.bytes = max(self.bytes, self.alive_bytes)
        return holder

    def _storage_key(self, tensor) -> tuple[int, int] | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        if _is_parameter(tensor):  # an (unsharded FSDP2) parameter, trainable or frozen
            return None
        try:
            storage = local_tensor(tensor).untyped_storage()
            key = storage.data_ptr()
        except RuntimeError:  # no real storage (a meta or fake tensor, e.g. a pipeline stage's shape probe)
            return None
        if key in self._excluded or storage.nbytes() == 0:
            return None
        return key, storage.nbytes()

    def _release(self, keys: list[int]) -> None:
        for key in keys:
            entry = self._alive.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] == 0:
                self.alive_bytes -= entry[1]
                del self._alive[key]

    def _pack(self, tensor: torch.Tensor):
        if self._inner is None:
            return self._hold(tensor, tensor)
        if tensor._base is not None and _is_parameter(tensor._base):
            return _Saved(self._inner[0](tensor))
        packed = self._inner[0](tensor)
        return self._hold(packed, packed)

    def _unpack(self, holder: _Saved):
        return holder.value if self._inner is None else self._inner[1](holder.value)

    @contextmanager
    def measuring(self) -> Iterator["SavedActivationMeter"]:
        """Install the hooks for the passes run inside this block."""
        self._alive.clear()
        self.alive_bytes = 0
        self.bytes = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


def _is_parameter(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is (a view of) a parameter: a trainable leaf, or any `nn.Parameter`. FSDP2
    all-gathers parameters into fresh storages, so a frozen one (a LoRA base weight, which a linear
    saves for its input gradient) is not among the storages excluded at the start."""
    base = tensor._base if tensor._base is not None else tensor
    return isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad)


def _params_and_buffers(model: nn.Module) -> Iterator[torch.Tensor]:
    for tensor in list(model.parameters()) + list(model.buffers()):
        yield from plain_parts(tensor)


def measure_memory(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved_activation_bytes: int, device: torch.device
) -> MemoryBytes:
    """This rank's memory right after backward (gradients present, before they are zeroed)."""
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return MemoryBytes(
        parameters=parameter_bytes(model),
        gradients=gradient_bytes(model),
        optimizer=optimizer_state_bytes(optimizer),
        saved_activations=saved_activation_bytes,
        cuda_peak_allocated=cuda_peak,
    )


class MetricsWriter:
    """One JSON line per step in this rank's file, written whole or not at all.

    A fresh run truncates the file; a resumed run (`append=True`) continues it. Each line
    is built first and handed to the kernel in one `os.write` (no buffer, so a crash loses
    nothing); when the disk is full or the file too large, whatever part of the line got
    in is cut off again and the run stops with one line. The file is opened without
    following links (`safe_write.open_for_append`).
    """

    def __init__(self, run_dir: Path, rank: int, append: bool = False):
        self.path = metrics_path(run_dir, rank)
        make_folder(self.path.parent)
        self._fd = open_for_append(self.path, truncate=not append)

    def write(self, record: dict) -> None:
        """Append a record's line; non-finite floats become null so every line stays valid JSON."""
        line = json_line(record).encode("utf-8")
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            write_through_descriptor(self._fd, line)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)  # no half line: the file ends with the last whole step
            raise WriteFailed(err, self.path, f"{self.path}: cannot append step {record.get('step')}'s metrics "
                              f"({err.strerror or err}); the file keeps every whole line before it") from None

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RunDisplay:
    """Rank 0's live view and shared logs: rich progress bar, TensorBoard, Weights & Biases.

    Other ranks get a silent instance, so the loop never branches on rank to log.
    """

    def __init__(self, *, enabled: bool, total_steps: int, run_dir: Path, progress: bool,
                 tensorboard: bool, wandb_project: str | None, config: dict):
        self.enabled = enabled
        self._total_steps = total_steps
        self._progress = None
        self._task = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        if progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(), transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, stats="")
            self._progress.start()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(RunDir(run_dir).tensorboard))
        if wandb_project:
            import wandb

            # Offline unless the user configured otherwise: works with no network.
            mode = os.environ.get("WANDB_MODE", "offline")
            self._wandb = wandb.init(project=wandb_project, dir=str(run_dir), mode=mode, config=config,
                                     name=Path(run_dir).name)

    def step(self, record: dict, log: bool) -> None:
        """Advance the bar; every `log` step also update the text and push scalars."""
        if not self.enabled:
            return
        if log:
            mfu = record.get("mfu")
            mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
            stats = f"loss {record['loss']:.3f}  {record['tokens_per_second']:,.0f} tok/s  MFU {mfu_text} (this step)"
            if self._progress is None:  # plain lines for logs and non-interactive runs
                print(f"step {record['step']}/{self._total_steps}  {stats}", flush=True)
        if self._progress is not None:
            fields = {"stats": stats} if log else {}
            self._progress.update(self._task, completed=record["step"], **fields)
        if log:
            scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step", "rank")}
            if self._tb is not None:
                for key, value in scalars.items():
                    self._tb.add_scalar(f"train/{key}", value, record["step"])
            if self._wandb is not None:
                self._wandb.log(scalars, step=record["step"])

    def eval(self, step: int, val_loss: float) -> None:
        """Record a validation loss."""
        if not self.enabled:
            return
        self.print(f"step {step}: val loss {val_loss:.4f}")
        if self._tb is not None:
            self._tb.add_scalar("val/loss", val_loss, step)
        if self._wandb is not None:
            self._wandb.log({"val_loss": val_loss}, step=step)

    def print(self, text: str) -> None:
        """A message above the bar (rank 0 only)."""
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Stop the bar and flush the loggers."""
        if self._progress is not None:
            self._progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
