"""Byte-level BPE tokenizers: trained locally with `tokenizers`, or loaded from a tokenizer.json.

Byte-level BPE (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners", GPT-2 section 2.2): every byte has a token, so any text encodes without
unknown tokens, and merges are learned from the corpus.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from flopwise.errors import UserError

END_OF_TEXT = "<|endoftext|>"
# Document separators other tokenizers use, tried in order when loading one.
KNOWN_END_TOKENS = (END_OF_TEXT, "<|end_of_text|>", "</s>", "<eos>", "[SEP]")


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn a byte-level BPE with `vocab_size` ids, `<|endoftext|>` being id 0."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def load_tokenizer(path: Path) -> Tokenizer:
    """Read a tokenizer.json (as written by `tokenizers` or HuggingFace), one-line error if not."""
    if not Path(path).is_file():
        raise UserError(f"data.tokenizer: {path} does not exist")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise UserError(f"data.tokenizer: {path} is not a tokenizer.json ({exc})") from None


def end_of_text_id(tokenizer: Tokenizer, source: str) -> int:
    """The id placed between documents; a tokenizer without one cannot separate them."""
    for token in KNOWN_END_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise UserError(
        f"{source} has no end-of-document token; it needs one of {', '.join(KNOWN_END_TOKENS)}"
    )
