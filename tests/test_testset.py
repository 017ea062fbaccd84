"""A whole test set (brisk/eval/testset.py): inputs, length-sorted batches, streamed results, --resume."""

from __future__ import annotations

import json

import pytest
import torch

from brisk.errors import DataError
from brisk.eval.decode import Result
from brisk.eval.testset import Item, length_batches, read_items, run_items

from .conftest import DEMO


class BatchEcho:
    """A recognizer whose text names the batch it was decoded in: equal outputs mean equal batches."""

    device = torch.device("cpu")

    def __init__(self, stop_after: int | None = None):
        self.batches: list[list[str]] = []
        self.stop_after = stop_after

    def transcribe_batches(self, chunks, max_new_tokens=None):
        for chunk in chunks:
            if self.stop_after is not None and len(self.batches) == self.stop_after:
                raise KeyboardInterrupt  # a kill between batches
            self.batches.append(list(chunk))
            yield [Result([], f"{p}@{'+'.join(chunk)}", 1.0) for p in chunk]


def _items(n=11):
    return [Item(i, f"k{i}", f"a{i}.wav", f"ref {i}", float((i * 7) % 5)) for i in range(n)]


def _row(item, result):
    return {"key": item.key, "text": result.text}


def test_batches_are_sorted_by_length_and_rows_come_back_in_input_order():
    items = _items()
    batches = length_batches(items, 4)
    secs = [it.seconds for b in batches for it in b]
    assert secs == sorted(secs, reverse=True) and [len(b) for b in batches] == [4, 4, 3]
    rows, t = run_items(BatchEcho(), items, None, _row, 4)
    assert [r["index"] for r in rows] == list(range(11)) and t["decoded"] == 11


@pytest.mark.parametrize("how", ["max_utts", "kill"])
def test_a_stopped_run_resumed_writes_what_an_uninterrupted_run_writes(tmp_path, how):
    items = _items()
    whole = tmp_path / "whole.jsonl"
    run_items(BatchEcho(), items, whole, _row, 4)
    part = tmp_path / "part.jsonl"
    if how == "max_utts":
        rows, t = run_items(BatchEcho(), items, part, _row, 4, max_utts=3)  # one batch of 4
        assert t["decoded"] == 4 and len(rows) == 4
    else:
        with pytest.raises(KeyboardInterrupt):
            run_items(BatchEcho(stop_after=2), items, part, _row, 4)
        with part.open("a", encoding="utf-8") as f:
            f.write('{"index": 3, "key": "k3", "te')  # a line torn by the kill
    kept = [json.loads(x) for x in part.read_text().splitlines()[:8]]
    assert len(kept) == 4 * (1 if how == "max_utts" else 2)  # streamed as decoded, not in input order
    again = BatchEcho()
    rows, t = run_items(again, items, part, _row, 4, resume=True)
    assert len(again.batches) == (2 if how == "max_utts" else 1) and t["decoded"] == 11 - len(kept)
    assert part.read_text() == whole.read_text()
    assert [json.loads(x)["index"] for x in whole.read_text().splitlines()] == list(range(11))


def test_resume_refuses_a_file_of_another_input(tmp_path):
    out = tmp_path / "r.jsonl"
    run_items(BatchEcho(), _items(), out, _row, 4)
    other = [Item(i, f"x{i}", f"a{i}.wav", None, 1.0) for i in range(11)]
    with pytest.raises(DataError, match=r"r.jsonl:1: .*another input"):
        run_items(BatchEcho(), other, out, _row, 4, resume=True)


def test_inputs_a_jsonl_a_folder_and_files(tmp_path):
    jsonl = read_items([str(DEMO / "valid.jsonl")])
    assert jsonl and all(it.ref is not None and it.seconds > 0 for it in jsonl)
    folder = DEMO / "audio" / "valid"
    files = sorted(p for p in folder.rglob("*.flac"))
    got = read_items([str(folder), str(files[0])])
    assert [it.path for it in got] == [str(p) for p in files] + [str(files[0])]
    assert [it.index for it in got] == list(range(len(files) + 1)) and all(it.seconds > 0 for it in got)
    assert got[0].ref is None and got[0].key == files[0].stem
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no audio files"):
        read_items([str(tmp_path / "empty")])


