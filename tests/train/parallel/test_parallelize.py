"""parallelize.apply_fsdp on the real engine: consecutive blocks grouped into FSDP2 units by `parallel.fsdp_unit_mb`.

A one-process gloo world is enough to see which blocks share a unit (FSDP2 gives the
modules of one `fully_shard([...])` call one state); the 2-process runs that train with
grouped units are in test_distributed.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch, torch.distributed as dist
    from flopwise.config.schema import ModelConfig, ParallelConfig
    from flopwise.plan.fsdp_units import planned_blocks_per_unit
    from flopwise.plan.spec import Layout, Workload
    from flopwise.train.model import build_model, transformer_blocks
    from flopwise.train.parallel.distributed import DistEnv
    from flopwise.train.parallel.parallelize import apply_fsdp
    from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing

    dist.init_process_group("gloo")
    env = DistEnv(0, 1, 0, "gloo", torch.device("cpu"), True)
    out = {}
    for unit_mb, checkpoint in ((0.0, False), (3.0, False), (4.0, True), (100.0, False)):
        torch.manual_seed(0)
        model = build_model(ModelConfig(n_layers=4, hidden=192, n_heads=6), 4096)
        names = [name for name, _ in model.named_parameters()]
        if checkpoint:
            apply_activation_checkpointing(model, True)
        blocks = transformer_blocks(model)
        per_block = sum(p.numel() for p in blocks[0].parameters())
        apply_fsdp(model, blocks, ParallelConfig(strategy="fsdp", fsdp_unit_mb=unit_mb), env, None)
        states = [id(block._get_fsdp_state()) for block in blocks]
        sizes = [states.count(s) for s in dict.fromkeys(states)]
        planned = planned_blocks_per_unit(Layout(framework="fsdp", fsdp_unit_mb=unit_mb), Workload(precision="fp32"),
                                          per_block, len(blocks))
        out[str(unit_mb)] = {"sizes": sizes, "planned": planned,
                             "names_kept": [n for n, _ in model.named_parameters()] == names,
                             "loss": model(torch.arange(32).view(2, 16)).float().mean().item()}
    print("RESULT " + json.dumps(out))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown, as train/launch/worker.py: gloo threads can abort there
    """
)


def test_blocks_are_grouped_into_units_by_parameter_bytes_as_the_planner_plans(tmp_path):
    script = tmp_path / "units.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with socket.socket() as free:  # a port no other test's process group holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    units = json.loads(line.removeprefix("RESULT "))
    # one block of this decoder holds 1.69 MiB of fp32 parameters
    assert units["0.0"]["sizes"] == [1, 1, 1, 1]  # 0: one unit per block, as before
    assert units["3.0"]["sizes"] == [2, 2]
    assert units["4.0"]["sizes"] == [3, 1]  # the last group is what is left; with activation checkpointing
    assert units["100.0"]["sizes"] == [4]
    for unit in units.values():
        assert unit["planned"] == unit["sizes"][0]  # the planner groups the same blocks
        assert unit["names_kept"]  # checkpoint keys (FQNs) do not depend on the grouping
    assert len({unit["loss"] for unit in units.values()}) == 1  # the same forward, bit for bit
