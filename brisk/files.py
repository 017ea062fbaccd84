"""Writes a crash never leaves half-done, and a background syncer that makes them durable.

Two different promises, kept apart because they cost very different amounts of time:

- atomic (every write here): the file is written under a temporary name in its own folder and renamed into
  place. A process that is killed, runs out of memory or is pre-empted leaves the old file or the new one,
  never a torn one: the written bytes are the kernel's (page cache) once ``write`` returns.
- durable (fsync): the bytes are on the disk, so a power loss or an OS crash keeps them too. fsync waits for
  the disk: seconds for a checkpoint of a few GB (bench/io_probe.py measures it; docs/whole-run.md has the
  figures). ``sync=True`` waits for it in place; ``sync=False`` hands the file to
  ``SYNCER``, one background thread that fsyncs files (then their folders) in the order they were written,
  while training goes on. At the end of a run nothing waits for it: the OS finishes the write-back on its
  own, and the run's last lines say how many bytes were still on their way (``Syncer.pending``).

torch.save computes a CRC32 of every record; torch.load never checks it, so it is switched off for these
writes (a pass over every byte; the torch setting is restored after each save).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch


class DiskSpaceError(OSError):
    """Not enough free disk for a write; the message names the folder, the bytes needed and free."""


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.3f} MB"


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) state, each storage counted once (tied weights are stored once)."""
    seen: set = set()
    total = 0

    def walk(o):
        nonlocal total
        if hasattr(o, "full_tensor"):  # an FSDP2 shard (DTensor): the full tensor's bytes, as it will be saved
            total += o.numel() * o.element_size()
        elif isinstance(o, torch.Tensor):
            key = (o.untyped_storage().data_ptr(), o.device) if o.numel() else id(o)
            if key not in seen:
                seen.add(key)
                total += o.untyped_storage().nbytes() if o.numel() else 0
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return total


def ensure_free(folder: Path, needed: int, what: str) -> None:
    """Refuse a write that cannot fit, before a byte is written (a full disk would leave a broken run)."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DiskSpaceError(f"{folder}: writing {what} needs about {gb(needed)} but only {gb(free)} are free; "
                             "free some space or point train.output_dir at a larger disk")


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (the new directory entry reaches the disk)."""
    if os.name != "posix":  # pragma: no cover - Windows cannot open a directory for fsync
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def no_crc32():
    """torch.save without CRC32 records (torch.load does not check them); the setting is restored after."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # pragma: no cover - torch without the serialization config
        yield
        return
    with config.patch({"save.compute_crc32": False}):
        yield


class Syncer:
    """One daemon thread that fsyncs files handed to it, oldest first, then each file's folder."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._pending: dict[Path, int] = {}
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def submit(self, paths: list[Path]) -> None:
        with self._lock:
            for p in paths:
                self._pending[Path(p)] = Path(p).stat().st_size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="brisk-fsync", daemon=True)
                self._thread.start()
        self._queue.put(list(paths))

    def pending(self) -> tuple[int, int]:
        """(files, bytes) handed over and not yet confirmed on the disk."""
        with self._lock:
            return len(self._pending), sum(self._pending.values())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every submitted file is on the disk (or timeout seconds); True when none is left."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.pending()[0]:
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        while True:
            for p in self._queue.get():
                try:
                    fsync_file(p)
                    fsync_dir(p.parent)
                except FileNotFoundError:
                    pass  # pruned or renamed meanwhile (a renamed file is submitted under its new name too)
                except OSError as e:  # reported at the end of the run; the file itself is in place
                    self.errors.append(f"{p}: {e}")
                with self._lock:
                    self._pending.pop(p, None)


SYNCER = Syncer()


@contextlib.contextmanager
def _atomic_file(path: Path, sync: bool, mode: str = "wb"):
    """A file object on a temp name in ``path``'s folder, renamed to ``path`` when the block ends (removed if it
    raises). ``sync``: fsync the file before the rename and the folder after; else hand ``path`` to SYNCER."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0o600 is for a temporary; the file renamed to path is not
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)
    else:
        SYNCER.submit([path])


def atomic_save(obj, path: Path, sync: bool = True) -> None:
    """torch.save to a temp file in the same folder, then rename: never a half-written file. ``sync``: durable on
    return; else the file goes to ``SYNCER``. Refuses (DiskSpaceError) when the tensors alone would not fit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ensure_free(path.parent, tensor_bytes(obj), path.name)
    with _atomic_file(path, sync) as f, no_crc32():
        torch.save(obj, f)


def write_json_atomic(obj, path: Path, sync: bool = True) -> None:
    with _atomic_file(path, sync, "w") as f:
        json.dump(obj, f, indent=1)


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc; elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_modes(folder: Path) -> None:
    """The modes a folder made by hand would have: 0o755 folders and 0o644 files under the usual umask
    (mkdtemp and mkstemp make 0o700 / 0o600, right for a temporary, wrong for a model folder people share)."""
    mask = current_umask()
    for p in [folder, *folder.rglob("*")]:
        if p.is_symlink():
            continue
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)
