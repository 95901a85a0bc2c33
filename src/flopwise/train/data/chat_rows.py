"""From a `data:` config with `mix` to packed chat rows: read, encode, mix by weight, pack."""

from __future__ import annotations

from pathlib import Path

from flopwise.config.schema import DataConfig
from flopwise.errors import UserError
from flopwise.train.data.chat import ChatEncoder, load_chat_tokenizer, read_chat_records
from flopwise.train.data.mixing import mix
from flopwise.train.data.packing import PackedRow, pack_examples


def chat_rows(cfg: DataConfig, tokenizer_folder: Path | None, examples: int, seed: int = 0) -> list[PackedRow]:
    """`examples` conversations drawn from `cfg.mix` by weight, encoded with the tokenizer's chat
    template (labels per `cfg.loss_on`) and packed into rows of `cfg.seq_len` tokens."""
    if not cfg.mix:
        raise UserError("data.mix: name at least one chat JSONL file ({path, weight})")
    folder = tokenizer_folder or cfg.tokenizer
    if folder is None:
        raise UserError("data.mix: chat data needs the model's tokenizer (set model.pretrained or data.tokenizer)")
    tokenizer = load_chat_tokenizer(Path(folder))
    encoder = ChatEncoder(tokenizer, loss_on=cfg.loss_on)
    datasets = [[encoder.encode(messages) for messages in read_chat_records(source.path)] for source in cfg.mix]
    chosen = mix(datasets, [source.weight for source in cfg.mix], examples, seed=seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return list(pack_examples(chosen, cfg.seq_len, pad_id=pad))
