#!/usr/bin/env python3
"""Regenerate brisk's bundled demo speech data set (data/demo) from scratch.

What it makes (under --out, default ``data/demo``):

* ``audio/train/utt0001.flac`` ... 240 training and ``audio/valid/...`` 40
  validation utterances of synthesized English speech, 16 kHz mono.  The
  validation set and the first 10 training utterances are lossless 16-bit
  FLAC (two of those as WAV, so both formats are exercised; tests and the
  FunASR parity checks read them); the other training utterances are
  Ogg/Opus (about 3 KB/s), so that more speech fits the 8 MB audio budget.
  Sentences are 3-5 words drawn independently at random from 24
  lowercase words (digits, colours, animals, objects), so no transcript can
  be predicted without listening; validation sentences are not in training
  and are spoken by voices that training never heard.
* ``audio/more/utt0001.ogg`` ... 960 more training utterances (Ogg/Opus): new
  sentences spoken by many more voices (MORE_VARIANTS on MORE_ACCENTS, a
  random pitch and rate each, never a validation voice's variant), and
  ``train_more.jsonl``: the 240 training lines followed by these 960.  The
  demo trains on it: 240 utterances are too few for a model trained from
  scratch to stop memorising (validation CER plateaus near 45%).
* ``tokenizer/`` - a tiny byte-level BPE tokenizer (tokenizer.json +
  tokenizer_config.json) loadable with ``transformers.AutoTokenizer``, with
  the chat / speech special tokens brisk uses.
* ``train.jsonl`` / ``valid.jsonl`` / ``train_more.jsonl`` - FunASR-style ("scp2jsonl") manifests
  with audio paths relative to the jsonl file's folder.
* ``am.mvn`` - CMVN statistics of the training features (FunASR's am.mvn format).
* ``README.md`` - a description of the set with its statistics.

Speech is synthesized with the ``espeak-ng`` program and resampled from its
native 22050 Hz to 16 kHz with ``sox``, leading and trailing silence trimmed.  Install them
with ``apt-get install -y espeak-ng sox``.

Output is deterministic for a given ``--seed`` (and given espeak-ng / sox /
libsndfile / tokenizers versions): the same sentences, voices and speaking
rates are chosen and sox is run without dither, so reruns produce the same
audio.  The FLAC, WAV, manifests and tokenizer are byte-identical; the Ogg
files decode to the same samples but are not byte-identical (libsndfile gives
each Ogg stream a random serial number).

Run from the repository root::

    python tools/make_demo_data.py                 # writes data/demo
    python tools/make_demo_data.py --out /tmp/demo --seed 1234 --more 0

bench/results/demo-cpu.md has what the more utterances do to the demo's CER.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 1234
N_TRAIN = 240
N_VALID = 40
# Training utterances (1-based) written as 16 kHz WAV instead of FLAC, so that
# loaders are exercised on both formats.
WAV_TRAIN_UTTS = (2, 9)
# Training utterances 1..LOSSLESS_TRAIN stay FLAC/WAV (tests and parity checks read them); later ones are
# Ogg/Opus at OPUS_LEVEL (libsndfile's compression level: 0.95 gives ~2.9 KB/s of speech at 16 kHz with a
# 10% mean fbank difference from the lossless audio, against 21% for Ogg/Vorbis at its lowest quality,
# ~4.7 KB/s; measured on 40 of the training utterances).
LOSSLESS_TRAIN = 10
OPUS_LEVEL = 0.95
N_MORE = 960  # the extra training utterances of train_more.jsonl (bench/results/demo-cpu.md)
SAMPLE_RATE = 16000
RATE_RANGE = (150, 200)  # espeak-ng -s (words per minute), inclusive
# An utterance shorter than this is re-spoken at the slowest rate, so that even
# the shortest sentences at fast rates give a reasonable amount of audio.
MIN_SECONDS = 1.0
MAX_TOTAL_AUDIO_BYTES = 8_000_000  # keep the repo light: <= 8 MB of audio

# espeak-ng voice[+variant] names.  NOTE: variants attached to "en-gb"
# (e.g. "en-gb+m3") are silently ignored by espeak-ng 1.51 and give plain
# en-gb audio, so British variants are spelled "en+...".  check_voices()
# guards against such silent duplicates.
# Training and validation voices are disjoint: validation measures recognition
# of speakers (voice variants) that training never heard.  Accents are shared,
# variants are not (m4, f4, m6 and klatt2 only ever speak validation sentences).
TRAIN_VOICES = (
    "en-us", "en-gb", "en-us+f3", "en+m3", "en-us+f2", "en+klatt",
    "en-gb-scotland+f1", "en-gb-x-rp+f5", "en-us+m1", "en+m2", "en-029+m5",
    "en-us-nyc+m7", "en+f3", "en-gb-x-gbclan+m1",
)
VALID_VOICES = ("en-us+m4", "en+f4", "en-gb-x-rp+m6", "en-us+klatt2")
VOICES = TRAIN_VOICES + VALID_VOICES

SYSTEM_PROMPT = "You are a helpful assistant."
USER_PROMPT = "语音转写："  # "speech transcription:", FunASR's usual ASR prompt

SPECIAL_TOKENS = (
    "<|endoftext|>",  # first, so it gets id 0 (also pad and eos)
    "<|im_start|>",
    "<|im_end|>",
    "<|startofspeech|>",
    "<|endofspeech|>",
    "<think>",
    "</think>",
)
TOKENIZER_VOCAB_SIZE = 512

# --more: many more voices (espeak-ng variants on several accents, a random pitch each), none of the
# validation voices' variants (m4, f4, m6, klatt2).
MORE_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
MORE_VARIANTS = ("m1", "m2", "m3", "m5", "m7", "m8", "f1", "f2", "f3", "f5", "klatt", "klatt3", "klatt4", "adam", "alex",
                 "andy", "annie", "benjamin", "david", "ed", "edward", "john", "linda", "max", "paul", "robert", "steph",
                 "travis", "victor", "Andrea", "Mike", "belinda", "caleb", "grandma", "grandpa", "iven", "norbert", "quincy")
MORE_RATE_RANGE = (140, 210)
MORE_PITCH_RANGE = (25, 75)  # espeak-ng -p (default 50)

# --------------------------------------------------------------------------
# Sentences: words drawn independently and uniformly from a small closed
# vocabulary, so nothing about a transcript can be guessed from the prompt or
# from the words before it: the model has to listen.  24 words that sound
# distinct keep the task learnable by a tiny model in minutes.
# --------------------------------------------------------------------------
WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "red", "green", "blue", "black", "white", "yellow",
    "cat", "dog", "bird", "fish", "fox", "horse", "box", "cup",
)
WORDS_PER_SENTENCE = (3, 5)  # inclusive


def grammar_words() -> list[str]:
    """Every word a sentence can contain, sorted (used for the README and as
    tokenizer training text)."""
    return sorted(WORDS)


def random_sentence(rng: random.Random) -> str:
    """Draw one sentence: a random length, then each word independently."""
    n = rng.randint(*WORDS_PER_SENTENCE)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_sentences(seed: int) -> tuple[list[str], list[str]]:
    """Unique training sentences, then validation sentences that are not in
    the training set but only use words the training set contains (so the
    validation set measures recognition, not unseen vocabulary)."""
    rng = random.Random(f"sentences-{seed}")
    train: list[str] = []
    while len(train) < N_TRAIN:
        s = random_sentence(rng)
        if s not in train:
            train.append(s)
    train_words = {w for s in train for w in s.split()}
    valid: list[str] = []
    while len(valid) < N_VALID:
        s = random_sentence(rng)
        if s not in train and s not in valid and set(s.split()) <= train_words:
            valid.append(s)
    return train, valid


# --------------------------------------------------------------------------
# Synthesis
# --------------------------------------------------------------------------
@dataclass
class Utterance:
    split: str  # "train" or "valid"
    index: int  # 1-based within the split
    text: str
    voice: str
    rate: int
    ext: str  # "flac", "wav" or "ogg" (Opus)
    pitch: int | None = None  # espeak-ng -p (None: the voice's own)

    @property
    def key(self) -> str:
        return f"{self.split}_{self.index:04d}"

    @property
    def rel_path(self) -> str:
        """Audio path relative to the data set folder (= the jsonl folder)."""
        return f"audio/{self.split}/utt{self.index:04d}.{self.ext}"


def plan_utterances(seed: int) -> list[Utterance]:
    """Assign sentence, voice and rate to every utterance.  Voices go round
    robin within each split: training sentences are spoken by TRAIN_VOICES
    only, validation sentences by VALID_VOICES only."""
    train, valid = make_sentences(seed)
    rng = random.Random(f"rates-{seed}")
    utts = []
    for split, sentences, voices in (("train", train, TRAIN_VOICES), ("valid", valid, VALID_VOICES)):
        for i, text in enumerate(sentences):
            index = i + 1
            is_wav = split == "train" and index in WAV_TRAIN_UTTS
            lossy = split == "train" and index > LOSSLESS_TRAIN
            utts.append(Utterance(
                split=split, index=index, text=text,
                voice=voices[i % len(voices)],
                rate=rng.randint(*RATE_RANGE),
                ext="wav" if is_wav else "ogg" if lossy else "flac",
            ))
    return utts


def plan_more(seed: int, n: int) -> list[Utterance]:
    """n more training utterances: new sentences (in neither split), many more voices, a random pitch and
    rate each. Their own random streams, so the base set does not depend on n."""
    rng = random.Random(f"extra-{seed}")
    train, valid = make_sentences(seed)
    seen = set(train) | set(valid)
    utts: list[Utterance] = []
    while len(utts) < n:
        text = random_sentence(rng)
        if text in seen:
            continue
        seen.add(text)
        voice = f"{rng.choice(MORE_ACCENTS)}+{rng.choice(MORE_VARIANTS)}"
        rate, pitch = rng.randint(*MORE_RATE_RANGE), rng.randint(*MORE_PITCH_RANGE)
        utts.append(Utterance("more", len(utts) + 1, text, voice, rate, "ogg", pitch))
    return utts


def run(cmd: list[str]) -> None:
    """Run a command, raising with its stderr if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")


