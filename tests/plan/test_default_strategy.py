"""plan/default_strategy.py: `parallel.strategy` unset is chosen for the device and the model, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.config.loading import load_config
from flopwise.plan.default_strategy import choose_strategy, memory_only_hardware, settle_strategy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.yaml"
CPU_SHARE = memory_only_hardware("cpu", 16 * 2**30)  # one process's share of a 32 GiB machine
BIG = ["model.n_layers=48", "model.hidden=6144", "model.n_heads=48", "data.vocab_size=32000"]  # ~22 B parameters


def test_a_whole_replica_that_fits_on_a_cpu_is_ddp_and_says_why():
    choice = choose_strategy(load_config(DEFAULT, []), CPU_SHARE, "cpu")
    assert choice.strategy == "ddp" and choice.chosen
    assert "2 processes, gloo on a CPU" in choice.reason and "a whole replica fits" in choice.reason
    assert choice.line().startswith("parallel.strategy: ddp (chosen: ") and "\n" not in choice.line()


def test_a_replica_too_large_for_a_process_is_fsdp_on_a_cpu_and_on_gpus():
    cfg = load_config(DEFAULT, BIG)
    cpu = choose_strategy(cfg, CPU_SHARE, "cpu")
    assert cpu.strategy == "fsdp" and "does not fit" in cpu.reason
    gpus = choose_strategy(load_config(DEFAULT, [*BIG, "parallel.nproc_per_node=8"]), get_hardware("h100-sxm"), "cuda")
    assert gpus.strategy == "fsdp" and "8 processes, NCCL" in gpus.reason
    small = choose_strategy(load_config(DEFAULT, ["parallel.nproc_per_node=8"]), get_hardware("h100-sxm"), "cuda")
    assert small.strategy == "ddp"


@pytest.mark.parametrize("overrides, strategy, why", [
    (["parallel.nproc_per_node=1"], "single", "one process"),
    (["parallel.nproc_per_node=4", "parallel.tp=2"], "fsdp", "parallel.tp=2"),
    (["parallel.nproc_per_node=4", "parallel.pp=2"], "pipeline", "parallel.pp=2"),
    (["precision.mode=bf16-params"], "fsdp", "16-bit parameters"),
    (["parallel.offload=optimizer"], "fsdp", "parallel.offload=optimizer"),
    (["parallel.nnodes=2"], "fsdp", "2 nodes choose without talking"),
])
def test_what_only_one_strategy_does_decides_it(overrides, strategy, why):
    choice = choose_strategy(load_config(DEFAULT, overrides), CPU_SHARE, "cpu")
    assert choice.strategy == strategy and why in choice.reason


def test_an_explicit_strategy_always_wins_and_settling_writes_the_choice_into_the_config():
    explicit = load_config(DEFAULT, [*BIG, "parallel.strategy=ddp"])
    assert choose_strategy(explicit, CPU_SHARE, "cpu").strategy == "ddp"
    assert not choose_strategy(explicit, CPU_SHARE, "cpu").chosen
    cfg = load_config(DEFAULT, [])
    assert cfg.parallel.strategy is None
    settle_strategy(cfg, CPU_SHARE, "cpu")
    assert cfg.parallel.strategy == "ddp"


def test_plan_config_plans_the_strategy_the_trainer_picks_on_this_device(tmp_path):
    """`plan --config configs/default.yaml` with this CPU's profile plans what `flopwise train` chooses here."""
    from flopwise.train.launch.strategy_choice import settle_for_this_device

    trainer = settle_for_this_device(load_config(DEFAULT, []))
    profile = ROOT / "tests" / "plan" / "cpu_profile_for_strategy.json"
    _write_cpu_profile(tmp_path / "cpu.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--config", str(DEFAULT), "--profile",
                          str(tmp_path / "cpu.json"), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"parallel.strategy: {trainer.strategy} (chosen: " in out.stderr
    layout = json.loads(out.stdout)["inputs"]["layout"]
    assert layout["zero_stage"] == {"ddp": 0, "fsdp": 3}[trainer.strategy]
    assert not profile.exists()


def _write_cpu_profile(path: Path) -> None:
    """A small CPU profile of two processes: `plan --profile` plans on this machine's memory per process."""
    from flopwise.plan.profile import DeviceProfile, GemmPoint

    DeviceProfile(device="cpu (test)", device_kind="cpu", gemm=(GemmPoint("fp32", 256, 256, 256, 5e10),),
                  memory_bandwidth_bytes_per_s=1e10, threads=1, processes=2).save(path)
