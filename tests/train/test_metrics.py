"""The saved-activation meter reads the peak alive, not the sum over a pass."""

from __future__ import annotations

import torch
from torch import nn

from flopwise.train.metrics import SavedActivationMeter


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))


def test_one_forward_counts_every_saved_storage_once():
    model = _model()
    meter = SavedActivationMeter(model)
    with meter.measuring():
        out = model(torch.randn(16, 64))
    # the input, and the ReLU output (saved by ReLU and by the second Linear) once; no weights
    assert meter.bytes == 2 * 16 * 64 * 4
    out.sum().backward()
    assert meter.alive_bytes == 0  # autograd released them all after backward


def test_a_frozen_parameter_gathered_into_new_storage_is_not_an_activation():
    """FSDP2 all-gathers each parameter into a fresh storage before the forward; a frozen one
    (LoRA's base, requires_grad=False), which a linear saves for its input gradient, is a weight."""
    model = _model()
    for param in model.parameters():
        param.requires_grad_(False)
    meter = SavedActivationMeter(model)
    model[2].weight = nn.Parameter(model[2].weight.detach().clone(), requires_grad=False)  # the "unsharded" copy
    x = torch.randn(16, 64, requires_grad=True)
    with meter.measuring():
        out = model(x)
    # the ReLU's output (its mask for the input gradient); the frozen second weight is not counted
    assert meter.bytes == 16 * 64 * 4
    out.sum().backward()


def test_forward_backward_in_turn_peaks_at_one_micro_batch_in_flight():
    """As a pipeline's 1F1B does: each micro-batch's saved tensors are freed by its backward."""
    model = _model()
    single = SavedActivationMeter(model)
    with single.measuring():
        model(torch.randn(16, 64)).sum().backward()
    meter = SavedActivationMeter(model)
    with meter.measuring():
        for _ in range(4):
            model(torch.randn(16, 64)).sum().backward()
    assert meter.bytes == single.bytes
    with meter.measuring():
        outs = [model(torch.randn(16, 64)) for _ in range(2)]  # two in flight
        for out in outs:
            out.sum().backward()
    assert meter.bytes == 2 * single.bytes


FILE_TOO_LARGE = """
import json, resource, signal, sys
from pathlib import Path
from flopwise.errors import UserError
from flopwise.train.metrics import MetricsWriter

run_dir, limit = Path(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
writer = MetricsWriter(run_dir, 0)
try:
    for step in range(1, 1000):
        writer.write({"step": step, "loss": 2.0, "note": "x" * 90})
except UserError as err:
    print(str(err))
"""


def test_a_metrics_line_is_written_whole_or_not_at_all_when_the_file_cannot_grow(tmp_path):
    """RLIMIT_FSIZE (file too large), as a full disk would do: the line that does not fit is cut off again."""
    import json
    import subprocess
    import sys

    limit = 1000  # bytes: a line crosses it part-way
    done = subprocess.run([sys.executable, "-c", FILE_TOO_LARGE, str(tmp_path), str(limit)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    text = (tmp_path / "metrics.rank0.jsonl").read_text()
    steps = [json.loads(line)["step"] for line in text.splitlines()]
    assert text.endswith("\n") and steps == list(range(1, len(steps) + 1)) and len(text) < limit
    assert len(text) + len(text) // len(steps) > limit  # the next line would have crossed it
    message = done.stdout.strip()
    assert "\n" not in message and f"cannot append step {len(steps) + 1}'s metrics (File too large)" in message


def test_flopwise_train_whose_metrics_cannot_grow_stops_with_one_line_and_whole_lines(tmp_path):
    """The same through `flopwise train` (one process, as a user meets it): exit 2, one line, no rank traceback."""
    import json
    import os
    import resource
    import subprocess
    import sys

    corpus = tmp_path / "text"
    corpus.mkdir()
    (corpus / "a.py").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(800)))
    train = [sys.executable, "-m", "flopwise", "train", "model.n_layers=1", "model.hidden=32", "model.n_heads=2",
             "model.max_seq_len=32", "data.vocab_size=300", "data.seq_len=16", "data.tokenizer_train_bytes=50000",
             f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}", "training.micro_batch_size=2",
             "parallel.strategy=single", "parallel.nproc_per_node=1", "logging.progress=false",
             "checkpoint.every_steps=1000", "training.eval_every=1000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    warm = subprocess.run([*train, "training.max_steps=1", f"logging.run_dir={tmp_path / 'warm'}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert warm.returncode == 0, warm.stderr[-2000:]  # the data cache exists: only the run's own files grow

    limit = 20_000  # bytes per file: the metrics file crosses it tens of steps in, before any checkpoint

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes fail EFBIG

    run_dir = tmp_path / "run"
    done = subprocess.run([*train, "training.max_steps=400", f"logging.run_dir={run_dir}"], capture_output=True,
                          text=True, env=env, timeout=300, preexec_fn=small_files)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "metrics.rank0.jsonl: cannot append step" in lines[0], done.stderr[-3000:]
    text = (run_dir / "metrics.rank0.jsonl").read_text()
    steps = [json.loads(line)["step"] for line in text.splitlines()]
    assert text.endswith("\n") and steps == list(range(1, len(steps) + 1)) and f"step {len(steps) + 1}'s" in lines[0]
