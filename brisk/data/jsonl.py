"""FunASR-format jsonl: one utterance (a short chat) a line.

    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "语音转写：<|startofspeech|>!/path/a.wav<|endofspeech|>"},
                  {"role": "assistant", "content": "transcript"}],
     "speech_length": 433, "text_length": 12, "key": "utt1"}

speech_length counts 10 ms frames, text_length tokens (FunASR's scp2jsonl writes both). Relative audio
paths are resolved against the jsonl file's folder, so a data set can move as a whole. Every problem is
reported with the file and line.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError  # noqa: F401 - re-exported

log = logging.getLogger("brisk")

SPEECH = re.compile(r"<\|startofspeech\|>(.*?)<\|endofspeech\|>")
# Top-level fields FunASR's index keeps for the context header (data.prompt_class).
CONTEXT_KEYS = ("hist_context", "hotwords", "asr_hotwords", "one_pass_result")


@dataclass
class Utterance:
    key: str
    source: str  # "file:line", for messages
    system: list[str]
    user: list[str]  # user turns, audio references resolved to absolute paths
    assistant: list[str]
    prev_content: list[str | None]  # FunASR's optional assistant "prev_content" per turn
    speech_length: int  # 10 ms frames
    text_length: int
    context: dict = field(default_factory=dict)  # hist_context, hotwords, asr_hotwords, one_pass_result (top level)

    @property
    def source_len(self) -> int:
        """The batching length FunASR uses: speech frames + text tokens."""
        return self.speech_length + self.text_length

    def audio_paths(self) -> list[str]:
        out = []
        for turn in self.user:
            out += [m[1:] for m in SPEECH.findall(turn) if m.startswith("!")]
        return out


@dataclass
class JsonlIndex:
    utterances: list[Utterance]
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" under skip_bad


def _resolve(turn: str, base: Path) -> str:
    def fix(m: re.Match) -> str:
        ref = m.group(1)
        if ref.startswith("!") and not ref.startswith("!!"):
            p = Path(ref[1:]).expanduser()
            if not p.is_absolute():
                p = base / p
            return f"<|startofspeech|>!{p}<|endofspeech|>"
        return m.group(0)

    return SPEECH.sub(fix, turn)


def not_a_jsonl(path: Path) -> str:
    """Why ``path`` cannot be read as a FunASR jsonl: missing, or a folder."""
    if path.is_dir():
        return f"{path} is a folder; give a FunASR jsonl file (one utterance a line) that names its audio files"
    return f"data file {path} does not exist"


CHAT_ONLY = (".parquet", ".arrow")  # data formats read for chat data alone


def not_speech_format(path: Path) -> str | None:
    """Why ``path`` is not a speech jsonl by its name alone (a parquet or arrow file), or None."""
    if path.suffix.lower() in CHAT_ONLY:
        return (f"{path} is a {path.suffix[1:]} file: speech data is a FunASR jsonl (one JSON object a line naming "
                "its audio file); parquet and datasets folders are read for chat data (model.family=causal_lm)")
    return None


def no_speech_length(value: int) -> str:
    """What is wrong with a line's speech_length that is not above 0 (a missing one reads as 0)."""
    if value == 0:
        return ("speech_length missing or 0: give the audio's length in 10 ms frames "
                "(int(frames * 100 / sample_rate), as FunASR's scp2jsonl writes it)")
    return f"speech_length={value}: a length must be above 0 (10 ms frames)"


def decode_line(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line: {e.reason}); "
                        "save the file as UTF-8") from None


def parse_line(text: str, where: str, base: Path) -> Utterance:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg  # "Unterminated string starting at" + position
        raise DataError(f"{where}: not valid JSON ({msg}, column {e.colno})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        has = f"; the line has {', '.join(map(str, obj))}" if isinstance(obj, dict) else ""
        raise DataError(f"{where}: expected an object with a 'messages' list (FunASR's layout){has}")
    system, user, assistant, prev = [], [], [], []
    for i, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise DataError(f"{where}: messages[{i}] needs 'role' and 'content'")
        role, content = msg["role"], msg["content"]
        if not isinstance(content, str):
            raise DataError(f"{where}: messages[{i}].content must be a string")
        if role == "system":
            system.append(content)
        elif role == "user":
            user.append(_resolve(content, base))
        elif role == "assistant":
            assistant.append(content)
            prev.append(msg.get("prev_content"))
        else:
            raise DataError(f"{where}: messages[{i}] has unknown role {role!r}")
    if not user or not assistant:
        raise DataError(f"{where}: needs at least one user and one assistant message")
    if len(user) != len(assistant):
        raise DataError(f"{where}: {len(user)} user turns but {len(assistant)} assistant turns")
    if not any(SPEECH.search(u) for u in user):
        raise DataError(f"{where}: no <|startofspeech|>!path<|endofspeech|> audio reference in a user turn")

    def length(name: str) -> int:
        v = obj.get(name, 0)
        v = v[0] if isinstance(v, (list, tuple)) and v else v
        try:
            return int(v)
        except (TypeError, ValueError):
            raise DataError(f"{where}: {name}={v!r} is not a number") from None

    # FunASR repeats one system prompt for every turn and supplies a default one.
    system = (system or ["You are a helpful assistant."]) * len(user) if len(system) <= 1 else system
    key = obj.get("key", where)
    key = key[0] if isinstance(key, (list, tuple)) else key
    context = {k: obj[k] for k in CONTEXT_KEYS if k in obj}
    return Utterance(str(key), where, system, user, assistant, prev, length("speech_length"), length("text_length"), context)


def read_jsonl(path: str | Path, *, max_speech_length: int, max_text_length: int, skip_bad: bool,
               check_audio: bool = True) -> JsonlIndex:
    path = Path(path)
    if not path.is_file():
        raise DataError(not_a_jsonl(path))
    index = JsonlIndex([])
    with path.open("rb") as f:  # bytes: a line that is not UTF-8 is named, not a UnicodeDecodeError traceback
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{n}"
            try:
                # without its line end: a JSON error's column is then counted on this line, not the next
                utt = parse_line(decode_line(raw.rstrip(b"\r\n"), where), where, path.parent)
                if utt.speech_length <= 0:
                    raise DataError(f"{where}: {no_speech_length(utt.speech_length)}")
                if utt.speech_length > max_speech_length:
                    raise DataError(f"{where}: speech_length={utt.speech_length} frames is over the cap "
                                    f"data.max_speech_length={max_speech_length}")
                if utt.text_length > max_text_length:
                    raise DataError(f"{where}: text_length={utt.text_length} is over data.max_text_length={max_text_length}")
            except DataError as e:
                if not skip_bad:
                    raise DataError(str(e), "lines") from None
                index.skipped.append(str(e))
                continue
            index.utterances.append(utt)
    from .check import check_audio_files, check_suspects

    check_suspects(index, path, skip_bad)
    if check_audio:
        check_audio_files(index, path, skip_bad)
    if not index.utterances:
        raise DataError(f"{path}: no usable utterances")
    if index.skipped:
        log.warning("%s: skipped %d bad lines (data.skip_bad=true), first: %s", path, len(index.skipped), index.skipped[0])
    return index
