"""Keep transformers', datasets' and torchao's progress bars and load notices out of flopwise's output."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_hf_libraries() -> None:
    """Offline, no progress bars, warnings only when something is wrong; call before importing transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # torchao tries its CUDA-only kernel libraries on import and logs each failure on a CPU.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="torchao")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
