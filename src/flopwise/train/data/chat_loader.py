"""Serving packed chat rows to each data-parallel rank, with the weight that makes the loss token-weighted.

The rows play the part of `loader.TokenLoader`'s windows: position is counted in global
rows consumed, step k gives rank r rows `[k*W*B + r*B, ...)` of a stream that is one
seeded permutation of all rows per epoch, so ranks are disjoint and a run saved with N
ranks resumes with M.

A chat row has few labelled tokens and their number varies from row to row, so the mean
of per-micro-batch means would weigh an answer token in a sparse row more than one in a
full row, and the result would change with the micro-batch size. Instead each batch
carries `loss_weight = W / (labelled tokens of the whole optimizer step, all ranks)`: the
summed token losses times it, accumulated over micro-steps and averaged over W ranks by
DDP / FSDP, is exactly the mean over every labelled token of the step, as one big batch.
The loader can count the step's tokens itself because every rank holds the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from flopwise.errors import UserError
from flopwise.train.data.chat import IGNORE_INDEX
from flopwise.train.data.chat_rows import PreparedChat


@dataclass
class ChatBatch:
    """A micro-batch of packed rows: [B, T] tensors and the step's token weight (see the module docstring)."""

    inputs: object  # torch int64 [B, T]
    targets: object  # -100 where no loss
    position_ids: object  # restart at 0 per document
    segment_ids: object  # document number per token, -1 for padding
    loss_weight: float

    def to(self, device, non_blocking: bool = False) -> ChatBatch:
        """The same batch on `device`."""
        move = [t.to(device, non_blocking=non_blocking)
                for t in (self.inputs, self.targets, self.position_ids, self.segment_ids)]
        return ChatBatch(*move, loss_weight=self.loss_weight)


class ChatLoader:
    """Yields `ChatBatch`es for one rank; 'train' is endless and reshuffled per epoch, 'val' is in order."""

    def __init__(self, prepared: PreparedChat, split: str, micro_batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, grad_accum: int = 1):
        if micro_batch_size < 1 or grad_accum < 1:
            raise UserError(f"micro_batch_size ({micro_batch_size}) and grad_accum ({grad_accum}) must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is outside world_size {world_size}")
        self.split = split
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.grad_accum = grad_accum
        self._prepared = prepared
        rows = prepared.rows(split)
        if not rows:
            raise UserError(f"data.mix: the {split} split has no rows")
        self.seq_len = int(rows[0].input_ids.shape[0])
        self._arrays = {name: np.stack([getattr(row, name) for row in rows])
                        for name in ("input_ids", "targets", "position_ids", "segment_ids")}
        self._labelled = (self._arrays["targets"] != IGNORE_INDEX).sum(axis=1)
        self.num_rows = len(rows)
        self._samples = 0
        self._orders: dict[int, np.ndarray] = {}

    @property
    def samples_per_step(self) -> int:
        """Rows all ranks consume together per micro-step (B * world_size)."""
        return self.micro_batch_size * self.world_size

    def __iter__(self) -> ChatLoader:
        return self

    def __next__(self) -> ChatBatch:
        batch = self.batch_at(self._samples)
        self._samples += self.samples_per_step
        return batch

    def row_ids(self, samples: int) -> list[int]:
        """The row indices this rank reads at global position `samples`."""
        first = samples + self.rank * self.micro_batch_size
        return [self._row(s) for s in range(first, first + self.micro_batch_size)]

    def batch_at(self, samples: int) -> ChatBatch:
        """This rank's micro-batch after `samples` global rows, weighted by its optimizer step's token count."""
        import torch

        rows = self.row_ids(samples)
        tensors = [torch.from_numpy(self._arrays[name][rows])
                   for name in ("input_ids", "targets", "position_ids", "segment_ids")]
        return ChatBatch(*tensors, loss_weight=self.world_size / max(1, self.step_tokens(samples)))

    def step_tokens(self, samples: int) -> int:
        """Labelled tokens of the whole optimizer step that position `samples` belongs to, over all ranks."""
        per_step = self.samples_per_step * self.grad_accum
        start = samples // per_step * per_step
        return int(sum(int(self._labelled[self._row(s)]) for s in range(start, start + per_step)))

    def _row(self, sample: int) -> int:
        epoch, index = divmod(int(sample), self.num_rows)
        return int(self._order(epoch)[index])

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if self.split == "train":
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            else:
                order = np.arange(self.num_rows)
            self._orders = {k: v for k, v in self._orders.items() if k >= epoch - 1}
            self._orders[epoch] = order
        return order

    def reset(self) -> None:
        """Start again from the first batch."""
        self._samples = 0

    def val_batches(self, n: int) -> Iterator[ChatBatch]:
        """The first `n` batches of this split, the same ones on every call."""
        self.reset()
        for _ in range(n):
            yield next(self)

    def state_dict(self) -> dict:
        """Where the loader stands, as JSON-able data; world-size independent."""
        epoch, position = divmod(self._samples, self.num_rows)
        return {"split": self.split, "epoch": epoch, "position": position, "seed": self.seed,
                "seq_len": self.seq_len, "num_rows": self.num_rows, "sha256": self._prepared.sha256(self.split)}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` left off (any world size; the same rows)."""
        try:
            epoch, position, seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
            num_rows = int(state["num_rows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"chat data loader state is incomplete or malformed ({exc})") from None
        if num_rows != self.num_rows or state.get("sha256") != self._prepared.sha256(self.split):
            raise UserError(f"the {self.split} chat rows changed since the checkpoint ({num_rows} rows then, "
                            f"{self.num_rows} now, or other tokens); resume with the same data.mix and data settings")
        self.seed = seed
        self._orders = {}
        self._samples = epoch * self.num_rows + position

    def close(self) -> None:
        """Nothing runs in the background; here for the loop's symmetry with TokenLoader."""
