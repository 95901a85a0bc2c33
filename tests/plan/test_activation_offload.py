"""Activation offload: saved activations of N blocks per stage in host memory, and the copies' cost."""

import json
import subprocess
import sys

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.errors import UserError
from flopwise.plan import activation_offload as ao
from flopwise.plan import memory as mem
from flopwise.plan.launcher_flags import rewrite
from flopwise.plan.planner import build_runspec, plan

BASE = dict(model="llama3-8b", hardware="h100", gpus=8, tp=1, pp=1, micro_batch=1, global_batch=64, seq_len=4096,
            precision="bf16", zero=1)


def _plan(**over):
    return plan(build_runspec(**{**BASE, **over}))


def test_offloaded_blocks_leave_the_device_but_for_the_window():
    """N of a stage's L blocks: the device sheds N/L of its saved activations less the two blocks in
    transit; the host holds the N/L share. 'all' is every block."""
    none, ten, every = (_plan(offload_activations=n) for n in (0, 10, "all"))
    per_layer, layers = none.memory.activation_bytes_per_layer, none.spec.model.n_layers
    assert ten.memory.activation_bytes_per_layer == every.memory.activation_bytes_per_layer == per_layer
    moved = per_layer * layers * 10 / layers  # one micro-batch in flight at pp 1
    assert ten.memory.cpu_offload_bytes == pytest.approx(moved)
    assert none.memory.activations - ten.memory.activations == pytest.approx(moved - ao.WINDOW_BLOCKS * per_layer)
    assert every.memory.cpu_offload_bytes == pytest.approx(per_layer * layers)
    assert every.memory.activations == pytest.approx(none.memory.activations - per_layer * (layers - ao.WINDOW_BLOCKS))
    assert none.memory.cpu_offload_bytes == 0 and none.time.offload_seconds == 0


def test_copies_on_the_compute_stream_all_show_and_on_their_own_stream_only_the_excess():
    """Composer (torch's save_on_cpu): every copy out and back is on the step. Megatron-Core (Transformer
    Engine's own stream): only what a copy takes beyond the block computed meanwhile."""
    serial = _plan(stack="composer", zero=3, offload_activations=10)
    per_layer, m = serial.memory.activation_bytes_per_layer, serial.spec.layout.grad_accum
    link = ao.host_bytes_per_second(get_hardware("h100"))
    assert link == pytest.approx(64e9 * ao.COPY_EFFICIENCY)
    assert serial.time.offload_seconds == pytest.approx(2 * m * 10 * per_layer / link)
    overlapped = _plan(stack="megatron-core", offload_activations=10)
    copies = 2 * m * 10 * overlapped.memory.activation_bytes_per_layer / link
    assert 0 < overlapped.time.offload_seconds < copies
    # without offload the layout fits only with a bf16 gradient buffer, which halves the reduction too:
    # compared at the fp32 reduction the offloaded plan runs
    assert overlapped.memory.fits_with == ()
    without = _plan(stack="megatron-core", grad_reduce="fp32")
    assert overlapped.time.step_seconds == pytest.approx(without.time.step_seconds + overlapped.time.offload_seconds)
    # Grace's NVLink-C2C (225 GB/s a GPU) hides more of the same copies than a B200's PCIe Gen5 x16
    fast, slow = (plan(build_runspec(**{**BASE, "model": "llama3-70b", "hardware": chip, "tp": 2, "stack": "nemo",
                                        "offload_activations": 40})) for chip in ("gb200", "b200"))
    assert fast.memory.cpu_offload_bytes == slow.memory.cpu_offload_bytes > 0
    assert fast.time.offload_seconds < slow.time.offload_seconds