def synthesize(text: str, voice: str, rate: int, out_path: Path, tmp_dir: Path, pitch: int | None = None) -> None:
    """espeak-ng -> 22050 Hz WAV -> sox -> trimmed 16 kHz mono 16-bit FLAC/WAV, or Ogg/Opus for an .ogg path
    (sox writes the 16-bit WAV, libsndfile encodes it: sox cannot write Opus)."""
    raw = tmp_dir / "espeak.wav"
    run(["espeak-ng", "-v", voice, "-s", str(rate), *(["-p", str(pitch)] if pitch is not None else []), "-w", str(raw), text])
    target = tmp_dir / "lossless.wav" if out_path.suffix == ".ogg" else out_path
    # -D: no dither.  sox dithers with random noise by default when it
    # resamples, which would make every run differ (and compress worse).
    # "gain -1" leaves 1 dB of headroom: espeak-ng peaks at full scale and the
    # resampler's overshoot would otherwise clip a few samples.
    # "silence ... reverse silence ... reverse" trims espeak-ng's leading and
    # trailing silence (~0.3 s an utterance, a fifth of the audio) and "pad"
    # puts back 50 ms at each end, so the set stays small.
    run(["sox", "-D", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16",
         "-e", "signed-integer", str(target), "gain", "-1",
         "silence", "1", "0.02", "0.3%", "reverse", "silence", "1", "0.02", "0.3%", "reverse",
         "pad", "0.05", "0.05"])
    if target != out_path:
        import soundfile as sf

        wave, rate_hz = sf.read(str(target), dtype="int16")
        sf.write(str(out_path), wave, rate_hz, format="OGG", subtype="OPUS", compression_level=OPUS_LEVEL)


