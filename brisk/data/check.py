"""Data checks that turn late, wrapped failures into early one-line errors.

- Every audio file named in a jsonl is stat'ed before training (no reading: 100k files take about a
  second), so a missing file stops the run at start with a count and the first few file:line, not after
  step 10 inside a DataLoader worker traceback; then its header is read (soundfile.info, on threads), so a
  file that cannot be decoded is found at start too, not at the step-0 validation or once per epoch.
- When a file is loaded, its real length is compared with the declared speech_length (10 ms frames, as
  FunASR's scp2jsonl writes it): batching budgets tokens by the declared length, so a wrong one silently
  builds batches far past data.batch_tokens.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError

if TYPE_CHECKING:  # jsonl.py calls these checks: a runtime import back would be a circle
    from .jsonl import JsonlIndex, Utterance

log = logging.getLogger("brisk")

# Declared speech_length may differ from the real fbank frame count by this fraction, and at least
# LENGTH_SLACK frames (0.2 s: tools differ on the window's edge and on resampling rounding).
LENGTH_TOLERANCE = 0.10
LENGTH_SLACK = 20
SHOW = 3  # missing files named in the message
# A transcript may hold more tokens than its declared text_length by this fraction, and at least TEXT_SLACK
# tokens (the answer's <|im_end|>, think tags, tokenizers that count differently); any number fewer is fine
# (text_length is an upper bound for batching). Beyond it batches silently overrun data.batch_tokens.
TEXT_TOLERANCE = 0.25
TEXT_SLACK = 8
SHORT_FRAMES = 10  # clips under 0.1 s (10 ms frames) are counted as suspect: too short to say a word


def check_audio_files(index: JsonlIndex, path: str | Path, skip_bad: bool) -> None:
    missing = [(u, p) for u in index.utterances for p in u.audio_paths() if not os.path.isfile(p)]
    if not missing:
        check_audio_headers(index, path, skip_bad)
        return
    total = sum(len(u.audio_paths()) for u in index.utterances)
    folders = sum(os.path.isdir(p) for _, p in missing)
    what = "do not exist" if not folders else "are folders, not files" if folders == len(missing) else "do not exist or are folders"
    first = "; ".join(f"{u.source}: {p}" + (" (a folder)" if os.path.isdir(p) else "") for u, p in missing[:SHOW])
    if not skip_bad:
        raise DataError(f"{path}: {len(missing)} of {total} audio files {what}, first: {first}", "lines")
    bad = {id(u) for u, _ in missing}
    index.utterances = [u for u in index.utterances if id(u) not in bad]
    index.skipped += [f"{u.source}: audio file {p} not found" for u, p in missing]
    log.warning("%s: %d of %d audio files %s; their %d lines are skipped (data.skip_bad=true), first: %s",
                path, len(missing), total, what, len(bad), first)
    check_audio_headers(index, path, skip_bad)


def undecodable(path: str) -> str | None:
    """Why soundfile cannot read this file's header (or that it holds no samples); None when it can."""
    import soundfile as sf

    try:
        info = sf.info(path)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return "it has no samples" if info.frames == 0 else None


def audio_problem(path: str) -> str | None:
    """What is wrong with one audio path: "missing", "a folder" or "cannot be decoded (why)"; None for a file
    whose header soundfile reads."""
    if os.path.isfile(path):
        why = undecodable(path)
        return None if why is None else f"cannot be decoded ({why})"
    return "a folder" if os.path.isdir(path) else "missing"


def check_audio_headers(index: JsonlIndex, path: str | Path, skip_bad: bool) -> None:
    """Every audio file's header read (soundfile.info, not the samples): a file that cannot be decoded stops the
    run before the model is built (or, with skip_bad, its lines are skipped with one warning), not at the
    step-0 validation or once per epoch."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(u, p) for u in index.utterances for p in u.audio_paths()]
    with ThreadPoolExecutor(min(16, 2 * (os.cpu_count() or 1))) as pool:  # file opens: I/O-bound, GIL released
        reasons = list(pool.map(undecodable, [p for _, p in pairs]))
    bad = [(u, p, why) for (u, p), why in zip(pairs, reasons) if why]
    if not bad:
        return
    first = "; ".join(f"{u.source}: {p} ({why})" for u, p, why in bad[:SHOW])
    total = sum(len(u.audio_paths()) for u in index.utterances)
    if not skip_bad:
        raise DataError(f"{path}: {len(bad)} of {total} audio files cannot be decoded, first: {first}", "lines")
    ids = {id(u) for u, _, _ in bad}
    index.utterances = [u for u in index.utterances if id(u) not in ids]
    index.skipped += [f"{u.source}: audio file {p} cannot be decoded ({why})" for u, p, why in bad]
    log.warning("%s: %d of %d audio files cannot be decoded; their %d lines are skipped (data.skip_bad=true), "
                "first: %s", path, len(bad), total, len(ids), first)


def check_declared_text_length(utt: Utterance, labels: list[int]) -> None:
    """The tokens the loss sees (labels other than -100) against the declared text_length (single-turn lines
    that declare one; a multi-turn line's total is FunASR's own business)."""
    declared = utt.text_length
    if declared <= 0 or len(utt.assistant) != 1:
        return
    real = sum(1 for x in labels if x != -100)
    if real > declared + max(TEXT_SLACK, TEXT_TOLERANCE * declared):
        raise DataError(f"{utt.source}: text_length={declared} but the answer is {real} tokens (with <|im_end|>); "
                        f"allowed: up to {TEXT_TOLERANCE:.0%} or {TEXT_SLACK} tokens more (fewer is fine: an upper "
                        "bound); fix text_length (tokens) in the jsonl")


def suspect_reason(utt: Utterance) -> str | None:
    """Why a line that parses may still be a mistake: an empty transcript, a clip under 0.1 s."""
    if not any(a.strip() for a in utt.assistant):
        return f"{utt.source}: empty transcript"
    if utt.speech_length < SHORT_FRAMES:
        return f"{utt.source}: speech_length={utt.speech_length} frames, under {SHORT_FRAMES * 10} ms"
    return None


def check_suspects(index: JsonlIndex, path: str | Path, skip_bad: bool) -> None:
    """Empty transcripts and very short clips: one warning with their count, or (data.skip_bad) skipped."""
    found = [(u, r) for u in index.utterances if (r := suspect_reason(u))]
    if not found:
        return
    empty = sum("empty transcript" in r for _, r in found)
    what = f"{empty} with an empty transcript, {len(found) - empty} shorter than {SHORT_FRAMES * 10} ms"
    if skip_bad:
        bad = {id(u) for u, _ in found}
        index.utterances = [u for u in index.utterances if id(u) not in bad]
        index.skipped += [r for _, r in found]
        log.warning("%s: skipped %d suspect lines (data.skip_bad=true): %s; first: %s", path, len(found), what, found[0][1])
    else:
        log.warning("%s: %d suspect lines kept (%s; first: %s); data.skip_bad=true skips them",
                    path, len(found), what, found[0][1])
