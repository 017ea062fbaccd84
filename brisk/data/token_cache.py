"""A data set prepared once and kept on disk: tokenised conversations, an indexed speech list.

The cache key is what the prepared arrays depend on: each data file's path, size and modification time (not a
content hash: hashing a 1.4 GB parquet set costs seconds at every start, and a rewritten file changes its
mtime), the tokenizer (a hash of its folder's files), the template text and the settings (max_len, overlong,
...). An entry is a folder ``<cache_dir>/<name>-<key>/`` of ``.npy`` arrays (read memory-mapped) and a
``meta.json`` written last; it appears by one rename, so a reader never sees half an entry.

Who builds: the first process to take the entry's lock (an ``flock`` on ``<name>-<key>.lock``). Every other
process, the other ranks of a run, or a second run on the same data, waits on the lock and then reads what
was built: no data set is prepared twice on one machine. For each source (data path + split) a small
``<name>-<source>.last.json`` remembers the last key's fields, so a rebuild can say what changed; the entry it
supersedes is removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("brisk")

VERSION = 1  # bumped when the layout of an entry changes


def file_identity(files: Iterable[Path]) -> list[list]:
    out = []
    for f in files:
        st = os.stat(f)
        out.append([str(Path(f).resolve()), st.st_size, st.st_mtime_ns])
    return out


def tokenizer_identity(tokenizer) -> str:
    """A hash of the tokenizer's folder (every file under 256 MB: vocab, merges, config, template); for a
    tokenizer with no folder, of its serialised vocabulary and settings."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.stat().st_size < 256 << 20:
                h.update(p.relative_to(folder).as_posix().encode())
                h.update(p.read_bytes())
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        h.update((backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)).encode())
    h.update(str(len(tokenizer)).encode())
    return h.hexdigest()[:16]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe_change(old: dict, new: dict) -> str:
    """What differs between two keys' fields, in words: 'data file x changed (size, mtime)', 'max_len 2048 -> 512'."""
    parts = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if k == "files":
            before = {f[0]: f[1:] for f in a or []}
            after = {f[0]: f[1:] for f in b or []}
            changed = [p for p in after if p in before and before[p] != after[p]]
            added = [p for p in after if p not in before]
            removed = [p for p in before if p not in after]
            for what, names in (("changed", changed), ("added", added), ("removed", removed)):
                if names:
                    parts.append(f"{len(names)} data file(s) {what} ({Path(names[0]).name}"
                                 + (", ..." if len(names) > 1 else "") + ")")
        elif k in ("tokenizer", "template"):
            parts.append(f"the {k} changed")
        else:
            parts.append(f"{k} {a} -> {b}")
    return "; ".join(parts) or "the cache layout changed"


class Entry:
    """One cache entry: ``path`` once built, with ``meta`` (meta.json)."""

    def __init__(self, root: str | Path, name: str, source: str, fields: dict):
        self.root, self.name = Path(root), name
        self.fields = {"version": VERSION, **fields}
        self.key = hashlib.sha256(json.dumps(self.fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.path = self.root / f"{name}-{self.key}"
        self.pointer = self.root / f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:12]}.last.json"
        self.meta: dict = {}
        self.note = ""  # what get() did: "read", "read (built by another process)", or "built: <why>"

    def ready(self) -> bool:
        meta = self.path / "meta.json"
        if meta.is_file():
            self.meta = json.loads(meta.read_text(encoding="utf-8"))
            return True
        return False

    def why_build(self) -> str:
        if self.pointer.is_file():
            try:
                old = json.loads(self.pointer.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return "no usable record of an earlier build"
            return describe_change(old.get("fields", {}), self.fields)
        return "first use of this data"

    @contextmanager
    def lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{self.name}-{self.key}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # the others wait here while one process builds
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def get(self, build: Callable[[Path], dict], what: str) -> bool:
        """Read the entry, or build it with ``build(tmp_folder) -> meta`` (under the lock). True when built here."""
        if self.ready():
            log.info("%s: read from the cache %s (built %s)", what, self.path, self.meta.get("built", "?"))
            self.note = "read"
            return False
        with self.lock():
            if self.ready():  # another process built it while this one waited
                log.info("%s: read from the cache %s, built by another process", what, self.path)
                self.note = "read (built by another process)"
                return False
            why = self.why_build()
            self.note = f"built: {why}"
            log.info("%s: preparing once into %s (%s)", what, self.path, why)
            tmp = self.root / f".{self.path.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                meta = build(tmp)
                meta.update(fields=self.fields, built=time.strftime("%Y-%m-%d %H:%M:%S"))
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
                shutil.rmtree(self.path, ignore_errors=True)
                os.replace(tmp, self.path)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self._supersede()
            self.ready()
            return True

    def _supersede(self) -> None:
        if self.pointer.is_file():
            try:
                old = json.loads(self.pointer.read_text(encoding="utf-8")).get("entry")
            except (OSError, ValueError):
                old = None
            if old and old != self.path.name and (self.root / old).is_dir():
                shutil.rmtree(self.root / old, ignore_errors=True)  # readers of it keep their open maps (POSIX)
                (self.root / f"{old}.lock").unlink(missing_ok=True)
        tmp = self.pointer.with_suffix(".tmp")
        tmp.write_text(json.dumps({"entry": self.path.name, "fields": self.fields}, default=str), encoding="utf-8")
        os.replace(tmp, self.pointer)


# ----------------------------------------------------------------------------------- parallel + progress
def workers_for(n_units: int, asked: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(asked or cores, n_units))


def parallel_map(fn: Callable, units: list, workers: int, what: str, total: int, size: Callable) -> Iterator:
    """``fn(unit)`` for every unit, results in order, in ``workers`` processes (forked: they inherit the
    tokenizer); a progress bar with an ETA on a terminal, else a log line every ~10%. ``size(unit)`` is what a
    unit adds to the count shown (conversations, lines)."""
    bar = _Progress(what, total)
    try:
        if workers <= 1 or multiprocessing.current_process().daemon:  # a daemonic process may not fork workers
            for u in units:
                out = fn(u)
                bar.advance(size(u))
                yield out
            return
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the processes are the parallelism
        global _JOB
        _JOB = fn  # forked workers inherit it: a closure (holding the tokenizer) need not pickle
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            for u, out in zip(units, pool.imap(_run_job, units, chunksize=1)):
                bar.advance(size(u))
                yield out
    finally:
        bar.close()


_JOB: Callable | None = None


def _run_job(unit):
    return _JOB(unit)


class _Progress:
    def __init__(self, what: str, total: int):
        self.what, self.total, self.done, self.t0 = what, max(total, 1), 0, time.perf_counter()
        self.next_log = 0.1
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                transient=True)
            self.task = self.bar.add_task(what, total=self.total)
            self.bar.start()

    def advance(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif self.done / self.total >= self.next_log and self.done < self.total:
            dt = time.perf_counter() - self.t0
            eta = dt * (self.total - self.done) / max(self.done, 1)
            log.info("%s: %d of %d (%.0f%%), %.0f/s, about %.0f s left", self.what, self.done, self.total,
                     100 * self.done / self.total, self.done / max(dt, 1e-9), eta)
            self.next_log += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
