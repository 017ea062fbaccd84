"""The first hour of a new user: one clear line for every mistake, run folders that never mix, resume that
says what it did, and output that reads well when piped (issue 11)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import soundfile as sf

from brisk.cli import main, one_line
from brisk.config import ConfigError, load_config
from brisk.data.jsonl import DataError, parse_line, read_jsonl

from .conftest import DEMO, DEMO_CONFIG, run_train, tiny_config


def _error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err  # one line
    return err.strip()


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, expected", [
    ("train.device=gpu", "train.device=gpu: use auto, cpu, cuda or cuda:N"),
    ("optim.lr=-1", "optim.lr=-1.0: must be a number above 0"),
    ("model.llm.config.hidden_size=abc", "model.llm.config.hidden_size='abc': expected an integer"),
    ("model.llm.config.hidden_sizee=64", "unknown key model.llm.config.hidden_sizee=64: not a key of transformers' Qwen3Config"),
    ("train.max_epochs=-1", "train.max_epochs=-1: must be at least 1"),
    ("train.max_stepz=3", "unknown config key train.max_stepz (from override 'train.max_stepz=3') (did you mean train.max_steps?)"),
    # the demo runs without the low frame rate: an IndexError in the adaptor gather before this check
    ("fun_asr_nano.adaptor.downsample_rate=2", "fun_asr_nano.adaptor.downsample_rate=2 needs fun_asr_nano.adaptor.use_low_frame_rate=true"),
])
def test_config_mistakes_are_one_line_exit_2(capsys, override, expected):
    assert expected in _error_line(capsys, ["train", str(DEMO_CONFIG), override])


@pytest.mark.parametrize("config, expected", [("sft_demo", "data.train: give chat data"),
                                              ("qwen3_asr_demo", "data.train: give a Qwen3-ASR fine-tuning jsonl"),
                                              ("demo", "data.train: give a FunASR jsonl")])
def test_no_training_data_is_one_line_before_the_model_is_built(capsys, tmp_path, config, expected):
    assert main(["train", config, "data.train=none", f"train.output_dir={tmp_path / 'r'}"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
    assert " INFO threads: " in out and " INFO model: " not in out  # the run started; no model was built first


def test_a_key_without_value_asks_for_key_value(capsys):
    for argv in (["train", "train.max_epochs"], ["train", str(DEMO_CONFIG), "train.max_epochs"]):
        line = _error_line(capsys, argv)
        assert "train.max_epochs has no value: did you mean key=value" in line and "does not exist" not in line


def test_help_config_lists_every_key_with_type_default_and_meaning(capsys):
    from brisk.config.help import rows

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    keys = [r[0] for r in rows()]
    assert len(keys) > 100 and all(meaning for *_, meaning in rows()), [r[0] for r in rows() if not r[3]]
    for key in keys:
        assert f"  {key} " in out, key
    # a comment continued on the next source line is printed whole; each section's header once
    assert "the N best kept checkpoints (by validation loss/acc, CER with val_decode) into" in out
    headers = [line.split()[0] for line in out.splitlines() if line.startswith("[")]
    assert len(headers) == len(set(headers)) and "[model.llm]" in headers
    lr = next(line for line in out.splitlines() if line.strip().startswith("optim.lr "))
    assert "float" in lr and "0.0002" in lr and "learning rate" in lr
    assert "brisk train --help-config" in str(pytest.raises(ConfigError, load_config, DEMO_CONFIG, ["train.x=1"]).value)


def test_help_config_with_a_config_shows_its_values(capsys):
    """`brisk train CONFIG [overrides] --help-config`: that config's value beside each key, * where it is not the
    default; its family's own section, no other family's."""
    assert main(["train", "sft_demo", "causal_lm.max_len=300", "--help-config"]) == 0
    out = capsys.readouterr().out
    line = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()}
    assert "its value in sft_demo" in out
    assert "causal_lm *" in line["model.family"] and "300 *" in line["causal_lm.max_len"]
    assert "0.002 *" in line["optim.lr"] and "truncate " in line["causal_lm.overlong"] and "*" not in line["causal_lm.overlong"]
    assert "qwen3_asr.language" not in line


def test_a_second_config_file_is_one_line(capsys):
    line = _error_line(capsys, ["train", "sft_demo", "other.yaml"])
    assert "other.yaml: one config file a run" in line and "include:" in line


def test_version(capsys):
    from brisk import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"brisk {__version__}"


def test_relative_output_dir_is_taken_from_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(DEMO_CONFIG).train.output_dir == str(tmp_path / "runs" / "demo")
    assert load_config(DEMO_CONFIG, ["train.output_dir=here"]).train.output_dir == str(tmp_path / "here")


# --------------------------------------------------------------------------------------- run folders
def test_the_demo_gets_a_fresh_folder_each_time_and_prints_it_first(tmp_path, monkeypatch, capsys):
    import brisk.train.run as run

    seen = []

    def fake_train(cfg):
        seen.append(cfg.train.output_dir)
        return {"history": [], "step": 0, "slow_steps": []}

    monkeypatch.setattr(run, "train", fake_train)
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 0 and main(["train"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(set(seen)) == 2 and all(s.startswith(str(tmp_path / "runs" / "demo-")) for s in seen)
    assert out[0] == f"run folder: {seen[0]}"


def _steps(run) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()]


def test_run_folders_never_mix_and_resume_says_what_it_did(tmp_path):
    run = tmp_path / "run"
    short = {"data.valid": None, "train.save_every": 3, "train.save_final": False, "optim.lr": 0.002}
    run_train(run, **short, **{"train.max_steps": 5, "train.resume": True})  # steps 4-5 come after the last checkpoint
    assert "nothing to resume" in (run / "train.log").read_text() and _steps(run) == [1, 2, 3, 4, 5]

    with pytest.raises(ConfigError, match="already holds a run .*train.resume=true.*train.overwrite=true"):
        run_train(run, **short, **{"train.max_steps": 5})

    run_train(run, **{**short, "train.max_steps": 7, "train.resume": True, "optim.lr": 0.001})
    log = (run / "train.log").read_text()
    assert "differs from the checkpoint's in 1 key: optim.lr: 0.002 -> 0.001" in log
    assert _steps(run) == [1, 2, 3, 4, 5, 6, 7]  # resumed at 3: the old 4 and 5 are gone, not repeated
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == list(range(1, 8))

    run_train(run, **short, **{"train.max_steps": 2, "train.overwrite": True})
    assert _steps(run) == [1, 2] and not (run / "checkpoints" / "ckpt-00000006.pt").exists()


# ----------------------------------------------------------------------------------------------- data
def _jsonl(tmp_path, lines: list[str]) -> str:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


def _demo_lines(n: int) -> list[str]:
    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [x.replace("!audio/", f"!{DEMO}/audio/") for x in lines]


def test_missing_audio_is_found_before_training(tmp_path):
    lines = _demo_lines(12)
    for i in (2, 5, 9):
        lines[i] = lines[i].replace(f"!{DEMO}/audio/", f"!{tmp_path}/gone/")
    path = _jsonl(tmp_path, lines)
    with pytest.raises(DataError, match=rf"3 of 12 audio files do not exist, first: {path}:3: .*gone.*; {path}:6: "):
        read_jsonl(path, max_speech_length=8000, max_text_length=100, skip_bad=False)
    index = read_jsonl(path, max_speech_length=8000, max_text_length=100, skip_bad=True)
    assert len(index.utterances) == 9 and len(index.skipped) == 3 and index.skipped[0].startswith(f"{path}:3:")


def test_a_wrong_speech_length_is_caught_when_loaded(tmp_path):
    lines = _demo_lines(3)
    obj = json.loads(lines[1])
    obj["speech_length"] = obj["speech_length"] * 3
    lines[1] = json.dumps(obj, ensure_ascii=False)
    data = _jsonl(tmp_path, lines)
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    split = build_split(tiny_config(tmp_path / "r", **{"data.train": data}), "train", Collator(), 483)
    split.dataset[(0, 0)]  # a right one loads
    with pytest.raises(DataError, match=rf"{data}:2: speech_length={obj['speech_length']} but audio file .* is \d+ frames"):
        split.dataset[(1, 0)]
    split = build_split(tiny_config(tmp_path / "r", **{"data.train": data, "data.skip_bad": True}), "train", Collator(), 483)
    assert "speech_length" in split.dataset[(1, 0)].error


def test_dataloader_worker_errors_are_the_line_they_carry(tmp_path):
    lines = _demo_lines(2)
    obj = json.loads(lines[0])
    obj["speech_length"] = 5
    data = _jsonl(tmp_path, [json.dumps(obj, ensure_ascii=False)])
    from brisk.data.loader import build_split
    from brisk.data.collate import collator_for

    cfg = tiny_config(tmp_path / "r", **{"data.train": data, "data.num_workers": 1})
    split = build_split(cfg, "train", collator_for(cfg), 483)
    with pytest.raises(DataError) as e:
        next(iter(split.loader))
    assert "Traceback" in str(e.value)  # torch's wrapper ...
    assert one_line(e.value).startswith(f"{data}:1: speech_length=5 but audio file")  # ... and what we print


def test_resampling_and_down_mixing_are_logged_once_with_counts(tmp_path):
    wave, rate = sf.read(DEMO / "audio" / "train" / "utt0001.flac")
    half = wave[::2]
    sf.write(tmp_path / "st8k.wav", np.stack([half, half], 1), rate // 2)
    line = json.loads(_demo_lines(1)[0])
    line["messages"][1]["content"] = f"语音转写：<|startofspeech|>!{tmp_path / 'st8k.wav'}<|endofspeech|>"
    data = _jsonl(tmp_path, [json.dumps(line, ensure_ascii=False)] * 3)
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logger = logging.getLogger("brisk")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        split = build_split(tiny_config(tmp_path / "r", **{"data.train": data, "data.max_utts": 1}), "train", Collator(), 483)
        for _ in range(2):  # two epochs: still said once
            list(split.loader)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    first = [r for r in records if "(first:" in r]
    assert len(first) == 2 and any("resampled from 8000 Hz to 16000 Hz" in r for r in first)
    assert any("down-mixed from 2 channels to mono" in r for r in first)
    counts = [r for r in records if r.startswith("train data, first pass")]
    assert counts == ["train data, first pass: 3 files down-mixed from 2 channels to mono, 3 files resampled from 8000 Hz to 16000 Hz"]


def test_json_errors_read_well(tmp_path):
    with pytest.raises(DataError) as e:
        parse_line('{"messages": "abc', "f.jsonl:3", tmp_path)
    assert "at at" not in str(e.value) and str(e.value).startswith("f.jsonl:3: not valid JSON (Unterminated string")


# --------------------------------------------------------------------------------------------- output
def test_piped_log_lines_are_one_line_per_event(tmp_path, capsys):
    from brisk.train.run import setup_logging

    setup_logging(None)  # pytest captures stdout: not a terminal
    logging.getLogger("brisk").info("x" * 300 + " end")
    assert "x" * 300 + " end" in capsys.readouterr().out


def test_report_prints_its_table_and_draws_loss_without_gpu_columns(tmp_path, capsys):
    run = tmp_path / "run"
    run_train(run, **{"train.max_steps": 4, "train.log_every": 1})
    log = (run / "train.log").read_text()
    assert "step 4 (epoch 1/1): loss" in log and "acc = share of transcript tokens" in log
    assert log.index("acc = share") < log.index("acc 0.")  # defined where first shown
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "| steps | mean | median | p90 | slow steps |" in out and "peak memory" not in out and "![" not in out
    assert f"wrote {run / 'report.md'}" in out
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and all(m["loss"] > 0 for m in metrics)


def test_a_graphed_step_is_labelled_as_one_whole():
    from brisk.diagnose.report import phase_bars

    steps = [{"data": 0.001, "forward": 0.0, "backward": 0.0, "optimizer": 0.02, "total": 0.022}] * 3
    assert [b[0] for b in phase_bars(steps)] == ["data", "whole graphed step", "between steps"]
    eager = [{**steps[0], "forward": 0.01, "backward": 0.02}]
    assert [b[0] for b in phase_bars(eager)] == ["data", "forward", "backward", "optimizer", "between steps"]


def test_profiler_chatter_is_kept_off_stderr(tmp_path):
    """Kineto's USDT lines are written to fd 2 by C++: checked in a child process, by its real stderr."""
    import subprocess
    import sys

    code = ("import torch, os\nfrom torch.profiler import profile\nfrom brisk.bench.quiet import without_profiler_chatter\n"
            "with without_profiler_chatter(), profile() as p:\n    torch.ones(3).sum()\n    os.write(2, b'kept line\\n')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(DEMO.parent.parent)})
    assert out.returncode == 0, out.stderr
    assert "USDT" not in out.stderr and "kept line" in out.stderr
