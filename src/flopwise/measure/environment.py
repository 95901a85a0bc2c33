"""What the run ran on, written once by rank 0 as RUN_DIR/environment.json.

A report read weeks later must say which torch, which device and how many threads made
its numbers; the config alone does not.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from pathlib import Path

from flopwise.runrecord.run_dir import RunDir
from flopwise.safe_write import make_folder, write_file

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "DS_ACCELERATOR")


def describe_environment() -> dict:
    """Host, Python, library versions, devices and the thread/device variables that change speed."""
    import torch

    from flopwise import __version__

    cuda = torch.cuda.is_available()
    record = {
        "flopwise": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus_visible": torch.cuda.device_count() if cuda else 0,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch_threads": torch.get_num_threads(),
        "bf16_matmul_native": _native_bf16(),
        "variables": {name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
    }
    for package in ("deepspeed", "transformers", "torchao"):
        try:
            from importlib.metadata import version

            record[package] = version(package)
        except Exception:  # not installed: nothing to record
            continue
    return record


def _native_bf16() -> bool | None:
    from flopwise.measure.bf16_on_cpu import cpu_has_native_bf16

    return cpu_has_native_bf16()


def write_environment(run_dir: str | Path) -> Path:
    """Rank 0 writes RUN_DIR/environment.json (other ranks return the path untouched)."""
    path = RunDir(run_dir).environment
    if int(os.environ.get("RANK", "0")) == 0:
        make_folder(path.parent)
        write_file(path, json.dumps(describe_environment(), indent=2) + "\n")
    return path
