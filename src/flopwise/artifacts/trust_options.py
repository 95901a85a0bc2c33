"""The two command-line flags that say what the person running a command trusts (`run_signature.py`).

Shared by `export`, `generate` and `compress`, the commands that rebuild a model from a
run's or a folder's files.
"""

from __future__ import annotations

import typer

TRUST_REMOTE_CODE_OPTION = typer.Option(
    False, "--trust-remote-code",
    help="Run the Python files an HF model's config names (auto_map). A run's or folder's own files never switch "
         "this on; give it only for code you would run yourself.")
ACCEPT_RUN_OPTION = typer.Option(
    False, "--accept-run",
    help="Use a run whose config.yaml / checkpoint manifest this user's key did not sign (another machine or user, "
         "an older flopwise, or edited since); it still never switches on remote code.")
