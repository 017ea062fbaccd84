"""Chat data tokenised once, in parallel, into a memory-mapped cache: what ``model.family: causal_lm`` trains from.

Rows come from any layout of chat_sources.py, in one of two formats:

- ``messages``: a whole conversation; labels are the assistant tokens of the training template (chat.py,
  TRL's ``assistant_only_loss``). Other columns (ultrachat's ``prompt``, ``prompt_id``) are ignored, but
  ``prompt_id`` or ``key`` names the conversation.
- TRL's conversational prompt/completion: ``prompt`` and ``completion``, each a list of messages. As TRL
  1.16's SFTTrainer labels them with its defaults (completion_only_loss): the prompt rendered with the
  generation prompt gets no loss, every token after it does (the completion turns, their end-of-turn tokens),
  with the tokenizer's own template (or ``causal_lm.chat_template``).

Both are truncated at causal_lm.max_len (the end dropped) or skipped (causal_lm.overlong), and a conversation left with no
labelled token is dropped, as TRL drops it; each is counted. The cache (token_cache.py) holds ``ids.npy``
(uint16 when the vocabulary fits, else int32), ``mask.npy`` (uint8, 1 where labelled), ``offsets.npy``
(int64, n + 1) and the keys; a DataLoader worker or another rank maps the same files.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError
from ..errors import DataError
from .chat import ChatEncoder, checked_message, parse_chat_obj, training_template
from .chat_sources import Unit, read_unit, resolve_files, units_of
from .dataset import Sample
from .prompt import Tokens
from .token_cache import Entry, file_identity, parallel_map, text_hash, tokenizer_identity, workers_for

log = logging.getLogger("brisk")

COUNTS = ("truncated", "skipped", "unlabelled", "bad_rows")


def _messages(value, where: str, name: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: '{name}' must be a non-empty list of messages")
    return [checked_message(m, where, f"{name}[{i}]") for i, m in enumerate(value)]


def parse_row(row, where: str) -> tuple[str, list[dict], list[dict] | None]:
    """(key, messages, completion): completion is None for the messages format; for prompt/completion,
    messages is the prompt."""
    if isinstance(row, DataError):
        raise row
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'messages' (or 'prompt' and 'completion')")
    if row.get("messages") is not None:
        conv = parse_chat_obj(row, where)
        return conv.key, conv.messages, None
    if "prompt" in row and "completion" in row:
        if isinstance(row["prompt"], str) or isinstance(row["completion"], str):
            raise DataError(f"{where}: 'prompt' and 'completion' are plain text; brisk reads the conversational "
                            "format (each a list of {role, content} messages)")
        prompt = _messages(row["prompt"], where, "prompt")
        completion = _messages(row["completion"], where, "completion")
        if any(m["role"] == "system" for m in prompt[1:] + completion):
            raise DataError(f"{where}: a system message may only come first")
        key = row.get("key", row.get("prompt_id", where))
        return str(key), prompt, completion
    raise DataError(f"{where}: expected 'messages' (a list of messages) or 'prompt' and 'completion'; the row "
                    f"has {', '.join(sorted(map(str, row))) or 'no columns'}")


class CompletionEncoder:
    """TRL 1.16's prompt/completion labelling (SFTTrainer.tokenize_fn, completion_only_loss)."""

    def __init__(self, tokenizer, template: str | None):
        self.tok, self.template = tokenizer, template

    def render(self, prompt: list[dict], completion: list[dict]) -> tuple[list[int], list[int]]:
        kw = {"tokenize": True, "return_dict": True, "chat_template": self.template}
        p = list(self.tok.apply_chat_template(prompt, add_generation_prompt=True, **kw)["input_ids"])
        ids = list(self.tok.apply_chat_template(prompt + completion, **kw)["input_ids"])
        n = 0  # the completion starts where the two renderings diverge (TRL's common_prefix_length)
        for a, b in zip(p, ids):
            if a != b:
                break
            n += 1
        return ids, [-100] * n + ids[n:]


