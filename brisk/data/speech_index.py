"""A FunASR jsonl indexed once, for lists of millions of utterances: arrays, not a Python object a line.

The index holds, for every usable line, its byte offset and size, its line number, speech_length and
text_length (what batching needs), as ``.npy`` arrays in a cache entry (token_cache.py: keyed by the jsonl's
path, size and mtime and the settings that decide which lines are kept). A sample's line is read back with
one ``pread`` and parsed when its batch is loaded. Building it parses every line in worker processes, with
the same checks and messages as jsonl.read_jsonl (bad lines, caps, suspect lines), and stats each audio file
there and reads its header (once per file and process), so the audio check, missing or undecodable files,
runs in parallel with the parsing; with ``data.check_audio=false`` it is skipped and the log says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError
from .chat_sources import Unit
from .check import SHORT_FRAMES, SHOW, audio_problem, suspect_reason
from .jsonl import decode_line, no_speech_length, not_a_jsonl, not_speech_format, parse_line
from .token_cache import Entry, file_identity, parallel_map, workers_for

log = logging.getLogger("brisk")

UNIT_BYTES = 8 << 20
FIELDS = ("offset", "size", "line", "speech", "text")
DTYPES = {"offset": np.int64, "size": np.int32, "line": np.int64, "speech": np.int32, "text": np.int32}


def _units(path: Path) -> list[Unit]:
    units, start, size = [], 0, path.stat().st_size
    with path.open("rb") as f:
        while start < size:
            f.seek(start + UNIT_BYTES)
            end = min(size, start + UNIT_BYTES + len(f.readline())) if start + UNIT_BYTES < size else size
            units.append(Unit(str(path), "jsonl", start, end))
            start = end
    return units


class _IndexUnit:
    """Parses one byte range of the jsonl in a worker; line numbers are counted from the range's start and
    made absolute by the caller."""

    def __init__(self, max_speech_length: int, max_text_length: int, skip_bad: bool, check_audio: bool):
        self.max_speech, self.max_text = max_speech_length, max_text_length
        self.skip_bad, self.check_audio = skip_bad, check_audio
        self.seen: dict[str, str | None] = {}  # audio path -> None (a file) or what it is; per worker

    def audio_problem(self, p: str) -> str | None:
        if p not in self.seen:  # its header too: a file that cannot be decoded is found now, not at step 0
            self.seen[p] = audio_problem(p)
        return self.seen[p]

    def __call__(self, unit: Unit) -> dict:
        path = Path(unit.file)
        with path.open("rb") as f:
            f.seek(unit.lo)
            block = f.read(unit.hi - unit.lo)
        cols = {k: [] for k in FIELDS}
        bad, suspects, missing = [], [], []  # (relative line, message)
        n_audio = 0
        pos = 0
        for rel, raw in enumerate(block.split(b"\n")):
            start, pos = pos, pos + len(raw) + 1
            if not raw.strip():
                continue
            where = f"{path}:@{rel}"  # placeholder line number, fixed by the caller
            try:
                utt = parse_line(decode_line(raw, where), where, path.parent)
                if utt.speech_length <= 0:
                    raise DataError(f"{where}: {no_speech_length(utt.speech_length)}")
                if utt.speech_length > self.max_speech:
                    raise DataError(f"{where}: speech_length={utt.speech_length} frames is over the cap "
                                    f"data.max_speech_length={self.max_speech}")
                if utt.text_length > self.max_text:
                    raise DataError(f"{where}: text_length={utt.text_length} is over data.max_text_length={self.max_text}")
            except DataError as e:
                bad.append((rel, str(e)))
                if not self.skip_bad:
                    break  # the run stops at the first bad line: no need to read on
                continue
            reason = suspect_reason(utt)
            if reason is not None:
                suspects.append((rel, reason))
                if self.skip_bad:
                    continue
            if self.check_audio:
                paths = utt.audio_paths()
                n_audio += len(paths)
                lost = [(p, what) for p in paths if (what := self.audio_problem(p))]
                if lost:
                    missing += [(rel, p, w) for p, w in lost]
                    if self.skip_bad:
                        continue
            for k, v in zip(FIELDS, (unit.lo + start, len(raw), rel, utt.speech_length, utt.text_length)):
                cols[k].append(v)
        return {"cols": {k: np.asarray(v, DTYPES[k]) for k, v in cols.items()}, "lines": block.count(b"\n"),
                "bad": bad, "suspects": suspects, "missing": missing, "n_audio": n_audio}


class SpeechIndex(Sequence):
    """The usable lines of a FunASR jsonl, memory-mapped; ``index[i]`` parses line i's Utterance."""

    def __init__(self, path: str | Path, folder: str | Path, meta: dict):
        self.path, self.folder, self.meta = Path(path), Path(folder), meta
        self._cols: dict | None = None
        self._fd: int | None = None
        self.cache_note = ""  # how the cache was used: read, or built and why
        skipped = self.folder / "skipped.txt"
        self.skipped: list[str] = skipped.read_text(encoding="utf-8").splitlines() if skipped.is_file() else []

    def _open(self) -> dict:
        if self._cols is None:
            self._cols = {k: np.load(self.folder / f"{k}.npy", mmap_mode="r") for k in FIELDS}
        return self._cols

    def __getstate__(self):
        return {**self.__dict__, "_cols": None, "_fd": None}

    def __len__(self) -> int:
        return int(self.meta["n"])

    def lengths(self) -> np.ndarray:
        c = self._open()
        return c["speech"].astype(np.int64) + c["text"]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = i % len(self)
        c = self._open()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        raw = os.pread(self._fd, int(c["size"][i]), int(c["offset"][i]))
        where = f"{self.path}:{int(c['line'][i])}"
        return parse_line(decode_line(raw, where), where, self.path.parent)

    @property
    def utterances(self):
        return self


