"""`brisk data speech`: a FunASR jsonl (Fun-ASR-Nano's and Qwen3-ASR's training data) from Kaldi-style lists.

``wav.scp`` holds ``key path`` a line, ``text`` holds ``key transcript``. Each utterance becomes FunASR's line:
a system turn, the user turn naming the audio, the transcript as the assistant turn, ``speech_length`` (10 ms
frames, from the file's header) and ``text_length``: the transcript's tokens under ``--tokenizer`` (a local
tokenizer folder, the LLM's: what FunASR's own list-to-jsonl script counts with Qwen3's tokenizer), else its
characters (an upper bound on the tokens of a BPE tokenizer, so batches hold fewer utterances than they could).
A key missing from ``text``, an audio file that is not there or whose header does not read: one line naming the
file and line, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError

SYSTEM = "You are a helpful assistant."
PROMPT = "语音转写："  # FunASR's training prompt for Fun-ASR-Nano


def read_pairs(path: Path, what: str) -> dict[str, tuple[str, str]]:
    """key -> (value, "file:line") of a ``key value`` list."""
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist")
    out = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) != 2:
            raise DataError(f"{path}:{n}: expected 'key {what.split()[0]}', got {line.strip()!r}")
        out[parts[0]] = (parts[1].strip(), f"{path}:{n}")
    return out


def speech_lines(wav_scp: Path, text: Path, count=len) -> list[dict]:
    """The jsonl's rows; ``count(transcript)`` is its text_length (characters unless a tokenizer counts)."""
    import soundfile as sf

    wavs, texts = read_pairs(wav_scp, "path list"), read_pairs(text, "transcript list")
    rows = []
    for key, (path, where) in wavs.items():
        if key not in texts:
            raise DataError(f"{where}: key {key} has no transcript in {text}")
        audio = Path(path).expanduser()
        if not audio.is_absolute():  # beside wav.scp, else from the current folder (where Kaldi recipes run)
            audio = wav_scp.parent / audio if (wav_scp.parent / audio).exists() or not audio.exists() else audio.resolve()
        if not audio.exists():
            raise DataError(f"{where}: audio file {path} not found (a relative path is looked for beside {wav_scp.name}, "
                            f"in {wav_scp.parent.resolve()}, then in the current folder)")
        try:
            info = sf.info(str(audio))
        except Exception as e:  # noqa: BLE001 - soundfile raises several kinds; the line says which file
            raise DataError(f"{where}: audio file {audio}: {e}") from None
        transcript = texts[key][0]
        rows.append({"key": key, "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{PROMPT}<|startofspeech|>!{audio}<|endofspeech|>"},
            {"role": "assistant", "content": transcript}],
            "speech_length": int(info.frames * 100 / info.samplerate), "text_length": count(transcript)})
    return rows


def add_arguments(ap) -> None:
    ap.add_argument("wav_scp", type=Path, help="key path, a line")
    ap.add_argument("text", type=Path, help="key transcript, a line")
    ap.add_argument("--out", type=Path, required=True, help="the jsonl to write")
    ap.add_argument("--tokenizer", type=Path, help="a local tokenizer folder (the LLM's, e.g. a Fun-ASR-Nano folder's "
                    "Qwen3-0.6B/): text_length counts its tokens; without it, the transcript's characters")


def token_counter(folder: Path):
    """text_length as tokens of the tokenizer in ``folder`` (no special tokens: the answer's own)."""
    from transformers import AutoTokenizer

    if not folder.is_dir():
        raise DataError(f"--tokenizer {folder}: not a folder (give the local folder holding tokenizer.json)")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataError(f"--tokenizer {folder}: no tokenizer could be read there ({str(e).splitlines()[0]})") from None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def make(args) -> int:
    from ..files import _atomic_file

    count = token_counter(args.tokenizer) if args.tokenizer else len
    rows = speech_lines(args.wav_scp, args.text, count)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with _atomic_file(args.out, sync=False, mode="w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} utterances to {args.out}; text_length counts "
          + (f"tokens of {args.tokenizer}" if args.tokenizer else "characters (--tokenizer counts tokens)"))
    return 0
