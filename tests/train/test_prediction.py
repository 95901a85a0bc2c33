"""Predicted vs measured: the device's peak, plan.json, and the end-of-run comparison."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch

from flopwise.plan.profile import load_profile
from flopwise.config.loading import load_config
from flopwise.train.parallel.distributed import DistEnv
from flopwise.measure.device_peak import CPU_KEY, catalog_entry_for_cuda, cpu_hardware, cuda_hardware, measure_matmul_flops
from flopwise.train.prediction import Forecast, compare, format_comparison, prepare

GIB = 2**30
CPU_ENV = DistEnv(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"), distributed=False)


@pytest.mark.parametrize(
    "name, memory_gib, key",
    [
        ("NVIDIA H100 80GB HBM3", 79.6, "h100-sxm"),
        ("NVIDIA H100 PCIe", 79.6, "h100-pcie"),
        ("NVIDIA H200", 139.8, "h200"),
        ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", 79.2, "a100-80gb-pcie"),
        ("Tesla V100-SXM2-32GB", 31.7, "v100-32gb"),
        ("NVIDIA GeForce RTX 4090", 23.6, "rtx4090"),
        ("NVIDIA L40S", 44.5, "l40s"),
    ],
)
def test_cuda_device_names_map_to_their_catalog_entry(name, memory_gib, key):
    spec = catalog_entry_for_cuda(name, int(memory_gib * GIB))
    assert spec is not None and spec.key == key


@pytest.mark.parametrize("name, memory_gib", [("Tesla T4", 14.7), ("NVIDIA H100 NVL", 93.1), ("Radeon Pro", 16.0)])
def test_unknown_gpu_gives_no_mfu_and_says_why(name, memory_gib):
    spec, source, reason = cuda_hardware(name, int(memory_gib * GIB))
    assert spec is None and source == "none"
    assert name in reason and "not in the hardware catalog" in reason
    forecast = Forecast(plan=None, hardware_key="unknown", hardware_name=name, peak_flops=None, peak_source=source,
                        flops_per_token=1e6, world_size=1, notes=[f"no MFU: {reason}"])
    assert forecast.mfu(1000.0) is None
    comparison = compare(forecast, _measured())
    assert comparison.measured["mfu"] is None
    assert "no MFU" in format_comparison(comparison)


def test_cpu_peak_is_measured_and_labelled():
    flops = measure_matmul_flops(torch.float32, n=256, seconds=0.05)
    assert math.isfinite(flops) and flops > 1e8
    spec = cpu_hardware({"fp32": flops}, 2, "measured CPU peak: test")
    assert spec.key == CPU_KEY
    assert spec.peak_flops("fp32") == pytest.approx(flops)
    assert spec.peak_flops("bf16") is None  # never borrowed from another dtype or chip
    assert spec.sources["peak_tflops"].startswith("measured CPU peak")
    assert spec.devices_per_node == 2


def _measured(tokens_per_second: float = 1000.0) -> dict:
    return {"parameters": 100, "gradients": 100, "optimizer": 200, "activations": 700, "cuda_peak_allocated": None,
            "tokens_per_second": tokens_per_second, "step_seconds": 1.0, "final_train_loss": 3.0,
            "val_losses": [(0, 8.0), (10, 4.0)], "steps": 10}


def _real_plan(*overrides: str):
    """The planner's own Plan for a tiny built-in model on a CPU-measured device."""
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.planner import plan

    cfg = load_config(None, ["model.n_layers=2", "model.hidden=64", "model.n_heads=4", "data.seq_len=64", *overrides])
    return plan(runspec_from_config(cfg, resolve_run(cfg), cpu_hardware({"fp32": 1e11}, 2, "test"), vocab_size=512))


def test_comparison_puts_prediction_beside_measurement_for_calibration():
    planned = _real_plan()
    forecast = Forecast(plan=planned, hardware_key=CPU_KEY, hardware_name="cpu", peak_flops=1e10,
                        peak_source="measured CPU peak", flops_per_token=2e6, world_size=2)
    comparison = compare(forecast, _measured(1000.0))
    predicted, measured, ratio = comparison.predicted, comparison.measured, comparison.measured_over_predicted
    memory = planned.memory
    # optimizer states + fp32 master weights; activations + logits
    assert predicted["memory_bytes"]["optimizer"] == memory.optimizer_states + memory.master_weights > 0
    assert predicted["memory_bytes"]["activations"] == memory.activations + memory.logits > 0
    assert predicted["tokens_per_second"] == planned.time.tokens_per_second
    assert measured["memory_bytes"]["total"] == 1100
    assert measured["mfu"] == pytest.approx(2e6 * 1000.0 / (2 * 1e10))
    assert measured["hardware"] == CPU_KEY  # read by `flopwise plan --calibrate`
    assert ratio["tokens_per_second"] == pytest.approx(1000.0 / planned.time.tokens_per_second)
    assert ratio["memory_weights"] == pytest.approx(100 / memory.weights)
    assert "predicted vs measured" in format_comparison(comparison)


