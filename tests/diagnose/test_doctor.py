"""flopwise doctor: structured rows, JSON output, the rules behind each status, and life without torch."""

import json
import os
import subprocess
import sys

import pytest

from flopwise.cli import main
from flopwise.diagnose import doctor
from flopwise.diagnose.doctor import (
    STATUSES,
    build_check,
    capability_check,
    check_python,
    driver_check,
    socket_ifname_check,
    threads_check,
)

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
ARCHES_WITH_HOPPER = ["sm_80", "sm_86", "sm_90"]


def test_run_checks_returns_structured_rows_for_this_machine():
    checks = doctor.run_checks()
    names = [c.name for c in checks]
    for expected in ("python", "torch", "torch build", "distributed backends", "fsdp2 (fully_shard)", "cpu cores", "threads", "NCCL_DEBUG", "deepspeed"):
        assert expected in names
    assert all(c.status in STATUSES for c in checks)
    assert all(c.fix for c in checks if c.status != "ok"), "every warn/fail row says what to do"
    backends = next(c for c in checks if c.name == "distributed backends")
    assert "gloo" in backends.value


def test_doctor_json_parses_and_exit_code_follows_failures(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert {"name", "status", "value", "fix"} <= set(data["checks"][0])
    assert sum(data["summary"].values()) == len(data["checks"])
    assert (exit_info.value.code or 0) == (1 if data["summary"]["fail"] else 0)


def test_doctor_without_torch_fails_that_row_with_the_install_command():
    code = "import sys; sys.modules['torch'] = None; from flopwise.cli import main; main(['doctor', '--json'])"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    data = json.loads(proc.stdout)
    torch_row = next(c for c in data["checks"] if c["name"] == "torch")
    assert torch_row["status"] == "fail" and "pip install torch" in torch_row["fix"]
    assert proc.returncode == 1
    assert any(c["name"] == "CUDA_VISIBLE_DEVICES" and c["status"] == "warn" for c in data["checks"])


def test_python_version_floor():
    assert check_python((3, 9, 18)).status == "fail"
    assert check_python((3, 11, 7)).status == "ok"


@pytest.mark.parametrize(
    "torch_cuda, status",
    [("11.7", "fail"), ("11.8", "warn"), ("12.4", "ok")],
)
def test_hopper_needs_cuda_11_8_and_gets_a_warning_below_12(torch_cuda, status):
    check = capability_check(0, *H100, torch_cuda, ARCHES_WITH_HOPPER)
    assert check.status == status
    if status != "ok":
        assert "CUDA" in check.fix


def test_torch_without_kernels_for_the_gpu_fails():
    check = capability_check(0, *H100, "12.1", ["sm_70", "sm_80", "sm_86"])
    assert check.status == "fail" and "sm_90" in check.fix
    # PTX for an older architecture is JIT-compiled for a newer GPU.
    assert capability_check(0, *H100, "12.1", ["sm_80", "compute_80"]).status == "ok"


def test_driver_against_the_runtime_torch_was_built_with():
    assert driver_check((12, 8), "12.4").status == "ok"
    assert driver_check((12, 2), "12.8").status == "warn"  # minor-version compatibility
    assert driver_check((11, 8), "12.1").status == "fail"
    assert driver_check(None, "12.1").status == "fail"


def test_cpu_torch_on_a_gpu_machine_fails():
    assert build_check(None, None, nvidia_gpu_present=True).status == "fail"
    assert build_check(None, None, nvidia_gpu_present=False).status == "ok"
    assert "RCCL" in build_check(None, "6.2", nvidia_gpu_present=False).fix


def test_socket_ifname_must_match_an_interface():
    interfaces = ["lo", "eth0", "ib0"]
    assert socket_ifname_check("eth", interfaces).status == "ok"
    assert socket_ifname_check("=eth", interfaces).status == "fail"
    assert socket_ifname_check("ens5", interfaces).status == "fail"
    assert socket_ifname_check("^docker", interfaces).status == "ok"


def test_thread_oversubscription_warns():
    assert threads_check("64", 8).status == "warn"
    assert threads_check("abc", 8).status == "fail"
    assert threads_check("1", 8).status == "ok"
