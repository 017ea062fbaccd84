"""`brisk data`: the commands the docs tell users to run to make data, part of the installed package."""

from __future__ import annotations

import json


from brisk.cli import main

from .conftest import DEMO, REPO


def test_speech_lists_become_a_funasr_jsonl_that_trains(tmp_path, capsys):
    wavs = sorted((DEMO / "audio" / "valid").glob("*.flac"))[:3]
    (tmp_path / "wav.scp").write_text("".join(f"u{i} {w}\n" for i, w in enumerate(wavs)), encoding="utf-8")
    (tmp_path / "text").write_text("u0 hello world\nu1 red cat\nu2 one two three\n", encoding="utf-8")
    out = tmp_path / "train.jsonl"
    assert main(["data", "speech", str(tmp_path / "wav.scp"), str(tmp_path / "text"), "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["key"] for r in rows] == ["u0", "u1", "u2"] and rows[2]["messages"][2]["content"] == "one two three"
    import soundfile as sf

    info = sf.info(str(wavs[0]))
    assert rows[0]["speech_length"] == int(info.frames * 100 / info.samplerate) and str(wavs[0]) in rows[0]["messages"][1]["content"]
    from brisk.data.jsonl import read_jsonl

    assert len(read_jsonl(out, max_speech_length=10**6, max_text_length=10**6, skip_bad=False).utterances) == 3


def test_a_key_without_a_transcript_is_one_line_and_nothing_is_written(tmp_path, capsys):
    wav = sorted((DEMO / "audio" / "valid").glob("*.flac"))[0]
    (tmp_path / "wav.scp").write_text(f"a {wav}\nb {wav}\n", encoding="utf-8")
    (tmp_path / "text").write_text("a hello\n", encoding="utf-8")
    out = tmp_path / "train.jsonl"
    assert main(["data", "speech", str(tmp_path / "wav.scp"), str(tmp_path / "text"), "--out", str(out)]) == 2
    assert f"{tmp_path / 'wav.scp'}:2: key b has no transcript" in capsys.readouterr().err and not out.exists()


def test_relative_audio_paths_beside_the_list_or_from_the_current_folder(tmp_path, monkeypatch, capsys):
    """A relative path in wav.scp is read beside it, else from the current folder (where Kaldi recipes run); a path
    found in neither is one line saying where it looked."""
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "text").write_text("u0 hello\n", encoding="utf-8")
    scp, out = tmp_path / "lists" / "wav.scp", tmp_path / "train.jsonl"
    monkeypatch.chdir(DEMO)
    scp.write_text("u0 audio/valid/utt0001.flac\n", encoding="utf-8")
    assert main(["data", "speech", str(scp), str(tmp_path / "lists" / "text"), "--out", str(out)]) == 0
    assert str((DEMO / "audio" / "valid" / "utt0001.flac").resolve()) in out.read_text(encoding="utf-8")
    scp.write_text("u0 audio/valid/no_such.flac\n", encoding="utf-8")
    assert main(["data", "speech", str(scp), str(tmp_path / "lists" / "text"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "wav.scp:1: audio file audio/valid/no_such.flac not found" in err and str(tmp_path / "lists") in err


def test_the_chat_demo_command_writes_the_bundled_set(tmp_path):
    assert main(["data", "chat", "demo", "--out", str(tmp_path / "chat")]) == 0
    for name in ("train.jsonl", "valid.jsonl", "tokenizer/tokenizer_config.json", "tokenizer/chat_template.jinja"):
        assert (tmp_path / "chat" / name).read_bytes() == (REPO / "data" / "chat_demo" / name).read_bytes(), name


def test_text_length_counts_the_tokenizers_tokens_when_given_one(tmp_path, capsys):
    """FunASR's own list-to-jsonl script counts text_length with the LLM's tokenizer; --tokenizer does the same (the
    bundled demo's word-level tokenizer: one token a word), without it the count is characters; a folder with no
    tokenizer is one line and nothing is written."""
    wavs = sorted((DEMO / "audio" / "valid").glob("*.flac"))[:2]
    (tmp_path / "wav.scp").write_text("".join(f"u{i} {w}\n" for i, w in enumerate(wavs)), encoding="utf-8")
    (tmp_path / "text").write_text("u0 red green blue\nu1 four seven\n", encoding="utf-8")
    args = [str(tmp_path / "wav.scp"), str(tmp_path / "text"), "--out"]
    assert main(["data", "speech", *args, str(tmp_path / "tok.jsonl"), "--tokenizer", str(DEMO / "tokenizer")]) == 0
    assert "text_length counts tokens of" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "tok.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["text_length"] for r in rows] == [3, 2]
    assert main(["data", "speech", *args, str(tmp_path / "chars.jsonl")]) == 0
    assert [json.loads(x)["text_length"] for x in (tmp_path / "chars.jsonl").read_text().splitlines()] == [14, 10]
    assert main(["data", "speech", *args, str(tmp_path / "bad.jsonl"), "--tokenizer", str(tmp_path)]) == 2
    assert "no tokenizer could be read there" in capsys.readouterr().err and not (tmp_path / "bad.jsonl").exists()