def test_a_bad_line_given_to_eval_does_not_advise_a_key_eval_does_not_take(tmp_path):
    lines = (DEMO / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    (tmp_path / "v.jsonl").write_text(lines[0] + "\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_items([str(tmp_path / "v.jsonl")])
    assert "v.jsonl:2: not valid JSON" in str(e.value) and "data.skip_bad=true to skip" not in str(e.value)
    assert str(e.value).endswith("skip them only for a run trained with data.skip_bad=true)")


class ThreadSpy(BatchEcho):
    """BatchEcho that records torch's CPU thread count while it decodes."""

    def __init__(self, device="cpu", device_features=True):
        super().__init__()
        self.device, self.device_features, self.seen = torch.device(device), device_features, []

    def transcribe_batches(self, chunks, max_new_tokens=None):
        for out in super().transcribe_batches(chunks, max_new_tokens):
            self.seen.append(torch.get_num_threads())
            yield out


@pytest.fixture
def three_threads():
    """torch at 3 CPU threads for the test (other tests may have left 1), put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        yield 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("n, want", [(1, 1), (2, 2), (-1, 3)])
def test_decoding_takes_the_thread_count_asked_and_puts_it_back(three_threads, n, want):
    spy = ThreadSpy()
    run_items(spy, _items(5), None, _row, 2, threads=n)
    assert spy.seen == [want] * 3 and torch.get_num_threads() == three_threads


@pytest.mark.parametrize("cores, want", [(2, 1), (1, 1), (8, 7)])
def test_auto_threads_on_the_cpu_leave_the_audio_reader_a_core(three_threads, monkeypatch, cores, want):
    """On a busy 2-core machine torch's default count made CPU decoding ~40x slower than one thread."""
    import brisk.eval.testset as testset

    monkeypatch.setattr(testset, "usable_cores", lambda: cores)
    spy = ThreadSpy()
    run_items(spy, _items(5), None, _row, 2, threads=0)
    assert spy.seen == [want] * 3 and torch.get_num_threads() == three_threads


def test_a_decode_that_dies_puts_the_thread_count_back(three_threads):
    spy = ThreadSpy()
    spy.stop_after = 1  # a kill between batches
    with pytest.raises(KeyboardInterrupt):
        run_items(spy, _items(5), None, _row, 2, threads=1)
    assert spy.seen == [1] and torch.get_num_threads() == three_threads


@pytest.mark.parametrize("features_on_gpu, want", [(True, 1), (False, 3)])
def test_auto_threads_on_a_gpu_take_one_unless_the_cpu_makes_the_features(three_threads, features_on_gpu, want):
    from brisk.eval.testset import host_threads

    with host_threads(ThreadSpy("cuda", features_on_gpu)):  # no CUDA work: only the count is read
        inside = torch.get_num_threads()
    assert inside == want and torch.get_num_threads() == three_threads


def test_a_negative_thread_count_below_minus_one_is_refused_by_name():
    from brisk.errors import ConfigError

    with pytest.raises(ConfigError, match="--host-threads -2"):
        run_items(ThreadSpy(), _items(2), None, _row, 2, threads=-2)


def test_a_bad_host_threads_is_refused_before_any_file_is_touched(tmp_path, capsys):
    from brisk.cli import main

    out = tmp_path / "results.jsonl"
    out.write_text("an earlier run's line\n")
    with pytest.raises(SystemExit) as stop:
        main(["eval", str(tmp_path / "run"), str(DEMO / "valid.jsonl"), "--out", str(out), "--host-threads", "-2"])
    assert stop.value.code == 2 and out.read_text() == "an earlier run's line\n"
    assert "--host-threads: '-2': use -1" in capsys.readouterr().err