def test_plan_json_is_the_planners_output_for_this_run(tmp_path):
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.planner import plan

    cfg = load_config(None, ["model.n_layers=2", "model.hidden=64", "model.n_heads=4", "data.seq_len=64",
                             "parallel.strategy=single", "parallel.nproc_per_node=1",
                             "training.gradient_checkpointing=true", f"logging.run_dir={tmp_path / 'run'}"])
    forecast = prepare(cfg, resolve_run(cfg), 512, CPU_ENV)
    written = json.loads((tmp_path / "run" / "plan.json").read_text())
    hardware = cpu_hardware({"fp32": forecast.peak_flops}, 1, forecast.peak_source)
    profile = load_profile(forecast.profile["path"])  # the device profile the prediction used
    assert forecast.peak_flops == profile.peak_flops("fp32")
    expected = plan(runspec_from_config(cfg, resolve_run(cfg), hardware, vocab_size=512), profile=profile).to_dict()
    assert written == json.loads(json.dumps(expected, default=str))
    assert written["inputs"]["layout"]["recompute"] == "full"
    assert written["inputs"]["workload"]["precision"] == "fp32"
    assert forecast.peak_source.startswith("measured CPU peak")
    assert forecast.flops_per_token == written["flops"]["model_per_unit"]
    assert forecast.mfu(1000.0) > 0


def test_bf16_on_cpu_reports_mfu_against_the_bf16_peak(tmp_path):
    """A real bf16 run on this CPU: MFU divides by the measured bf16 peak, never the fp32 one, so it stays <= 100 %."""
    from flopwise.train.loop import run_training
    from flopwise.train.parallel.distributed import init_distributed

    text = tmp_path / "text"
    text.mkdir()
    (text / "code.py").write_text("".join(f"def f_{i % 50}(x):\n    return x * {i % 7}  # {i}\n" for i in range(3000)))
    cfg = load_config(None, [
        "model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=64", "data.vocab_size=320",
        "data.seq_len=64", "data.prefetch=0", "data.tokenizer_train_bytes=100000", f"data.paths=[{text}]",
        f"data.cache_dir={tmp_path / 'cache'}", "parallel.strategy=single", "parallel.nproc_per_node=1",
        "precision.mode=bf16", "training.max_steps=8", "training.micro_batch_size=8", "training.eval_every=8",
        "training.eval_batches=1", "logging.progress=false", f"logging.run_dir={tmp_path / 'run'}",
    ])
    run_training(cfg, init_distributed(cfg.parallel))
    comparison = json.loads((tmp_path / "run" / "predicted_vs_measured.json").read_text())
    profile = load_profile(comparison["profile"]["path"])
    # the run names the profile that predicted it, by a hash of the very file, and the load it ran under
    record = comparison["profile"]
    assert record["sha256"] == hashlib.sha256(Path(record["path"]).read_bytes()).hexdigest()
    assert record["source"] in ("cache", "measured") and record["cpu_count"] == os.cpu_count()
    load = comparison["measured"]["machine_load"]
    assert load["cpu_count"] == os.cpu_count() and load["own_threads"] == torch.get_num_threads()
    assert load["start"] is not None and load["end"] is not None
    # The same figure computed on two paths (mean of the profile's points, then JSON): equal to rounding.
    assert comparison["hardware"]["peak_flops"] == pytest.approx(profile.peak_flops("bf16"), rel=1e-12)
    assert profile.peak_flops("bf16") != pytest.approx(profile.peak_flops("fp32"), rel=1e-3)
    assert 0 < comparison["measured"]["mfu"] <= 1.0
    assert 0 < comparison["predicted"]["mfu"] <= 1.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.rank0.jsonl").read_text().splitlines()]
    assert rows and all(0 < row["mfu"] <= 1.0 for row in rows)


def test_offloaded_model_states_are_compared_as_host_bytes():
    planned = _real_plan("parallel.offload=params")
    host = planned.memory.cpu_offload_bytes
    assert host > 0
    forecast = Forecast(plan=planned, hardware_key=CPU_KEY, hardware_name="cpu", peak_flops=None,
                        peak_source="none", flops_per_token=None, world_size=2)
    comparison = compare(forecast, _measured())
    measured, ratio = comparison.measured["memory_bytes"], comparison.measured_over_predicted
    assert measured["host_offload"] == 400 and measured["weights"] == 0 and measured["total"] == 700
    assert ratio["memory_host_offload"] == pytest.approx(400 / host)
    counted = sum(planned.memory.per_device_bytes()[k] for k in ("weights", "gradients", "optimizer", "activations"))
    # the counted components; `other` is not measured on CPU
    assert comparison.predicted["memory_bytes"]["counted_total"] == pytest.approx(counted)
    assert measured["counted_total"] == 700
    assert "memory: host (offloaded)" in format_comparison(comparison)