class _UnitEncoder:
    """Tokenises one unit of rows; runs in a forked worker (the tokenizer comes with the fork)."""

    def __init__(self, tokenizer, template: str, completion_template: str | None, max_len: int, overlong: str,
                 dtype):
        self.chat = ChatEncoder(tokenizer, template, max_len, overlong)
        self.completion = CompletionEncoder(tokenizer, completion_template)
        self.max_len, self.overlong, self.dtype = max_len, overlong, dtype

    def __call__(self, unit: Unit) -> dict:
        ids, mask, lengths, keys = [], [], [], []
        counts = dict.fromkeys(COUNTS, 0)
        bad: list[str] = []
        for where, row in read_unit(unit):
            try:
                key, messages, completion = parse_row(row, where)
            except DataError as e:
                bad.append(str(e))
                counts["bad_rows"] += 1
                continue
            if completion is None:
                t, labels = self.chat.render(messages)
            else:
                t, labels = self.completion.render(messages, completion)
            if len(t) > self.max_len:
                if self.overlong == "skip":
                    counts["skipped"] += 1
                    continue
                t, labels = t[: self.max_len], labels[: self.max_len]
                counts["truncated"] += 1
            if all(x == -100 for x in labels):
                counts["unlabelled"] += 1
                continue
            if labels[0] != -100:  # the shifted loss and packing need it: no target crosses conversations
                return {"fatal": f"{where}: the chat template starts with a labelled token; a conversation must "
                                 "open with a system or user turn"}
            ids.append(np.asarray(t, dtype=self.dtype))
            mask.append(np.asarray([x != -100 for x in labels], dtype=np.uint8))
            lengths.append(len(t))
            keys.append(key)
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
        return {"ids": cat(ids, self.dtype), "mask": cat(mask, np.uint8), "lengths": np.asarray(lengths, np.int64),
                "keys": keys, "counts": counts, "bad": bad}


# ------------------------------------------------------------------------------------------- the files
class _NpyWriter:
    """A 1-D .npy written as it grows: a header of fixed size first, rewritten with the length at the end."""

    HEADER = 128

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.f = path.open("wb")
        self.f.write(b"\0" * self.HEADER)

    def write(self, a: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(a, dtype=self.dtype).tobytes())
        self.n += len(a)

    def close(self) -> None:
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                    "fortran_order": False, "shape": (self.n,)})
        if len(head.getvalue()) != self.HEADER:  # pragma: no cover - a 1-D header always fits 128 bytes
            raise RuntimeError("unexpected .npy header size")
        self.f.seek(0)
        self.f.write(head.getvalue())
        self.f.close()


