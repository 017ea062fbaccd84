"""Day-one trust (issue 24): model files are data, a failed start leaves nothing behind, every mistake is one
line, Ctrl-C saves, the numbers a user reads are right, exports behave like shared files."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from brisk.cli import main
from brisk.safe_load import UnsafeFileError, load_torch_file

from .conftest import DEMO_CONFIG, REPO, tiny_overrides


@contextlib.contextmanager
def _said(level=logging.INFO):
    """The brisk logger's messages (it does not propagate to caplog once a run has set up its logging)."""
    lines: list[str] = []
    handler = logging.Handler(level)
    handler.emit = lambda r: lines.append(r.getMessage())
    logger = logging.getLogger("brisk")
    old = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


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


def test_the_demo_with_a_mistaken_override_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `brisk train` alone makes ./runs/demo-<time>
    assert "speed.preset='fastest'" in _error_line(capsys, ["train", "speed.preset=fastest"])
    assert list((tmp_path / "runs").glob("demo-*")) == []


def test_a_start_that_failed_on_data_does_not_block_the_rerun(tmp_path, capsys):
    run, data = tmp_path / "run", tmp_path / "d.jsonl"
    lines = _demo_lines(4)
    data.write_text("\n".join([lines[0].replace("!/", "!/gone/"), *lines[1:]]) + "\n", encoding="utf-8")
    argv = ["train", str(DEMO_CONFIG), *tiny_overrides(run), f"data.train={data}", "data.valid=null",
            "train.max_steps=1", "train.save_final=false"]
    assert "audio files do not exist" in _error_line(capsys, argv)
    assert not run.exists()  # a start that never took a step leaves nothing: the folder it made is gone
    (run / "notes").mkdir(parents=True)  # a folder that was there before keeps what it held
    assert "audio files do not exist" in _error_line(capsys, argv)
    assert sorted(p.name for p in run.iterdir()) == ["notes"]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")  # the data fixed, the same command
    assert main(argv) == 0
    assert [line for line in (run / "steps.jsonl").read_text().splitlines()]  # it trained