def _fix(msg: str, path: Path, line: int, rel: int) -> str:
    return msg.replace(f"{path}:@{rel}", f"{path}:{line}", 1)


def _write_index(folder: Path, path: Path, units: list[Unit], results, skip_bad: bool, check_audio: bool) -> dict:
    cols = {k: [] for k in FIELDS}
    line0 = 1
    skipped: list[str] = []
    n_suspect = n_empty = n_missing = n_missing_lines = n_folders = n_broken = n_audio = 0
    first_suspect = None
    first_missing: list[str] = []
    for unit, r in zip(units, results):
        for rel, msg in r["bad"]:
            msg = _fix(msg, path, line0 + rel, rel)
            if not skip_bad:
                raise DataError(msg, "lines")
            skipped.append(msg)
        for rel, msg in r["suspects"]:
            msg = _fix(msg, path, line0 + rel, rel)
            n_suspect += 1
            n_empty += "empty transcript" in msg
            first_suspect = first_suspect or msg
            if skip_bad:
                skipped.append(msg)
        seen_lines = set()
        for rel, p, w in r["missing"]:
            source = f"{path}:{line0 + rel}"
            n_missing += 1
            n_folders += w == "a folder"
            n_broken += w.startswith("cannot")
            if len(first_missing) < SHOW:
                # "cannot be decoded (why)": the message's head says the first part, the file its why
                detail = w.removeprefix("cannot be decoded ") if w.startswith("cannot be decoded (") else f"({w})"
                first_missing.append(f"{source}: {p}" + ("" if w == "missing" else f" {detail}"))
            if rel not in seen_lines:
                seen_lines.add(rel)
                n_missing_lines += 1
                if skip_bad:
                    skipped.append(f"{source}: audio file {p} " + ("not found" if w == "missing" else w))
        n_audio += r["n_audio"]
        r["cols"]["line"] += line0
        for k in FIELDS:
            cols[k].append(r["cols"][k])
        line0 += r["lines"]
    kinds = [k for k, n in (("do not exist", n_missing - n_folders - n_broken), ("are folders, not files", n_folders),
                            ("cannot be decoded", n_broken)) if n]
    what = " or ".join(kinds) if kinds else "do not exist"
    if n_missing and not skip_bad:
        raise DataError(f"{path}: {n_missing} of {n_audio} audio files {what}, first: {'; '.join(first_missing)}",
                        "lines")
    for k in FIELDS:
        np.save(folder / f"{k}.npy", np.concatenate(cols[k]) if cols[k] else np.zeros(0, DTYPES[k]))
    if skipped:
        (folder / "skipped.txt").write_text("\n".join(s.replace("\n", " ") for s in skipped) + "\n", encoding="utf-8")
    n = sum(len(c) for c in cols["offset"])
    return {"n": n, "lines": line0 - 1, "skipped": len(skipped), "suspects": n_suspect, "suspects_empty": n_empty,
            "first_suspect": first_suspect, "audio_checked": check_audio, "audio_files": n_audio,
            "audio_missing": n_missing, "audio_missing_what": what, "audio_missing_lines": n_missing_lines,
            "first_missing": first_missing}


