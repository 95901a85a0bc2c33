"""A tiny llama-architecture model and tokenizer written by `save_pretrained`, and a local JSONL
corpus: the offline stand-ins for a hub model and a `datasets` source."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
)
WORDS = ("the model learns to count apples and pears while the planner predicts memory and time "
         "for every step of the run on a small machine").split()


def corpus_lines(n: int = 400) -> list[str]:
    """Deterministic, repetitive sentences a tiny model can learn something from."""
    lines = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12 + i % 9)]
        lines.append(" ".join(words) + f" number {i % 50}.")
    return lines


def write_jsonl(path: Path, n: int = 400) -> Path:
    """A local JSONL file with a `text` field per record."""
    path.write_text("".join(json.dumps({"text": line, "id": i}) + "\n" for i, line in enumerate(corpus_lines(n))))
    return path


def write_pretrained(folder: Path, vocab: int = 384, model_vocab: int = 512, tie: bool = False,
                     max_shard_size: str | None = None, seed: int = 0) -> Path:
    """save_pretrained a 2-layer llama (hidden 64) and a byte-level BPE tokenizer into `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                      bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    wrapped.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=model_vocab, max_position_embeddings=256,
                         tie_word_embeddings=tie, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    wrapped.save_pretrained(str(folder))
    return folder


def pretrained_root(tmp_path_factory, name: str) -> Path:
    """A fresh temporary folder holding `write_pretrained`'s model in `pretrained/`."""
    root = tmp_path_factory.mktemp(name)
    write_pretrained(root / "pretrained")
    return root


def export_logits(run_dir: Path, out: Path, pretrained: Path, ids):
    """`flopwise export` a LoRA run merged (transformers, `out/merged`) and adapter-only (PEFT,
    `out/adapter-only`); returns the logits on `ids` of the base model, the merged export and the base
    with the adapter, for the tests to compare."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.artifacts.test_export_lora import cli, logits

    for extra, name in (([], "merged"), (["--adapter"], "adapter-only")):
        done = cli("export", str(run_dir), "--out", str(out / name), *extra)
        assert done.returncode == 0, done.stderr[-2000:]
    base = AutoModelForCausalLM.from_pretrained(str(pretrained), dtype=torch.float32).eval()
    base_logits = logits(base, ids)  # before PEFT wraps `base` in place
    adapted = PeftModel.from_pretrained(base, str(out / "adapter-only" / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged" / "hf")).eval()
    return base_logits, logits(merged, ids), logits(adapted, ids)
