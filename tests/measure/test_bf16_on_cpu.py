"""flopwise.measure.bf16_on_cpu: the CPU's bf16 flags and when the warning is considered."""

from __future__ import annotations

from flopwise.measure.bf16_on_cpu import bf16_over_fp32_matmul_time, bf16_warning, cpu_bf16_flags


def test_flags_are_read_from_cpuinfo(tmp_path):
    with_amx = tmp_path / "amx"
    with_amx.write_text("processor : 0\nflags : fpu sse avx2 avx512f amx_bf16 amx_tile\n")
    without = tmp_path / "plain"
    without.write_text("processor : 0\nflags : fpu sse avx2\n")
    assert cpu_bf16_flags(with_amx) == ["amx_bf16"]
    assert cpu_bf16_flags(without) == []
    assert cpu_bf16_flags(tmp_path / "absent") is None


def test_no_warning_for_fp32_or_on_a_gpu():
    assert bf16_warning("fp32", on_cpu=True) is None
    assert bf16_warning("bf16", on_cpu=False) is None


def test_the_warning_follows_the_measured_ratio():
    ratio = bf16_over_fp32_matmul_time()
    assert ratio > 0
    message = bf16_warning("bf16", on_cpu=True)
    if message is not None:  # this CPU runs bf16 slower than fp32: the line says by how much
        assert message.startswith("warning: precision.mode=bf16 on this CPU: a 256x256 bf16 matmul took")
        assert "as long as fp32 (measured now;" in message
