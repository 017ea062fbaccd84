"""Data: FunASR jsonl, audio, features, prompts, the token-bucketed sampler, collation, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from brisk.families.fun_asr_nano.config import FrontendConfig
from brisk.data.audio import read_audio, resample
from brisk.data.collate import Collator
from brisk.families.fun_asr_nano.dataset import SpeechDataset
from brisk.families.fun_asr_nano.features import Frontend, lfr
from brisk.data.jsonl import DataError, read_jsonl
from brisk.data.prompt import PromptBuilder
from brisk.data.sampler import TokenBatchSampler
from brisk.formats.batch import AudioBatch

from .conftest import DEMO


def line(audio: str, text: str = "the red fox", speech_length: int = 200, text_length: int = 3) -> str:
    return json.dumps({"key": audio, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"语音转写：<|startofspeech|>!{audio}<|endofspeech|>"},
        {"role": "assistant", "content": text}], "speech_length": speech_length, "text_length": text_length}, ensure_ascii=False)


def write(tmp_path, lines: list[str]):
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def read(p, skip_bad=False, cap=8000, check_audio=True):
    return read_jsonl(p, max_speech_length=cap, max_text_length=100, skip_bad=skip_bad, check_audio=check_audio)


GOOD = str(DEMO / "audio/train/utt0001.flac")


def test_demo_jsonl_reads_with_relative_audio_resolved():
    idx = read(DEMO / "train.jsonl")
    assert len(idx.utterances) == 240  # data/demo/README.md: 240 training utterances
    u = idx.utterances[0]
    assert u.audio_paths()[0] == str(DEMO / "audio/train/utt0001.flac")
    assert u.source_len == u.speech_length + u.text_length


def test_malformed_line_names_file_and_line(tmp_path):
    p = write(tmp_path, [line(GOOD), "{not json", line(GOOD)])
    with pytest.raises(DataError, match=rf"{p}:2: not valid JSON"):
        read(p)
    idx = read(p, skip_bad=True)
    assert len(idx.utterances) == 2 and len(idx.skipped) == 1 and ":2:" in idx.skipped[0]


def test_length_cap_and_zero_length_name_the_line(tmp_path):
    p = write(tmp_path, [line(GOOD), line(GOOD, speech_length=9000), line(GOOD, speech_length=0)])
    with pytest.raises(DataError, match=rf"{p}:2: speech_length=9000 frames is over the cap"):
        read(p)
    idx = read(p, skip_bad=True)
    assert len(idx.utterances) == 1 and [s.split(":")[1] for s in idx.skipped] == ["2", "3"]


def test_a_missing_speech_length_is_named_as_missing_not_as_empty_audio(tmp_path):
    obj = json.loads(line(GOOD))
    del obj["speech_length"]
    p = write(tmp_path, [line(GOOD), json.dumps(obj, ensure_ascii=False)])
    with pytest.raises(DataError, match=rf"{p}:2: speech_length missing or 0: give the audio's length in 10 ms"):
        read(p)


def test_a_folder_or_another_layout_is_named_for_what_it_is(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path} is a folder; give a FunASR jsonl file"):
        read(tmp_path)
    p = write(tmp_path, [json.dumps({"audio": GOOD, "text": "language English<asr_text>red"})])
    with pytest.raises(DataError, match=rf"{p}:1: expected an object with a 'messages' list .*; the line has audio, text"):
        read(p)


def test_a_json_error_names_its_column_on_the_line(tmp_path):
    bad = line(GOOD)[:-1]  # the closing brace gone: the error is at the line's end, not column 1 of the next
    p = write(tmp_path, [bad])
    with pytest.raises(DataError, match=rf"{p}:1: not valid JSON \(.*column {len(bad) + 1}\)"):
        read(p)


def _dataset(p, tokenizer, skip_bad=False):
    idx = read(p, skip_bad=skip_bad, check_audio=False)  # a file can also vanish after the start-up check
    return SpeechDataset(idx.utterances, FrontendConfig(dither=0.0), PromptBuilder(tokenizer), seed=0,
                         skip_bad=skip_bad, max_speech_length=8000)


def test_missing_and_empty_audio_name_file_and_line(tmp_path, tokenizer):
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, dtype=np.float32), 16000)
    real = 1 + (sf.info(GOOD).frames - 400) // 160  # fbank frames: what speech_length declares
    p = write(tmp_path, [line(GOOD, speech_length=real), line(str(tmp_path / "gone.wav")), line(str(empty))])
    with pytest.raises(DataError, match=rf"1 of 3 audio files do not exist, first: {p}:2: .*gone.wav"):
        read(p)  # found at start, before any training
    ds = _dataset(p, tokenizer)
    assert ds[0].tokens is not None
    with pytest.raises(DataError, match=rf"{p}:2: .*gone.wav not found"):
        ds[1]
    with pytest.raises(DataError, match=rf"{p}:3: .*empty.wav has no samples"):
        ds[2]
    ds = _dataset(p, tokenizer, skip_bad=True)
    bad = Collator()([ds[0], ds[1], ds[2]])
    assert bad.n_utts == 1 and len(bad.bad) == 2


def test_wav_and_flac_and_resampling(tmp_path):
    wav = read_audio(str(DEMO / "audio/train/utt0002.wav"), 16000)
    flac = read_audio(GOOD, 16000)
    assert wav.dtype == flac.dtype == torch.float32 and wav.numel() > 16000 and flac.abs().max() <= 1
    t = torch.arange(16000) / 16000
    tone = torch.sin(2 * math.pi * 440 * t)
    sf.write(tmp_path / "tone8k.wav", tone[::2].numpy(), 8000)
    up = read_audio(str(tmp_path / "tone8k.wav"), 16000)
    assert up.numel() == 16000
    assert torch.allclose(up[200:-200], tone[200:-200], atol=0.02)  # band-limited interpolation of a 440 Hz tone
    assert resample(tone, 16000, 16000 // 2).numel() == 8000


def test_channels_averaged_and_mono_taken_as_it_is(tmp_path):
    """FunASR averages channels; a mono file's samples come back unchanged (no torch op on the reader
    threads), a stereo file's as the mean of its two channels."""
    g = torch.Generator().manual_seed(0)
    left, right = (0.5 * torch.rand(4000, generator=g) - 0.25 for _ in range(2))
    sf.write(tmp_path / "mono.wav", left.numpy(), 16000, subtype="FLOAT")
    sf.write(tmp_path / "stereo.wav", torch.stack([left, right], 1).numpy(), 16000, subtype="FLOAT")
    assert torch.equal(read_audio(str(tmp_path / "mono.wav"), 16000), left)
    notes: list = []
    both = read_audio(str(tmp_path / "stereo.wav"), 16000, notes)
    assert torch.equal(both, torch.stack([left, right], 1).mean(dim=1)) and "down-mixed" in notes[0][0]


