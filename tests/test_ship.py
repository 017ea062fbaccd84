"""What a user ships equals what they trained (issue 32): exports that compute as their run did, resumes that
refuse a different model and leave the folder untouched, one line for a missing CUDA."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from brisk.cli import main
from brisk.families import section

from .conftest import DEMO, run_train

ROOT = Path(__file__).resolve().parents[1]


def _subset(tmp_path: Path, src: Path, n: int) -> Path:
    """The first n lines of a jsonl, audio paths made absolute (the copy lives elsewhere)."""
    out = tmp_path / f"{src.stem}-{n}.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    out.write_text("\n".join(x.replace("!audio/", f"!{src.parent}/audio/") for x in lines) + "\n", encoding="utf-8")
    return out


def _eval(capsys, model: Path, data: Path, out: Path, *extra: str) -> list[dict]:
    assert main(["eval", str(model), str(data), "--out", str(out), *extra]) == 0
    capsys.readouterr()
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def speech_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ship") / "run"
    run_train(run, **{"train.max_steps": 6, "train.export": "funasr", "train.export_dtype": "fp32",
                      "fun_asr_nano.frontend.dither": 1.0})  # trained with dither: inference must still not dither
    return run


def test_speech_exports_evaluate_as_their_run(speech_run, tmp_path, capsys):
    import dataclasses

    from brisk.data.audio import read_audio
    from brisk.families.fun_asr_nano.features import Frontend
    from brisk.eval.load import load_for_inference

    run = speech_run
    assert main(["export", str(run), "--format", "hf", "--dtype", "fp32"]) == 0
    data = _subset(tmp_path, DEMO / "valid.jsonl", 4)
    ref = _eval(capsys, run, data, tmp_path / "run.jsonl", "--max-new-tokens", "12")
    for fmt in ("funasr", "hf"):
        folder = run / f"model-{fmt}"
        assert (folder / "am.mvn").read_bytes() == (DEMO / "am.mvn").read_bytes()  # in the folder, not a path back
        assert str(DEMO) not in (folder / "brisk.json").read_text(encoding="utf-8")
        got = _eval(capsys, folder, data, tmp_path / f"{fmt}.jsonl", "--max-new-tokens", "12")
        assert got == ref, fmt  # to the utterance
        # and the features the two models see are the same numbers
        _, _, cfg_run = load_for_inference(run)
        _, _, cfg_exp = load_for_inference(folder)
        assert dataclasses.replace(section(cfg_exp).frontend, cmvn_file=None) == \
            dataclasses.replace(section(cfg_run).frontend, cmvn_file=None), fmt
        audio = read_audio(str(DEMO / "audio" / "valid" / "utt0001.flac"), section(cfg_run).frontend.fs)
        a = Frontend(dataclasses.replace(section(cfg_run).frontend, dither=0.0))(audio)
        b = Frontend(dataclasses.replace(section(cfg_exp).frontend, dither=0.0))(audio)
        assert torch.equal(a, b), fmt
    raw = (run / "model-funasr" / "config.yaml").read_text(encoding="utf-8")
    assert "cmvn_file: am.mvn" in raw and "dither: 0.0" in raw  # FunASR's runtime: its CMVN, no dither


def test_chat_export_evaluates_as_its_run(tmp_path, capsys):
    from brisk.config import load_config
    from brisk.train.run import train

    run = tmp_path / "chat"
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [
        f"train.output_dir={run}", "train.max_steps=8", "diagnose.report=false", "train.tensorboard=false",
        "train.export_dtype=fp32", "causal_lm.max_len=96"])  # a max_len the export must carry (defaults to 2048)
    train(cfg)
    data = ROOT / "data" / "chat_demo" / "valid.jsonl"
    _eval(capsys, run, data, tmp_path / "run.jsonl", "--answers", "3", "--max-new-tokens", "8")
    s_run = json.loads((tmp_path / "run.summary.json").read_text())
    ans_run = (tmp_path / "run.jsonl").read_text()
    _eval(capsys, run / "model-hf", data, tmp_path / "exp.jsonl", "--answers", "3", "--max-new-tokens", "8")
    s_exp = json.loads((tmp_path / "exp.summary.json").read_text())
    assert s_exp == s_run and (tmp_path / "exp.jsonl").read_text() == ans_run
    rows = [json.loads(x) for x in ans_run.splitlines()]  # the exact-match rate is the share of exact answers
    assert s_run["answered"] == 3 and s_run["exact_match"] == sum(r["exact"] for r in rows) / 3
    # `brisk export RUN` without --format rewrites the run's own export (hf: a chat model has no FunASR layout)
    assert main(["export", str(run), "--dtype", "fp32"]) == 0
    assert "exported hf folder" in capsys.readouterr().out and not (run / "model-funasr").exists()
    _eval(capsys, run / "model-hf", data, tmp_path / "again.jsonl", "--answers", "3", "--max-new-tokens", "8")
    assert (tmp_path / "again.jsonl").read_text() == ans_run


# ------------------------------------------------------------------------------------------- resume
def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _sft_argv(run: Path, *extra: str) -> list[str]:
    return ["train", "sft_demo", f"train.output_dir={run}", "diagnose.report=false", "train.tensorboard=false",
            "train.export=none", *extra]


def test_a_resume_with_another_model_is_refused_and_leaves_the_folder_byte_identical(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_sft_argv(run, "train.max_steps=4")) == 0
    before = _hashes(run)
    capsys.readouterr()
    assert main(_sft_argv(run, "train.max_steps=8", "train.resume=true", "model.llm.config.hidden_size=64",
                          "causal_lm.max_len=256")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.llm.config.hidden_size: 128 -> 64" in err and "causal_lm.max_len" in err, err
    assert "train.max_steps" not in err  # allowed keys are not named as refused
    assert _hashes(run) == before
    # eval and export given a run whose files disagree: one line too, nothing written
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text(encoding="utf-8").replace("hidden_size: 128", "hidden_size: 64"), encoding="utf-8")
    before = _hashes(run)
    data = ROOT / "data" / "chat_demo" / "valid.jsonl"
    for argv in (["eval", str(run), str(data)], ["export", str(run), "--format", "hf"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "model.llm.config.hidden_size: 128 -> 64" in err, err
    assert _hashes(run) == before


def test_a_resume_may_extend_the_run_and_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_sft_argv(run, "train.max_steps=4")) == 0
    capsys.readouterr()
    assert main(_sft_argv(run, "train.max_steps=6", "train.resume=true", "train.log_every=3")) == 0
    assert "resume: 2 allowed changes: train.log_every: 10 -> 3; train.max_steps: 4 -> 6" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- device
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.parametrize("verb", ["eval", "transcribe"])
def test_device_cuda_without_cuda_is_one_line(verb, capsys):
    # checked before the model is loaded: no run is needed
    argv = [verb, str(ROOT / "no-such-run"), str(DEMO / "valid.jsonl"), "--device", "cuda"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda: no CUDA device is available" in err, err


# ------------------------------------------------------------------------------------ smaller things
def _demo_lines(n: int) -> list[str]:
    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [x.replace("!audio/", f"!{DEMO}/audio/") for x in lines]


def test_data_is_checked_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    import brisk.train.assemble as assemble
    import brisk.train.run as run_mod

    built = []
    real = assemble.assemble
    monkeypatch.setattr(run_mod, "assemble", lambda *a, **k: built.append(1) or real(*a, **k))
    lines = _demo_lines(4)
    lines[2] = '{"key": "x", "messages": ['
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    from .conftest import tiny_overrides

    argv = ["train", str(ROOT / "configs" / "demo.yaml"), *tiny_overrides(tmp_path / "r", **{"data.train": str(bad)})]
    assert main(argv) == 2
    assert f"{bad}:3: not valid JSON" in capsys.readouterr().err and not built


def test_an_undecodable_audio_file_is_found_at_start_and_skipped_once(tmp_path, caplog):
    from brisk.data.jsonl import DataError, read_jsonl

    (tmp_path / "noise.wav").write_bytes(b"RIFF not really a wave file" * 10)
    lines = _demo_lines(5)
    obj = json.loads(lines[1])
    obj["messages"][1]["content"] = f"语音转写：<|startofspeech|>!{tmp_path / 'noise.wav'}<|endofspeech|>"
    lines[1] = json.dumps(obj, ensure_ascii=False)
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"1 of 5 audio files cannot be decoded, first: {data}:2: .*noise.wav"):
        read_jsonl(data, max_speech_length=8000, max_text_length=100, skip_bad=False)
    index = read_jsonl(data, max_speech_length=8000, max_text_length=100, skip_bad=True)
    assert len(index.utterances) == 4 and "cannot be decoded" in index.skipped[0]


def test_a_bad_override_of_the_demo_leaves_no_runs_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "optim.lr=abc"]) == 2
    assert "optim.lr" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_transcribe_says_once_what_it_did_to_the_audio(speech_run, tmp_path, capsys):
    import numpy as np
    import soundfile as sf

    wave, rate = sf.read(str(DEMO / "audio" / "valid" / "utt0001.flac"))
    sf.write(tmp_path / "st22k.wav", np.stack([wave[::1], wave[::1]], 1), 22050)
    assert main(["transcribe", str(speech_run), str(tmp_path / "st22k.wav"), str(tmp_path / "st22k.wav"),
                 "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    notes = [x for x in err.splitlines() if x.startswith("INFO audio:")]
    assert len(notes) == 1 and "2 file(s) resampled from 22050 Hz to 16000 Hz" in notes[0] and "down-mixed" in notes[0]


def test_every_default_the_help_prints_is_a_value(tmp_path):
    from brisk.config import load_config
    from brisk.config.help import rows

    # (task: the old name of model.family, filled from it, so none there means "the family's word")
    nones = [key for key, _tp, default, _ in rows() if default == "none" and key != "task"]
    assert "data.valid" in nones and "train.resume_from" in nones
    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"{k}=none" for k in nones])
    from brisk.config import get_dotted

    from brisk.config import optional_keys

    # an optional key's none is null; a key whose values include the word none (lora.bias) keeps it
    assert all(get_dotted(cfg, k) is None if k in optional_keys() else get_dotted(cfg, k) == "none" for k in nones)


def test_a_dropped_conversation_is_one_warning_and_transformers_stays_quiet(tmp_path):
    import logging

    from transformers import AutoTokenizer

    from brisk.data.chat_store import build_chat_store

    tok = AutoTokenizer.from_pretrained(str(ROOT / "data" / "chat_demo" / "tokenizer"), local_files_only=True)
    tok.model_max_length = 16  # what makes transformers warn about "indexing errors"
    long = {"messages": [{"role": "user", "content": "repeat: " + " ".join(["dog"] * 60)},
                         {"role": "assistant", "content": "dog"}]}
    short = {"messages": [{"role": "user", "content": "repeat: dog"}, {"role": "assistant", "content": "dog"}]}
    data = tmp_path / "c.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in (long, long, short)) + "\n", encoding="utf-8")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger("brisk"), logging.getLogger("transformers")]
    saved = [(lg, lg.handlers[:], lg.level) for lg in loggers]
    for lg in loggers:
        lg.handlers = [handler]
        lg.setLevel(logging.INFO)
    try:
        build_chat_store(str(data), tok, max_len=40, overlong="truncate", skip_bad=False, cache_dir=tmp_path / "cache")
    finally:
        for lg, hs, level in saved:
            lg.handlers, lg.level = hs, level
    dropped = [r for r in records if "conversations dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelname == "WARNING" and "2 conversations dropped" in dropped[0].getMessage()
    assert not any("indexing errors" in r.getMessage() for r in records)


def test_funasr_runtime_takes_the_exported_cmvn_and_computes_brisks_features(speech_run):
    """FunASR's own AutoModel, given the export, builds its front end from the folder's am.mvn, without dither,
    and computes the features brisk trained on."""
    pytest.importorskip("funasr")
    from funasr import AutoModel

    from brisk.data.audio import read_audio
    from brisk.families.fun_asr_nano.features import Frontend
    from brisk.eval.load import load_for_inference

    folder = speech_run / "model-funasr"
    am = AutoModel(model=str(folder), device="cpu", disable_update=True)
    fe = am.kwargs["frontend"]
    assert fe.cmvn is not None and Path(fe.cmvn_file).resolve() == (folder / "am.mvn").resolve() and fe.dither == 0.0
    _, _, cfg = load_for_inference(speech_run)
    wave = read_audio(str(DEMO / "audio" / "valid" / "utt0001.flac"), 16000)
    ref, _ = fe(wave[None], torch.tensor([wave.numel()]))
    import dataclasses

    ours = Frontend(dataclasses.replace(section(cfg).frontend, dither=0.0))(wave)
    assert ref.shape[1:] == ours.shape and torch.allclose(ref[0], ours, atol=1e-3, rtol=1e-4)


def test_every_shipped_config_names_files_inside_the_package():
    """A pip-installed brisk has brisk/configs and brisk/bundled but no repository around them: a relative path
    in a shipped config (as written, symlinks not followed: the repository's data/ links into the package)
    must stay inside the package and exist."""
    import os

    import yaml

    import brisk
    from brisk.config import SHIPPED, shipped_names

    package = os.path.dirname(os.path.abspath(brisk.__file__))
    keys = (("data", "train"), ("data", "valid"), ("data", "tokenizer"), ("data", "profile"),
            ("model", "frontend", "cmvn_file"), ("include",))
    outside = []
    for name in shipped_names():
        raw = yaml.safe_load((SHIPPED / f"{name}.yaml").read_text(encoding="utf-8")) or {}
        for key in keys:
            value = raw
            for part in key:
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, str) and not os.path.isabs(value):
                where = os.path.normpath(os.path.join(SHIPPED, value))
                if os.path.commonpath([where, package]) != package or not os.path.exists(where):
                    outside.append(f"{name}.yaml: {'.'.join(key)}: {value}")
    assert "demo" in shipped_names() and not outside, outside
