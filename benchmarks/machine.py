"""What machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info() -> dict:
    """CPU model, core count, Python and platform: enough to tell two result files apart."""
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}
