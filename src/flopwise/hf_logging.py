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
    # torchao tries its CUDA-only kernel libraries on import and logs each failure on a CPU, and
    # registers enums torch now handles natively. A filter (unlike a level, which torch's logging
    # setup may reset) drops exactly those notices.
    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.ERROR)
        if not any(isinstance(f, _LoadNoticeFilter) for f in logger.filters):
            logger.addFilter(_LoadNoticeFilter())
    warnings.filterwarnings("ignore", module="torchao")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


class _LoadNoticeFilter(logging.Filter):
    """Drops torchao's "Failed to load <CUDA library>" and torch's enum-registration notices."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Failed to load" in message or "is an Enum subclass" in message)
