"""hashing.py: the digests a save records are those of the bytes on disk, whichever thread hashed them."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

from flopwise.train.checkpoint import hashing
from flopwise.train.checkpoint.hashing import HashingFileSystem, StableMemory, file_digest, hashing_writer


@pytest.fixture(params=["sha256", "blake3"])
def algorithm(request) -> str:
    if request.param == "blake3" and hashing.preferred_algorithm() != "blake3":
        pytest.skip("the blake3 package is not installed")
    return request.param


@pytest.mark.parametrize("handoff", [1 << 16, 16 << 20])
def test_a_dcp_save_records_the_digest_and_size_of_every_file_it_wrote(tmp_path, algorithm, monkeypatch, handoff):
    monkeypatch.setattr(hashing, "HANDOFF_BYTES", handoff)
    state = {"model": {"w": torch.randn(300, 300), "b": torch.randn(7)}, "optim": {"step": torch.tensor(3.0)}}
    writer = hashing_writer(tmp_path, algorithm, state)
    dcp.save(state, storage_writer=writer, no_dist=True)
    written = {path.name: entry for path, entry in writer.fs.written.items()}
    assert ".metadata" in written and len(written) == 2  # the data file and DCP's renamed .metadata
    for path, (size, digest) in writer.fs.written.items():
        assert size == path.stat().st_size and digest == file_digest(path, algorithm)


def test_stable_memory_holds_views_inside_its_tensors_only():
    tensor = torch.arange(1 << 16, dtype=torch.float32)
    stable = StableMemory({"t": tensor, "nested": [torch.zeros(0)]})
    whole = memoryview(tensor.numpy()).cast("B")
    assert stable.holds(whole) and stable.holds(whole[1000:5000])
    assert not stable.holds(memoryview(bytearray(whole.nbytes)))
    assert not StableMemory().holds(whole)


@pytest.fixture
def small_handoff(monkeypatch):
    """Hand written bytes to the hashing thread every 64 KiB, so these small files use it as a checkpoint does."""
    monkeypatch.setattr(hashing, "HANDOFF_BYTES", 1 << 16)


def test_a_large_buffer_outside_stable_memory_is_copied_before_write_returns(tmp_path, algorithm, small_handoff):
    """Torch hands DCP's stream buffers it frees after the call: changing one afterwards must not change the digest."""
    stable_tensor = torch.randn(1 << 18)
    fs = HashingFileSystem(algorithm, StableMemory({"t": stable_tensor}))
    path = tmp_path / "file"
    scratch = bytearray(b"x" * (hashing.LARGE_WRITE * 2))
    with fs.create_stream(path, "wb") as stream:
        stream.write(b"header")
        stream.write(memoryview(stable_tensor.numpy()))  # handed to the hashing thread without a copy
        stream.write(scratch)
        scratch[:] = b"y" * len(scratch)  # what a freed buffer's next owner does
        for _ in range(3000):  # many small writes, batched
            stream.write(b"0123456789")
    size, digest = fs.written[path]
    assert size == path.stat().st_size and digest == file_digest(path, algorithm)


def test_a_failed_write_ends_the_hashing_thread(tmp_path, algorithm, small_handoff):
    stable_tensor = torch.randn(1 << 18)
    fs = HashingFileSystem(algorithm, StableMemory({"t": stable_tensor}))
    before = threading.active_count()
    with pytest.raises(OSError, match="disk full"):
        with fs.create_stream(tmp_path / "file", "wb") as stream:
            stream.write(memoryview(stable_tensor.numpy()))
            assert threading.active_count() == before + 1  # the hashing thread runs
            raise OSError("disk full")
    assert threading.active_count() == before and not fs.written


def test_stable_memory_reads_a_dtensor_through_its_local_shard(tmp_path, monkeypatch):
    """FSDP2's staged state holds DTensors, whose own storage has no data pointer (a save died on it)."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo")
    try:
        weight = distribute_tensor(torch.randn(64, 64), init_device_mesh("cpu", (1,)), [Shard(0)])
        with pytest.raises(RuntimeError):
            weight.untyped_storage().data_ptr()  # why the shard is read instead
        stable = StableMemory({"model": {"w": weight}})
        assert stable.holds(memoryview(weight.to_local().numpy()).cast("B"))
        writer = hashing_writer(tmp_path, "sha256", {"model": {"w": weight}})
        dcp.save({"model": {"w": weight}}, storage_writer=writer)
        for path, (size, digest) in writer.fs.written.items():
            assert size == path.stat().st_size and digest == file_digest(path, "sha256")
    finally:
        dist.destroy_process_group()
