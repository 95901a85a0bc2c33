"""A tiny DCP `.metadata` must not make the reader allocate gigabytes.

Nine bytes (`PROTO 4, NONE, LONG_BINPUT 2^27, STOP`) name no class, so the allow-list lets
them through, and the C unpickler then sizes its memo table for index 2^27: 2 GiB. The
first test proves the allocation with the allow-listed unpickler alone at a smaller index
(2^25, 512 MiB); the others show the reader refuses the full-size payload with one line
while its peak memory stays small.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys

import pytest

from flopwise.train.checkpoint.safe_read import check_pickle_bounds

MiB = 1 << 20


def memo_bomb(index: int) -> bytes:
    return b"\x80\x04N" + b"r" + struct.pack("<I", index) + b"."


PEAK_SCRIPT = """
import io, resource, sys
from pathlib import Path
import torch  # imported before the first reading, so the peak measures the read alone
from flopwise.errors import UserError
from flopwise.train.checkpoint.safe_read import MetadataUnpickler, safe_dcp_load

def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

folder = Path(sys.argv[2])
before = peak_kib()
message = ""
if sys.argv[1] == "unpickler":  # the allow-listed unpickler without the bounds check
    MetadataUnpickler(io.BytesIO((folder / ".metadata").read_bytes())).load()
else:
    try:
        safe_dcp_load({}, folder)
    except UserError as err:
        message = str(err)
print(peak_kib() - before)
print(message)
"""


def peak_growth(tmp_path, how: str, payload: bytes) -> tuple[int, str]:
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / ".metadata").write_bytes(payload)
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, how, str(folder)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    growth_kib, message = (done.stdout.splitlines() + [""])[:2]
    return int(growth_kib) * 1024, message


def test_the_allow_list_alone_lets_nine_bytes_allocate(tmp_path):
    assert len(memo_bomb(2**26)) == 9
    growth, _ = peak_growth(tmp_path, "unpickler", memo_bomb(2**26))
    assert growth > 300 * MiB  # 2^26 memo slots of 8 bytes = 512 MiB (peak RSS after imports may already hold some)


@pytest.mark.parametrize("index", [2**27, 2**30, 2**32 - 1])
def test_the_reader_refuses_a_memo_bomb_with_one_line_and_little_memory(tmp_path, index):
    growth, message = peak_growth(tmp_path, "reader", memo_bomb(index))
    assert growth < 50 * MiB
    assert "refused by flopwise's checkpoint reader" in message and f"memo entry {index}" in message
    assert "\n" not in message


@pytest.mark.parametrize("payload, words", [
    (b"\x80\x04h\x05.", "never stored"),                                     # BINGET of an empty memo
    (b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b"N.", "frame of"),       # FRAME longer than the file
    (b"\x80\x04X" + struct.pack("<I", 2**31) + b"ab.", "not a well-formed"),  # BINUNICODE longer than the file
    (b"\x80\x05\x96" + struct.pack("<Q", 2**62) + b".", "not a well-formed"),  # BYTEARRAY8 of 4 EiB
])
def test_lengths_and_reads_beyond_the_file_are_refused(payload, words):
    with pytest.raises(pickle.UnpicklingError, match=words):
        check_pickle_bounds(payload)


def test_what_pickle_writes_passes():
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
    from torch.distributed.checkpoint.metadata import TensorProperties
    import torch

    chunk = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([4]))
    meta = Metadata(state_dict_metadata={f"w{i}": TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                                       torch.Size([4]), [chunk]) for i in range(50)})
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        check_pickle_bounds(pickle.dumps(meta, protocol=protocol))
