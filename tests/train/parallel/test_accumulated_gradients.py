"""What a rank holds while flopwise's trainer accumulates gradients under FSDP2, measured on 2 real
processes and compared with what `flopwise plan` counts for the same config (plan/stage_memory.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import json, os, sys, torch, torch.distributed as dist
    from flopwise.config.loading import load_config
    from flopwise.config.precision import precision_of
    from flopwise.train.model import Decoder
    from flopwise.train.parallel.distributed import DistEnv
    from flopwise.train.parallel.parallelize import apply_fsdp
    from flopwise.train.parallel.strategy_torch import gradient_sync
    from flopwise.train.techniques.precision import fsdp_mixed_precision_policy

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = sys.argv[2]
    cfg = load_config(sys.argv[1], ["parallel.strategy=fsdp", f"precision.mode={mode}"])
    torch.manual_seed(0)
    model = Decoder(cfg.model, 4096)
    if mode == "bf16-true":
        model.to(torch.bfloat16)
    env = DistEnv(rank, 2, rank, "gloo", torch.device("cpu"), True)
    model = apply_fsdp(model, model.blocks, cfg.parallel, env, fsdp_mixed_precision_policy(precision_of(mode)))
    ids = torch.randint(0, 4096, (2, 32))

    def held_gradient_bytes():
        """Every gradient FSDP keeps for its parameters now: the unsharded accumulation, or the shard."""
        total, seen = 0, set()
        for module in model.modules():
            state = getattr(module, "_get_fsdp_state", None)
            group = state()._fsdp_param_group if state else None
            if group is None or id(group) in seen:  # blocks grouped in one unit share its state
                continue
            seen.add(id(group))
            for p in group.fsdp_params:
                for grad in (p.unsharded_accumulated_grad, p._unsharded_param.grad if hasattr(p, "_unsharded_param") else None,
                             p.sharded_param.grad):
                    if grad is not None:
                        local = grad.to_local() if hasattr(grad, "to_local") else grad
                        total += local.numel() * local.element_size()
        return total

    with gradient_sync(model, enabled=False):  # a non-final accumulation micro-step, as the trainer runs it
        model(ids).float().sum().backward()
    during = held_gradient_bytes()
    with gradient_sync(model, enabled=True):  # the final one reduce-scatters
        model(ids).float().sum().backward()
    after = held_gradient_bytes()
    params = sum(p.numel() for p in model.parameters())  # sharded DTensors: numel is the global count
    if rank == 0:
        print(json.dumps({"during": during, "after": after, "params": params}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.mark.distributed
@pytest.mark.parametrize("mode, accumulated_bytes", [("bf16-params", 4), ("bf16-true", 2)])
def test_fsdp_accumulation_holds_whole_gradients_as_the_plan_counts(tmp_path, mode, accumulated_bytes):
    """Between micro-steps each rank holds the whole model's gradients, upcast to FSDP's fp32 reduce dtype
    under a 16-bit parameter policy; after the synced step only its shard. The plan of the same config
    with accumulation counts those whole gradients, and without accumulation the shard."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.planner import plan

    script = tmp_path / "accumulate.py"
    script.write_text(SCRIPT)
    config = ROOT / "configs" / "default.yaml"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
                           str(config), mode], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["during"] == measured["params"] * accumulated_bytes
    assert measured["after"] < measured["during"] / 1.5  # the shard (padded), in the parameters' dtype

    def planned_gradients(micro_steps: int) -> float:
        overrides = ["parallel.strategy=fsdp", f"precision.mode={mode}", "training.micro_batch_size=2",
                     f"training.global_batch_size={4 * micro_steps}"]
        cfg = load_config(config, overrides)
        return plan(runspec_from_config(cfg, resolve_run(cfg, processes=2), get_hardware("h100-sxm"))).memory.gradients

    assert planned_gradients(2) == pytest.approx(measured["during"], rel=0.02)
    assert planned_gradients(1) < measured["during"] / 1.5
