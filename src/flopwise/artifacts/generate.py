"""`flopwise generate RUN_DIR|HF_DIR --prompt "..."`: sample text from a trained or compressed model.

Loads an HF folder (`flopwise export`'s `hf/`, a `flopwise compress` LLM folder, or any local
save_pretrained folder) with `AutoModelForCausalLM` / `AutoTokenizer` and samples with
transformers' `generate` (KV cache; temperature, top-k, top-p). A run directory is
exported first when it has no `export/hf/` yet; an existing export is used as it is (export
again after further training).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir

MAX_NEW_TOKENS = 1 << 20
MAX_TEMPERATURE = 100.0  # far above any useful value; keeps nan/inf and absurd sizes out of torch


@dataclass
class Sampling:
    """How tokens are drawn; temperature 0 means greedy decoding."""

    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int | None = 50
    top_p: float | None = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        """Each flag in its range, as one line (transformers raises a ValueError deep in `generate`)."""
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise UserError(f"--max-new-tokens: {self.max_new_tokens} is outside 1 to {MAX_NEW_TOKENS}")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE):
            raise UserError(f"--temperature: {self.temperature} is outside 0 (greedy) to {MAX_TEMPERATURE:g}")
        if self.top_k is not None and self.top_k < 0:
            raise UserError(f"--top-k: {self.top_k} is below 0 (0 = all tokens)")
        if self.top_p is not None and not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise UserError(f"--top-p: {self.top_p} is outside (0, 1]")
        if not 0 <= self.seed < 2**63:
            raise UserError(f"--seed: {self.seed} is outside 0 to 2^63-1")


@dataclass
class Generation:
    """What `generate_text` produced and how fast."""

    folder: Path
    prompt: str
    text: str  # prompt + continuation, decoded
    new_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")


def resolve_hf_folder(target: Path, *, trust_remote_code: bool = False, accept_run: bool = False) -> Path:
    """The HF folder for `target`: itself if it holds config.json, else a run's export (made if absent)."""
    target = Path(target)
    if (target / "config.json").is_file():
        return target
    if (RunDir(target).export / "hf" / "config.json").is_file():
        return RunDir(target).export / "hf"
    if RunDir(target).checkpoints.is_dir():
        from flopwise.artifacts.export import export_checkpoint

        result = export_checkpoint(target, trust_remote_code=trust_remote_code, accept_run=accept_run)
        print(f"exported {result.checkpoint} to {result.hf_folder}", flush=True)
        return result.hf_folder
    raise UserError(f"{target}: neither an HF folder (config.json) nor a run directory (checkpoints/)")


def load_for_generation(folder: Path, *, trust_remote_code: bool = False):
    """(model, tokenizer) from an HF folder, offline, in eval mode.

    The folder's files never switch on remote code (an `auto_map` in config.json or
    tokenizer_config.json): transformers is told `trust_remote_code` explicitly, which is
    the command line's `--trust-remote-code`, so it neither runs the code nor asks.
    """
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                  trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise UserError(f"{folder}: no tokenizer transformers can load ({str(exc).splitlines()[0][:160]})") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                     trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise UserError(f"{folder}: transformers cannot load the model ({str(exc).splitlines()[0][:160]})") from None
    return model.eval(), tokenizer


def generate_text(model, tokenizer, prompt: str, sampling: Sampling, folder: Path = Path(".")) -> Generation:
    """Continue `prompt` with `model.generate` (KV cache), seeded; returns the text and its speed."""
    import torch

    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    input_ids = encoded.input_ids
    if input_ids.shape[1] == 0:
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        input_ids = torch.tensor([[bos]])
    greedy = sampling.temperature == 0
    options = dict(max_new_tokens=sampling.max_new_tokens, do_sample=not greedy, use_cache=True,
                   pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    if not greedy:
        options.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)
    torch.manual_seed(sampling.seed)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **options)
    seconds = time.perf_counter() - start
    new_tokens = int(output.shape[1] - input_ids.shape[1])
    text = tokenizer.decode(output[0], skip_special_tokens=True)
    return Generation(folder=folder, prompt=prompt, text=text, new_tokens=new_tokens, seconds=seconds)
