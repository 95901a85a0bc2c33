"""The one entry from a `data:` config to cached token shards, whatever the source.

Files and folders (`data.paths`, the default corpus) are read by `data.py`; a HuggingFace
`datasets` source (`data.hf_dataset`) by `hf_dataset.py`, which reuses data.py's shard
builder. Both give the same `PreparedData`, so the loader and exact resume do not care.
"""

from __future__ import annotations

from flopwise.config.schema import DataConfig
from flopwise.train.data.files import PreparedData, prepare_file_data


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Build (once) or load the token shards for `cfg`; safe to call from several processes."""
    if cfg.hf_dataset is not None:
        # `datasets` is an optional extra: loaded only for a datasets source
        from flopwise.train.data.hf_dataset import prepare_hf_dataset

        return prepare_hf_dataset(cfg)
    return prepare_file_data(cfg)