def test_lfr_stacks_seven_frames_every_six_with_edge_replication():
    feats = torch.arange(20, dtype=torch.float32)[:, None].repeat(1, 2)  # frame i holds value i
    out = lfr(feats, 7, 6)
    assert out.shape == (4, 14)
    assert out[0, ::2].tolist() == [0, 0, 0, 0, 1, 2, 3]  # 3 copies of frame 0 in front
    assert out[-1, ::2].tolist() == [15, 16, 17, 18, 19, 19, 19]  # last frame repeated past the end
    fe = Frontend(FrontendConfig(dither=0.0))
    assert fe.num_frames(16000) == fe(torch.zeros(16000).uniform_(-0.1, 0.1)).shape[0]


def test_dither_is_seeded_per_sample(tokenizer):
    idx = read(DEMO / "train.jsonl")
    ds = SpeechDataset(idx.utterances[:2], FrontendConfig(dither=1.0), PromptBuilder(tokenizer), seed=3,
                       skip_bad=False, max_speech_length=8000)
    assert torch.equal(ds[(0, 5)].feats[0], ds[(0, 5)].feats[0])  # same (epoch, index): same features
    assert not torch.equal(ds[(0, 5)].feats[0], ds[(0, 6)].feats[0])  # another epoch: another dither


def test_prompt_layout_and_label_masking(tokenizer):
    idx = read(DEMO / "train.jsonl")
    u = idx.utterances[0]
    t = PromptBuilder(tokenizer).build(u, [30])
    (beg, n), = t.audio_slots
    assert n == 4  # ceil(ceil(ceil(30/2)/2)/2)
    assert t.input_ids[beg:beg + n] == [0] * n
    answer = tokenizer.encode(u.assistant[0] + "<|im_end|>")
    assert t.input_ids[-len(answer):] == answer and t.labels[-len(answer):] == answer
    assert set(t.labels[:-len(answer)]) == {-100}
    think = PromptBuilder(tokenizer, do_think=False).build(u, [30])
    assert len(think.input_ids) == len(t.input_ids) + len(tokenizer.encode("<think>\n\n</think>\n\n"))


def test_sampler_budget_cap_coverage_and_seeded_order():
    lengths = [int(x) for x in torch.randint(50, 700, (500,), generator=torch.Generator().manual_seed(0))]
    s = TokenBatchSampler(lengths, batch_tokens=2000, max_utts=10, sort_size=64, seed=7)
    b0 = s.batches(0)
    assert sorted(i for b in b0 for i in b) == list(range(500))
    for b in b0:
        assert len(b) <= 10
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 2000
    assert b0 == TokenBatchSampler(lengths, batch_tokens=2000, max_utts=10, sort_size=64, seed=7).batches(0)
    assert b0 != s.batches(1)
    s.set_epoch(1, start=5)
    assert [[i for i, _ in b] for b in s] == s.batches(1)[5:]
    two = [TokenBatchSampler(lengths, batch_tokens=2000, max_utts=10, sort_size=64, seed=7, rank=r, world_size=2).batches(0)
           for r in (0, 1)]
    assert len(two[0]) == len(two[1])


def test_padded_collation(tokenizer):
    idx = read(DEMO / "train.jsonl")
    ds = SpeechDataset(idx.utterances[:3], FrontendConfig(dither=0.0), PromptBuilder(tokenizer), seed=0,
                       skip_bad=False, max_speech_length=8000)
    b = Collator()([ds[i] for i in range(3)])
    lens = [len(ds[i].tokens.input_ids) for i in range(3)]
    assert b.input_ids.shape == (3, max(lens)) and b.attention_mask.sum(1).tolist() == lens
    assert b.speech.shape[0] == 3 and b.speech_lengths.tolist() == [ds[i].feats[0].shape[0] for i in range(3)]
    assert b.audio_pos.numel() == sum(b.slot_counts)
    assert isinstance(b, AudioBatch) and b.shape_key() == ("padded", 3, max(lens), *b.speech.shape[:2], sum(b.slot_counts))
