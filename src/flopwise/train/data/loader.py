"""The trainer's runtime token stream: `TokenLoader` serves each data-parallel rank its own
[B, T] windows from the shards `prepare_data` built, resumably.

The token stream is cut into non-overlapping windows of `seq_len + 1` tokens (nanoGPT's
`get_batch`, minus the randomness per call: here every epoch is one seeded permutation of all
windows). Position is counted in *global* samples consumed, and step k gives rank r the
samples `[k*W*B + r*B, k*W*B + (r+1)*B)` of that stream, so ranks are disjoint, an epoch is
covered exactly once, and a run saved with N ranks resumes with M.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np

from flopwise.errors import UserError
from flopwise.train.data.files import PreparedData
from flopwise.train.data.shards import open_shard


class TokenLoader:
    """Yields `(inputs, targets)` int64 [B, T] batches for one rank; see the module docstring.

    'train' is infinite and reshuffles every epoch; 'val' walks the windows in order, the
    same sequence every time (`reset()` / `val_batches(n)` start it over).
    """

    def __init__(
        self,
        prepared: PreparedData,
        split: str,
        seq_len: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        prefetch: int = 4,
        pin_memory: bool | None = None,
    ):
        if seq_len < 1 or micro_batch_size < 1:
            raise UserError(f"seq_len ({seq_len}) and micro_batch_size ({micro_batch_size}) must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is outside world_size {world_size}")
        if prefetch < 0:
            raise UserError(f"data.prefetch is {prefetch}; it must be >= 0")
        self.split = split
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.prefetch = prefetch
        self._prepared = prepared  # its sha256 goes into the state: a resume on other data is refused
        # Page-locked batches let `.to(cuda, non_blocking=True)` overlap the copy with compute.
        self.pin_memory = _cuda_available() if pin_memory is None else pin_memory
        self._shards = [open_shard(p, prepared.token_dtype) for p in prepared.shards(split)]
        per_shard = np.array([max(0, (len(s) - 1) // seq_len) for s in self._shards], dtype=np.int64)
        self._window_starts = np.concatenate([[0], np.cumsum(per_shard)])
        self.num_windows = int(self._window_starts[-1])
        if self.num_windows == 0:
            tokens = sum(len(s) for s in self._shards)
            raise UserError(
                f"the {split} split has {tokens} tokens, fewer than seq_len+1 = {seq_len + 1}; "
                "add data, lower seq_len or raise data.val_fraction"
            )
        self._samples = 0  # global samples consumed, over all ranks and epochs
        self._orders: dict[int, np.ndarray] = {}
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()

    @property
    def tokens_per_batch(self) -> int:
        """Tokens in one of this rank's batches (B * T)."""
        return self.micro_batch_size * self.seq_len

    @property
    def samples_per_step(self) -> int:
        """Samples all ranks consume together per step (B * world_size)."""
        return self.micro_batch_size * self.world_size

    @property
    def epoch(self) -> int:
        """The epoch the next batch starts in."""
        return self._samples // self.num_windows

    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self):
        if self.prefetch == 0:
            batch = self.batch_at(self._samples)
        else:
            if self._thread is None:
                self._start_thread()
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._thread = None
                raise item
            batch = item
        self._samples += self.samples_per_step
        return batch

    def batch_at(self, samples: int):
        """This rank's batch for the step that starts after `samples` global samples."""
        import torch

        first = samples + self.rank * self.micro_batch_size
        sample_ids = np.arange(first, first + self.micro_batch_size, dtype=np.int64)
        windows = np.empty_like(sample_ids)
        for i, sample in enumerate(sample_ids):
            epoch, index = divmod(int(sample), self.num_windows)
            windows[i] = self._order(epoch)[index]
        rows = np.empty((self.micro_batch_size, self.seq_len + 1), dtype=np.int64)
        shard_ids = np.searchsorted(self._window_starts, windows, side="right") - 1
        for i, (window, shard) in enumerate(zip(windows, shard_ids)):
            start = int(window - self._window_starts[shard]) * self.seq_len
            rows[i] = self._shards[shard][start : start + self.seq_len + 1]
        tensor = torch.from_numpy(rows)
        inputs, targets = tensor[:, :-1].contiguous(), tensor[:, 1:].contiguous()
        if self.pin_memory:
            inputs, targets = inputs.pin_memory(), targets.pin_memory()
        return inputs, targets

    def window_ids(self, samples: int) -> list[int]:
        """The window indices this rank reads at position `samples` (for checks and tests)."""
        first = samples + self.rank * self.micro_batch_size
        return [
            int(self._order(s // self.num_windows)[s % self.num_windows])
            for s in range(first, first + self.micro_batch_size)
        ]

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if self.split == "train":
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            else:
                order = np.arange(self.num_windows)
            self._orders = {k: v for k, v in self._orders.items() if k >= epoch - 1}
            self._orders[epoch] = order
        return order

    def reset(self) -> None:
        """Start again from the first batch (the val split then repeats exactly)."""
        self._stop_thread()
        self._samples = 0

    def val_batches(self, n: int) -> Iterator:
        """The first `n` batches of this split, the same ones on every call."""
        self.reset()
        try:
            for _ in range(n):
                yield next(self)
        finally:
            # No prefetching between evaluations: a producer thread left running could be
            # inside a torch call when the interpreter exits, which aborts the process.
            self._stop_thread()

    def state_dict(self) -> dict:
        """Where the loader stands, as JSON-able data; world-size independent."""
        epoch, position = divmod(self._samples, self.num_windows)
        return {
            "split": self.split,
            "epoch": epoch,
            "position": position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_windows": self.num_windows,
            "sha256": self._prepared.sha256(self.split),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` left off, with any world size or micro batch size."""
        try:
            epoch, position, seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
            seq_len, num_windows = int(state["seq_len"]), int(state["num_windows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"data loader state is incomplete or malformed ({exc})") from None
        if state.get("split", self.split) != self.split:
            raise UserError(f"data loader state is for the {state['split']} split, not {self.split}")
        if seq_len != self.seq_len:
            raise UserError(
                f"the checkpoint's data loader used seq_len {seq_len}, this run uses {self.seq_len}; "
                "resume with the same seq_len"
            )
        if num_windows != self.num_windows:
            raise UserError(
                f"the {self.split} data changed since the checkpoint ({num_windows} windows then, "
                f"{self.num_windows} now); resume with the same data settings"
            )
        saved, now = state.get("sha256"), self._prepared.sha256(self.split)
        if saved is not None and saved != now:  # checkpoints from before the fingerprint have none
            raise UserError(
                f"the {self.split} data changed since the checkpoint: the same {num_windows} windows, but other "
                f"tokens (sha256 {str(saved)[:12]}... then, {now[:12]}... now); resume on the data the run was "
                "trained on, or start a fresh logging.run_dir"
            )
        self._stop_thread()
        self.seed = seed
        self._orders = {}
        self._samples = epoch * self.num_windows + position

    def close(self) -> None:
        """Stop the prefetch thread."""
        self._stop_thread()

    def __del__(self):
        try:
            self._stop_thread()
        except Exception:
            pass

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(
            target=self._produce,
            args=(self._samples, self._queue, self._stop),
            name=f"flopwise-prefetch-{self.split}-r{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def _produce(self, samples: int, out: queue.Queue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                batch = self.batch_at(samples)
                while not stop.is_set():
                    try:
                        out.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                samples += self.samples_per_step
        except BaseException as exc:  # handed to the consumer, raised on its next()
            out.put(exc)

    def _stop_thread(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        self._queue = None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
