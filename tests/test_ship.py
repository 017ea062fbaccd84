"""What a user ships equals what they trained (issue 32): exports that compute as their run did, resumes that
refuse a different model and leave the folder untouched, one line for a missing CUDA."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from brisk.cli import main

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
                      "model.frontend.dither": 1.0})  # trained with dither: inference must still not dither
    return run


def test_speech_exports_evaluate_as_their_run(speech_run, tmp_path, capsys):
    import dataclasses

    from brisk.data.audio import read_audio
    from brisk.data.features import Frontend
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
        assert dataclasses.replace(cfg_exp.model.frontend, cmvn_file=None) == \
            dataclasses.replace(cfg_run.model.frontend, cmvn_file=None), fmt
        audio = read_audio(str(DEMO / "audio" / "valid" / "utt0001.flac"), cfg_run.model.frontend.fs)
        a = Frontend(dataclasses.replace(cfg_run.model.frontend, dither=0.0))(audio)
        b = Frontend(dataclasses.replace(cfg_exp.model.frontend, dither=0.0))(audio)
        assert torch.equal(a, b), fmt
    raw = (run / "model-funasr" / "config.yaml").read_text(encoding="utf-8")
    assert "cmvn_file: am.mvn" in raw and "dither: 0.0" in raw  # FunASR's runtime: its CMVN, no dither


def test_chat_export_evaluates_as_its_run(tmp_path, capsys):
    from brisk.config import load_config
    from brisk.train.run import train

    run = tmp_path / "chat"
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [
        f"train.output_dir={run}", "train.max_steps=8", "diagnose.report=false", "train.tensorboard=false",
        "train.export_dtype=fp32", "data.max_len=96"])  # a max_len the export must carry (defaults to 2048)
    train(cfg)
    data = ROOT / "data" / "chat_demo" / "valid.jsonl"
    _eval(capsys, run, data, tmp_path / "run.jsonl", "--answers", "3", "--max-new-tokens", "8")
    s_run = json.loads((tmp_path / "run.summary.json").read_text())
    ans_run = (tmp_path / "run.jsonl").read_text()
    _eval(capsys, run / "model-hf", data, tmp_path / "exp.jsonl", "--answers", "3", "--max-new-tokens", "8")
    s_exp = json.loads((tmp_path / "exp.summary.json").read_text())
    assert s_exp == s_run and (tmp_path / "exp.jsonl").read_text() == ans_run


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
                          "data.max_len=256")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.llm.config.hidden_size: 128 -> 64" in err and "data.max_len" in err, err
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
