"""Bytes the collectives of one training step move through this rank, by mesh dimension and kind.

What the planner's `comm.{dp,tp,pp}_bytes` predict, measured: a `TorchDispatchMode` sees
every collective the step issues, whoever issues it — FSDP2's all-gathers and
reduce-scatters and DDP's all-reduces (`torch.ops.c10d`), DTensor's tensor-parallel
collectives (`torch.ops._c10d_functional`, after DTensor has desugared its op, as torch's
own `CommDebugMode` lets it) and the pipeline's sends and receives. Each is counted with the
ring model the planner uses (`plan/comm.py`), as the bytes each rank sends: an all-reduce
of S bytes over n ranks sends 2(n−1)/n·S from each rank, an all-gather or reduce-scatter
(n−1)/n·S of the whole buffer, a pipeline send S (a receive is the sender's bytes). Its
group's ranks say which mesh dimension it runs on.

`measuring_step` picks the one step a run meters: its second (the first also carries the
pipeline's shape inference and lazy initialisation; a one-step run is not metered), without `torch.compile` or DeepSpeed
(which this mode is not known to compose with) and only with more than one process.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from flopwise.config.mesh_shape import DIMS, MeshShape

c10d = torch.ops.c10d
funcol = torch.ops._c10d_functional

# op -> (kind, where its process group is among the arguments, which argument holds the counted tensors)
_C10D = {
    c10d.allreduce_: ("all_reduce", 1, 0),
    c10d.allreduce_coalesced_: ("all_reduce", 1, 0),
    c10d._allgather_base_: ("all_gather", 2, 0),
    c10d.allgather_into_tensor_coalesced_: ("all_gather", 2, 0),
    c10d._reduce_scatter_base_: ("reduce_scatter", 2, 1),
    c10d.reduce_scatter_tensor_coalesced_: ("reduce_scatter", 2, 1),
    c10d.broadcast_: ("broadcast", 1, 0),
    c10d.send: ("send", 1, 0),  # receives are the sender's bytes: not counted twice
}
_FUNCTIONAL = {  # op -> (kind, position of the group name, factor on the input's bytes for the whole buffer)
    funcol.all_reduce: ("all_reduce", 2, False),
    funcol.all_gather_into_tensor: ("all_gather", 2, True),
    funcol.reduce_scatter_tensor: ("reduce_scatter", 3, False),
    funcol.broadcast: ("broadcast", 2, False),
}


def ring_bytes(kind: str, n: int, nbytes: float) -> float:
    """Bytes through one rank for a collective over `n` ranks on a buffer of `nbytes` (ring model)."""
    if kind == "send":
        return nbytes
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    return (n - 1) / n * nbytes


def dimension_of(ranks: list[int], shape: MeshShape) -> str:
    """Which mesh dimension a group of global ranks spans: "dp", "tp", "pp", or "mixed".

    The mesh is `arange(world).reshape(pp, dp_replicate, dp_shard, tp)` (train/parallel/mesh.py), so a
    group runs along the dimensions in which its ranks' coordinates differ."""
    sizes = [getattr(shape, name) for name in DIMS]

    def coords(rank: int) -> list[int]:
        out = []
        for size in reversed(sizes):
            out.append(rank % size)
            rank //= size
        return out[::-1]

    first = coords(ranks[0])
    varying = {DIMS[i] for r in ranks[1:] for i, c in enumerate(coords(r)) if c != first[i]}
    if varying and varying <= {"dp_replicate", "dp_shard"}:
        return "dp"
    if varying in ({"tp"}, {"pp"}):
        return varying.pop()
    return "mixed"


class CollectiveBytesMeter(TorchDispatchMode):
    """Counts, while active, the bytes each collective moves through this rank: `bytes[dim][kind]`."""

    def __init__(self, shape: MeshShape):
        super().__init__()
        self.shape = shape
        self.bytes: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._dims: dict[str, tuple[str, int]] = {}  # group name -> (dimension, size)

    def _group(self, group) -> tuple[str, int]:
        if isinstance(group, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            group = _resolve_process_group(group)
        elif not isinstance(group, dist.ProcessGroup):
            group = dist.ProcessGroup.unbox(group)
        name = group.group_name
        if name not in self._dims:
            ranks = dist.get_process_group_ranks(group)
            self._dims[name] = (dimension_of(ranks, self.shape), len(ranks))
        return self._dims[name]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor

        if any(t is DTensor or issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor desugars the op into plain-tensor collectives, seen next
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in _C10D:
            kind, at_group, at_tensors = _C10D[packet]
            tensors = args[at_tensors]
            nbytes = sum(_nbytes(t) for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors]))
            self._add(kind, args[at_group], nbytes)
        elif packet in _FUNCTIONAL:
            kind, at_group, gathered = _FUNCTIONAL[packet]
            dim, n = self._group(args[at_group])
            nbytes = _nbytes(args[0]) * (n if gathered else 1)
            self.bytes[dim][kind] += ring_bytes(kind, n, nbytes)
        return out

    def _add(self, kind: str, group, nbytes: float) -> None:
        dim, n = self._group(group)
        self.bytes[dim][kind] += ring_bytes(kind, n, nbytes)

    def per_dimension(self) -> dict[str, float]:
        """Total bytes through this rank per dimension (dp, tp, pp, and mixed if any)."""
        return {dim: sum(kinds.values()) for dim, kinds in self.bytes.items()}

    def to_dict(self) -> dict[str, dict[str, float]]:
        """Bytes by dimension and collective kind, JSON-able."""
        return {dim: dict(kinds) for dim, kinds in self.bytes.items()}


def _nbytes(tensor) -> int:
    if isinstance(tensor, (list, tuple)):
        return sum(_nbytes(t) for t in tensor)
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def measuring_step(first_step: int, max_steps: int, world_size: int, strategy: str, compiled: bool) -> int | None:
    """The step number whose collectives a run counts, or None (see the module docstring)."""
    if world_size == 1 or compiled or strategy == "deepspeed" or first_step + 1 > max_steps:
        return None  # a run of one step keeps that step for the speed figures
    return first_step + 1


DIMENSIONS = ("dp", "tp", "pp", "mixed")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")
