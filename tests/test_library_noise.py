"""flopwise.library_noise: library chatter goes to RUN_DIR/library*.log, shown only with -v."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SNIPPET = """
import logging, sys, warnings
from flopwise.library_noise import library_prints_to_log, route_library_noise
path = route_library_noise(sys.argv[1], verbose=sys.argv[2] == "1")
with library_prints_to_log():
    print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
warnings.warn("a library deprecation", FutureWarning)
logging.getLogger("torchao").warning("could not load a CUDA kernel library")
print("the user's line")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_warnings_and_library_logs_go_to_the_log_and_only_with_verbose_to_the_screen(tmp_path, verbose):
    done = subprocess.run([sys.executable, "-c", SNIPPET, str(tmp_path), "1" if verbose else "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "library.log").read_text()
    assert ("built successfully" in done.stdout) == verbose and ("built successfully" in log) != verbose
    assert done.stdout.strip().splitlines()[-1] == "the user's line"
    assert "FutureWarning: a library deprecation" in log and "torchao WARNING: could not load" in log
    shown = "a library deprecation" in done.stderr and "could not load" in done.stderr
    assert shown == verbose
    if not verbose:
        assert done.stderr == ""


@pytest.mark.distributed
def test_a_ddp_run_shows_no_library_warning_and_names_the_log(tmp_path):
    corpus = tmp_path / "text"
    corpus.mkdir()
    (corpus / "items.py").write_text("".join(f"class Item{i % 31}:\n    size = {i % 17}\n" for i in range(3000)))
    config = {
        "model": {"n_layers": 1, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(corpus)], "cache_dir": str(tmp_path / "cache"), "vocab_size": 320, "seq_len": 32,
                 "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"strategy": "ddp", "nproc_per_node": 2},
        "training": {"max_steps": 2, "micro_batch_size": 2, "warmup_steps": 1, "eval_every": 2, "eval_batches": 1},
        "logging": {"run_dir": str(tmp_path / "run"), "progress": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    done = subprocess.run([sys.executable, "-m", "flopwise", "train", "config.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stdout + done.stderr
    logs = [Path(tmp_path / "run" / name) for name in ("library.log", "library.rank1.log")]
    assert all("broadcast_buffers" in log.read_text() for log in logs)
    assert f"are in {logs[0]}, {logs[1]}; -v shows them" in done.stdout


def test_torch_child_loggers_stay_quiet_after_torch_reinstalls_its_handlers(tmp_path):
    snippet = (
        "import logging, sys\n"
        "from flopwise.library_noise import route_library_noise\n"
        "route_library_noise(sys.argv[1], verbose=False)\n"
        "import torch._logging\n"
        "torch._logging._internal._init_logs()\n"  # what torch.compile does on its first call
        "logging.getLogger('torch.utils._pytree').warning('Enum subclass registration is deprecated')\n"
    )
    done = subprocess.run([sys.executable, "-c", snippet, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Enum subclass" not in done.stderr
    assert "Enum subclass registration is deprecated" in (tmp_path / "library.log").read_text()


@pytest.mark.parametrize("verbose", [False, True])
def test_deepspeed_console_handler_added_after_the_routing_stays_quiet(tmp_path, verbose):
    """DeepSpeed attaches its stdout handler when imported, here after the routing (as when transformers
    imports it during `flopwise export`): its "Setting accelerator to CPU" goes to the log, shown with -v."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    snippet = (
        "import logging, sys\n"
        "from flopwise.library_noise import route_library_noise\n"
        "route_library_noise(sys.argv[1], verbose=sys.argv[2] == '1')\n"
        "import deepspeed.utils.logging\n"
        "logging.getLogger('DeepSpeed').warning('a notice of DeepSpeed')\n"
        "print('the user''s line')\n"
    )
    done = subprocess.run([sys.executable, "-c", snippet, str(tmp_path), "1" if verbose else "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "DeepSpeed WARNING: a notice of DeepSpeed" in (tmp_path / "library.log").read_text()
    assert (done.stdout + done.stderr).count("a notice of DeepSpeed") == int(verbose)  # once: no doubled handler
    if not verbose:
        assert "accelerator" not in done.stdout + done.stderr  # DeepSpeed's own, from its import
    assert done.stdout.strip().splitlines()[-1] == "the users line"