class LibEspeak:
    """libespeak-ng through ctypes, from the espeakng-loader wheel (the library and its voice data, no program):
    the fallback where the espeak-ng program is not installed (no apt). It speaks as the program does: the same
    voice[+variant] names, words a minute and pitch, the program's synthesis flags, the same 22050 Hz 16-bit
    samples (not bit-identical run to run: a few samples' difference, as the library keeps state between
    calls). The library keeps one global state: calls are serialised."""

    RATE, PITCH = 1, 3  # espeak_PARAMETER: espeakRATE, espeakPITCH
    SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS (espeak_Synth returns when the text is spoken)
    FLAGS = 0x1000 | 0x100  # espeakENDPAUSE | espeakPHONEMES (espeakCHARS_AUTO = 0), as espeak-ng's program
    # The program resolves "en-gb" by language to the voice file "en" (English, Great Britain); the library's
    # espeak_SetVoiceByName looks names up by file only.
    FILES = {"en-gb": "en"}

    def __init__(self) -> None:
        import ctypes

        try:
            import espeakng_loader
        except ImportError:
            sys.exit("error: neither the espeak-ng program nor the espeakng-loader package is installed "
                     "(`apt-get install -y espeak-ng` or `pip install 'brisk[tools]'`)")
        self.ct = ctypes
        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self.lock = threading.Lock()
        self.chunks: list[bytes] = []
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

        def collect(wav, n, _events):
            if wav and n > 0:
                self.chunks.append(ctypes.string_at(wav, n * 2))
            return 0  # 0: go on

        self.callback = callback_type(collect)  # kept on self: the library holds only the pointer
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.sample_rate = self.lib.espeak_Initialize(self.SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({self.sample_rate}) with {espeakng_loader.get_data_path()}")
        self.lib.espeak_SetSynthCallback(self.callback)

    def __call__(self, text: str, voice: str, rate: int, pitch: int | None = None) -> tuple[bytes, int]:
        """16-bit mono PCM (native byte order) and its sample rate."""
        with self.lock:
            if self.lib.espeak_SetVoiceByName(self.FILES.get(voice, voice).encode()) != 0:
                raise RuntimeError(f"libespeak-ng: unknown voice {voice!r}")
            self.lib.espeak_SetParameter(self.RATE, rate, 0)
            if pitch is not None:
                self.lib.espeak_SetParameter(self.PITCH, pitch, 0)
            self.chunks = []
            data = text.encode() + b"\0"
            err = self.lib.espeak_Synth(data, len(data), 0, 1, 0, self.FLAGS, None, None)  # 1: POS_CHARACTER
            if err != 0:
                raise RuntimeError(f"libespeak-ng: espeak_Synth failed ({err}) on {text!r}")
            return b"".join(self.chunks), self.sample_rate


_LIB: list[LibEspeak] = []  # made once, on first use (make_wholerun_data speaks from threads)
_LIB_LOCK = threading.Lock()


def espeak_pcm(text: str, voice: str, rate: int, pitch: int | None = None) -> tuple[bytes, int]:
    """espeak-ng's speech of `text` as 16-bit mono PCM (native byte order) and its sample rate: the espeak-ng
    program where it is on PATH, else libespeak-ng from the espeakng-loader package."""
    if shutil.which("espeak-ng") is None:
        with _LIB_LOCK:
            if not _LIB:
                _LIB.append(LibEspeak())
        return _LIB[0](text, voice, rate, pitch)
    cmd = ["espeak-ng", "-v", voice, "-s", str(rate), *(["-p", str(pitch)] if pitch is not None else []), "--stdout", text]
    wav = subprocess.run(cmd, capture_output=True, check=True).stdout
    import io

    import soundfile as sf

    samples, fs = sf.read(io.BytesIO(wav), dtype="int16")
    return samples.tobytes(), fs


def check_tools() -> None:
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        sys.exit(f"error: {' and '.join(missing)} not found on PATH; this script needs the "
                 f"espeak-ng and sox programs (e.g. `apt-get install -y espeak-ng sox`).")


def check_voices(tmp_dir: Path) -> None:
    """Fail if a voice is unknown or silently falls back to another voice
    (espeak-ng ignores some variant spellings without an error)."""
    seen: dict[str, str] = {}
    for voice in VOICES:
        path = tmp_dir / "probe.wav"
        run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(path), "the red fox"])
        digest = hashlib.md5(path.read_bytes()).hexdigest()
        if digest in seen:
            raise RuntimeError(f"voices {seen[digest]!r} and {voice!r} produce identical audio")
        seen[digest] = voice


