"""Fuzz: over 1,000 invalid configs, overrides and CLI flags, each must end in one error line.

Validation only, in this process (no training, no torchrun): zero tracebacks, zero hangs
(each case runs under an alarm), zero exit-0. A handful also go through a real
`python -m flopwise` subprocess, the way a user meets them.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys

import pytest

import typer

from flopwise.cli import app
from flopwise.errors import UserError
from flopwise.compress.config import parse_compress_config
from flopwise.config.loading import load_train_config
from tests.fuzz.bad_inputs import Case, generate, write_input_files

CASE_LIMIT_SECONDS = 30  # a hang guard, not a speed claim: a valid plan on this CPU takes ~1 s

CASES = generate()
COMMAND = typer.main.get_command(app)  # built once: typer rebuilds it on every app() call


def main(argv: list[str]) -> None:
    """`flopwise.cli.main` on the prebuilt click command: a UserError is one line on stderr and exit 2."""
    try:
        COMMAND.main(args=argv, prog_name="flopwise", standalone_mode=True)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        if "\n" in str(err):
            raise
        sys.exit(err.exit_code)


class Hung(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    def fire(signum, frame):
        raise Hung(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_case(case: Case, tmp_path) -> str | None:
    """None when the case was refused properly, else what went wrong."""
    try:
        with alarm(CASE_LIMIT_SECONDS):
            if case.kind == "override":
                load_train_config(None, list(case.payload), parse_compress_config)
                return "accepted"
            if case.kind == "file":
                path = tmp_path / "bad.yaml"
                path.write_text(case.payload[0], encoding="utf-8")
                load_train_config(str(path), list(case.payload[1:]), parse_compress_config)
                return "accepted"
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    main([part.replace("{tmp}", str(tmp_path)) for part in case.payload])
                except SystemExit as stop:
                    code = stop.code
                else:
                    code = 0
            text = out.getvalue() + err.getvalue()
            if code in (0, None):
                return "exit 0"
            if "Traceback" in text:
                return "traceback: " + text[-500:]
            return None
    except UserError as refused:
        return "more than one line" if "\n" in str(refused) else None
    except Hung as hung:
        return str(hung)
    except BaseException as crash:  # noqa: BLE001  (any other exception is the bug this test looks for)
        return f"{type(crash).__name__}: {str(crash)[:300]}"


def test_the_generator_is_seeded_and_large_enough():
    assert len(CASES) >= 1000
    assert generate() == CASES
    assert {c.kind for c in CASES} == {"override", "file", "cli"}


def test_every_invalid_input_is_refused_with_one_line(tmp_path):
    write_input_files(tmp_path)
    failures = []
    for case in CASES:
        problem = run_case(case, tmp_path)
        if problem is not None:
            failures.append(f"{case}  ->  {problem}")
    assert not failures, f"{len(failures)} of {len(CASES)} cases:\n" + "\n".join(failures[:40])


SUBPROCESS_CASES = [
    ["train", "training.seed=99999999999999999999"],
    ["train", "training.lr=.nan"],
    ["train", "compress.sparsity=1.5"],
    ["plan", "--pue", "0.5"],
    ["compare", "--gpus", "1000000000000000000000000000000"],
]


@pytest.mark.parametrize("argv", SUBPROCESS_CASES, ids=lambda a: " ".join(a)[:40])
def test_as_a_user_meets_them_one_line_and_exit_2(argv, tmp_path):
    done = subprocess.run([sys.executable, "-m", "flopwise", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert not list(tmp_path.iterdir()), "an invalid input must not create files"
