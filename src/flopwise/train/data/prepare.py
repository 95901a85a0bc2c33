"""The one entry from a `data:` config to the data a loader serves, whatever the source.

Files and folders (`data.paths`, the default corpus) are read by `files.py`; a HuggingFace
`datasets` source (`data.hf_dataset`) by `hf_dataset.py`, which reuses files.py's shard
builder. Both give the same `PreparedData`, so the loader and exact resume do not care.
Chat files (`data.mix`) become packed rows (`chat_rows.PreparedChat`) served by
`chat_loader.ChatLoader`.
"""

from __future__ import annotations

from flopwise.config.schema import DataConfig
from flopwise.train.data.files import prepare_file_data


def prepare_data(cfg: DataConfig):
    """Build (once) or load the token shards for `cfg`, or its packed chat rows; safe from several processes."""
    if cfg.mix:
        from flopwise.train.data.chat_rows import prepare_chat_data

        return prepare_chat_data(cfg)
    if cfg.hf_dataset is not None:
        # `datasets` is an optional extra: loaded only for a datasets source
        from flopwise.train.data.hf_dataset import prepare_hf_dataset

        return prepare_hf_dataset(cfg)
    return prepare_file_data(cfg)
