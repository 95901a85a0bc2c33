"""The language-model path: an exported run (model.safetensors + config.yaml) compressed and scored."""

import math
import os
import subprocess
import sys

import pytest
import torch

from flopwise.compress.config import CompressConfig
from flopwise.compress.run import compress_task
from flopwise.compress.tasks import lm_task
from flopwise.config.signature import signed_config_text


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A tiny decoder, briefly trained in-process, exported the way `flopwise export` writes it."""
    from safetensors.torch import save_file

    from flopwise.config.loading import dump_config, load_config
    from flopwise.train.data.loader import TokenLoader
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.model import build_model

    root = tmp_path_factory.mktemp("lmrun")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)))
    run_dir = root / "run"
    cfg = load_config(None, [
        f"data.paths=[{corpus}]", "data.vocab_size=300", "data.seq_len=32", f"data.cache_dir={root / 'cache'}",
        "data.val_fraction=0.1", "model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=32",
        f"logging.run_dir={run_dir}",
    ])
    prepared = prepare_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, prepared.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = TokenLoader(prepared, "train", 32, 8, seed=0, prefetch=0)
    for _ in range(30):
        inputs, targets = next(loader)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    (run_dir / "export").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run_dir / "export" / "model.safetensors"))
    (run_dir / "config.yaml").write_text(signed_config_text(dump_config(cfg)))  # as the run records it
    return run_dir


def _cfg(**kw):
    return CompressConfig(latency_iters=3, latency_warmup=1, latency_batch=4, batch_size=4, eval_batches=2, compile=False, **kw)


def test_lm_int8_dynamic_keeps_validation_loss(exported_run, tmp_path):
    task = lm_task(exported_run, eval_batches=2, batch_size=4)
    result = compress_task(task, _cfg(method="int8-dynamic"), tmp_path)
    before, after = result["summary"]["quality_before"], result["summary"]["quality_after"]
    assert math.isfinite(after) and abs(after - before) / before < 0.02
    assert result["compressed"]["quality"]["perplexity"] == pytest.approx(math.exp(after))


def test_lm_pruned_export_loads_back_with_its_sparsity(exported_run, tmp_path):
    from flopwise.compress import load_compressed
    from flopwise.compress.prune import sparsity_by_layer

    task = lm_task(exported_run, eval_batches=2, batch_size=4)
    result = compress_task(task, _cfg(method="prune", sparsity=0.5), tmp_path)
    assert result["details"]["sparsity"]["overall"] == pytest.approx(0.5, abs=1e-3)
    loaded = load_compressed(tmp_path)
    assert sparsity_by_layer(loaded)["overall"] == pytest.approx(0.5, abs=1e-3)
    x = task.make_input(2)
    with torch.no_grad():
        assert loaded(x).shape == task.model(x).shape


def test_cli_on_run_dir_writes_into_the_run(exported_run):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "flopwise", "compress", str(exported_run), "--method", "2:4", "--no-compile", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (exported_run / "compressed" / "2-4" / "report.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8-static", "qat"])
def test_lm_compiled_int8_static_and_qat_keep_validation_loss(exported_run, tmp_path, method):
    task = lm_task(exported_run, eval_batches=2, batch_size=4)
    cfg = CompressConfig(method=method, latency_iters=3, latency_warmup=1, latency_batch=4, batch_size=4,
                         eval_batches=2, calib_batches=4, qat_steps=10)
    result = compress_task(task, cfg, tmp_path)
    assert result["backend"] == "pt2e-x86" and result["compiled"]
    assert result["summary"]["relative_quality_loss"] < 0.05
    assert result["summary"]["memory_ratio"] > 2.0  # Linear weights int8; embeddings stay fp32


def test_lm_int8_graph_takes_any_sequence_length_in_a_fresh_process(exported_run, tmp_path):
    """The .pt2 is exported with a dynamic sequence dimension (up to max_seq_len), not fixed at calibration length."""
    task = lm_task(exported_run, eval_batches=2, batch_size=4)
    compress_task(task, _cfg(method="int8-dynamic"), tmp_path)
    code = ("import sys, torch\nfrom flopwise.compress import load_compressed\nm = load_compressed(sys.argv[1])\n"
            "print([tuple(m(torch.randint(0, 300, (b, t))).shape) for b, t in ((1, 8), (3, 17), (2, 32))])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[(1, 8, 300), (3, 17, 300), (2, 32, 300)]"


@pytest.mark.slow
@pytest.mark.distributed
def test_fp32_validation_loss_is_the_training_runs_own_last_one(tmp_path):
    """compress scores the float model on the held-out batches the run evaluated, so the figures agree."""
    import json

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)))
    run_dir = tmp_path / "run"
    overrides = [
        f"data.paths=[{corpus}]", "data.vocab_size=300", "data.seq_len=32", f"data.cache_dir={tmp_path / 'cache'}",
        "data.val_fraction=0.2", "model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=32",
        "training.max_steps=4", "training.eval_every=4", "training.eval_batches=3", "training.micro_batch_size=4",
        "parallel.nproc_per_node=2", "parallel.strategy=ddp", f"logging.run_dir={run_dir}", "logging.progress=false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    for args in (["train", *overrides], ["export", str(run_dir)]):
        done = subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads((run_dir / "predicted_vs_measured.json").read_text())["measured"]["val_losses"][-1]
    assert last["step"] == 4
    task = lm_task(run_dir, eval_batches=3)
    assert task.quality(task.model)["val_loss"] == pytest.approx(last["loss"], rel=1e-4)
    assert "the batches the training run evaluated" in task.quality_basis