def _write_store(folder: Path, results, dtype, skip_bad: bool) -> dict:
    ids, mask = _NpyWriter(folder / "ids.npy", dtype), _NpyWriter(folder / "mask.npy", np.uint8)
    lengths, counts, bad = [], dict.fromkeys(COUNTS, 0), []
    with (folder / "keys.txt").open("w", encoding="utf-8") as keys:
        for r in results:
            if "fatal" in r:
                raise DataError(r["fatal"])
            if r["bad"] and not skip_bad:
                raise DataError(r["bad"][0], "rows")
            ids.write(r["ids"])
            mask.write(r["mask"])
            lengths.append(r["lengths"])
            keys.writelines(k.replace("\n", " ") + "\n" for k in r["keys"])
            for k, v in r["counts"].items():
                counts[k] += v
            bad += r["bad"][: max(0, 20 - len(bad))]  # the first few, for the log and the summary
    ids.close()
    mask.close()
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    np.save(folder / "offsets.npy", np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    return {"n": int(len(lens)), "tokens": int(lens.sum()), "counts": counts, "bad_first": bad}


class ChatStore(torch.utils.data.Dataset):
    """Tokenised conversations read from a cache entry, memory-mapped. Pickles by path: a DataLoader worker
    (fork or spawn) maps the same files instead of receiving a copy."""

    def __init__(self, folder: str | Path, meta: dict):
        self.folder, self.meta = Path(folder), meta
        self.counts = {k: meta["counts"].get(k, 0) for k in COUNTS}
        self.bad_first: list[str] = meta.get("bad_first", [])
        self._arrays = None
        self._keys: list[str] | None = None
        self.cache_note = ""  # how the cache was used: read, or built and why

    def _open(self):
        if self._arrays is None:
            load = lambda name: np.load(self.folder / name, mmap_mode="r")  # noqa: E731
            self._arrays = (load("ids.npy"), load("mask.npy"), np.load(self.folder / "offsets.npy"))
        return self._arrays

    def __getstate__(self):
        return {**self.__dict__, "_arrays": None, "_keys": None}

    def __len__(self) -> int:
        return int(self.meta["n"])

    def lengths(self) -> np.ndarray:
        return np.diff(self._open()[2])

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = (self.folder / "keys.txt").read_text(encoding="utf-8").split("\n")[: len(self)]
        return self._keys

    def tokens(self, index: int) -> Tokens:
        ids, mask, off = self._open()
        a, b = int(off[index]), int(off[index + 1])
        t = ids[a:b].astype(np.int64)
        return Tokens(t.tolist(), np.where(mask[a:b] != 0, t, -100).tolist())

    def __getitem__(self, item: tuple[int, int] | int) -> Sample:
        index, _ = item if isinstance(item, tuple) else (item, 0)
        return Sample(self.keys[index], [], self.tokens(index))


def completion_template(tokenizer, path: str | None) -> str | None:
    if path:
        return Path(path).read_text(encoding="utf-8")
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        raise ConfigError("data.tokenizer: the tokenizer folder has no chat template; give one with "
                          "causal_lm.chat_template=FILE")
    return own.get("default") if isinstance(own, dict) else own


def build_chat_store(path: str, tokenizer, *, max_len: int, overlong: str, skip_bad: bool, cache_dir: str | Path,
                     split: str | None = None, template_path: str | None = None, workers: int = 0,
                     what: str = "data.train") -> ChatStore:
    files = resolve_files(path, split, what)
    template = training_template(tokenizer, template_path)
    plain = completion_template(tokenizer, template_path)
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.int32
    entry = Entry(cache_dir, "chat", f"{path}|{split}", {
        "files": file_identity(files), "tokenizer": tokenizer_identity(tokenizer), "template": text_hash(template + plain),
        "max_len": max_len, "overlong": overlong, "skip_bad": skip_bad, "dtype": np.dtype(dtype).name})

    def build(folder: Path) -> dict:
        units = units_of(files)
        rows = sum(u.hi - u.lo for u in units if u.kind != "jsonl")
        n_jobs = workers_for(len(units), workers)
        job = _UnitEncoder(tokenizer, template, plain, max_len, overlong, dtype)
        # jsonl units are measured in bytes: progress counts units there, rows elsewhere
        size = (lambda u: u.hi - u.lo) if rows else (lambda u: 1)
        results = parallel_map(job, units, n_jobs, f"tokenising {what}", rows or len(units), size)
        meta = _write_store(folder, results, dtype, skip_bad)
        meta["workers"] = n_jobs
        return meta

    entry.get(build, f"{what} ({len(files)} file{'s' * (len(files) > 1)}, tokens)")
    store = ChatStore(entry.path, entry.meta)
    store.cache_note = entry.note
    report(store, path, max_len, overlong)
    if not len(store):
        raise DataError(f"{path}: no usable conversations")
    return store


def report(store: ChatStore, path: str, max_len: int, overlong: str) -> None:
    """Every conversation not trained as written is counted here (and in the run's summary)."""
    c = store.counts
    log.info("%s: %d conversations, %d tokens", path, len(store), store.meta["tokens"])
    if c["truncated"] or c["skipped"]:
        log.info("%s: %d conversations over causal_lm.max_len=%d %s", path, c["truncated"] + c["skipped"], max_len,
                 "truncated" if overlong == "truncate" else "skipped (causal_lm.overlong=skip)")
    if c["unlabelled"]:
        log.warning("%s: %d conversations dropped: no assistant token left within causal_lm.max_len=%d", path,
                    c["unlabelled"], max_len)
    if c["bad_rows"]:
        log.warning("%s: skipped %d bad rows (data.skip_bad=true), first: %s", path, c["bad_rows"],
                    store.bad_first[0] if store.bad_first else "?")


def read_rows(path: str, split: str | None = None, what: str = "data.valid",
              n: int | None = None) -> list[tuple[str, list[dict], list[dict] | None]]:
    """The first ``n`` good rows of chat data in any layout (chat_sources.py), parsed as training parses them:
    (key, messages, completion) as parse_row returns them; bad rows are left out (the store counts them)."""
    out = []
    for unit in units_of(resolve_files(path, split, what)):
        for where, row in read_unit(unit):
            if n is not None and len(out) >= n:
                return out
            try:
                out.append(parse_row(row, where))
            except DataError:
                continue
    return out
