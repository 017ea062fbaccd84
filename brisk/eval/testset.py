"""A whole test set: inputs of any size, decoded in length-sorted batches, results streamed to a jsonl.

Inputs (``read_items``): a FunASR jsonl (each line's first audio and first answer, the reference), a folder
(every audio file under it, in path order; no references) or audio files. The batches are fixed before any
decoding: every input sorted by length (longest first, so the largest batch's memory is met at the start),
cut into ``batch_size`` pieces. A resumed run therefore decodes the same batches as an uninterrupted one and
writes the same transcripts.

``ResultsFile`` appends one line per utterance as each batch finishes (flushed, with its input ``index``), so
a killed run keeps everything it decoded; ``--resume`` reads those lines (a torn last line is dropped), checks
each against the input (same index, same key) and decodes only batches with something left. When every
input is done the file is rewritten, atomically, in input order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf
import torch

from ..diagnose.slow import usable_cores
from ..errors import ConfigError, DataError
from ..files import _atomic_file

log = logging.getLogger("brisk")

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".m4a", ".aac", ".aiff", ".aif", ".au", ".sph")


@dataclass(frozen=True)
class Item:
    index: int  # position in the input: the output's order
    key: str
    path: str  # audio file
    ref: str | None  # the reference transcript (a jsonl's first answer); None for bare audio
    seconds: float  # duration, for sorting (a jsonl's speech_length, else the file header)


def _duration(path: Path) -> float:
    try:
        info = sf.info(str(path))
        return info.frames / max(info.samplerate, 1)
    except (sf.LibsndfileError, RuntimeError, OSError):
        return 0.0  # unreadable here: sorted last; reading it for decoding says what is wrong, naming the file


EVAL_HINT = "(fix or remove such lines: eval and transcribe skip them only for a run trained with data.skip_bad=true)"


def read_items(sources: list[str], max_speech_length: int = 10**9, skip_bad: bool = False) -> list[Item]:
    """Each source: a .jsonl (FunASR lines: key, first audio, first answer), a folder (its audio files, sorted,
    keys their paths relative to it without suffix) or an audio file (key: its name without suffix)."""
    from ..data.jsonl import read_jsonl

    items: list[Item] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.suffix.lower() in AUDIO_SUFFIXES and f.is_file())
            if not files:
                raise DataError(f"{p}: a folder with no audio files ({', '.join(AUDIO_SUFFIXES[:4])}, ...)")
            for f in files:
                key = str(f.relative_to(p).with_suffix(""))
                items.append(Item(len(items), key, str(f), None, _duration(f)))
        elif p.suffix == ".jsonl":
            if not p.is_file():
                raise DataError(f"{p}: no such jsonl file")
            try:
                index = read_jsonl(p, max_speech_length=max_speech_length, max_text_length=10**9, skip_bad=skip_bad)
            except DataError as e:  # training's hint names a key these commands do not take
                raise DataError(f"{e.problem} {EVAL_HINT}" if e.skippable else str(e)) from None
            for u in index.utterances:
                ref = u.assistant[0] if u.assistant else None
                items.append(Item(len(items), u.key, u.audio_paths()[0], ref, u.speech_length / 100))
        else:
            items.append(Item(len(items), p.stem, str(p), None, _duration(p) if p.is_file() else 0.0))
    return items


def items_of(keys: list[str], paths: list[str], refs: list[str | None]) -> list[Item]:
    """Items of a model family's own eval set (its jsonl layout); durations from the audio headers."""
    return [Item(i, k, p, r, _duration(Path(p))) for i, (k, p, r) in enumerate(zip(keys, paths, refs))]


def length_batches(items: list[Item], batch_size: int) -> list[list[Item]]:
    """Every item sorted by duration, longest first (ties: input order), cut into batches of ``batch_size``."""
    order = sorted(items, key=lambda it: (-it.seconds, it.index))
    return [order[b:b + batch_size] for b in range(0, len(order), batch_size)]


class ResultsFile:
    """One jsonl line per decoded utterance, appended as decoded; rewritten in input order once all are in."""

    def __init__(self, path: Path, items: list[Item], resume: bool):
        self.path, self.items = path, items
        self.rows: dict[int, dict] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.is_file():
            self._read_back()
        elif path.exists() and not resume:
            log.info("%s exists: written afresh (--resume continues it instead)", path)
        mode = "a" if self.rows else "w"
        self.file = path.open(mode, encoding="utf-8")
        if resume:
            log.info("--resume: %d of %d utterances already in %s", len(self.rows), len(items), path)

    def _read_back(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        keep = 0  # bytes of whole lines
        for n, line in enumerate(lines, 1):
            if not line.strip():
                keep += len(line.encode()) + 1
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):  # the last line, torn by the kill: dropped, decoded again
                    break
                raise DataError(f"{self.path}:{n}: not a JSON line; this file was not written by brisk eval/transcribe "
                                "(drop --resume to start afresh)") from None
            i = row.get("index")
            if not isinstance(i, int) or not 0 <= i < len(self.items) or self.items[i].key != row.get("key"):
                raise DataError(f"{self.path}:{n}: index {i} / key {row.get('key')!r} is not in this input at that "
                                "position: the file belongs to another input (drop --resume to start afresh)")
            self.rows[i] = row
            keep += len(line.encode()) + 1
        with self.path.open("r+b") as f:
            f.truncate(min(keep, os.path.getsize(self.path)))

    def done(self, item: Item) -> bool:
        return item.index in self.rows

    def add(self, rows: list[dict]) -> None:
        for row in rows:
            self.rows[row["index"]] = row
            self.file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.file.flush()  # a killed process keeps every finished batch

    def complete(self) -> bool:
        return len(self.rows) == len(self.items)

    def close(self) -> list[dict]:
        """The rows in input order; the file rewritten so when every input is done."""
        self.file.close()
        rows = [self.rows[i] for i in sorted(self.rows)]
        if self.complete():
            with _atomic_file(self.path, sync=False, mode="w") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return rows


