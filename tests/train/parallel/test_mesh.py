"""Meshes on the real engine: TP 2 x FSDP 2 and HSDP 2 x 2 on 4 gloo processes match one
process training on the whole batch (three SGD steps: losses and gathered weights)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from flopwise.errors import UserError
from flopwise.config.mesh_shape import MeshShape, mesh_shape


def test_shapes_fill_the_world_and_name_the_keys_when_they_cannot():
    assert mesh_shape(8, tp=2) == MeshShape(dp_shard=4, tp=2)
    assert mesh_shape(8, pp=2, tp=2).dp_shard == 2
    assert mesh_shape(4, dp_replicate=2).describe() == "dp_replicate 2 x dp_shard 2"
    assert mesh_shape(1).describe() == "single process"
    with pytest.raises(UserError, match="parallel.pp x parallel.dp_replicate x parallel.tp = 3 must divide"):
        mesh_shape(4, tp=3)
    with pytest.raises(UserError, match="= 8, but there are 4 processes"):
        mesh_shape(4, dp_shard=4, tp=2)


SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from flopwise.config.schema import ModelConfig
    from flopwise.config.mesh_shape import mesh_shape
    from flopwise.train.parallel.mesh import build_mesh, data_parallel_rank
    from flopwise.train.model import build_model
    from flopwise.train.parallel.tensor_parallel import apply_tp

    layout = sys.argv[1]
    dist.init_process_group("gloo")
    shape = mesh_shape(4, tp=2) if layout == "tp-fsdp" else mesh_shape(4, dp_replicate=2)
    mesh = build_mesh(shape, "cpu")
    cfg = ModelConfig(kind="llama", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, max_seq_len=32)

    def make():
        torch.manual_seed(0)
        return build_model(cfg, 64)

    plain, model = make(), make()
    apply_tp(model, mesh["tp"], sequence_parallel=True)
    dp_mesh = mesh["dp_replicate", "dp_shard"] if shape.dp_replicate > 1 else mesh["dp_shard"]
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    dp_rank, dp_size = data_parallel_rank(mesh)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (plain, model)]
    torch.manual_seed(1)
    for step in range(3):
        ids = torch.randint(0, 64, (2 * dp_size, 16))
        ref = torch.nn.functional.cross_entropy(plain(ids).flatten(0, 1), ids.flatten())
        ref.backward()
        mine = ids[2 * dp_rank: 2 * dp_rank + 2]
        loss = torch.nn.functional.cross_entropy(model(mine).flatten(0, 1), mine.flatten())
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        torch.testing.assert_close(mean.item(), ref.item(), rtol=1e-5, atol=1e-6)
    theirs = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(p.detach(), theirs[name].full_tensor().detach(), rtol=1e-4, atol=1e-5, msg=name)
    print(f"rank {dist.get_rank()} ok {shape.describe()}")
    dist.destroy_process_group()
    # leave without interpreter teardown, as flopwise's workers do (train/launch/worker.py): gloo's C++
    # threads can abort the process there ("terminate called without an active exception")
    sys.stdout.flush()
    os._exit(0)
    """
)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["tp-fsdp", "hsdp"])
def test_a_two_dimensional_mesh_matches_one_process(tmp_path, layout):
    script = tmp_path / "mesh.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script), layout],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert all(f"rank {r} ok" in result.stdout for r in range(4))
