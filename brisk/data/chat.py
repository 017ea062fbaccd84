"""Chat SFT rows -> tokens with assistant-only labels, for ``model.family: causal_lm`` (read, cached and counted by
chat_store.py, from any layout of chat_sources.py; training and `brisk eval` both read through it).

One conversation a row, in the format ultrachat / OpenAI-style sets already have::

    {"messages": [{"role": "system", "content": "..."},      # optional
                  {"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}

Tokens come from the model folder's own chat template, rendered by ``tokenizer.apply_chat_template`` with
``return_assistant_tokens_mask=True``; labels are the token ids where that mask is 1 and -100 elsewhere,
which is how TRL's SFTTrainer builds assistant-only labels. The mask needs ``{% generation %}`` markers in
the template; most model templates lack them, so, as TRL does, a known template is swapped for its
training twin (the twins TRL ships, vendored in ``chat_templates/``), or ``causal_lm.chat_template`` names one.
A conversation longer than ``causal_lm.max_len`` is truncated at the end (TRL's keep_start) or skipped
(``causal_lm.overlong``), and counted; one left without a labelled token is dropped, as TRL drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .jsonl import DataError
from .prompt import Tokens

TEMPLATES = Path(__file__).parent / "chat_templates"
# Model templates (as their folders ship them) whose training twin brisk knows: TRL's list for the Qwen3 family.
KNOWN = ("qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8")
ROLES = ("system", "user", "assistant")


def has_generation_markers(template: str) -> bool:
    return "{%- generation %}" in template or "{% generation %}" in template


def training_template(tokenizer, path: str | None = None) -> str:
    """The chat template whose ``{% generation %}`` markers give the assistant mask.

    ``path`` (causal_lm.chat_template) wins; else the tokenizer's own if it has markers; else the training twin of
    a known model template; else a ConfigError that says how to give one."""
    if path:
        text = Path(path).read_text(encoding="utf-8")
        if not has_generation_markers(text):
            raise ConfigError(f"causal_lm.chat_template={path}: has no {{% generation %}} markers, so no assistant-only "
                              "labels can come from it; wrap the assistant output in {% generation %}...{% endgeneration %}")
        return text
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        raise ConfigError("data.tokenizer: the tokenizer folder has no chat template (chat_template.jinja or "
                          "tokenizer_config.json's chat_template); give one with causal_lm.chat_template=FILE")
    if isinstance(own, dict):
        own = own.get("default", "")
    if has_generation_markers(own):
        return own
    for name in KNOWN:
        if own == (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"):
            return (TEMPLATES / f"{name}_training.jinja").read_text(encoding="utf-8")
    raise ConfigError("causal_lm.chat_template: the tokenizer's chat template has no {% generation %} markers and is not "
                      f"one brisk knows ({', '.join(KNOWN)}); give a template with markers: causal_lm.chat_template=FILE")


@dataclass
class Conversation:
    key: str
    source: str  # "file:line"
    messages: list[dict]


def checked_message(msg, where: str, name: str) -> dict:
    """One chat message with a known role and string content (``name``: where it sits, e.g. messages[2]), as a
    clean {role, content} dict; one DataError line naming ``where`` and ``name`` otherwise."""
    if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
        raise DataError(f"{where}: {name} needs 'role' and 'content'")
    if msg["role"] not in ROLES:
        raise DataError(f"{where}: {name} has role {msg['role']!r}; use one of {', '.join(ROLES)}")
    if not isinstance(msg["content"], str):
        raise DataError(f"{where}: {name}.content must be a string")
    if "<|startofspeech|>" in msg["content"]:  # a speech line would train the text model on an audio path's text
        raise DataError(f"{where}: {name} holds a <|startofspeech|> audio reference: this is speech data (FunASR "
                        "jsonl), and a chat model (model.family=causal_lm) reads text; train it with "
                        "model.family=fun_asr_nano or qwen3_asr")
    return {"role": msg["role"], "content": msg["content"]}


def parse_chat_obj(obj, where: str) -> Conversation:
    """A row of a chat data set (a jsonl line, a parquet or arrow row) with a ``messages`` list."""
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) or not obj["messages"]:
        raise DataError(f"{where}: expected an object with a non-empty 'messages' list")
    messages = []
    for i, msg in enumerate(obj["messages"]):
        messages.append(checked_message(msg, where, f"messages[{i}]"))
        if msg["role"] == "system" and i > 0:
            raise DataError(f"{where}: messages[{i}]: a system message may only come first")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message, so nothing to learn from")
    key = obj.get("key", obj.get("prompt_id", where))
    return Conversation(str(key), where, messages)


class ChatEncoder:
    """Conversation -> (input_ids, labels) with the training template; ``None`` for one that is dropped."""

    def __init__(self, tokenizer, template: str, max_len: int, overlong: str):
        self.tok, self.template = tokenizer, template
        self.max_len, self.overlong = max_len, overlong
        quiet_length_warning(tokenizer)

    def render(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True, chat_template=self.template,
                                           return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        return ids, [t if m else -100 for t, m in zip(ids, mask)]

    def encode(self, conv: Conversation) -> tuple[Tokens | None, str]:
        """(tokens, what happened): '' kept as is, 'truncated', 'skipped' (too long), 'unlabelled'."""
        ids, labels = self.render(conv.messages)
        what = ""
        if len(ids) > self.max_len:
            if self.overlong == "skip":
                return None, "skipped"
            ids, labels, what = ids[: self.max_len], labels[: self.max_len], "truncated"
        if all(x == -100 for x in labels):
            return None, "unlabelled"
        if labels[0] != -100:  # the shifted loss and packing need it: no target crosses conversations
            raise DataError(f"{conv.source}: the chat template starts with an assistant token; a conversation must "
                            "open with a system or user turn")
        return Tokens(ids, labels), what


def quiet_length_warning(tokenizer) -> None:
    """Mark transformers' "Token indices sequence length is longer than the specified maximum ... will result in
    indexing errors" as already shown: brisk truncates or skips by causal_lm.max_len itself and says how many."""
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
