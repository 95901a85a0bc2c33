"""`flopwise generate RUN_DIR|HF_DIR --prompt ...` (registered by `train/commands.py`); the work is in `generate.py`."""

from __future__ import annotations

import typer


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

        from flopwise.artifacts.generate import Sampling, generate_text, load_for_generation, resolve_hf_folder

        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or None,
                            top_p=top_p, seed=seed)  # a bad flag is one line before the model loads
        folder = resolve_hf_folder(Path(target))
        model, tokenizer = load_for_generation(folder)
        result = generate_text(model, tokenizer, prompt, sampling, folder)
        if as_json:
            print(json.dumps({"folder": str(folder), "prompt": prompt, "text": result.text,
                              "new_tokens": result.new_tokens, "seconds": result.seconds,
                              "tokens_per_second": result.tokens_per_second}))
            return
        print(result.text)
        print(f"-- {result.new_tokens} new tokens in {result.seconds:.2f} s "
              f"({result.tokens_per_second:.1f} tokens/s, KV cache) from {folder}")
