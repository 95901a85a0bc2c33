"""CLI commands of flopwise.train (registered by flopwise.cli): `flopwise train`, `flopwise export`."""

from __future__ import annotations

from typing import Optional

import typer

TRAIN_HELP = (
    "Train a model from a YAML config, with `key=value` overrides.\n\n"
    "With no config, trains the embedded default: a small LLaMA-style decoder on the Python standard "
    "library's source, 2 processes with FSDP2 on this CPU, about 2 minutes, then prints predicted vs "
    "measured.\n\n"
    "Examples: `flopwise train` | `flopwise train configs/gpu_single_node.yaml training.max_steps=500` | "
    "`flopwise train parallel.nproc_per_node=1 parallel.strategy=single`"
)


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""

    @app.command(name="train", help=TRAIN_HELP)
    def train(
        args: Optional[list[str]] = typer.Argument(
            None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help="A YAML config and/or dotted overrides."
        ),
        resume_from: Optional[str] = typer.Option(
            None, "--resume-from", help="Continue from this checkpoint: step-N, N, or a checkpoint folder."
        ),
    ) -> None:
        """Load the config (one-line errors, exit 2) and start the run."""
        from flopwise.train.config_loading import load_config
        from flopwise.train.launch import launch

        config_path, overrides = split_arguments(args or [])
        if resume_from:
            overrides.append(f"checkpoint.resume_from={resume_from}")
        launch(load_config(config_path, overrides))

    register_export(app)
    register_generate(app)


def split_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is the config file unless it looks like `key=value`."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


EXPORT_HELP = (
    "Consolidate a run's checkpoint into one model.safetensors (+ config.yaml; + an HF folder for HF "
    "models) in RUN_DIR/export/, the input of `flopwise compress RUN_DIR`.\n\n"
    "Examples: `flopwise export runs/default` | `flopwise export runs/default --step 1200 --out /tmp/model`"
)


def register_export(app: typer.Typer) -> None:
    """`flopwise export RUN_DIR [--step N] [--out DIR]`."""

    @app.command(name="export", help=EXPORT_HELP)
    def export(
        run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run directory with checkpoints/."),
        step: Optional[int] = typer.Option(None, "--step", help="Export this step (default: the latest valid)."),
        out: Optional[str] = typer.Option(None, "--out", help="Output folder (default: RUN_DIR/export)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Verify and consolidate one checkpoint."""
        import json

        from flopwise.train.export import export_checkpoint

        result = export_checkpoint(run_dir, step, out)
        if as_json:
            print(json.dumps({"checkpoint": str(result.checkpoint), "out": str(result.out), "step": result.step,
                              "tensors": result.tensors, "parameters": result.parameters,
                              "hf_folder": str(result.hf_folder) if result.hf_folder else None}))
            return
        print(f"exported {result.checkpoint} (step {result.step}, {result.parameters:,} parameters in "
              f"{result.tensors} tensors) to {result.out / 'model.safetensors'}")
        if result.hf_folder:
            print(f"HF folder: {result.hf_folder}")


GENERATE_HELP = (
    "Sample text from a trained run (exported on first use), an HF folder, or a compressed LLM folder, "
    "with transformers' generate (KV cache).\n\n"
    "Examples: `flopwise generate runs/default --prompt \"def main(\"` | "
    "`flopwise generate runs/default/compressed/int8-weight-only --prompt \"Hello\" --temperature 0`"
)


def register_generate(app: typer.Typer) -> None:
    """`flopwise generate RUN_DIR|HF_DIR --prompt TEXT [--max-new-tokens --temperature --top-k --top-p --seed]`."""

    @app.command(name="generate", help=GENERATE_HELP)
    def generate(
        target: str = typer.Argument(..., metavar="RUN_DIR|HF_DIR", help="A run directory or an HF folder."),
        prompt: str = typer.Option(..., "--prompt", "-p", help="The text to continue."),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens to add."),
        temperature: float = typer.Option(0.8, "--temperature", help="Sampling temperature; 0 = greedy."),
        top_k: int = typer.Option(50, "--top-k", help="Sample among the k most likely tokens (0 = all)."),
        top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling: the smallest set holding this probability."),
        seed: int = typer.Option(0, "--seed", help="Random state for sampling (same value, same text)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Load the model and print the prompt with its continuation."""
        import json
        from pathlib import Path

        from flopwise.train.generate import Sampling, generate_text, load_for_generation, resolve_hf_folder

        folder = resolve_hf_folder(Path(target))
        model, tokenizer = load_for_generation(folder)
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or None,
                            top_p=top_p, seed=seed)
        result = generate_text(model, tokenizer, prompt, sampling, folder)
        if as_json:
            print(json.dumps({"folder": str(folder), "prompt": prompt, "text": result.text,
                              "new_tokens": result.new_tokens, "seconds": result.seconds,
                              "tokens_per_second": result.tokens_per_second}))
            return
        print(result.text)
        print(f"-- {result.new_tokens} new tokens in {result.seconds:.2f} s "
              f"({result.tokens_per_second:.1f} tokens/s, KV cache) from {folder}")