def build_speech_index(path: str, *, max_speech_length: int, max_text_length: int, skip_bad: bool, cache_dir,
                       check_audio: bool = True, workers: int = 0, what: str = "data.train") -> SpeechIndex:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"{what}: {not_a_jsonl(p)}")
    if not_speech_format(p):
        raise DataError(f"{what}: {not_speech_format(p)}")
    entry = Entry(cache_dir, "speech", str(p.resolve()), {
        "files": file_identity([p]), "max_speech_length": max_speech_length, "max_text_length": max_text_length,
        "skip_bad": skip_bad, "check_audio": check_audio})

    def build(folder: Path) -> dict:
        units = _units(p)
        n_jobs = workers_for(len(units), workers)
        job = _IndexUnit(max_speech_length, max_text_length, skip_bad, check_audio)
        what_ = f"indexing {what}" + (" + checking audio" if check_audio else "") + " (bytes)"
        results = parallel_map(job, units, n_jobs, what_, p.stat().st_size, lambda u: u.hi - u.lo)
        return _write_index(folder, p, units, results, skip_bad, check_audio)

    entry.get(build, f"{what} (speech list index)")
    index = SpeechIndex(p, entry.path, entry.meta)
    index.cache_note = entry.note
    report(index, path, skip_bad, check_audio)
    if not len(index):
        raise DataError(f"{path}: no usable utterances")
    return index


def report(index: SpeechIndex, path: str, skip_bad: bool, check_audio: bool) -> None:
    m = index.meta
    log.info("%s: %d utterances of %d lines", path, len(index), m["lines"])
    if not check_audio:
        log.info("%s: audio files not checked (data.check_audio=false): a missing one is named when its batch "
                 "is loaded", path)
    elif m["audio_missing"]:
        log.warning("%s: %d of %d audio files %s; their %d lines are skipped (data.skip_bad=true), first: %s", path,
                    m["audio_missing"], m["audio_files"], m["audio_missing_what"], m["audio_missing_lines"],
                    "; ".join(m["first_missing"]))
    else:
        log.info("%s: all %d audio files exist (checked %s)", path, m["audio_files"], m.get("built", "now"))
    if m["suspects"]:
        what = f"{m['suspects_empty']} with an empty transcript, {m['suspects'] - m['suspects_empty']} shorter than " \
               f"{SHORT_FRAMES * 10} ms"
        if skip_bad:
            log.warning("%s: skipped %d suspect lines (data.skip_bad=true): %s; first: %s", path, m["suspects"], what,
                        m["first_suspect"])
        else:
            log.warning("%s: %d suspect lines kept (%s; first: %s); data.skip_bad=true skips them", path, m["suspects"],
                        what, m["first_suspect"])
    if index.skipped:
        log.warning("%s: skipped %d bad lines (data.skip_bad=true), first: %s", path, len(index.skipped), index.skipped[0])