def test_a_start_left_by_a_killed_process_is_cleared_by_the_rerun(tmp_path, capsys):
    """A process killed before its first checkpoint could not clean up: the next start removes what it left."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("a start killed while loading\n", encoding="utf-8")
    argv = ["train", str(DEMO_CONFIG), *tiny_overrides(run), "data.valid=null", "train.max_steps=1",
            "train.save_final=false"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "held a start that never reached its first checkpoint (train.log" in out and "removed those files" in out


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


# ------------------------------------------------------------------------------ numbers a user reads
def test_cer_and_wer_count_insertions_against_empty_references():
    from brisk.eval.evaluate import score
    from brisk.eval.metrics import corpus_rates, rate

    rows, s = score(["a", "b"], ["abc", "  ,. "], ["abd", "xy"])  # the second reference is empty once normalised
    assert rows[1]["empty_ref"] and "empty_ref" not in rows[0]
    assert (s["char_errors"], s["chars"], s["empty_refs"]) == (3, 3, 1)  # 1 substitution + 2 insertions
    assert s["cer"] == pytest.approx(1.0) and s["wer"] == pytest.approx(2.0)  # never 0% beside 3 errors
    assert corpus_rates([""], [""])["cer"] == 0.0 and corpus_rates([""], ["a"])["cer"] == float("inf")
    assert rate(0, 0) == 0.0 and rate(2, 4) == 0.5


def _index_of(tmp_path, lines, **kw):
    from brisk.data.jsonl import read_jsonl

    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, read_jsonl(path, max_speech_length=8000, max_text_length=1000, **kw)


def _with(line: str, **changes) -> str:
    import json

    obj = json.loads(line)
    if "text" in changes:
        obj["messages"][-1]["content"] = changes.pop("text")
    obj.update(changes)
    return json.dumps(obj, ensure_ascii=False)


def test_empty_transcripts_and_very_short_clips_warn_once_with_a_count_or_are_skipped(tmp_path):
    lines = _demo_lines(5)
    lines[1] = _with(lines[1], text="")
    lines[3] = _with(lines[3], speech_length=5)
    with _said(logging.WARNING) as said:
        path, index = _index_of(tmp_path, lines, skip_bad=False)
    warned = [m for m in said if "suspect" in m]
    assert len(warned) == 1 and "2 suspect lines kept (1 with an empty transcript, 1 shorter than 100 ms" in warned[0]
    assert f"first: {path}:2: empty transcript" in warned[0] and len(index.utterances) == 5
    _, index = _index_of(tmp_path, lines, skip_bad=True)
    assert len(index.utterances) == 3 and len(index.skipped) == 2


def test_a_declared_text_length_far_below_the_tokens_is_an_error_naming_the_line():
    from brisk.data.check import check_declared_text_length
    from brisk.data.jsonl import DataError, parse_line

    from .conftest import DEMO

    utt = parse_line(_with(_demo_lines(1)[0], text_length=10), "x.jsonl:7", DEMO)
    check_declared_text_length(utt, [-100] * 5 + [1] * 18)  # 18 <= 10 + 8: within the slack
    check_declared_text_length(utt, [1] * 5)  # fewer tokens than declared: an upper bound is fine
    with pytest.raises(DataError, match=r"x.jsonl:7: text_length=10 but the answer is 19 tokens"):
        check_declared_text_length(utt, [-100] * 5 + [1] * 19)
    multi = parse_line(_with(_demo_lines(1)[0], text_length=0), "x.jsonl:8", DEMO)
    check_declared_text_length(multi, [1] * 100)  # not declared: nothing to check


def test_the_demo_data_declares_its_text_lengths_within_the_tolerance(tokenizer):
    from brisk.data.check import check_declared_text_length
    from brisk.data.jsonl import parse_line

    from .conftest import DEMO

    for n, line in enumerate(_demo_lines(50)):
        utt = parse_line(line, f"train.jsonl:{n + 1}", DEMO)
        check_declared_text_length(utt, tokenizer(utt.assistant[0])["input_ids"] + [0])  # + <|im_end|>


# ------------------------------------------------------------------------------- a busy machine
def _rec(step, total, cpu, host=None, **kw):
    return {"step": step, "total": total, "data": 0.0, "events": {}, "cpu": cpu, "host": host or total,
            "shape": {}, "new_shape": False, **kw}


def test_contention_is_named_once_with_the_load_from_injected_numbers():
    from brisk.diagnose.slow import SlowStepDetector, contention

    assert contention(0.2, 1.0, 1.0, load=3.0, cores=2)  # a fifth of a core, run queue over the cores
    assert contention(0.2, 1.0, 1.0, load=1.5, cores=2) is None  # the cores are not all taken: not contention
    assert contention(0.9, 1.0, 1.0, load=6.0, cores=2) is None  # it got its core
    load = [1.0]
    det = SlowStepDetector(3.0, 2, 50, cores=2, load=lambda: (load[0], 0, 0), cpu_device=True)
    with _said(logging.WARNING) as said:
        for i in range(1, 11):
            det.observe(_rec(i, 0.2, 0.19))  # alone: steady, a core each step
        load[0] = 3.4
        for i in range(11, 21):
            det.observe(_rec(i, 2.0 if i % 2 else 0.25, 0.2 if i % 2 else 0.1))  # another process took the cores
    assert len([m for m in said if "the machine is busy" in m]) == 1, said
    assert "load average 3.4 on 2 cores" in said[0]
    assert {s["cause"] for s in det.slow} == {"contention"} and len(det.slow) == 5


def test_a_run_starved_from_its_first_step_is_named_too():
    from brisk.diagnose.slow import SlowStepDetector

    det = SlowStepDetector(3.0, 2, 50, cores=2, load=lambda: (5.9, 0, 0), cpu_device=True)
    for i in range(1, 8):
        det.observe(_rec(i, 1.3, 0.5))  # half a core from the start: the usual share is no reference
    assert "got 0.38 CPU-seconds per second of the step where 1.00 are expected" in det.busy


def test_a_virtual_machine_whose_host_takes_its_cores_is_named_by_its_steal():
    """In a VM the hypervisor can give the cores to other machines: the load average inside stays low, and Linux
    counts the lost time as steal. A starved step with a fifth or more of the VM's CPU time stolen is contention,
    named with the steal; without steal (or below the share) a low load is still not contention."""
    from brisk.diagnose.slow import SlowStepDetector, contention

    said = contention(0.2, 1.0, 1.0, load=0.9, cores=2, steal=0.45)
    assert said and "45% of this machine's CPU time went to other machines (steal" in said
    assert contention(0.2, 1.0, 1.0, load=0.9, cores=2, steal=0.05) is None  # a little steal: not the cause
    assert contention(0.2, 1.0, 1.0, load=0.9, cores=2) is None  # nothing known of steal
    assert contention(0.9, 1.0, 1.0, load=0.9, cores=2, steal=0.6) is None  # stolen, but this process got its core
    assert "load average 3.0" in contention(0.2, 1.0, 1.0, load=3.0, cores=2, steal=0.6)  # the run queue first
    det = SlowStepDetector(3.0, 2, 50, cores=2, load=lambda: (0.8, 0, 0), cpu_device=True)
    with _said(logging.WARNING) as said:
        for i in range(1, 11):
            det.observe(_rec(i, 0.2, 0.19, steal=0.0))
        for i in range(11, 21):
            det.observe(_rec(i, 2.0 if i % 2 else 0.25, 0.2 if i % 2 else 0.1, steal=0.5))
    assert len([m for m in said if "the virtual machine's host is busy" in m]) == 1, said
    assert {s["cause"] for s in det.slow} == {"contention"}


def test_each_step_record_carries_the_steal_share_where_the_kernel_counts_it():
    import torch

    import os

    from brisk.diagnose.timer import StepTimer, steal_seconds, steal_share

    assert steal_share(10.0, 12.0, 1.0) == round(2.0 / os.cpu_count(), 4)  # 2 CPU-seconds stolen in 1 s of wall
    assert steal_share(None, 12.0, 1.0) is None and steal_share(10.0, 12.0, 0.0) is None
    if steal_seconds() is None:
        pytest.skip("no steal column in /proc/stat here")
    timer = StepTimer(torch.device("cpu"))

    class B:
        shape = {}

        def shape_key(self):
            return ()

    timer.start(1, 0, B(), 0.0, {})
    sum(range(200_000))
    rec = timer.end({})[0]
    assert 0.0 <= rec["steal"] <= 1.0


def test_repeated_slow_steps_are_summarised_not_printed_one_by_one():
    from brisk.diagnose import slow

    det = slow.SlowStepDetector(3.0, 2, 50, cores=2, load=lambda: (0.1, 0, 0))
    with _said(logging.WARNING) as said:
        for i in range(1, 6):
            det.observe(_rec(i, 0.1, 0.1))
        for i in range(6, 6 + 2 * slow.SUMMARY_EVERY + slow.SHOW_PER_CAUSE):
            det.observe(_rec(i, 1.0, 1.0, new_shape=True))
    lines = said
    assert len(det.slow) == 2 * slow.SUMMARY_EVERY + slow.SHOW_PER_CAUSE
    assert len([m for m in lines if m.startswith("slow step ")]) == slow.SHOW_PER_CAUSE
    assert len([m for m in lines if m.startswith(f"slow steps: {slow.SUMMARY_EVERY} more")]) == 2
    assert "later slow steps of this cause are counted" in lines[slow.SHOW_PER_CAUSE - 1]


def test_the_slow_steps_of_a_resumed_run_are_counted_from_its_file(tmp_path):
    from brisk.diagnose.slow import SlowStepDetector

    path = tmp_path / "slow_steps.jsonl"
    path.write_text('{"step": 5}\n{"step": 9}\n')  # the run before the resume
    det = SlowStepDetector(3.0, 0, 50, path=path, cores=2, load=lambda: (0.1, 0, 0))
    for i, t in enumerate([0.1, 0.1, 1.0], 10):
        det.observe(_rec(i, t, t))
    det.close()
    assert len(det.slow) == 1 and det.run_total() == 3


def test_a_run_puts_torchs_thread_count_back(tmp_path, monkeypatch):
    """train.cpu_threads is the steps': the export (host work after them) and the caller after train() returns
    have the process's own count again."""
    import brisk.models.export as export_module

    from .conftest import run_train

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    at_export = []
    monkeypatch.setattr(export_module, "export_folder", lambda *a, **k: at_export.append(torch.get_num_threads()))
    try:
        run_train(tmp_path / "run", **{"train.max_steps": 1, "train.cpu_threads": other, "train.export": "funasr"})
        assert f"threads: {other} intra-op thread(s)" in (tmp_path / "run" / "train.log").read_text()
        assert at_export == [before]
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_thread_counts_leave_the_workers_their_cores(monkeypatch):
    import torch

    from brisk.config import load_config
    from brisk.train import threads
    from brisk.train.threads import pick_threads

    before = torch.get_num_threads()
    try:
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=0", "data.num_workers=1"])
        assert "1 intra-op thread(s) (auto: 2 usable cores less 1 DataLoader worker(s))" in pick_threads(cfg, torch.device("cpu"), cores=2)
        assert torch.get_num_threads() == 1
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=0", "data.num_workers=4"])
        pick_threads(cfg, torch.device("cpu"), cores=2)
        assert torch.get_num_threads() == 1  # never below one
        monkeypatch.setattr(threads, "TORCH_DEFAULT", 3)  # the count this process started with, as if 3
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=-1"])
        assert "torch's default, 3 intra-op threads" in pick_threads(cfg, torch.device("cpu"), cores=2)
        assert torch.get_num_threads() == 3  # -1 on the CPU: the process's own count, not the last run's
        # the advice to leave the workers their cores only where there are workers and too few cores for both
        assert "leaves the workers their cores" in pick_threads(cfg, torch.device("cpu"), cores=2)
        no_workers = load_config(DEMO_CONFIG, ["train.cpu_threads=-1", "data.num_workers=0"])
        assert "leaves the workers" not in pick_threads(no_workers, torch.device("cpu"), cores=2)
        assert "leaves the workers" not in pick_threads(cfg, torch.device("cpu"), cores=8)
        torch.set_num_threads(1)
        assert pick_threads(cfg, torch.device("cuda"), cores=2) is None
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=0"])
        assert "1 intra-op thread(s) (auto, on cuda" in pick_threads(cfg, torch.device("cuda"), cores=2)
        assert torch.get_num_threads() == 1  # auto on a GPU: one thread feeds the device
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=-1"])
        assert pick_threads(cfg, torch.device("cuda"), cores=2) is None
        assert torch.get_num_threads() == 3  # after auto's one: -1 is the process's own count again
        torch.set_num_threads(2)
        cfg = load_config(DEMO_CONFIG, ["train.cpu_threads=1"])
        assert "1 intra-op thread(s) (train.cpu_threads, on cuda" in pick_threads(cfg, torch.device("cuda"), cores=2)
        assert torch.get_num_threads() == 1  # pick_threads touches no CUDA state: runs on the CPU machine
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------- a tiny finished run: eval and export
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from .conftest import run_train

    run = tmp_path_factory.mktemp("trust_run")
    valid = run.parent / f"{run.name}_valid.jsonl"
    valid.write_text("\n".join(_demo_lines(4)) + "\n", encoding="utf-8")
    run_train(run, **{"train.max_steps": 4, "train.save_every": 2, "train.val_every": 2, "data.valid": str(valid),
                      "train.export": "funasr", "train.keep_n": 3})
    return run, valid


