"""One DeviceMesh for every layout: pipeline × replicate × shard × tensor.

The world is split as torchtitan does (`ParallelDims`): `pp` outermost, then data
parallelism as `dp_replicate` (HSDP's replicas, or DDP) × `dp_shard` (FSDP2's shards),
then `tp` innermost so tensor-parallel peers are neighbours (same node on real clusters,
where the fastest link is). The shape itself, checked, is `config/mesh_shape.py`'s.
"""

from __future__ import annotations

from flopwise.config.mesh_shape import DIMS, MeshShape


def build_mesh(shape: MeshShape, device_type: str):
    """A named DeviceMesh over all four dimensions (size-1 ones included, so names always resolve)."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = tuple(getattr(shape, name) for name in DIMS)
    return init_device_mesh(device_type, sizes, mesh_dim_names=DIMS)


def data_parallel_rank(mesh) -> tuple[int, int]:
    """(rank, size) of this process among the data-parallel replicas: who reads which batch.

    Tensor-parallel and pipeline peers read the same batch.
    """
    rep, shard = mesh["dp_replicate"], mesh["dp_shard"]
    return rep.get_local_rank() * shard.size() + shard.get_local_rank(), rep.size() * shard.size()


def dp_mesh_of(mesh, shape: MeshShape):
    """The sub-mesh FSDP2 shards over: ("dp_replicate", "dp_shard") for HSDP, else "dp_shard"."""
    return mesh["dp_replicate", "dp_shard"] if shape.dp_replicate > 1 else mesh["dp_shard"]
