"""train/parallel/comm_volume.py: collective bytes counted from the ops a real step issues."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from flopwise.train.parallel.comm_volume import dimension_of, measuring_step, ring_bytes
from flopwise.config.mesh_shape import MeshShape


def test_ring_bytes_follow_the_planners_model():
    assert ring_bytes("all_reduce", 4, 1000) == 1500  # 2(n-1)/n
    assert ring_bytes("all_gather", 4, 1000) == 750 == ring_bytes("reduce_scatter", 4, 1000)
    assert ring_bytes("send", 2, 1000) == 1000
    assert ring_bytes("all_reduce", 1, 1000) == 0


def test_a_groups_ranks_name_its_mesh_dimension():
    shape = MeshShape(pp=2, dp_shard=2, tp=2)  # ranks = arange(8).reshape(2, 1, 2, 2)
    assert dimension_of([0, 1], shape) == "tp"
    assert dimension_of([0, 2], shape) == "dp"
    assert dimension_of([1, 5], shape) == "pp"
    assert dimension_of([0, 1, 2, 3], shape) == "mixed"
    assert dimension_of([0, 2], MeshShape(dp_replicate=2, dp_shard=2)) == "dp"  # HSDP: both dp dims
    assert dimension_of([0, 1, 2, 3], MeshShape(dp_replicate=2, dp_shard=2)) == "dp"


def test_one_step_is_metered_never_the_only_one():
    assert measuring_step(1, 10, 4, "fsdp", False) == 2
    assert measuring_step(6, 10, 4, "pipeline", False) == 7  # a resumed run
    assert measuring_step(1, 1, 4, "fsdp", False) is None
    assert measuring_step(1, 10, 1, "single", False) is None
    assert measuring_step(1, 10, 4, "deepspeed", False) is None
    assert measuring_step(1, 10, 4, "fsdp", True) is None


SCRIPT = textwrap.dedent('''
    import json, os, sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from flopwise.train.parallel.comm_volume import CollectiveBytesMeter
    from flopwise.config.mesh_shape import MeshShape
    mesh = init_device_mesh("cpu", (2,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    meter = CollectiveBytesMeter(MeshShape(dp_shard=2))
    with meter:
        model(torch.randn(4, 16)).sum().backward()
        t = torch.ones(10)
        op = dist.P2POp(dist.isend if dist.get_rank() == 0 else dist.irecv, t, 1 - dist.get_rank())
        for work in dist.batch_isend_irecv([op]):
            work.wait()
    # the reported rank per dimension: the one that sends the most in it, all its kinds
    from flopwise.train.parallel.distributed import DistEnv
    from flopwise.train.loop import _largest_comm_bytes
    rank = dist.get_rank()
    env = DistEnv(rank, 2, rank, "gloo", torch.device("cpu"), True)
    local = {"dp": {"all_gather": 10.0, "reduce_scatter": 1.0}} if rank == 0 else {
        "dp": {"all_gather": 5.0, "reduce_scatter": 8.0}, "pp": {"send": 3.0}}
    largest = _largest_comm_bytes(local, env)
    if dist.get_rank() == 0:
        print(json.dumps(largest))
        print(json.dumps(meter.to_dict()))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.mark.distributed
def test_fsdp2_gathers_and_scatters_and_a_send_are_counted(tmp_path):
    script = tmp_path / "meter.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counted = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = 2 * (16 * 16 + 16) * 4  # the whole model in fp32
    # each layer is gathered for forward and again for backward, half of it sent by each rank;
    # the gradients are reduce-scattered once; rank 0 sends 10 floats
    assert counted["dp"] == {"all_gather": weights, "reduce_scatter": weights / 2, "send": 40.0}
    # rank 1 sends more over dp (13 bytes to 11): its kinds, not the largest of each kind over ranks
    largest = json.loads(proc.stdout.strip().splitlines()[-2])
    assert largest == {"dp": {"all_gather": 5.0, "reduce_scatter": 8.0}, "pp": {"send": 3.0}}
