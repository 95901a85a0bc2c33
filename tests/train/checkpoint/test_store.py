"""Checkpoints on one process, real files and real torch: exact resume, manifest and `latest`,
fallback from a corrupted newest checkpoint, retention, the safe metadata loader, the NaN
stop, and `flopwise export`. Tiny models; the whole module runs in well under a minute."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil

import pytest
import torch

from flopwise.errors import UserError
from flopwise.train.checkpoint import store as ckpt
from flopwise.train.checkpoint.hashing import file_digest, preferred_algorithm
from flopwise.train.checkpoint.safe_read import MetadataUnpickler, SafeFileSystemReader, safe_dcp_load
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.train.checkpoint.policy import TrainingDiverged
from flopwise.train.loop import run_training
from flopwise.train.parallel.distributed import init_distributed

TINY = [
    "model.n_layers=2", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=64",
    "data.vocab_size=320", "data.seq_len=32", "data.prefetch=2", "data.tokenizer_train_bytes=200000",
    "parallel.strategy=single", "parallel.nproc_per_node=1",
    "training.micro_batch_size=4", "training.warmup_steps=2", "training.max_steps=8", "training.eval_every=4",
    "training.eval_batches=2", "logging.progress=false",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt-corpus")
    (root / "text").mkdir()
    text = "".join(f"def f_{i % 89}(x, n={i % 11}):\n    return x * {i % 5} - n  # line {i}\n" for i in range(3000))
    (root / "text" / "code.py").write_text(text)
    return root


def run(corpus, run_dir, *extra):
    cfg = load_config(None, [*TINY, f"data.paths=[{corpus / 'text'}]", f"data.cache_dir={corpus / 'cache'}",
                             f"logging.run_dir={run_dir}", *extra])
    return run_training(cfg, init_distributed(cfg.parallel))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """8 uninterrupted steps without any checkpoint: the losses every resumed run must repeat."""
    return run(corpus, tmp_path_factory.mktemp("ref") / "run", "checkpoint.at_end=false").train_losses


@pytest.fixture(scope="module")
def saved(corpus, tmp_path_factory, reference):
    """The same run, checkpointing every 2 steps (saving must not change a single loss)."""
    run_dir = tmp_path_factory.mktemp("saved") / "run"
    result = run(corpus, run_dir, "checkpoint.every_steps=2", "checkpoint.keep_last=10")
    assert result.train_losses == reference
    return run_dir


def test_resume_from_a_middle_checkpoint_repeats_the_losses_bit_for_bit(corpus, tmp_path, saved, reference):
    result = run(corpus, tmp_path / "resumed", f"checkpoint.resume_from={saved / 'checkpoints' / 'step-4'}")
    assert result.train_losses == reference[4:]
    metrics = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.rank0.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [5, 6, 7, 8]


def test_a_checkpoint_has_a_manifest_a_latest_pointer_and_json_trainer_state(saved):
    folder = saved / "checkpoints"
    assert [step for step, _ in ckpt.published_steps(saved)] == [2, 4, 6, 8]
    assert (folder / "latest").read_text().strip() == "step-8"
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp")]
    manifest = ckpt.read_manifest(folder / "step-8")
    assert manifest["step"] == 8 and manifest["world_size"] == 1 and manifest["vocab_size"] == 320
    assert manifest["config"]["training"]["max_steps"] == 8
    names = set(manifest["files"])
    assert {".metadata", "trainer.rank00000.json"} <= names and any(n.endswith(".distcp") for n in names)
    for name, entry in manifest["files"].items():
        assert (folder / "step-8" / name).stat().st_size == entry["bytes"]
        assert len(entry[preferred_algorithm()]) == 64  # blake3 (or sha256 without the package): 256 bits
        assert entry[preferred_algorithm()] == file_digest(folder / "step-8" / name, preferred_algorithm())
    trainer = json.loads((folder / "step-8" / "trainer.rank00000.json").read_text())
    assert trainer["step"] == 8 and trainer["tokens_seen"] == 8 * 4 * 32
    assert trainer["loader"]["position"] == 8 * 4
    assert set(trainer["rng"]) >= {"python", "numpy", "torch"}
    assert trainer["scheduler"]["last_epoch"] == 8
    assert ckpt.verify_checkpoint(folder / "step-8") is None


def test_a_corrupted_newest_checkpoint_is_reported_and_the_previous_one_is_used(
        corpus, tmp_path, saved, reference, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    for step in (6, 8):
        shutil.rmtree(run_dir / "checkpoints" / f"step-{step}")  # make step-4 the one before the newest
    shard = next((run_dir / "checkpoints" / "step-4").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    (run_dir / "checkpoints" / "latest").write_text("step-4\n")
    capsys.readouterr()
    result = run(corpus, run_dir)  # automatic resume: latest valid
    out = capsys.readouterr().out
    assert "step-4: " in out and f"fails its {preferred_algorithm()} checksum (corrupted); falling back to the previous one" in out
    assert "resumed from checkpoint step-2" in out
    assert result.train_losses == reference[2:]


def test_truncated_and_missing_shards_are_detected(saved, tmp_path):
    copy = tmp_path / "step-8"
    shutil.copytree(saved / "checkpoints" / "step-8", copy)
    shard = next(copy.glob("*.distcp"))
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    assert "truncated" in ckpt.verify_checkpoint(copy)
    shard.unlink()
    assert ckpt.verify_checkpoint(copy).startswith("missing file")
    (copy / "manifest.json").unlink()
    assert "incomplete save" in ckpt.verify_checkpoint(copy)
    with pytest.raises(UserError, match="missing|incomplete"):
        ckpt.resolve_checkpoint(tmp_path, str(copy))
    with pytest.raises(UserError, match=r"checkpoint.resume_from: step-99 not found .*step-2, step-4"):
        ckpt.resolve_checkpoint(saved, "step-99")


def test_retention_keeps_the_last_k_and_pinned_steps(corpus, tmp_path):
    run_dir = tmp_path / "run"
    run(corpus, run_dir, "checkpoint.every_steps=2", "checkpoint.keep_last=2", "checkpoint.pin=[2]")
    assert [step for step, _ in ckpt.published_steps(run_dir)] == [2, 6, 8]


def test_the_metadata_loader_refuses_anything_but_dcp_metadata(saved, tmp_path):
    folder = tmp_path / "evil"
    shutil.copytree(saved / "checkpoints" / "step-2", folder)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    (folder / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        SafeFileSystemReader(folder).read_metadata()
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        MetadataUnpickler(io.BytesIO(pickle.dumps(eval))).load()
    real = SafeFileSystemReader(saved / "checkpoints" / "step-2").read_metadata()
    assert "model.output.weight" in real.state_dict_metadata or len(real.state_dict_metadata) > 10


def test_a_nan_loss_stops_the_run_with_a_diagnosis_and_saves_nothing_after_it(corpus, tmp_path):
    """The real step and step boundary; the divergence itself is forced by a NaN weight (the loop
    already skips updates with non-finite gradients, so a tiny model rarely gets there alone)."""
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.checkpoint.policy import StepBoundary
    from flopwise.train.loop import build_state
    from flopwise.train.step import train_step

    run_dir = tmp_path / "nan"
    cfg = load_config(None, [*TINY, f"data.paths=[{corpus / 'text'}]", f"data.cache_dir={corpus / 'cache'}",
                             f"logging.run_dir={run_dir}", "checkpoint.every_steps=1"])
    env = init_distributed(cfg.parallel)
    state = build_state(cfg, env, prepare_data(cfg.data))
    boundary = StepBoundary(cfg, env, vocab_size=320, run=resolve_run(cfg, processes=env.world_size),
                            report=lambda line: None)
    try:
        for _ in range(2):
            boundary.after_step(state, train_step(state, env, 1).loss)
        with torch.no_grad():
            next(state.built.module.parameters()).fill_(float("nan"))
        with pytest.raises(TrainingDiverged) as caught:
            boundary.after_step(state, train_step(state, env, 1).loss)
    finally:
        boundary.close()
        state.train_loader.close()
    message = str(caught.value)
    assert "loss is NaN/Inf at step 3 on rank 0" in message
    assert f"last good checkpoint: {run_dir / 'checkpoints' / 'step-2'}" in message
    assert [step for step, _ in ckpt.published_steps(run_dir)] == [1, 2]
    assert caught.value.exit_code == 3


def test_under_a_loss_scaler_non_finite_steps_are_tolerated_up_to_the_patience():
    from flopwise.train.checkpoint.policy import NonFiniteGuard

    guard = NonFiniteGuard(patience=3, scaler_present=True)
    assert [guard.observe(s, bad) for s, bad in [(1, True), (2, True), (3, False), (4, True), (5, True)]] == [
        False, False, False, False, False]
    assert not guard.healthy and guard.observe(6, True) and guard.first_bad_step == 4
    assert NonFiniteGuard(patience=3, scaler_present=False).observe(1, True)


def test_export_writes_one_safetensors_file_that_compress_can_read(saved, tmp_path):
    from safetensors.torch import load_file

    from flopwise.compress.tasks import find_export
    from flopwise.artifacts.export import export_checkpoint
    from flopwise.train.model import build_model

    result = export_checkpoint(saved, step=4)
    assert result.out == saved / "export" and result.step == 4
    weights, config = find_export(saved)
    assert weights == saved / "export" / "model.safetensors" and config == saved / "config.yaml"
    cfg = load_config(config)
    model = build_model(cfg.model, 320)
    model.load_state_dict(load_file(str(weights)), strict=True)

    # The exported tensors are the checkpoint's: resume the checkpointed weights and compare.
    fresh = build_model(cfg.model, 320).state_dict()
    with ckpt.quiet_single_process_notice():
        safe_dcp_load({"model": fresh}, saved / "checkpoints" / "step-4")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, fresh[name]), name

    with pytest.raises(UserError, match=r"--step: 3 not found"):
        export_checkpoint(saved, step=3, out=tmp_path / "x")


def test_a_time_interval_saves_when_the_minutes_have_passed(corpus, tmp_path):
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.checkpoint.policy import StepBoundary
    from flopwise.train.loop import build_state

    run_dir = tmp_path / "timed"
    cfg = load_config(None, [*TINY, f"data.paths=[{corpus / 'text'}]", f"data.cache_dir={corpus / 'cache'}",
                             f"logging.run_dir={run_dir}", "checkpoint.every_minutes=60"])
    env = init_distributed(cfg.parallel)
    state = build_state(cfg, env, prepare_data(cfg.data))
    boundary = StepBoundary(cfg, env, vocab_size=320, run=resolve_run(cfg, processes=env.world_size),
                            report=lambda line: None)
    try:
        state.step = 1
        boundary.after_step(state, 1.0)
        assert ckpt.published_steps(run_dir) == []
        boundary.last_save_time -= 3601  # an hour later
        state.step = 2
        boundary.after_step(state, 1.0)
        assert [step for step, _ in ckpt.published_steps(run_dir)] == [2]
    finally:
        boundary.close()
        state.train_loader.close()


def test_export_of_an_hf_model_writes_a_folder_transformers_can_load(corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    from flopwise.artifacts.export import export_checkpoint

    config = transformers.LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    config.save_pretrained(tmp_path / "hf")
    run_dir = tmp_path / "run"
    run(corpus, run_dir, "model.kind=hf", f"model.hf_config={tmp_path / 'hf' / 'config.json'}", "training.max_steps=2")
    result = export_checkpoint(run_dir)
    assert result.step == 2 and result.hf_folder == run_dir / "export" / "hf"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(result.hf_folder))
    from safetensors.torch import load_file

    ours = load_file(str(run_dir / "export" / "model.safetensors"))
    tokens = torch.randint(0, 320, (1, 16))
    from flopwise.train.model import build_model

    model = build_model(load_config(run_dir / "config.yaml").model, 320)
    model.load_state_dict(ours)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=tokens).logits, model(tokens), atol=1e-6)


def test_going_back_to_an_older_step_moves_the_newer_ones_aside_and_a_restart_continues_forward(
        corpus, tmp_path, saved, reference):
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    result = run(corpus, run_dir, "checkpoint.resume_from=step-4", "checkpoint.every_steps=2")
    assert result.train_losses == reference[4:]
    assert list((run_dir / "checkpoints" / "superseded").glob("*/step-8"))
    # The same config again (as a torchrun restart or a requeue would): the run's own latest, not step-4.
    again = run(corpus, run_dir, "checkpoint.resume_from=step-4", "checkpoint.every_steps=2", "training.max_steps=8")
    assert again.train_losses == []
