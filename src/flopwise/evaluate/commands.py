"""`flopwise eval TARGET --data FILES --tasks NAMES`: perplexity and lm-eval tasks, written as eval.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flopwise.errors import UserError

EVAL_HELP = (
    "Evaluate a run (its export, made on first use), an export or an HF folder: perplexity on local text "
    "or JSONL files, and lm-evaluation-harness tasks (lm-eval, optional extra `eval`). Writes eval.json "
    "into TARGET.\n\n"
    "Examples: `flopwise eval runs/chat --data val.jsonl` | "
    "`flopwise eval runs/chat/export/hf --tasks my_task --include tasks/`"
)


def register(app: typer.Typer) -> None:
    """Add `flopwise eval` to the app."""

    @app.command(name="eval", help=EVAL_HELP)
    def evaluate(
        target: str = typer.Argument(..., metavar="RUN_DIR|HF_DIR", help="A run directory, an export or an HF folder."),
        data: Optional[list[str]] = typer.Option(None, "--data", help="Text/JSONL files for perplexity (repeatable)."),
        text_field: str = typer.Option("text", "--text-field", help="The JSONL field holding the text."),
        seq_len: int = typer.Option(512, "--seq-len", help="Perplexity window in tokens."),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Read at most this many tokens."),
        tasks: Optional[str] = typer.Option(None, "--tasks", help="lm-eval task names, comma-separated."),
        include: Optional[Path] = typer.Option(None, "--include", help="A folder of lm-eval task YAML files."),
        limit: Optional[int] = typer.Option(None, "--limit", help="At most this many examples per task."),
        out: Optional[Path] = typer.Option(None, "--out", help="Where to write the JSON (default TARGET/eval.json)."),
    ) -> None:
        """Load the model once, run what was asked, print and write the results."""
        from flopwise.artifacts.generate import load_for_generation, resolve_hf_folder

        names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else []
        if not data and not names:
            raise UserError("eval: nothing to do; give --data FILES (perplexity) and/or --tasks NAMES (lm-eval)")
        target_path = Path(target)
        if not target_path.exists():
            raise UserError(f"eval: {target} does not exist")
        folder = resolve_hf_folder(target_path)
        model, tokenizer = load_for_generation(folder)
        result: dict = {"model": str(folder)}
        if data:
            from flopwise.evaluate.perplexity import perplexity

            ppl = perplexity(model, tokenizer, data, seq_len=seq_len, max_tokens=max_tokens, text_field=text_field)
            result["perplexity"] = ppl.as_dict()
            print(f"perplexity {ppl.perplexity:.3f} over {ppl.tokens} tokens (windows of {ppl.seq_len})")
        if names:
            from flopwise.evaluate.harness import run_tasks

            result["tasks"] = run_tasks(model, tokenizer, names, include=include, limit=limit)
            for task, scores in result["tasks"].items():
                shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in scores.items())
                print(f"{task}: {shown}")
        destination = out or target_path / "eval.json"
        destination.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {destination}")
