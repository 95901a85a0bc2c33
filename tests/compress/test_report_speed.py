"""The compress report claims a speed-up only when the latency quartile ranges are apart."""

from __future__ import annotations

from flopwise.compress.report import notes
from flopwise.compress.model_run import ranges_apart


def latency(median: float, q1: float, q3: float) -> dict:
    return {"batch_size": 1, "median_ms": median, "q1_ms": q1, "q3_ms": q3, "p10_ms": q1, "p90_ms": q3}


def result_with(speedup: dict) -> dict:
    return {"task": "digits-mlp", "method": "prune", "backend": "torch.nn.utils.prune", "compiled": False, "threads": 1,
            "quality_metric": "accuracy", "details": {"note": "no speed-up expected"},
            "summary": {"speedup": speedup, "memory_ratio": 1.0, "disk_ratio": 2.0, "quality_before": 0.9,
                        "quality_after": 0.89, "relative_quality_loss": 0.01}}


def test_overlapping_ranges_are_not_a_difference():
    assert not ranges_apart(latency(10, 8, 12), latency(9, 7, 11))
    assert ranges_apart(latency(10, 9, 11), latency(3, 2.5, 3.5))


def test_notes_say_no_measurable_difference_instead_of_a_ratio_from_noise():
    line = [l for l in notes(result_with({"1": {"vs_fp32_eager": 3.45, "vs_fastest_fp32": 3.45,
                                                "measurable_vs_fp32_eager": False,
                                                "measurable_vs_fastest_fp32": False}}))
            if l.startswith("speed")][0]
    assert "3.45" not in line and "no measurable difference from fp32 eager" in line


def test_notes_state_slower_as_slower_not_as_a_tiny_ratio():
    line = [l for l in notes(result_with({"1": {"vs_fp32_eager": 0.004, "vs_fastest_fp32": 0.5,
                                                "measurable_vs_fp32_eager": True,
                                                "measurable_vs_fastest_fp32": True}}))
            if l.startswith("speed")][0]
    assert "250.00x slower than fp32 eager" in line and "2.00x slower than fastest fp32" in line and " 0.00x" not in line
