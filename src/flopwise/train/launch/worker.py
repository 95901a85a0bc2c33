"""The per-process entry torchrun starts: `python -m flopwise.train.launch.worker CONFIG.yaml`.

The config is the resolved one `flopwise train` wrote into the run directory. A
mistake found here (a data path, a model config) ends this rank with one line and exit
code 2; under `flopwise train` the line goes to the launcher, which prints it once.
A preemption (SIGTERM/SIGUSR1, checkpoint saved) exits with 75, a diverged loss with 3.
"""

from __future__ import annotations

import os
import sys
import traceback

from flopwise.errors import Preempted, UserError



def main(argv: list[str] | None = None) -> None:
    """Load the config and run this rank, then leave without interpreter teardown.

    The rank has closed its files, loaders and process group by then. Skipping the
    teardown (`os._exit`) avoids a known abort ("terminate called without an active
    exception") when C++ threads of torch/gloo or a daemon thread inside a torch call are
    torn down during interpreter finalization, which would turn a finished run into a
    failed rank.
    """
    from flopwise.train.launch.heartbeat import start_beating, stop_beating
    from flopwise.train.launch.start import LAUNCHER_PID_ENV
    from flopwise.train.launch.parent_watch import die_with_parent

    launcher = os.environ.get(LAUNCHER_PID_ENV)
    die_with_parent(int(launcher) if launcher and launcher.isdigit() else None)  # no orphans if the launcher dies
    rank = int(os.environ.get("RANK", "0"))
    start_beating(rank)  # the launcher ends the job when this rank stops beating (train/launch/heartbeat.py)
    code = run(sys.argv[1:] if argv is None else argv)
    stop_beating(rank)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(args: list[str]) -> int:
    """This rank's work; returns its exit code (0, 2 for a user error, 75 preempted, 3 diverged)."""
    if len(args) != 1:
        print("usage: python -m flopwise.train.launch.worker CONFIG.yaml", file=sys.stderr)
        return 2
    _clear_report()  # a message left by an earlier attempt (before a restart) is not this one's
    try:
        # inside the try: a failure while importing is reported like any other error of this rank
        from flopwise.config.loading import load_config
        from flopwise.train.launch.start import run_here

        run_here(load_config(args[0]))
    except UserError as err:
        if isinstance(err, Preempted):
            from flopwise.train.launch.start import ignore_stop_signals

            ignore_stop_signals()  # saved: a further signal must not turn the report into a traceback
        _report(str(err))
        return err.exit_code
    except KeyboardInterrupt:  # SIGINT before the run took over the stop signals: the launcher says it
        return 130
    except ModuleNotFoundError as err:  # an optional extra (deepspeed, transformers, ...) is missing
        from flopwise.extras import missing_extra_message

        message = missing_extra_message(err)
        if message is None:
            traceback.print_exc()
            return 1
        _report(message)
        return 2
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # a bug: show it, fail this rank
        traceback.print_exc()
        return 1
    return 0


def _clear_report() -> None:
    error_file = os.environ.get("FLOPWISE_ERROR_FILE")
    if error_file:
        rank = int(os.environ.get("RANK", "0"))
        try:
            os.unlink(f"{error_file}.rank{rank:05d}")
        except FileNotFoundError:
            pass


def _report(message: str) -> None:
    error_file = os.environ.get("FLOPWISE_ERROR_FILE")
    rank = os.environ.get("RANK", "0")
    if error_file:
        try:
            with open(f"{error_file}.rank{int(rank):05d}", "w", encoding="utf-8") as handle:
                handle.write(message)
            return
        except OSError:  # the launcher's folder is gone (it stopped first): say it here instead
            pass
    print(f"error: {message}", file=sys.stderr)


if __name__ == "__main__":
    main()