def test_a_published_gb200_layout_fits_with_its_offload():
    """NeMo's Llama 3.1 405B fp8 GB200 row (tp 2, Megatron FSDP, 95 of 126 blocks offloaded) fits as stated;
    without the offload it fits only with recompute. fp8 copies under ZeRO-3 are a gathered unit's, not the whole model's."""
    row = dict(model="llama3.1-405b", hardware="gb200", stack="nemo", gpus=128, tp=2, pp=1, micro_batch=1,
               global_batch=256, seq_len=8192, precision="fp8", zero=3)
    offloaded = plan(build_runspec(**row, offload_activations=95))
    assert offloaded.fits and not any(o.startswith("recompute") for o in offloaded.memory.fits_with)
    # without it, only recompute the recipe does not run would make it fit
    assert any(o.startswith("recompute") for o in plan(build_runspec(**row)).memory.fits_with)
    assert 0 < offloaded.memory.fp8_buffers < 0.05 * 405e9 / 2 * mem.FP8_CACHED_BYTES_PER_PARAM


@pytest.mark.parametrize(("argv", "expected"), [
    (["--cpu-offloading", "--x", "1"], ["--x", "1"]),
    (["--activation_cpu_offload"], ["--offload-activations", "all"]),
    (["--activation-cpu-offload", "false", "--x", "1"], ["--offload-activations", "0", "--x", "1"]),
    (["--fsdp_config_activation_cpu_offload=true"], ["--offload-activations", "all"]),
])
def test_launchers_offload_switches_read_as_typed(argv, expected):
    assert rewrite(argv) == expected


def test_megatron_and_nemo_block_counts_are_the_option():
    def layout(*args):
        out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama3-8b", "--gpus", "8", "--tp",
                              "1", "--mbs", "1", "--gbs", "64", "--seq", "8192", "--stack", "nemo", "--json", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["layout"]["offload_activations"]

    assert layout("--cpu-offloading", "--cpu-offloading-num-layers", "10") == 10
    assert layout("--activation_offload_layers", "12") == 12
    assert layout() == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--offload-activations", "lots"], "error: --offload-activations 'lots' must be a number of blocks"),
    (["--offload-activations", "-2"], "error: --offload-activations must be >= 0"),
    (["--activation-cpu-offload=maybe"], "error: --activation-cpu-offload takes true or false"),
    (["--offload-activations", "4", "--search"], "error: --search does not try activation offload"),
])
def test_bad_offload_values_refuse_in_one_line(args, message):
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama3-8b", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith(message) and len(out.stderr.splitlines()) == 1


def test_parse_and_cnn():
    assert ao.parse_blocks(None) == ao.parse_blocks("none") == ao.parse_blocks("0") == 0
    assert ao.parse_blocks("ALL") == ao.parse_blocks(True) == ao.ALL_BLOCKS and ao.describe(ao.ALL_BLOCKS) == "all"
    with pytest.raises(UserError, match="is a CNN"):
        build_runspec(model="resnet50", hardware="h100", gpus=8, offload_activations=2)


def test_host_links_are_catalogued_with_their_source():
    h100, gb200, a100 = (get_hardware(k) for k in ("h100", "gb200", "a100-80gb"))
    assert (h100.host_link_gbs, a100.host_link_gbs, gb200.host_link_gbs) == (64, 32, 225)
    assert "PCI-SIG" in h100.sources["host_link"] and "NVLink-C2C" in gb200.sources["host_link"]
    assert ao.host_bytes_per_second(get_hardware("tpu-v4")) == ao.FALLBACK_HOST_BYTES_PER_S


def test_megatron_core_refuses_what_its_layer_offload_cannot_run():
    """Megatron-Core's transformer_config.py raises for CPU offload with pipeline parallelism, with
    recompute, or over every layer; the plan says so in one line, and a layout that does not fit with
    offload is not given a recompute Megatron would refuse. torch's save_on_cpu (Composer) has no such limits."""
    for bad, word in ((dict(pp=2), "--pp 2"), (dict(recompute="selective"), "recompute"),
                      (dict(offload_activations="all"), "fewer layers")):
        with pytest.raises(UserError, match=word):
            _plan(stack="megatron-core", **{"offload_activations": 10, **bad})
    assert _plan(stack="composer", zero=3, pp=2, offload_activations="all", recompute="full").memory.cpu_offload_bytes > 0
    crowded = _plan(stack="megatron-core", offload_activations=2, micro_batch=8, global_batch=64)
    assert crowded.spec.layout.recompute == "none" and not crowded.memory.fits
