"""How a name typed by a user or printed by a source is spelled before it is looked up.

Papers, vendors and trainers write the same thing several ways ("A100 80GB", "flash_attn",
"Megatron Bridge", "BF16"); the catalogs, stacks and choices spell their keys in lower case with
words joined by "-". One spelling rule for all of them, so every lookup reads a name alike.
"""

from __future__ import annotations


def spelled(text: str) -> str:
    """`text` in lower case, its words (split at spaces and `_`) joined by "-"."""
    return "-".join(text.strip().lower().replace("_", " ").split())
