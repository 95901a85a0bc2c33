"""`flopwise plan` as a real process: default example, --json, one-line errors, no torch."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "plan", *args], capture_output=True, text=True,
                          env=ENV, timeout=60)


def test_default_example_prints_every_section():
    out = run()
    assert out.returncode == 0, out.stderr
    for title in ("Parameters", "FLOPs", "Memory per device", "Time", "Energy and cost", "assumptions"):
        assert title in out.stdout
    assert "Llama 2 7B" in out.stdout and "fits" in out.stdout


def test_json_output_parses_and_carries_inputs():
    out = run("--json", "--model", "gpt3-175b", "--hardware", "a100-80gb", "--gpus", "1024", "--tp", "8",
              "--pp", "8", "--tokens", "300B", "--sequence-parallel", "--recompute", "selective")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["inputs"]["model"] == "gpt3-175b" and data["inputs"]["layout"]["dp"] == 16
    assert data["flops"]["kaplan_6nd_total"] == pytest.approx(3.14e23, rel=5e-3)
    assert isinstance(data["fits"], bool) and data["time"]["mfu"] > 0


@pytest.mark.parametrize("args", [
    ("--gpus", "8", "--dp", "3"),
    ("--tp", "3", "--gpus", "3"),
    ("--pp", "100", "--gpus", "100"),
    ("--model", "no-such-model"),
    ("--hardware", "no-such-chip"),
    ("--tokens", "a lot"),
    ("--precision", "int3"),
])
def test_bad_input_exits_2_with_one_line(args):
    out = run(*args)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_calibrate_option_uses_the_measured_mfu(tmp_path):
    (tmp_path / "predicted_vs_measured.json").write_text(json.dumps({"measured": {"mfu": 0.25, "hardware": "h100-sxm"}}))
    data = json.loads(run("--json", "--calibrate", str(tmp_path)).stdout)
    assert data["time"]["efficiency"] == 0.25 and data["time"]["mfu"] <= 0.25 + 1e-12


NO_TORCH = """
import sys
{body}
assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]
print('ok')
"""


def test_planner_import_does_not_import_torch():
    body = "import flopwise.plan.planner, flopwise.plan.calibration; flopwise.plan.planner.plan(flopwise.plan.planner.build_runspec())"
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(body=body)], capture_output=True, text=True, env=ENV)
    assert out.stdout.strip() == "ok", out.stderr


def test_plan_command_does_not_import_torch():
    body = ("from flopwise.cli import main\nsys.argv = ['flopwise', 'plan', '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "sys.stdout = sys.__stdout__")
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(body=body)], capture_output=True, text=True, env=ENV)
    assert out.stdout.strip().endswith("ok"), out.stderr
