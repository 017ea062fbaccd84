"""Data prepared once: the token cache of chat data and the index of speech lists are read on a second start,
rebuilt (saying why) when a data file, the tokenizer or a setting changes, built by one process when many
start together, and shared with DataLoader workers by path; the sampler works from the index's arrays."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from brisk.data.chat import ChatEncoder, parse_chat_obj, training_template
from brisk.data.chat_store import build_chat_store
from brisk.data.jsonl import read_jsonl
from brisk.data.sampler import TokenBatchSampler
from brisk.data.speech_index import build_speech_index
from brisk.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "data" / "chat_demo"
DEMO = ROOT / "data" / "demo"


def chat(path, tok_or_dir, cache, **kw):
    tok = tok_or_dir if not isinstance(tok_or_dir, (str, Path)) else AutoTokenizer.from_pretrained(
        str(tok_or_dir), local_files_only=True)
    kw = {"max_len": 4096, "overlong": "truncate", "skip_bad": False, "workers": 1, **kw}
    return build_chat_store(str(path), tok, cache_dir=cache, **kw)


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    shutil.copyfile(CHAT / "train.jsonl", path)
    shutil.copytree(CHAT / "tokenizer", tmp_path / "tok")
    return path, tmp_path / "tok", tmp_path / "cache"


def test_cache_hit_equals_in_memory_tokenisation(data):
    path, tok, cache = data
    first = chat(path, tok, cache, workers=2)
    again = chat(path, tok, cache)
    assert first.cache_note == "built: first use of this data" and again.cache_note == "read"
    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    encoder = ChatEncoder(tokenizer, training_template(tokenizer), 4096, "truncate")  # in memory, one at a time
    convs = [parse_chat_obj(json.loads(x), f"{path}:{n}") for n, x in enumerate(path.read_text().splitlines(), 1)]
    ref = [encoder.encode(c)[0] for c in convs]
    assert again.keys == [c.key for c in convs] and again.lengths().tolist() == [len(t.input_ids) for t in ref]
    for i in (0, 7, len(ref) - 1):
        assert again.tokens(i).input_ids == ref[i].input_ids and again.tokens(i).labels == ref[i].labels
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [first.folder.name]


def test_changed_file_rebuilds_and_says_why(data):
    path, tok, cache = data
    old = chat(path, tok, cache)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:100]) + "\n")
    new = chat(path, tok, cache)
    assert new.cache_note == "built: 1 data file(s) changed (train.jsonl)" and len(new) == 100
    assert not old.folder.exists()  # the superseded entry is removed
    os.utime(path, ns=(1, 1))  # same bytes, another mtime: size + mtime is the identity
    assert chat(path, tok, cache).cache_note.startswith("built: 1 data file(s) changed")


def test_changed_tokenizer_rebuilds(data):
    path, tok, cache = data
    chat(path, tok, cache)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 1024
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert chat(path, tok, cache).cache_note == "built: the tokenizer changed"


def test_changed_max_len_rebuilds(data):
    path, tok, cache = data
    chat(path, tok, cache)
    short = chat(path, tok, cache, max_len=32)
    assert short.cache_note == "built: max_len 4096 -> 32" and short.counts["truncated"] > 0
    assert chat(path, tok, cache, max_len=32, overlong="skip").cache_note == "built: overlong truncate -> skip"


def _race(args):
    path, tok, cache = args
    return chat(path, tok, cache).cache_note


def test_many_processes_one_build(data):
    with multiprocessing.get_context("fork").Pool(3) as pool:
        notes = pool.map(_race, [data] * 3)
    assert sorted(notes)[0].startswith("built") and sum(n.startswith("built") for n in notes) == 1


def test_store_pickles_by_path(data):
    path, tok, cache = data
    ds = chat(path, tok, cache)
    ds[0]  # maps the arrays in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 4096 < os.path.getsize(ds.folder / "ids.npy")
    back = pickle.loads(blob)
    assert back[5].tokens.labels == ds[5].tokens.labels and back[5].key == ds[5].key


# ----------------------------------------------------------------------------------------------- speech
def test_speech_index_equals_read_jsonl(tmp_path):
    for name in ("train.jsonl", "train_more.jsonl"):
        ix = build_speech_index(str(DEMO / name), max_speech_length=8000, max_text_length=2048, skip_bad=False,
                                cache_dir=tmp_path, workers=2)
        ref = read_jsonl(DEMO / name, max_speech_length=8000, max_text_length=2048, skip_bad=False)
        assert list(ix) == ref.utterances and ix.lengths().tolist() == [u.source_len for u in ref.utterances]
        again = build_speech_index(str(DEMO / name), max_speech_length=8000, max_text_length=2048, skip_bad=False,
                                   cache_dir=tmp_path)
        assert ix.cache_note.startswith("built") and again.cache_note == "read"
        assert pickle.loads(pickle.dumps(again))[3] == ref.utterances[3]


def broken_list(tmp_path: Path) -> Path:
    lines = (DEMO / "train.jsonl").read_text().splitlines()[:12]
    lines = [line.replace("!audio/", f"!{DEMO}/audio/") for line in lines]
    lines[3] = "not json"
    lines[5] = lines[5].replace(".flac", "_gone.flac").replace(".wav", "_gone.wav")
    row = json.loads(lines[7])
    row["messages"][2]["content"] = " "
    lines[7] = json.dumps(row)
    path = tmp_path / "list.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_speech_index_skips_as_read_jsonl(tmp_path):
    path = broken_list(tmp_path)
    ref = read_jsonl(path, max_speech_length=8000, max_text_length=2048, skip_bad=True)
    ix = build_speech_index(str(path), max_speech_length=8000, max_text_length=2048, skip_bad=True, cache_dir=tmp_path,
                            workers=2)
    assert list(ix) == ref.utterances and sorted(ix.skipped) == sorted(ref.skipped) and len(ix.skipped) == 3
    assert ix.meta["audio_missing"] == 1 and ix.meta["suspects"] == 1
    with pytest.raises(DataError, match=rf"{path}:4: not valid JSON.*skip_bad"):
        build_speech_index(str(path), max_speech_length=8000, max_text_length=2048, skip_bad=False, cache_dir=tmp_path)
    lines = path.read_text().splitlines()
    del lines[3]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{path}: 1 of 11 audio files do not exist, first: {path}:5: .*_gone"):
        build_speech_index(str(path), max_speech_length=8000, max_text_length=2048, skip_bad=False, cache_dir=tmp_path)
    unchecked = build_speech_index(str(path), max_speech_length=8000, max_text_length=2048, skip_bad=False,
                                   cache_dir=tmp_path, check_audio=False)
    assert len(unchecked) == 11 and unchecked.meta["audio_checked"] is False and unchecked.meta["audio_files"] == 0


def test_sampler_from_arrays_computes_an_epoch_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 3000, 5000)
    a = TokenBatchSampler(lengths, batch_tokens=6000, max_utts=10, sort_size=512, seed=3)
    b = TokenBatchSampler(lengths.tolist(), batch_tokens=6000, max_utts=10, sort_size=512, seed=3)
    assert a.batches(1) == b.batches(1)
    n = len(a)
    assert a.batches(0) is a.batches(0) and len(list(iter(a))) == n  # len() and iter() share one computation
    flat = sorted(i for batch in a.batches(0) for i in batch)
    assert flat == list(range(5000))
    assert all(max(lengths[batch]) * len(batch) <= 6000 or len(batch) == 1 for batch in a.batches(0))


def test_speech_index_finds_an_undecodable_file_at_start(tmp_path):
    """A file that exists but cannot be decoded is found when the list is indexed (before the model is built),
    named with its line; with skip_bad its line is skipped and counted, as read_jsonl does."""
    (tmp_path / "noise.wav").write_bytes(b"RIFF not really a wave file" * 10)
    lines = (DEMO / "valid.jsonl").read_text(encoding="utf-8").replace("!audio/", f"!{DEMO}/audio/").splitlines()[:5]
    obj = json.loads(lines[1])
    obj["messages"][1]["content"] = f"语音转写：<|startofspeech|>!{tmp_path / 'noise.wav'}<|endofspeech|>"
    lines[1] = json.dumps(obj, ensure_ascii=False)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kw = dict(max_speech_length=8000, max_text_length=2048, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=rf"{path}: 1 of 5 audio files cannot be decoded, first: {path}:2: .*noise.wav"):
        build_speech_index(str(path), skip_bad=False, **kw)
    ix = build_speech_index(str(path), skip_bad=True, **kw)
    ref = read_jsonl(path, max_speech_length=8000, max_text_length=2048, skip_bad=True)
    assert len(ix) == len(ref.utterances) == 4 and "cannot be decoded" in ix.skipped[0]