def test_activation_checkpointing_gets_a_footnote_under_the_terminal_table():
    """Under recompute the planner counts a block's recomputed activations the meter never sees, so the
    activations ratio reads well below 1: the terminal table says why, as the JSON notes do."""
    from flopwise.train.prediction import RECOMPUTE_FOOTNOTE, RECOMPUTE_NOTE

    def comparison_of(*overrides):
        forecast = Forecast(plan=_real_plan(*overrides), hardware_key=CPU_KEY, hardware_name="cpu", peak_flops=None,
                            peak_source="none", flops_per_token=None, world_size=2)
        return compare(forecast, _measured())

    for every in ("true", "2"):
        checkpointed = comparison_of(f"training.gradient_checkpointing={every}")
        text = format_comparison(checkpointed)
        assert RECOMPUTE_NOTE in checkpointed.notes
        flat = " ".join(text.split())  # the footnote wraps at the console's width
        assert "memory: activations †" in text and RECOMPUTE_FOOTNOTE in flat
        assert flat.index(RECOMPUTE_FOOTNOTE) > flat.index("└")  # under the table
    plain = comparison_of()
    assert RECOMPUTE_NOTE not in plain.notes and "†" not in format_comparison(plain)


def test_collective_bytes_are_compared_per_mesh_dimension():
    planned = _real_plan()  # FSDP2 over 2 processes: data-parallel traffic only
    comm = planned.comm
    assert comm.dp_bytes > 0 and comm.tp_bytes == 0 and comm.pp_bytes == 0
    forecast = Forecast(plan=planned, hardware_key=CPU_KEY, hardware_name="cpu", peak_flops=None,
                        peak_source="none", flops_per_token=None, world_size=2)
    measured = dict(_measured(), comm_bytes={"dp": {"all_gather": 600.0, "reduce_scatter": 300.0}})
    comparison = compare(forecast, measured)
    ratio = comparison.measured_over_predicted
    assert comparison.measured["comm_bytes_per_step"] == {"dp": 900.0}
    assert comparison.predicted["comm_bytes_per_step"] == {"dp": comm.dp_bytes, "tp": 0.0, "pp": 0.0}
    assert ratio["comm_dp"] == pytest.approx(900.0 / comm.dp_bytes)
    assert (ratio["comm_tp"], ratio["comm_pp"]) == (1.0, 1.0)  # nothing planned, nothing sent
    text = format_comparison(comparison)
    assert "sent per step: dp" in text and "sent per step: tp" not in text


SRC_TRAIN = Path(__file__).resolve().parents[2] / "src" / "flopwise" / "train"
# Every `.to_dict()` train/ calls, by receiver: records it writes, never a plan (the plan stays typed
# inside the trainer: `Forecast.plan: Plan`, serialised once by `runrecord.write_plan`).
TO_DICT_RECEIVERS = {"meter": "the collective-bytes meter of one step", "StepRecord": "a metrics row"}


def to_dict_receivers(root: Path = SRC_TRAIN) -> list[tuple[str, str]]:
    """(file, receiver) of every `X.to_dict()` under `root`; a call's receiver is named by its callee."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_dict":
                receiver = node.func.value
                if isinstance(receiver, ast.Call):
                    receiver = receiver.func
                found.append((path.relative_to(root).as_posix(), ast.unparse(receiver)))
    return found


def test_no_plan_is_turned_into_a_dict_inside_the_trainer():
    from typing import get_type_hints

    from flopwise.plan.planner import Plan

    assert get_type_hints(Forecast)["plan"] == Plan | None
    unknown = [(path, receiver) for path, receiver in to_dict_receivers() if receiver not in TO_DICT_RECEIVERS]
    assert not unknown, f"to_dict() of something else than a record inside train/: {unknown}"
    assert {receiver for _, receiver in to_dict_receivers()} == set(TO_DICT_RECEIVERS)  # the scan sees them


def test_a_planted_plan_to_dict_is_found(tmp_path):
    (tmp_path / "writer.py").write_text("def write(forecast):\n    return forecast.plan.to_dict()\n")
    assert to_dict_receivers(tmp_path) == [("writer.py", "forecast.plan")]