def progress_bar(total: int, done: int, enabled: bool):
    """A rich progress bar over utterances: count, utterances/s, elapsed, ETA (shown on a terminal only)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.2f} utts/s" if task.speed else "- utts/s")

    bar = Progress(TextColumn("decoding"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), disable=not enabled, transient=False)
    task = bar.add_task("decode", total=total, completed=done)
    return bar, task


def auto_threads(rec) -> int:
    """--host-threads 0: one thread on a GPU with the features there (the host only feeds it); on the CPU one a
    usable core less the one the audio reader takes; the count as it is (-1) otherwise (CPU features for a GPU).
    On a busy 2-core machine torch's default of 2 decoded the CPU demo's eval in 18.9 s, one thread in 0.4 s: every
    parallel op waits at a barrier for the thread whose core the other process holds."""
    if rec.device.type == "cuda":
        return 1 if getattr(rec, "device_features", False) else -1
    if rec.device.type == "cpu":
        return max(1, usable_cores() - 1)
    return -1


@contextmanager
def host_threads(rec, n: int = 0):
    """torch's intra-op CPU threads while ``rec`` decodes, put back after (torch.set_num_threads is process-wide).

    ``n``: that many; -1 the count as it is (torch's default, one a core, unless something set it); 0 (auto) one
    thread when ``rec`` decodes on a GPU with its features there, the count as it is otherwise. On a GPU the
    host only reads, pads and copies. On one H200 (a 16-vCPU VM, batch 64, four interleaved fresh
    processes): 74.5 and 73.5 utterances/s with torch's 16 threads, 160.4 and 160.9 with one, with no steal
    time recorded; in one slow process the host padding of a batch's waveforms alone took 288 ms against 4 with
    one thread. Features made on the CPU (--cpu-features) keep the count: their fbank is the CPU's own work.
    OpenMP keeps a count per thread: threads started inside (the decoder's prefetch thread, and its reading
    pool when first made here) take the new count and keep it after."""
    if n < -1:
        raise ConfigError(f"--host-threads {n}: use -1 (as they are), 0 (auto) or a count")
    want = n if n else auto_threads(rec)
    before = torch.get_num_threads()
    if want < 1 or want == before:
        yield
        return
    torch.set_num_threads(want)
    log.info("decoding: %d torch CPU thread(s) (of %d; put back after)%s", want, before,
             "" if n else (": the host only reads, pads and copies for the GPU" if rec.device.type == "cuda" else
                           ": a core left to the audio reader (OpenMP threads wait for any that lost its core)"))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decode_items(rec, items: list[Item], batch_size: int, max_new_tokens: int | None = None, skip=None,
                 max_utts: int | None = None):
    """Yield (items, Results) per length-sorted batch; batches whose items ``skip`` says are done are passed over
    (a partly done batch is decoded whole: its batch-mates are the same as in an uninterrupted run). Stops
    after the batch that reaches ``max_utts`` utterances decoded in this call."""
    batches = length_batches(items, batch_size)
    todo = [b for b in batches if skip is None or not all(skip(it) for it in b)]
    if max_utts is not None:
        cut, n = 0, 0
        while cut < len(todo) and n < max_utts:
            n += len(todo[cut])
            cut += 1
        todo = todo[:cut]
    results = rec.transcribe_batches([[it.path for it in b] for b in todo], max_new_tokens)
    for batch, res in zip(todo, results):
        yield batch, res


def run_items(rec, items: list[Item], out: Path | None, row_of, batch_size: int, max_new_tokens: int | None = None,
              resume: bool = False, max_utts: int | None = None, progress: bool = False,
              threads: int = 0) -> tuple[list[dict], dict]:
    """Decode ``items`` into rows (``row_of(item, result)``), streamed to ``out`` when given, with ``threads``
    torch CPU threads (``host_threads``). Returns the rows in input order (those of earlier runs too, with
    --resume) and this run's timing: seconds, utterances and audio seconds decoded now."""
    sink = ResultsFile(out, items, resume) if out is not None else None
    rows: dict[int, dict] = {}
    decoded, audio, t0 = 0, 0.0, time.perf_counter()
    done = len(sink.rows) if sink else 0
    bar, task = progress_bar(len(items), done, progress)
    try:
        with bar, host_threads(rec, threads):
            for batch, results in decode_items(rec, items, batch_size, max_new_tokens,
                                               skip=sink.done if sink else None, max_utts=max_utts):
                new = [dict(index=it.index, **row_of(it, r)) for it, r in zip(batch, results)
                       if sink is None or not sink.done(it)]
                if sink is not None:
                    sink.add(new)
                for row in new:
                    rows[row["index"]] = row
                decoded += len(new)
                audio += sum(r.audio_seconds for it, r in zip(batch, results))
                bar.update(task, advance=len(new))
        if rec.device.type == "cuda":
            torch.cuda.synchronize(rec.device)
    finally:
        if sink is not None:
            ordered = sink.close()
    seconds = time.perf_counter() - t0
    if sink is None:
        ordered = [rows[i] for i in sorted(rows)]
    return ordered, {"seconds": seconds, "decoded": decoded, "audio_seconds": audio}