def tool_version(cmd: list[str]) -> str:
    """First line of `cmd`'s output, without espeak-ng's data path."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = (proc.stdout or proc.stderr).strip().splitlines()[0]
    return " ".join(line.split("Data at:")[0].split())


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------
def train_tokenizer(texts: list[str], out_dir: Path) -> None:
    """Train a tiny Qwen-like byte-level BPE tokenizer and save it in the
    layout transformers' AutoTokenizer loads (tokenizer.json +
    tokenizer_config.json, PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    # Byte-level: every UTF-8 string (e.g. the Chinese prompt) is encodable,
    # so no unknown token is needed.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # ByteLevel post-processing only fixes offsets; it adds no BOS/EOS.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),  # ids 0..6, special=True
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
    }
    write_text(out_dir / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def tokenizer_texts(train_texts: list[str]) -> list[str]:
    """Tokenizer training text: training transcripts, the word list and the
    prompt / chat-role strings that appear in rendered conversations."""
    chat = [SYSTEM_PROMPT, USER_PROMPT, "system\n", "user\n", "assistant\n"]
    return train_texts + [" ".join(grammar_words())] + chat


# --------------------------------------------------------------------------
# Feature normalisation
# --------------------------------------------------------------------------
def write_cmvn(wav_paths: list[Path], out: Path) -> None:
    """am.mvn (Kaldi nnet format, as FunASR model folders ship it) with the mean and inverse standard
    deviation of the training set's LFR features (560 dims, no dither), computed with brisk's front end.
    Normalised features let a model trained from scratch start listening within minutes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    from brisk.families.fun_asr_nano.config import FrontendConfig
    from brisk.data.audio import read_audio
    from brisk.families.fun_asr_nano.features import Frontend

    fe = Frontend(FrontendConfig(dither=0.0))
    feats = torch.cat([fe(read_audio(str(p), SAMPLE_RATE)) for p in wav_paths]).double()
    mean, std = feats.mean(0), feats.std(0).clamp_min(1e-3)
    row = lambda v: " ".join(f"{x:.6f}" for x in v.tolist())  # noqa: E731
    d = feats.shape[1]
    write_text(out, f"<Nnet>\n<Splice> {d} {d}\n[ 0 ]\n<AddShift> {d} {d}\n<LearnRateCoef> 0 [ {row(-mean)} ]\n"
                    f"<Rescale> {d} {d}\n<LearnRateCoef> 0 [ {row(1.0 / std)} ]\n</Nnet>\n")


# --------------------------------------------------------------------------
# Manifests and README
# --------------------------------------------------------------------------
def speech_length(duration_s: float) -> int:
    """Number of 25 ms / 10 ms-shift fbank frames, as FunASR computes it."""
    return int((duration_s * 1000 - 25) // 10 + 1)


def jsonl_record(utt: Utterance, duration_s: float, text_length: int) -> dict:
    return {
        "key": utt.key,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user",
             "content": f"{USER_PROMPT}<|startofspeech|>!{utt.rel_path}<|endofspeech|>"},
            {"role": "assistant", "content": utt.text},
        ],
        "speech_length": speech_length(duration_s),
        "text_length": text_length,
    }


def write_text(path: Path, text: str) -> None:
    # Explicit newline="\n" so the files are byte-identical on every platform.
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_readme(out: Path, seed: int, utts: list[Utterance], durations: dict[str, float],
                 total_bytes: int, vocab_size: int, special_ids: dict[str, int]) -> None:
    """README with the set's statistics, so it always matches the files."""
    def seconds(split: str) -> float:
        return sum(durations[u.key] for u in utts if u.split == split)

    n_train = sum(u.split == "train" for u in utts)
    n_more = sum(u.split == "more" for u in utts)
    n_valid = len(utts) - n_train - n_more
    total_s = seconds("train") + seconds("valid") + seconds("more")
    n_words = [len(u.text.split()) for u in utts]
    wavs = ", ".join(f"`utt{i:04d}.wav`" for i in WAV_TRAIN_UTTS)
    train_voices = ", ".join(f"`{v}`" for v in TRAIN_VOICES)
    valid_voices = ", ".join(f"`{v}`" for v in VALID_VOICES)
    specials = ", ".join(f"`{t}` = {i}" for t, i in special_ids.items())
    espeak = tool_version(["espeak-ng", "--version"])
    sox = tool_version(["sox", "--version"])
    text = f"""# brisk demo speech data set

A tiny synthetic English speech-recognition set for brisk's demos, tests and
smoke-training of small speech-LLMs.  Everything here is generated by
`tools/make_demo_data.py`; do not edit it by hand, rerun the script:

```bash
apt-get install -y espeak-ng sox
python tools/make_demo_data.py --out data/demo --seed {seed}
```

## How it was made

* Sentences: {min(n_words)}-{max(n_words)} words, lowercase ASCII, no punctuation,
  each word drawn independently and uniformly from {len(grammar_words())} words (listed below),
  so a transcript cannot be guessed from the prompt or from its first words: the model has to listen.
  Validation sentences never occur in training, but all their words do.
* Speech: `espeak-ng` ({espeak}), voices used round robin within each split.
  Training: {train_voices}.
  Validation, voices training never heard: {valid_voices}.
  Speaking rate drawn from {RATE_RANGE[0]}-{RATE_RANGE[1]}
  words per minute; an utterance under {MIN_SECONDS} s is re-spoken at {RATE_RANGE[0]}.
* Audio: resampled from 22050 Hz to 16 kHz mono 16-bit with `sox` ({sox}),
  1 dB lower (headroom against clipping), no dither, leading and trailing silence
  trimmed (sox `silence`, 0.3% threshold) and 50 ms of silence put back at each end.
  Other tool versions may give slightly different audio.

## Contents

| split | utterances | audio | duration |
|-------|-----------:|-------|---------:|
| train | {n_train} | `audio/train/`: utt0001-utt{LOSSLESS_TRAIN:04d} FLAC ({wavs} are WAV), the rest Ogg/Opus | {seconds("train"):.1f} s |
| more (training) | {n_more} | `audio/more/*.ogg` (Ogg/Opus) | {seconds("more"):.1f} s |
| valid | {n_valid} | `audio/valid/*.flac` | {seconds("valid"):.1f} s |

Total: {total_s:.1f} s ({total_s / 60:.1f} min) of audio in {total_bytes / 1e6:.2f} MB; utterances last
{min(durations.values()):.2f}-{max(durations.values()):.2f} s. `train_more.jsonl` holds the {n_train} training
lines and the {n_more} more: {n_train + n_more} training utterances, {seconds("train") + seconds("more"):.1f} s.
The more utterances are new sentences spoken by {len(MORE_VARIANTS)} espeak-ng variants on {len(MORE_ACCENTS)}
accents (never a validation voice's variant) at a pitch of {MORE_PITCH_RANGE[0]}-{MORE_PITCH_RANGE[1]} and
{MORE_RATE_RANGE[0]}-{MORE_RATE_RANGE[1]} words per minute. Ogg/Opus at libsndfile's compression level
{OPUS_LEVEL}: lossy, about 3 KB/s.

* `train.jsonl`, `valid.jsonl`: FunASR `scp2jsonl` format, one JSON object per
  line: `key`, `messages` (system, user, assistant), `speech_length` (fbank
  frames: 25 ms window, 10 ms shift) and `text_length` (tokens of the transcript
  under the tokenizer below).  The user turn is
  `{USER_PROMPT}<|startofspeech|>!audio/train/utt0001.flac<|endofspeech|>`; audio
  paths are relative to this folder.
* `am.mvn`: feature normalisation (Kaldi nnet format, as in FunASR model folders): minus the mean and
  one over the standard deviation of the training set's 560-dim LFR features (brisk's front end, no
  dither); the demo config sets `fun_asr_nano.frontend.cmvn_file` to it.
* `tokenizer/`: Qwen-style byte-level BPE tokenizer, {vocab_size} tokens, trained on
  the training transcripts and prompts.  Load it with
  `transformers.AutoTokenizer.from_pretrained("data/demo/tokenizer")`.
  Special tokens: {specials}.
  `<|endoftext|>` is also the pad and eos token; no BOS/EOS is added automatically.
* `qwen3_asr_processor/`: this tokenizer with Qwen3-ASR's special tokens, chat template and feature
  extractor, for the Qwen3-ASR demo (`brisk train qwen3_asr_demo`); made by
  `python tools/make_qwen3_asr_processor.py --out data/demo/qwen3_asr_processor`, not by this script.

Words: {" ".join(grammar_words())}.

## Licence

The speech was synthesized with espeak-ng, a GPL-3.0 program; the GPL covers
the program, not the audio it produces.  The sentences, audio, manifests and
tokenizer were generated for this project and are distributed under brisk's
licence (Apache-2.0).
"""
    write_text(out / "README.md", text)


# --------------------------------------------------------------------------
def prepare_out_dir(out: Path) -> None:
    """Remove only what this script generates, so a rerun starts clean."""
    for sub in ("audio", "tokenizer"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    for name in ("train.jsonl", "valid.jsonl", "train_more.jsonl", "README.md", "am.mvn"):
        (out / name).unlink(missing_ok=True)
    for split in ("train", "valid", "more"):
        (out / "audio" / split).mkdir(parents=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"random seed for sentences and rates (default: {DEFAULT_SEED})")
    parser.add_argument("--more", type=int, default=N_MORE,
                        help=f"extra training utterances in audio/more/ and train_more.jsonl (default: {N_MORE})")
    args = parser.parse_args()
    out = Path(args.out)

    check_tools()
    import soundfile as sf  # imported late so the tool check comes first
    from transformers import AutoTokenizer

    utts = plan_utterances(args.seed) + plan_more(args.seed, args.more)
    prepare_out_dir(out)
    with tempfile.TemporaryDirectory() as tmp:
        check_voices(Path(tmp))
        for n, utt in enumerate(utts, 1):
            path = out / utt.rel_path
            synthesize(utt.text, utt.voice, utt.rate, path, Path(tmp), utt.pitch)
            if utt.split != "more" and sf.info(str(path)).duration < MIN_SECONDS and utt.rate > RATE_RANGE[0]:
                utt.rate = RATE_RANGE[0]
                synthesize(utt.text, utt.voice, utt.rate, path, Path(tmp), utt.pitch)
            if n % 200 == 0:
                print(f"synthesized {n}/{len(utts)}", flush=True)

    total_bytes = sum((out / u.rel_path).stat().st_size for u in utts)
    if total_bytes > MAX_TOTAL_AUDIO_BYTES:
        sys.exit(f"error: audio totals {total_bytes} bytes, over the {MAX_TOTAL_AUDIO_BYTES} budget")

    write_cmvn([out / u.rel_path for u in utts if u.split == "train"], out / "am.mvn")
    train_tokenizer(tokenizer_texts([u.text for u in utts if u.split == "train"]), out / "tokenizer")
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))

    durations: dict[str, float] = {}
    manifests: dict[str, list[str]] = {}
    for split in ("train", "valid", "more"):
        lines = manifests.setdefault(split, [])
        for utt in (u for u in utts if u.split == split):
            durations[utt.key] = sf.info(str(out / utt.rel_path)).duration
            record = jsonl_record(utt, durations[utt.key], len(tok.tokenize(utt.text)))
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    write_text(out / "train.jsonl", "".join(manifests["train"]))
    write_text(out / "valid.jsonl", "".join(manifests["valid"]))
    write_text(out / "train_more.jsonl", "".join(manifests["train"] + manifests["more"]))

    special_ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    write_readme(out, args.seed, utts, durations, total_bytes, len(tok), special_ids)
    print(f"wrote {len(utts)} utterances ({sum(durations.values()):.1f} s, "
          f"{total_bytes / 1e6:.2f} MB of audio) and tokenizer (vocab {len(tok)}) to {out}")


if __name__ == "__main__":
    main()
