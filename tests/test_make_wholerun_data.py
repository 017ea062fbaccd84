"""tools/make_wholerun_data.py without the espeak-ng program: speech through libespeak-ng (the espeakng-loader
wheel, brisk[tools]) with the program's voices and rates."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from .conftest import REPO

pytest.importorskip("espeakng_loader")
sys.path.insert(0, str(REPO / "tools"))
import make_demo_data as demo  # noqa: E402


@pytest.fixture
def library(monkeypatch):
    """espeak_pcm with no espeak-ng program on PATH: the library path."""
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)


def seconds(text: str, voice: str, rate: int) -> tuple[float, np.ndarray]:
    pcm, fs = demo.espeak_pcm(text, voice, rate)
    assert fs == 22050
    samples = np.frombuffer(pcm, dtype=np.int16)
    return len(samples) / fs, samples


def test_the_library_speaks_every_voice_at_the_given_rate(library):
    slow, a = seconds("three red cats and a blue box", "en-us", 140)
    fast, _ = seconds("three red cats and a blue box", "en-us", 200)
    assert 1.0 < fast < slow < 4.0 and np.abs(a).max() > 3000
    gb, b = seconds("three red cats and a blue box", "en-gb", 140)  # the program's name for the voice file "en"
    assert abs(gb - slow) > 0.01 or not np.array_equal(a[:20000], b[:20000])
    for voice in demo.VOICES:
        assert seconds("the red fox", voice, 160)[0] > 0.5, voice
    with pytest.raises(RuntimeError, match="unknown voice 'xx-nowhere'"):
        demo.espeak_pcm("the red fox", "xx-nowhere", 160)


def test_make_wholerun_data_writes_a_small_set_without_the_program(tmp_path):
    env_path = str(tmp_path / "bin")  # a PATH without espeak-ng (python is called by its full path)
    out = tmp_path / "set"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_wholerun_data.py"), "--out", str(out),
                           "--train", "3", "--valid", "1", "--jobs", "2"], capture_output=True, text=True,
                          env={"PATH": env_path, "HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["utterances"] == 4 and 1.5 <= stats["seconds_min"] <= stats["seconds_max"] <= 10.0
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all((out / "audio" / "train" / f"utt{i:04d}.ogg").stat().st_size > 1000 for i in (1, 2, 3))
    import soundfile as sf

    info = sf.info(str(out / "audio" / "valid" / "utt0001.ogg"))
    assert info.samplerate == 16000 and info.channels == 1 and info.duration >= 1.5