def test_eval_says_which_weights_it_used_and_which_checkpoint_is_best(tiny_run, capsys):
    import json

    run, valid = tiny_run
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    best = min((e["val_loss"], n) for n, e in index.items() if "val_loss" in e)[1]
    assert main(["eval", str(run), str(valid), "--max-new-tokens", "4", "--out", str(run.parent / "e.jsonl")]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith(f"weights: {run / 'checkpoints' / 'ckpt-00000004.pt'}")
    assert (f"(the best checkpoint by validation loss, {index[best]['val_loss']:.4f})" in first if best == "ckpt-00000004.pt"
            else f"the best checkpoint by validation loss ({index[best]['val_loss']:.4f}) is {run / 'checkpoints' / best}" in first)
    assert main(["eval", str(run), str(valid), "--weights", "best", "--max-new-tokens", "4", "--out", str(run.parent / "e.jsonl")]) == 0
    assert "(the best checkpoint by validation loss" in capsys.readouterr().out.splitlines()[0]


def test_eval_of_a_jsonl_that_is_not_utf8_is_one_line(tiny_run, tmp_path, capsys):
    run, _ = tiny_run
    path = _latin1_jsonl(tmp_path)
    assert f"{path}:2: not UTF-8 (byte 0xe7" in _error_line(capsys, ["eval", str(run), str(path)])


def test_export_refuses_to_replace_without_overwrite_and_shares_its_files(tiny_run, capsys, tmp_path):
    from brisk.files import current_umask

    run, _ = tiny_run
    other = tmp_path / "elsewhere"
    other.mkdir()
    line = _error_line(capsys, ["export", str(run), "--out", str(other)])
    assert f"{other} already exists: pass --overwrite to replace it" in line
    out = run / "model-funasr"  # written at the end of training: the run's own export is rewritten (README step 6)
    assert main(["export", str(run)]) == 0
    printed = capsys.readouterr().out
    assert f"exported funasr folder {out}" in printed and "replacing the one there" in printed
    mask = current_umask()
    for p in [out, *out.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~mask
        assert p.stat().st_mode & 0o777 == want, (p, oct(p.stat().st_mode))


def test_the_hf_readme_is_written_from_the_config(tiny_run, capsys):
    run, _ = tiny_run
    assert main(["export", str(run), "--format", "hf", "--out", str(run.parent / "hf_export")]) == 0
    text = (run.parent / "hf_export" / "README.md").read_text()
    assert "~L/8" not in text and "every adaptor output, one per LFR frame (fun_asr_nano.adaptor.use_low_frame_rate false)" in text
    from brisk.config import load_config
    from brisk.families.fun_asr_nano.export import spliced

    cfg = load_config(DEMO_CONFIG, ["fun_asr_nano.adaptor.use_low_frame_rate=true"])
    assert "the first ~L/8 adaptor outputs" in spliced(cfg)


def test_the_closing_lines_count_the_run_after_a_resume(tmp_path):
    from .conftest import run_train

    run = tmp_path / "run"
    short = {"data.valid": None, "train.save_every": 1, "train.keep_n": 10}
    run_train(run, **short, **{"train.max_steps": 2})
    result = run_train(run, **short, **{"train.max_steps": 4, "train.resume": True})
    on_disk = sorted(p.name for p in (run / "checkpoints").glob("*.pt"))
    said = [x for x in (run / "train.log").read_text().splitlines() if " checkpoints: " in x]
    assert said and f"checkpoints: {len(on_disk)} files" in said[-1] and len(on_disk) >= 4
    assert result["slow_in_run"] == len((run / "slow_steps.jsonl").read_text().splitlines())


# ----------------------------------------------------------------------------- configs without the clone
def test_configs_ship_in_the_package_and_load_by_name(tmp_path, monkeypatch):
    from brisk.cli import _config_and_overrides
    from brisk.config import SHIPPED, load_config, shipped_config

    from .conftest import REPO

    assert SHIPPED.parent.name == "brisk" and (SHIPPED / "fun_asr_nano.yaml").is_file()
    assert (REPO / "configs").resolve() == SHIPPED  # the repository's configs/ is the same folder, not a copy
    monkeypatch.chdir(tmp_path)  # no configs/ here: a name is enough
    assert _config_and_overrides(["fun_asr_nano", "train.max_steps=3"], None) == (SHIPPED / "fun_asr_nano.yaml", ["train.max_steps=3"])
    assert shipped_config("demo.yaml") == SHIPPED / "demo.yaml" and shipped_config("configs/demo") is None
    cfg = load_config(shipped_config("demo"))
    assert Path(cfg.data.train) == (REPO / "data" / "demo" / "train_more.jsonl").resolve() and Path(cfg.data.train).is_file()
    assert load_config(REPO / "bench" / "configs" / "bench_nano.yaml").data.profile.endswith("brisk/bench/profiles/aishell1_like.jsonl")
    assert shipped_config("bench_nano") is None  # the bench's configs are not shipped


def test_a_misspelt_config_name_lists_the_shipped_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _error_line(capsys, ["train", "fun_asr_nanoo"])
    assert "config file fun_asr_nanoo does not exist, nor a shipped config of that name (" in line
    assert "demo, fun_asr_1p7b" in line and line.endswith("did you mean fun_asr_nano?")


def test_a_full_disk_is_one_line_that_says_what_to_do(tmp_path, monkeypatch, capsys):
    """A write past the disk's end mid-run (no file name to give: a write, not an open) ends in one line, exit 2.
    tools/fault_campaign.py --full-disk fills a real tmpfs under a run and checks the checkpoint it keeps."""
    import errno

    import brisk.train.run as run_module

    def full(cfg):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_module, "train", full)
    assert main(["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the disk is full") and "train.resume=true" in err[0]


def test_data_of_the_other_kind_is_named_in_one_line(tmp_path, capsys):
    """A parquet file as speech data, and speech jsonl as chat data: each kind read where it belongs, said so."""
    (tmp_path / "chat.parquet").write_bytes(b"PAR1")
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "a"),
                                f"data.train={tmp_path / 'chat.parquet'}"])
    assert "speech data is a FunASR jsonl" in line and "read for chat data" in line
    line = _error_line(capsys, ["train", "sft_demo", f"train.output_dir={tmp_path / 'b'}",
                                f"data.train={REPO / 'data' / 'demo' / 'valid.jsonl'}"])
    assert "<|startofspeech|> audio reference" in line and "model.family=fun_asr_nano or qwen3_asr" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
