"""Day-one trust (issue 24): model files are data, a failed start leaves nothing behind, every mistake is one
line, Ctrl-C saves, the numbers a user reads are right, exports behave like shared files."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from brisk.cli import main
from brisk.safe_load import UnsafeFileError, load_torch_file

from .conftest import DEMO_CONFIG, tiny_overrides


def _error_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


# --------------------------------------------------------------------------------- files are data
class _RunsACommand:
    """Unpickling this would create ``marker`` (a stand-in for any command a file's author chose)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_file(tmp_path, legacy: bool):
    marker = tmp_path / "MARKER"
    path = tmp_path / ("evil_legacy.pt" if legacy else "evil.pt")
    obj = {"state_dict": {"w": torch.zeros(2)}, "extra": _RunsACommand(marker)}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path, marker


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickle_that_runs_a_command_is_refused_and_nothing_runs(tmp_path, legacy):
    path, marker = _evil_file(tmp_path, legacy)
    with pytest.raises(UnsafeFileError) as e:
        load_torch_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_an_unsafe_model_init_is_one_line_exit_2_through_the_cli(tmp_path, capsys):
    path, marker = _evil_file(tmp_path, legacy=False)
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"model.init={path}"])
    assert str(path) in line and "posix.system" in line and "refused" in line
    assert not marker.exists()


def test_a_model_init_with_other_keys_says_counts_and_first_keys(tmp_path, capsys):
    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"encoder.foo": torch.zeros(2), "bar": torch.zeros(1)}}, path)
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"model.init={path}"])
    assert f"{path}: keys do not match" in line and "2 unexpected" in line and "'bar'" in line and "missing (e.g. [" in line


def test_rng_state_is_plain_data_and_round_trips(tmp_path):
    from brisk.train.checkpoint import rng_state, set_rng_state

    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    torch.save({"rng": rng_state()}, tmp_path / "c.pt")
    want = (torch.rand(3), random.random(), np.random.rand(3))
    set_rng_state(load_torch_file(tmp_path / "c.pt")["rng"])  # weights_only=True
    got = (torch.rand(3), random.random(), np.random.rand(3))
    assert torch.equal(want[0], got[0]) and want[1] == got[1] and np.array_equal(want[2], got[2])


def test_a_checkpoint_written_before_the_rule_still_loads(tmp_path):
    """Older checkpoints hold numpy's RNG state as a numpy array: numpy's array reconstruction is allowed."""
    from brisk.train.checkpoint import set_rng_state

    np.random.seed(5)
    old = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    torch.save({"rng": old, "config": {"a": 1}}, tmp_path / "old.pt")
    want = np.random.rand(2)
    set_rng_state(load_torch_file(tmp_path / "old.pt")["rng"])
    assert np.array_equal(np.random.rand(2), want)


def test_an_array_of_python_objects_is_still_refused(tmp_path):
    marker = tmp_path / "MARKER"
    arr = np.empty(1, dtype=object)
    arr[0] = _RunsACommand(marker)
    torch.save({"a": arr}, tmp_path / "obj.pt")
    with pytest.raises(UnsafeFileError):
        load_torch_file(tmp_path / "obj.pt")
    assert not marker.exists()


# ---------------------------------------------------------------- a failed start leaves nothing behind
def _demo_lines(n: int) -> list[str]:
    from .conftest import DEMO

    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [x.replace("!audio/", f"!{DEMO}/audio/") for x in lines]


def test_a_start_that_failed_on_data_does_not_block_the_rerun(tmp_path, capsys):
    run, data = tmp_path / "run", tmp_path / "d.jsonl"
    lines = _demo_lines(4)
    data.write_text("\n".join([lines[0].replace("!/", "!/gone/"), *lines[1:]]) + "\n", encoding="utf-8")
    argv = ["train", str(DEMO_CONFIG), *tiny_overrides(run), f"data.train={data}", "data.valid=null",
            "train.max_steps=1", "train.save_final=false"]
    assert "audio files do not exist" in _error_line(capsys, argv)
    assert (run / "config.yaml").exists()  # what the failed start wrote
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")  # the data fixed, the same command
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "held a start that never reached its first checkpoint (config.yaml" in out and "removed those files" in out
    assert [line for line in (run / "steps.jsonl").read_text().splitlines()]  # it trained


