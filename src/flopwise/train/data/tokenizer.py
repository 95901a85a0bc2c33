"""Byte-level BPE tokenizers trained locally with `tokenizers`; or a model's own tokenizer, loaded
from a tokenizer.json or from a folder transformers reads one from.

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
    """Read a tokenizer.json (as written by `tokenizers` or HuggingFace), or the tokenizer of a model
    folder (`folder_tokenizer`); one-line error if there is none."""
    path = Path(path).expanduser()
    if path.is_dir():
        return folder_tokenizer(path)
    if not path.is_file():
        raise UserError(f"data.tokenizer: {path} does not exist")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise UserError(f"data.tokenizer: {path} is not a tokenizer.json ({exc})") from None


# Files a save_pretrained tokenizer is read from (tokenizer.json, or the slow files transformers converts:
# SentencePiece's tokenizer.model, GPT-2's vocab.json + merges.txt, BERT's vocab.txt, tiktoken's ...).
TOKENIZER_FILE_PATTERNS = ("tokenizer*", "vocab*", "merges*", "*.model", "*.tiktoken", "spiece*",
                           "special_tokens_map.json", "added_tokens.json")


def tokenizer_files(path: Path) -> list[Path]:
    """The files a tokenizer is read from: the tokenizer.json itself, or a folder's tokenizer files
    (never its weights), sorted; what a data cache entry's key hashes."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"data.tokenizer: {path} does not exist")
    found = {item for pattern in TOKENIZER_FILE_PATTERNS for item in path.glob(pattern) if item.is_file()}
    if not found:
        raise UserError(no_tokenizer_message(path, "no tokenizer.json, tokenizer.model or tokenizer_config.json"))
    return sorted(found)


def no_tokenizer_message(folder: Path, why: str) -> str:
    """One line: a model folder without a usable tokenizer, and how to give it one."""
    return (f"data.tokenizer: {folder} has no tokenizer ({why}); a pretrained model (model.pretrained) trains "
            f"with its own tokenizer, never a new one: save it there with tokenizer.save_pretrained('{folder}'), "
            "or set data.tokenizer to its tokenizer.json")


def folder_tokenizer(folder: Path) -> Tokenizer:
    """A model folder's tokenizer as a `tokenizers.Tokenizer`: its tokenizer.json, else what
    transformers' AutoTokenizer builds from the folder's other files (the fast backend of a
    SentencePiece or GPT-2 tokenizer), so ids match the pretrained embeddings."""
    folder = Path(folder).expanduser()
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder / "tokenizer.json")
    tokenizer_files(folder)  # none at all: the one-line refusal
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, ImportError, ...)
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise UserError(no_tokenizer_message(folder, f"transformers cannot load one: {first}")) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise UserError(no_tokenizer_message(folder, f"{type(loaded).__name__} has no fast (tokenizers) backend"))
    return backend


def end_of_text_id(tokenizer: Tokenizer, source: str) -> int:
    """The id placed between documents; a tokenizer without one cannot separate them."""
    for token in KNOWN_END_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise UserError(
        f"{source} has no end-of-document token; it needs one of {', '.join(KNOWN_END_TOKENS)}"
    )
