"""A tiny real run to forge, and re-hashing a forged checkpoint so its manifest matches (the attack as reported)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def tiny_train_command(tmp_path: Path, run_dir: Path, *extra: str) -> tuple[list[str], dict]:
    """`flopwise train` of a one-layer model on a small corpus in `tmp_path`, and its environment."""
    corpus = tmp_path / "text"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.py").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(800)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "flopwise", "train", "model.n_layers=1", "model.hidden=32", "model.n_heads=2",
             "model.max_seq_len=32", "data.vocab_size=300", "data.seq_len=16", "data.tokenizer_train_bytes=50000",
             f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}", f"logging.run_dir={run_dir}",
             "training.micro_batch_size=2", "training.warmup_steps=1", "training.eval_every=2",
             "training.eval_batches=1", "logging.progress=false", *extra]
    return train, env


def rehash(folder: Path) -> None:
    """Rewrite the checkpoint's manifest so every (forged) file's size and sha256 match, and sign it again.

    Signing needs the user's key, which the attacker lacks (an unsigned manifest is refused first:
    test_remote_code_from_files.py); re-signing here tests the reader behind that check on its own.
    """
    from flopwise.config.signature import sign_manifest

    manifest = json.loads((folder / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(sign_manifest(manifest)))
