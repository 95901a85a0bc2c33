"""The training loop on one process: accumulation, loss scaling, fp32 norms, checkpointing
memory vs the planner, the HF model path, and what a run writes. Real torch, tiny models."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig
from flopwise.config.loading import load_config
from flopwise.train.data.prepare import prepare_data
from flopwise.train.loop import build_state, lr_at, run_training
from flopwise.config.resolve import batch_layout
from flopwise.train.step import train_step
from flopwise.train.metrics import SavedActivationMeter
from flopwise.train.parallel.distributed import init_distributed

TINY = [
    "model.n_layers=2", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=64",
    "data.vocab_size=320", "data.seq_len=32", "data.prefetch=0", "data.tokenizer_train_bytes=200000",
    "parallel.strategy=single", "parallel.nproc_per_node=1",
    "training.micro_batch_size=4", "training.warmup_steps=2", "training.eval_every=5", "training.eval_batches=2",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small, deterministic Python-like text corpus (~150 KB), tokenized once for the module."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "text").mkdir()
    lines = []
    for i in range(3000):
        lines.append(f"def function_{i % 97}(value, count={i % 13}):\n    return value * {i % 7} + count  # step {i}\n")
    (root / "text" / "code.py").write_text("".join(lines))
    return root


def tiny_cfg(corpus, tmp_path, *extra: str) -> RunConfig:
    return load_config(None, [*TINY, f"data.paths=[{corpus / 'text'}]", f"data.cache_dir={corpus / 'cache'}",
                              f"logging.run_dir={tmp_path / 'run'}", *extra])


def single_env(cfg: RunConfig):
    return init_distributed(cfg.parallel)


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    cfg = load_config(None, ["training.max_steps=100", "training.warmup_steps=10", "training.lr=1e-3",
                             "training.min_lr=1e-4"]).training
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(55, cfg) == pytest.approx(5.5e-4)
    assert lr_at(100, cfg) == pytest.approx(1e-4)


def test_global_batch_must_divide_into_micro_batches():
    cfg = load_config(None, ["training.micro_batch_size=4", "training.global_batch_size=24"]).training
    assert batch_layout(cfg, 2) == (24, 3)
    with pytest.raises(UserError, match="training.global_batch_size: 20 is not a multiple"):
        batch_layout(load_config(None, ["training.micro_batch_size=4", "training.global_batch_size=20"]).training, 2)


def test_accumulating_k_micro_batches_equals_one_batch_k_times_larger(corpus, tmp_path):
    """Same samples, same seed: 4 micro-steps of 2 == 1 step of 8 (fp32, tolerance 1e-5 relative)."""
    results = []
    for extra in (["training.micro_batch_size=2", "training.global_batch_size=8"],
                  ["training.micro_batch_size=8", "training.global_batch_size=8"]):
        cfg = tiny_cfg(corpus, tmp_path, *extra)
        env = single_env(cfg)
        prepared = prepare_data(cfg.data)
        state = build_state(cfg, env, prepared)
        accum = batch_layout(cfg.training, 1)[1]
        losses = [train_step(state, env, accum).loss for _ in range(3)]
        params = torch.cat([p.detach().flatten() for p in state.built.module.parameters()])
        results.append((accum, losses, params))
    (accum_a, losses_a, params_a), (accum_b, losses_b, params_b) = results
    assert (accum_a, accum_b) == (4, 1)
    assert losses_a == pytest.approx(losses_b, rel=1e-5)
    torch.testing.assert_close(params_a, params_b, rtol=1e-5, atol=1e-6)


def test_fp16_grad_scaler_skips_a_step_with_an_inf_gradient_and_lowers_the_scale(corpus, tmp_path):
    cfg = tiny_cfg(corpus, tmp_path, "precision.mode=fp16")
    env = single_env(cfg)
    state = build_state(cfg, env, prepare_data(cfg.data))
    assert state.scaler is not None and state.scaler.get_scale() == 2.0**16
    weight = state.built.module.blocks[0].mlp.w1.weight
    handle = weight.register_hook(lambda grad: grad * float("inf"))
    before = [p.detach().clone() for p in state.built.module.parameters()]
    result = train_step(state, env, 1)
    assert result.skipped and not math.isfinite(result.grad_norm)
    assert state.scaler.get_scale() == 2.0**15
    for old, new in zip(before, state.built.module.parameters()):
        assert torch.equal(old, new), "a skipped step must not change any parameter"
    handle.remove()
    result = train_step(state, env, 1)
    assert not result.skipped and math.isfinite(result.loss)
    assert state.scaler.get_scale() == 2.0**15
    assert not torch.equal(before[0], next(state.built.module.parameters()))


def test_fp32_norms_keep_norm_outputs_fp32_under_bf16(corpus, tmp_path):
    cfg = tiny_cfg(corpus, tmp_path, "precision.mode=bf16", "precision.fp32_norm=true")
    env = single_env(cfg)
    state = build_state(cfg, env, prepare_data(cfg.data))
    dtypes = []
    norms = [m for m in state.built.module.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert norms and all(getattr(m, "fp32_norm", False) for m in norms)
    for norm in norms:
        norm.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    results = [train_step(state, env, 1) for _ in range(2)]
    assert set(dtypes) == {torch.float32}
    assert all(math.isfinite(r.loss) for r in results)
    logits = state.built.model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.dtype == torch.float32  # outside autocast everything is fp32 again


def _saved_bytes(cfg, env, prepared) -> int:
    state = build_state(cfg, env, prepared)
    inputs, targets = next(state.train_loader)
    meter = SavedActivationMeter(state.built.module, state.built.saved_tensor_hooks)
    with meter.measuring():
        loss = torch.nn.functional.cross_entropy(state.built.model(inputs).flatten(0, 1), targets.flatten())
    loss.backward()
    return meter.bytes


def test_activation_checkpointing_cuts_saved_bytes_as_the_planner_predicts(corpus, tmp_path):
    """Measured drop in saved-for-backward bytes vs L x (planner per-layer none - full), within 10%.

    The planner's whole `activations` figure under full recompute also holds one layer's
    recomputed working set during backward, which saved-tensor hooks by design do not see,
    so the comparison is per layer, as Korthikanti et al. (2022) Table 2 states it.
    """
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.planner import plan
    from flopwise.measure.device_peak import cpu_hardware

    shape = ["model.n_layers=3", "model.hidden=64", "model.n_heads=4", "training.micro_batch_size=4"]
    plain = tiny_cfg(corpus, tmp_path, *shape)
    checkpointed = tiny_cfg(corpus, tmp_path, *shape, "training.gradient_checkpointing=true")
    env = single_env(plain)
    prepared = prepare_data(plain.data)
    measured_plain = _saved_bytes(plain, env, prepared)
    measured_ckpt = _saved_bytes(checkpointed, env, prepared)

    hardware = cpu_hardware({"fp32": 1e11}, 1, "test")
    per_layer = {
        name: plan(runspec_from_config(cfg, resolve_run(cfg, processes=1), hardware, vocab_size=prepared.vocab_size)).to_dict()["memory"]["activation_bytes_per_layer"]
        for name, cfg in (("none", plain), ("full", checkpointed))
    }
    predicted_cut = plain.model.n_layers * (per_layer["none"] - per_layer["full"])
    measured_cut = measured_plain - measured_ckpt
    assert measured_ckpt < measured_plain / 2
    assert measured_cut == pytest.approx(predicted_cut, rel=0.10)


def test_int8_activation_compression_shrinks_measured_saved_bytes(corpus, tmp_path):
    shape = ["model.hidden=64", "model.n_heads=4"]
    env = single_env(tiny_cfg(corpus, tmp_path))
    prepared = prepare_data(tiny_cfg(corpus, tmp_path).data)
    plain = _saved_bytes(tiny_cfg(corpus, tmp_path, *shape), env, prepared)
    compressed = _saved_bytes(tiny_cfg(corpus, tmp_path, *shape, "training.activation_compression=int8"), env, prepared)
    assert compressed < plain / 2


def _metrics(run_dir, rank=0):
    return [json.loads(line) for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]


REQUIRED_METRICS = {
    "step", "rank", "loss", "lr", "grad_norm", "tokens_per_second", "step_seconds", "data_seconds",
    "compute_seconds", "optimizer_seconds",
}
MEMORY_METRICS = {"memory_parameters_bytes", "memory_gradients_bytes", "memory_optimizer_bytes",
                  "memory_saved_activations_bytes"}


def test_a_run_trains_and_writes_its_run_directory(corpus, tmp_path, capsys):
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=20", "training.lr=1e-2", "training.eval_every=10",
                   "training.eval_at_start=true", "training.pruning.sparsity=0.6", "logging.tensorboard=true")
    result = run_training(cfg, single_env(cfg))
    run_dir = tmp_path / "run"
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "plan.json", "metrics.rank0.jsonl",
                                                   "predicted_vs_measured.json"}
    assert load_config(run_dir / "config.yaml") == cfg
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(REQUIRED_METRICS <= set(r) for r in rows)
    assert [r["step"] for r in rows if MEMORY_METRICS <= set(r)] == [1, 2, 3, 4, 5, 20]  # measure_every=20
    assert rows[-1]["memory_parameters_bytes"] > 0
    assert rows[-1]["memory_optimizer_bytes"] == 2 * rows[-1]["memory_parameters_bytes"]  # AdamW m and v
    assert [s for s, _ in result.val_losses] == [0, 10, 20]
    assert result.val_losses[-1][1] < result.val_losses[0][1] - 1.0  # clearly falling
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["inputs"]["layout"]["dp"] == 1 and plan["inputs"]["hardware"] == "cpu-measured"
    comparison = json.loads((run_dir / "predicted_vs_measured.json").read_text())
    assert comparison["measured"]["hardware"] == "cpu-measured"
    assert 0 < comparison["measured"]["mfu"]
    assert comparison["measured"]["memory_bytes"]["weights"] == rows[-1]["memory_parameters_bytes"]
    assert comparison["predicted"]["memory_bytes"]["weights"] == rows[-1]["memory_parameters_bytes"]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert "predicted vs measured" in out
    assert "not applied during training" in out  # the seed's pruning block is named, not silently dropped


def test_hf_model_path_trains_a_few_steps(corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    config.save_pretrained(tmp_path / "hf")
    cfg = tiny_cfg(corpus, tmp_path, "model.kind=hf", f"model.hf_config={tmp_path / 'hf' / 'config.json'}",
                   "training.max_steps=3", "training.eval_every=3")
    result = run_training(cfg, single_env(cfg))
    assert result.steps == 3
    assert all(math.isfinite(loss) for loss in result.train_losses)
    rows = _metrics(tmp_path / "run")
    assert len(rows) == 3 and rows[-1]["memory_saved_activations_bytes"] > 0


PLAN_DIR = Path(__file__).resolve().parents[2] / "src" / "flopwise" / "plan"


class PlanEntries:
    """Every call from outside `plan/` into a `plan/` function that hands it a config value: the
    RunConfig, one of its sections, or what `config/` resolved from it (ResolvedRun, MeshShape,
    Precision). Recorded as "caller -> callee", by file and function, while the block runs."""

    def __init__(self):
        self.found: set[str] = set()

    @staticmethod
    def _where(frame) -> str:
        path = Path(frame.f_code.co_filename)
        short = path.relative_to(PLAN_DIR.parents[1]).as_posix() if PLAN_DIR.parents[1] in path.parents else path.name
        return f"{short}:{frame.f_code.co_name}"

    def _profile(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(str(PLAN_DIR)):
            return
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename.startswith(str(PLAN_DIR)):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(type(frame.f_locals.get(name)).__module__.startswith("flopwise.config.") for name in names):
            self.found.add(f"{self._where(caller)} -> {self._where(frame)}")

    def __enter__(self):
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def test_a_planted_entry_into_the_planner_is_recorded(corpus, tmp_path):
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import planned_config

    cfg = tiny_cfg(corpus, tmp_path)
    with PlanEntries() as entries:
        planned_config(cfg, resolve_run(cfg))
        planned_config(cfg, resolve_run(cfg))  # the same call site again: one entry
    assert entries.found == {"test_loop.py:test_a_planted_entry_into_the_planner_is_recorded"
                             " -> flopwise/plan/from_config.py:planned_config"}


def test_the_training_config_enters_the_planner_at_most_twice_in_a_run(corpus, tmp_path):
    """Issue 20's measure: followed from run_training through every call it is passed to, the config
    (or a section of it, or its ResolvedRun) crosses into plan/ at two call sites: the default
    strategy's rule (parallel.strategy unset) and the forecast's bridge, `planned_config`."""
    cfg = tiny_cfg(corpus, tmp_path, "parallel.strategy=null", "training.max_steps=2", "training.eval_every=2")
    env = single_env(cfg)
    with PlanEntries() as entries:
        result = run_training(cfg, env)
    assert result.steps == 2 and cfg.parallel.strategy == "single"
    assert "flopwise/train/prediction.py:prepare -> flopwise/plan/from_config.py:planned_config" in entries.found
    assert len(entries.found) <= 2, "the config enters plan/ at:\n" + "\n".join(sorted(entries.found))


def test_a_device_chosen_precision_is_the_one_the_run_resolves_and_plans(corpus, tmp_path, monkeypatch):
    """A pretrained model's bf16 default on a bf16 GPU changes `precision.mode` before the run is
    resolved, so the forecast plans the precision the model trains in (here on a CPU, the default
    is applied by hand)."""
    from flopwise.train import loop

    def bf16_device(cfg, device):
        cfg.precision.mode = "bf16"
        return "precision.mode=bf16: this device computes in bf16"

    monkeypatch.setattr(loop, "pretrained_precision_default", bf16_device)
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=1", "training.eval_every=1")
    run_training(cfg, single_env(cfg))
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["inputs"]["workload"]["precision"] == "bf16"
    assert load_config(tmp_path / "run" / "config.yaml").precision.mode == "bf16"


@pytest.mark.slow
def test_weights_and_biases_offline_needs_no_network(corpus, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=2", "logging.wandb=true", "logging.log_every=1")
    run_training(cfg, single_env(cfg))
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