def test_a_second_process_into_a_folder_in_use_is_refused_even_with_overwrite(tmp_path, capsys):
    import subprocess
    import sys

    from .conftest import REPO

    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from brisk.train.run_dir import run_lock\n"
         f"with run_lock({str(run)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (run / "config.yaml").write_text("the other process's\n")
        line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(run), "train.overwrite=true"])
        assert f"train.output_dir={run} is in use: brisk process {holder.pid} is training there" in line
        assert (run / "config.yaml").read_text() == "the other process's\n"  # nothing of it was touched
    finally:
        holder.communicate("")
    assert holder.returncode == 0


# ----------------------------------------------------------------------- one line, exit 2, no traceback
def test_an_output_dir_that_is_a_file_or_under_proc_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "f")])
    assert f"train.output_dir={tmp_path / 'f'} is a file, not a folder" in line
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides("/proc/brisk_run")])
    assert "train.output_dir=/proc/brisk_run is under /proc" in line


def test_an_output_dir_on_a_read_only_filesystem_is_one_line(tmp_path, capsys, monkeypatch):
    import errno
    from pathlib import Path

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)  # a read-only mount cannot be made here without privileges
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "ro" / "run")])
    assert f"train.output_dir={tmp_path / 'ro' / 'run'}: cannot write there (Read-only file system)" in line


def _latin1_jsonl(tmp_path):
    """Line 2 written in Latin-1 ("ç" is the byte 0xe7), the rest UTF-8."""
    lines = _demo_lines(3)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(lines[0].encode() + b"\n" + lines[1].replace("语音转写", "Transcrição").encode("latin-1", "replace") + b"\n")
    return path


def test_a_jsonl_that_is_not_utf8_is_one_line_naming_file_and_line(tmp_path, capsys):
    path = _latin1_jsonl(tmp_path)
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"data.train={path}"])
    assert f"{path}:2: not UTF-8 (byte 0xe7 at byte" in line and "invalid continuation byte" in line


def test_a_yaml_syntax_error_is_one_line_with_line_and_column(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_steps: 3\n  lr: [1, 2\nmodel:\n  x: 1\n", encoding="utf-8")
    line = _error_line(capsys, ["train", str(path)])
    assert line.startswith(f"error: {path}:4:6: not valid YAML: expected ',' or ']'")


def test_an_audio_path_that_is_a_folder_says_so(tmp_path, capsys):
    lines = _demo_lines(3)
    (tmp_path / "folder.wav").mkdir()
    lines[1] = lines[1].replace(lines[1].split("<|startofspeech|>!")[1].split("<|endofspeech|>")[0], str(tmp_path / "folder.wav"))
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"data.train={data}"])
    assert f"1 of 3 audio files are folders, not files, first: {data}:2: {tmp_path / 'folder.wav'} (a folder)" in line
    from brisk.data.audio import AudioError, read_audio

    with pytest.raises(AudioError, match="is a folder, not a file"):
        read_audio(str(tmp_path / "folder.wav"), 16000)


# ------------------------------------------------------------------------------------ Ctrl-C, SIGTERM
def _train_until_signalled(tmp_path, sig):
    import json
    import shlex
    import signal
    import subprocess
    import sys

    from .conftest import REPO

    run = tmp_path / f"run_{sig}"
    argv = [str(DEMO_CONFIG), *tiny_overrides(run), "train.max_steps=100000", "train.log_every=1", "data.valid=null"]
    proc = subprocess.Popen([sys.executable, "-m", "brisk", "train", *argv], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if " step 2 (epoch" in line:
            proc.send_signal(sig)
            break
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + sig, out
    assert "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    name = signal.Signals(sig).name
    assert last.startswith(f"stopped by {name} after step "), out
    step = int(last.split("after step ")[1].split(";")[0])
    ckpt = run / "checkpoints" / f"ckpt-{step:08d}.pt"
    assert f"checkpoint {ckpt};" in last and ckpt.exists()
    assert [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()] == list(range(1, step + 1))
    resume = shlex.split(last.split("resume: ", 1)[1])
    assert resume[:2] == ["brisk", "train"] and resume[-2:] == [f"train.output_dir={run}", "train.resume=true"]
    return run, step, resume[2:]


@pytest.mark.parametrize("sig", [2, 15])  # SIGINT (Ctrl-C), SIGTERM (pre-emption)
def test_a_signal_saves_a_checkpoint_says_how_to_resume_and_resume_continues(tmp_path, sig, capsys):
    import json

    run, step, resume = _train_until_signalled(tmp_path, sig)
    if sig == 15:
        return  # one resume is enough to show that the printed command continues the run
    assert main(["train", *resume, f"train.max_steps={step + 2}"]) == 0
    assert f"resumed from {run / 'checkpoints' / f'ckpt-{step:08d}.pt'} at step {step}" in capsys.readouterr().out
    assert [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()] == list(range(1, step + 3))
