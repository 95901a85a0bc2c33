"""Training checkpoints: `store` (save, publish, verify, prune), `resume` (what to continue
from, and restoring it), `policy` (when to save; signals and non-finite losses at a step
boundary) and `safe_read` (loading files as data, never as code)."""
