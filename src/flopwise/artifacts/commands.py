"""CLI commands of flopwise.artifacts (registered by flopwise.cli): `flopwise generate`, `flopwise export`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flopwise.artifacts.trust_options import ACCEPT_RUN_OPTION, TRUST_REMOTE_CODE_OPTION
from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""
    from flopwise.artifacts.generate_cli import register_generate

    register_generate(app)
    register_export(app)


EXPORT_HELP = (
    "Consolidate a run's checkpoint into one model.safetensors (+ config.yaml; + an HF folder for HF "
    "models) in RUN_DIR/export/, the input of `flopwise compress RUN_DIR`.\n\n"
    "A LoRA/QLoRA run exports its base with the adapter merged in, or with --adapter the adapter alone.\n\n"
    "Examples: `flopwise export runs/default` | `flopwise export runs/default --step 1200 --out /tmp/model`"
)


def register_export(app: typer.Typer) -> None:
    """`flopwise export RUN_DIR [--step N] [--out DIR] [--adapter]`."""

    @app.command(name="export", help=EXPORT_HELP)
    def export(
        run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run directory with checkpoints/."),
        step: Optional[int] = typer.Option(None, "--step", help="Export this step (default: the latest valid)."),
        out: Optional[str] = typer.Option(None, "--out", help="Output folder (default: RUN_DIR/export)."),
        adapter: bool = typer.Option(False, "--adapter", help="A LoRA/QLoRA run: write only its adapter, in "
                                     "PEFT's format (OUT/adapter), instead of the merged model."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show library warnings and logs."),
        trust_remote_code: bool = TRUST_REMOTE_CODE_OPTION,
        accept_run: bool = ACCEPT_RUN_OPTION,
    ) -> None:
        """Verify and consolidate one checkpoint."""
        import json

        from flopwise.library_noise import route_library_noise

        if not Path(run_dir).is_dir():  # before the library log would create RUN_DIR/export
            raise UserError(f"{run_dir}: no such run directory")
        route_library_noise(Path(out) if out else RunDir(run_dir).export, verbose)
        from flopwise.artifacts.export import export_checkpoint

        result = export_checkpoint(run_dir, step, out, adapter=adapter, trust_remote_code=trust_remote_code,
                                   accept_run=accept_run)
        if as_json:
            print(json.dumps({"checkpoint": str(result.checkpoint), "out": str(result.out), "step": result.step,
                              "tensors": result.tensors, "parameters": result.parameters,
                              "hf_folder": str(result.hf_folder) if result.hf_folder else None,
                              "adapter_folder": str(result.adapter_folder) if result.adapter_folder else None}))
            return
        if result.adapter_folder:
            print(f"exported the adapter of {result.checkpoint} (step {result.step}, {result.parameters:,} "
                  f"parameters) to {result.adapter_folder} (peft.PeftModel.from_pretrained)")
            return
        print(f"exported {result.checkpoint} (step {result.step}, {result.parameters:,} parameters in "
              f"{result.tensors} tensors) to {result.out / 'model.safetensors'}")
        if result.hf_folder:
            print(f"HF folder: {result.hf_folder}")
