"""Keep library chatter out of the user's run and in a log file beside it.

DeepSpeed's import raises dozens of torch `FutureWarning`s per rank, DDP warns about
`broadcast_buffers` on every rank, torchao logs each CUDA kernel library it cannot load on
a CPU machine. None of it is about the user's run, and on a 2-rank run it buries the
progress bar. `route_library_noise` sends Python warnings and the loggers of those
libraries to `<folder>/library.log` (one file per rank under torchrun); with
`verbose=True` (`-v`, or FLOPWISE_VERBOSE=1 set by it for the ranks) they are shown as
well. flopwise's own messages are printed, never sent through `warnings`, so nothing of
the run is hidden.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

from flopwise.safe_write import make_folder, open_for_append

VERBOSE_ENV = "FLOPWISE_VERBOSE"
LIBRARY_LOGGERS = ("deepspeed", "torchao", "torch", "transformers", "datasets", "py.warnings")
# torch._logging re-installs its own console handler on "torch" when torch.compile starts, so
# the chatty children also get a filter of their own (filters on a logger survive that).
TORCH_CHILDREN = ("torch.utils._pytree", "torch._dynamo", "torch._inductor", "torch.distributed", "torch._export",
                  "torch.export", "torch.ao")
# DeepSpeed attaches a stdout handler to its "DeepSpeed" logger when it is imported, which is often
# after the routing (transformers imports it to check for it: "Setting accelerator to CPU"): a filter
# routes that logger's records whatever handlers arrive later.
FILTERED_LOGGERS = (*TORCH_CHILDREN, "DeepSpeed")
_installed: dict[str, object] = {}


def verbose_requested() -> bool:
    """True when `-v` was given to this command or to the `flopwise train` that started this rank."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def log_path_for(folder: Path) -> Path:
    """`folder/library.log`, or `folder/library.rank<R>.log` inside a torchrun rank other than 0."""
    from flopwise.runrecord.run_dir import RunDir

    return RunDir(folder).library_log(int(os.environ.get("RANK", "0")))


def route_library_noise(folder: Path | str, verbose: bool | None = None) -> Path:
    """Send warnings and library loggers to folder/library.log; also show them when verbose.

    Returns the log file. Idempotent within a process: a second call moves the log.
    """
    verbose = verbose_requested() if verbose is None else verbose
    path = log_path_for(Path(folder))
    make_folder(path.parent)
    for key in ("handler", "console"):
        previous = _installed.pop(key, None)
        if isinstance(previous, logging.Handler):
            previous.close()
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).removeHandler(previous)
    handler = _NoFollowFileHandler(path, mode="a", encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    _installed["handler"] = handler
    _installed["verbose"] = verbose
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if verbose and not any(_is_console(h) for h in logger.handlers):
            _installed["console"] = console
            logger.addHandler(console)
        if not verbose:
            # a library's own console handler (attached at its import, before this call): quieted
            for console in [h for h in logger.handlers if _is_console(h)]:
                console.setLevel(logging.CRITICAL + 1)
            logger.propagate = False
    for name in FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _ToLogFile)]:
            logger.removeFilter(old)
        logger.addFilter(_ToLogFile(handler, verbose))
    if not verbose:
        logging.lastResort = None  # a library record with no handler left must not reach stderr

    original = _installed.setdefault("showwarning", warnings.showwarning)

    def showwarning(message, category, filename, lineno, file=None, line=None):
        with _append_text(path) as log:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))
        if verbose:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    warnings.simplefilter("default")  # each distinct warning once per place, into the log
    return path


@contextlib.contextmanager
def library_prints_to_log():
    """Route what a library `print`s (DeepSpeed's "... built successfully" per rank) to the library log.

    Only around calls into the library (e.g. `deepspeed.initialize`); shown as well when verbose,
    and left alone before `route_library_noise` has chosen the log file.
    """
    handler = _installed.get("handler")
    if _installed.get("verbose", True) or not isinstance(handler, logging.FileHandler):
        yield
        return
    with _append_text(Path(handler.baseFilename)) as log, contextlib.redirect_stdout(log):
        yield


def _append_text(path: Path):
    """The library log opened for appending text, never through a link planted in the run directory."""
    return os.fdopen(open_for_append(path), "a", encoding="utf-8")


class _NoFollowFileHandler(logging.FileHandler):
    """logging's FileHandler, opening its file with `_append_text`."""

    def _open(self):
        return _append_text(Path(self.baseFilename))


class _ToLogFile(logging.Filter):
    """Write the record to the library log; let it go on to the console only when verbose."""

    def __init__(self, handler: logging.Handler, verbose: bool):
        super().__init__()
        self.handler, self.verbose = handler, verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.handler.level:
            self.handler.handle(record)
        return self.verbose


def _is_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
        and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
