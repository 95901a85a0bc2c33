"""Chat and instruction records into token ids with labels on the assistant's turns only.

A record is a JSON object with `messages` ([{role, content}, ...]) or with `prompt` and
`response` (read as one user turn and one assistant turn). It is rendered with the
tokenizer's chat template (transformers `apply_chat_template`) where it has one, else with
`PLAIN_CHAT_TEMPLATE`. Fine-tuning on the prompt tokens as well teaches the model to write
prompts; the usual practice (the InstructGPT/Alpaca-style SFT recipes, TRL's
`assistant_only_loss`) trains on the answers only, so `loss_on="assistant"` labels -100
everywhere else. Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flopwise.errors import UserError

IGNORE_INDEX = -100  # the label torch's cross_entropy and HF models skip
# Used when the tokenizer has no chat template: one line naming the role, then the text.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatExample:
    """One conversation as token ids, and the label of each (its own id, or IGNORE_INDEX)."""

    input_ids: list[int]
    labels: list[int]


def read_chat_records(path: Path) -> Iterator[list[dict]]:
    """Yield each JSONL record of `path` as a list of {role, content} messages."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"data.mix: {path} does not exist")
    try:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if line.strip():
                    yield _messages_of(_parse(line, path, line_no), path, line_no)
    except UnicodeDecodeError:
        raise UserError(f"data.mix: {path} is not UTF-8 text; JSONL must be UTF-8") from None
    except OSError as exc:
        raise UserError(f"data.mix: cannot read {path}: {exc.strerror or exc}") from None


def _parse(line: str, path: Path, line_no: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}:{line_no}: expected a JSON object with `messages` or `prompt`/`response`")
    return record


def _messages_of(record: dict, path: Path, line_no: int) -> list[dict]:
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record and "response" in record:
        messages = [{"role": "user", "content": record["prompt"]},
                    {"role": "assistant", "content": record["response"]}]
    else:
        raise UserError(f"{path}:{line_no}: no `messages` list and no `prompt`/`response` fields")
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{path}:{line_no}: `messages` must be a non-empty list of {{role, content}}")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise UserError(f"{path}:{line_no}: each message needs a role ({', '.join(ROLES)}) "
                            "and a text content")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def load_chat_tokenizer(folder: Path):
    """A transformers fast tokenizer from a local folder, given `PLAIN_CHAT_TEMPLATE` if it has no template."""
    from flopwise.hf_logging import quiet_hf_libraries

    quiet_hf_libraries()
    from transformers import AutoTokenizer

    folder = Path(folder).expanduser()
    if folder.is_file():
        folder = folder.parent
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, ...)
        raise UserError(f"data.tokenizer: cannot load a tokenizer from {folder} "
                        f"({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"data.tokenizer: the tokenizer in {folder} is not a fast tokenizer "
                        "(needs tokenizer.json for character offsets)")
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer


class ChatEncoder:
    """Renders conversations and labels the tokens of the assistant's turns.

    The assistant's spans are found as character ranges: the text of the conversation up
    to message i (with the generation prompt when message i is the assistant's) is a
    prefix of the full text, so message i covers the characters between the two renders.
    A token is labelled when its first character lies in such a span. Templates whose
    renders are not prefixes of each other are refused (rather than mislabelled).
    """

    def __init__(self, tokenizer, loss_on: str = "assistant", add_eos: bool = True):
        if loss_on not in ("assistant", "all"):
            raise UserError(f"data.loss_on: {loss_on!r} is not allowed (allowed: assistant, all)")
        self.tokenizer = tokenizer
        self.loss_on = loss_on
        self.eos_id = tokenizer.eos_token_id if add_eos else None

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The template's text; its own refusals (roles that must alternate, ...) become one line."""
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # noqa: BLE001  (jinja's TemplateError, the template's raise_exception)
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            roles = ", ".join(m["role"] for m in messages)
            raise UserError(f"data.mix: the chat template refuses a conversation with roles [{roles}] ({first})") from None

    def assistant_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The full text and the [start, end) character spans of the assistant's turns."""
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True) if i else ""
            through = self.render(messages[: i + 1])
            if not text.startswith(through) or not through.startswith(before):
                raise UserError("data.loss_on: the chat template renders a conversation's beginning differently "
                                "from the whole; set data.loss_on=all for this tokenizer")
            spans.append((len(before), len(through)))
        return text, spans

    def encode(self, messages: list[dict]) -> ChatExample:
        text, spans = self.assistant_spans(messages)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        if self.loss_on == "all":
            labels = list(ids)
        else:
            labels = [tok if any(a <= start < b for a, b in spans) else IGNORE_INDEX
                      for tok, (start, _end) in zip(ids, encoded["offset_mapping"])]
        if self.eos_id is not None:
            ids.append(self.eos_id)
            # the end of an answer is worth learning: the model learns to stop
            ends_with_answer = messages[-1]["role"] == "assistant"
            labels.append(self.eos_id if self.loss_on == "all" or ends_with_answer else IGNORE_INDEX)
        return ChatExample(ids, labels)
