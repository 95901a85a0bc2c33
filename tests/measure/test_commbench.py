"""flopwise bench: nccl-tests arithmetic, argument errors, and one real 2-process gloo run."""

import json

import pytest

from flopwise.cli import main
from flopwise.measure.commbench import (
    bus_bandwidth_factor,
    element_count,
    nccl_transport_lines,
    parse_ops,
    parse_sizes,
    rank_notes,
    saturation,
    summarize,
)
from flopwise.errors import UserError


def test_sizes_use_binary_multiples_like_nccl_tests():
    assert parse_sizes("1K,64M,1M") == [1024, 1024**2, 64 * 1024**2]
    assert parse_sizes("512") == [512]
    with pytest.raises(UserError, match="--sizes"):
        parse_sizes("1X")


def test_ops_are_checked():
    assert parse_ops("all") == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    with pytest.raises(UserError, match="allowed"):
        parse_ops("all_to_all")


def test_bus_bandwidth_factors_follow_nccl_tests():
    assert bus_bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_bandwidth_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_bandwidth_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_bandwidth_factor("broadcast", 8) == 1.0


def test_summary_row_bandwidth_and_rank_spread():
    row = summarize("all_reduce", 10**9, 4, [0.9, 1.0, 1.1, 1.0])
    assert row["latency_seconds"] == pytest.approx(1.0)
    assert row["algbw_gb_per_s"] == pytest.approx(1.0)
    assert row["busbw_gb_per_s"] == pytest.approx(1.5)
    assert row["rank_spread"] == pytest.approx(0.2)
    # all_gather/reduce_scatter sizes round so every rank's share is whole
    assert element_count("all_gather", 1000, 3) % 3 == 0


def test_saturation_point_and_bucket_advice():
    rows = [summarize("all_reduce", s, 2, [t]) for s, t in [(2**16, 1e-3), (2**20, 2e-3), (4 * 2**20, 4.5e-3), (16 * 2**20, 17e-3)]]
    sat = saturation(rows)
    assert sat["saturation_size_bytes"] == 4 * 2**20
    assert sat["suggested_bucket_mb"] == 4.0
    assert "2-8 MB" in sat["advice"]
    rising = [summarize("all_reduce", s, 2, [1e-3]) for s in (2**16, 2**20)]
    assert saturation(rising)["suggested_bucket_mb"] is None


def test_late_rank_is_the_one_with_the_shortest_time():
    notes = rank_notes([summarize("all_reduce", 2**20, 3, [0.010, 0.004, 0.010])])
    assert notes and "rank 1 arrived last" in notes[0]


def test_nccl_debug_transport_lines_are_extracted():
    log = "\n".join(
        [
            "host:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            "host:1:1 [0] NCCL INFO NET/IB : No device found.",
            "host:1:1 [0] NCCL INFO NET/IB : No device found.",
            "host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
            "unrelated line",
        ]
    )
    assert nccl_transport_lines(log) == [
        "NCCL version 2.21.5+cuda12.4",
        "NET/IB : No device found.",
        "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
    ]


@pytest.mark.distributed
def test_bench_two_gloo_processes_over_torchrun(tmp_path, capsys):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--op", "all_reduce,all_gather", "--sizes", "256K", "--nproc", "2", "--iters", "3",
              "--warmup", "1", "--backend", "gloo", "--json", "--out", str(out)])  # fmt: skip
    assert exit_info.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written
    assert written["backend"] == "gloo" and written["world_size"] == 2
    assert [r["op"] for r in written["results"]] == ["all_reduce", "all_gather"]
    for row in written["results"]:
        assert row["size_bytes"] == 256 * 1024
        assert row["algbw_gb_per_s"] > 0 and row["busbw_gb_per_s"] > 0
        assert len(row["per_rank_seconds"]) == 2 and all(t > 0 for t in row["per_rank_seconds"])
    assert written["results"][0]["busbw_gb_per_s"] == pytest.approx(written["results"][0]["algbw_gb_per_s"])


def test_bench_rejects_bad_input_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--op", "gossip", "--nproc", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "allowed" in err
