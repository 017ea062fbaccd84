"""`brisk eval`, `brisk transcribe`, the CER/WER normalisation and train.val_decode, on a tiny run trained here."""

from __future__ import annotations

import json
import subprocess
import sys

import jiwer
import pytest

from brisk.cli import main
from brisk.eval.evaluate import load_run, score
from brisk.eval.metrics import errors, normalize

from .conftest import DEMO, REPO, run_train

N_VAL = 6


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A few steps of the tiny demo model with validation decoding on (a subset of the validation set), fast."""
    run = tmp_path_factory.mktemp("tiny_run")
    lines = (DEMO / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:N_VAL]
    valid = run.parent / f"{run.name}_valid.jsonl"
    valid.write_text("\n".join(x.replace("!audio/", f"!{DEMO}/audio/") for x in lines) + "\n", encoding="utf-8")
    # Validation decodes with the fast decoder (train.val_decode_fast); `brisk eval` below checks it against the
    # plain one on the same run.
    result = run_train(run, **{"train.max_steps": 6, "train.val_decode": 4, "train.val_decode_fast": True, "data.valid": str(valid),
                               "train.export": "funasr", "diagnose.report": True})
    return run, valid, result


def test_normalisation_is_the_documented_one():
    assert normalize("  Ｈｅｌｌｏ，  World!  ４２ ") == "hello world 42"  # full-width -> half-width, lowercase
    assert normalize("it's a cat-dog.") == "it s a cat dog"  # punctuation becomes a space
    e = errors("the red fox", "the rad fox fox")
    assert (e.words, e.word_errors) == (3, 2)  # one substitution, one insertion
    assert (e.chars, e.char_errors) == (9, 4)  # "theredfox" vs "theradfoxfox": 1 substitution + 3 insertions
    assert errors("语音转写", "语音转与").char_errors == 1


def test_val_decode_writes_cer_into_history_and_report(tiny_run):
    run, _, result = tiny_run
    hist = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert hist[0]["step"] == 0 and hist[-1]["step"] == 6  # decoded before the first step and at the end
    assert all(0.0 <= h["cer"] and 0.0 <= h["wer"] and h["decoded"] == 4 for h in hist)
    rows = [json.loads(x) for x in (run / "valid_decode.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * len(hist) and {r["step"] for r in rows} == {h["step"] for h in hist}
    last = [r for r in rows if r["step"] == 6]
    assert hist[-1]["cer"] == pytest.approx(jiwer.cer([normalize(r["ref"]).replace(" ", "") for r in last],
                                                      [normalize(r["hyp"]).replace(" ", "") for r in last]))
    assert len(result["transcripts"]) == 4 and "CER" in (run / "report.md").read_text()


def test_eval_writes_one_line_per_utterance_and_jiwer_summary(tiny_run, tmp_path, capsys):
    run, valid, _ = tiny_run
    out = tmp_path / "eval.jsonl"
    assert main(["eval", str(run), str(valid), "--out", str(out), "--batch-size", "4", "--max-new-tokens", "16"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    refs = [json.loads(x)["messages"][2]["content"] for x in valid.read_text(encoding="utf-8").splitlines()]
    assert [r["ref"] for r in rows] == refs and len(rows) == N_VAL
    assert all({"key", "ref", "hyp", "char_errors", "word_errors"} <= set(r) for r in rows)
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    hyps = [r["hyp"] for r in rows]
    cer = jiwer.cer([normalize(r).replace(" ", "") for r in refs], [normalize(h).replace(" ", "") for h in hyps])
    assert summary["cer"] == pytest.approx(cer) and summary["cer"] == pytest.approx(summary["char_errors"] / summary["chars"])
    assert summary["wer"] == pytest.approx(jiwer.wer([normalize(r) for r in refs], [normalize(h) for h in hyps]))
    assert f"{100 * summary['cer']:.2f}%" in printed and "utterances/s" in printed and "real-time factor" in printed
    assert summary["rtf"] > 0 and summary["utts_per_s"] > 0
    # --fast: the same transcripts (the same ids, by tests/test_decode_parity.py), said in the summary.
    fast = tmp_path / "eval_fast.jsonl"
    assert main(["eval", str(run), str(valid), "--out", str(fast), "--batch-size", "4", "--max-new-tokens", "16",
                 "--fast"]) == 0
    assert [json.loads(x)["hyp"] for x in fast.read_text(encoding="utf-8").splitlines()] == hyps
    assert json.loads(fast.with_suffix(".summary.json").read_text())["decoder"] == "fast decoder"
    assert "fast decoder" in capsys.readouterr().out and summary["decoder"] == "generate"


def test_transcribe_prints_a_line_per_file(tiny_run):
    run, _, _ = tiny_run
    wavs = [str(p) for p in sorted((DEMO / "audio" / "valid").glob("*.flac"))[:3]]
    cmd = [sys.executable, "-m", "brisk", "transcribe", str(run), *wavs, "--max-new-tokens", "12", "--fast"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [x for x in out.stdout.splitlines() if x.strip()]
    assert [x.split("\t")[0] for x in lines] == wavs and all("\t" in x for x in lines)
    # The same texts as decoding in-process with the run's final weights.
    cfg, model, tok, w = load_run(run)
    from brisk.eval.evaluate import recognizer

    texts = [r.text for r in recognizer(cfg, model, tok, max_new_tokens=12).transcribe(wavs)]
    assert [x.split("\t", 1)[1] for x in lines] == texts and w.name == "ckpt-00000006.pt"  # the newest weights


def test_transcribe_multi_step_prints_the_same_texts(tiny_run, capsys):
    """--fast-multi-step (several decode steps a replay; eager on the CPU) through the CLI: the plain texts."""
    run, _, _ = tiny_run
    wavs = [str(p) for p in sorted((DEMO / "audio" / "valid").glob("*.flac"))[:3]]
    cfg, model, tok, _ = load_run(run)
    from brisk.eval.evaluate import recognizer

    texts = [r.text for r in recognizer(cfg, model, tok, max_new_tokens=12).transcribe(wavs)]
    capsys.readouterr()
    assert main(["transcribe", str(run), *wavs, "--max-new-tokens", "12", "--fast-multi-step", "--no-progress"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "\t" in x]
    assert [x.split("\t", 1)[1] for x in lines] == texts


def test_transcribe_missing_file_is_one_line_exit_2(tiny_run, tmp_path, capsys):
    run, _, _ = tiny_run
    assert main(["transcribe", str(run), str(tmp_path / "nope.wav")]) == 2
    err = capsys.readouterr().err
    assert "nope.wav" in err and err.count("\n") == 1


def test_load_run_picks_checkpoints_when_asked(tiny_run):
    run, _, _ = tiny_run
    _, _, _, best = load_run(run, weights="best")
    _, _, _, last = load_run(run, weights="last")
    assert best.parent.name == "checkpoints" and last.name == "ckpt-00000006.pt"
    _, model, _, _ = load_run(run)
    assert not model.training and not any(p.requires_grad for p in model.parameters())  # nothing here trains


def test_score_counts_empty_hypotheses_as_deletions():
    rows, s = score(["a", "b"], ["one two", "three"], ["one", ""])
    assert [r["word_errors"] for r in rows] == [1, 1] and s["wer"] == pytest.approx(2 / 3)


def test_eval_stopped_by_max_utts_and_resumed_equals_one_run(tiny_run, tmp_path, capsys):
    run, valid, _ = tiny_run
    args = ["--batch-size", "2", "--max-new-tokens", "8", "--no-progress"]
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    assert main(["eval", str(run), str(valid), "--out", str(whole), *args]) == 0
    assert main(["eval", str(run), str(valid), "--out", str(part), "--max-utts", "3", *args]) == 0
    assert len(part.read_text().splitlines()) == 4 and "4 of 6 utterances decoded so far" in capsys.readouterr().out
    assert main(["eval", str(run), str(valid), "--out", str(part), "--resume", *args]) == 0
    assert part.read_text() == whole.read_text()
    s1, s2 = (json.loads(p.with_suffix(".summary.json").read_text()) for p in (whole, part))
    assert s2["decoded_now"] == 2 and s1["cer"] == s2["cer"] and s2["utterances"] == N_VAL


def test_transcribe_a_folder_streams_a_jsonl(tiny_run, tmp_path, capsys):
    run, _, _ = tiny_run
    folder = tmp_path / "audio"
    folder.mkdir()
    wavs = sorted((DEMO / "audio" / "valid").glob("*.flac"))[:3]
    for w in wavs:
        (folder / w.name).write_bytes(w.read_bytes())
    out = tmp_path / "t.jsonl"
    assert main(["transcribe", str(run), str(folder), "--out", str(out), "--max-new-tokens", "12", "--no-progress"]) == 0
    assert f"wrote 3 transcript(s) to {out}" in capsys.readouterr().err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    cfg, model, tok, _ = load_run(run)
    from brisk.eval.evaluate import recognizer

    texts = [r.text for r in recognizer(cfg, model, tok, max_new_tokens=12).transcribe([str(w) for w in wavs])]
    assert [r["key"] for r in rows] == [w.stem for w in wavs] and [r["text"] for r in rows] == texts
    # --out x.txt would hold jsonl: one line before any model is loaded, and nothing written
    assert main(["transcribe", str(run), str(folder), "--out", str(tmp_path / "t.txt")]) == 2
    assert "name the file *.jsonl" in capsys.readouterr().err and not (tmp_path / "t.txt").exists()


def test_fast_decoding_freezes_the_collector_only_while_it_decodes(tiny_run, monkeypatch, capsys):
    """--fast: the objects alive when the decode starts are left out of Python's collections during it (gc.freeze)
    and given back after; the plain decoder leaves the collector alone."""
    import gc

    import brisk.eval.testset as testset

    run, _, _ = tiny_run
    wav = str(sorted((DEMO / "audio" / "valid").glob("*.flac"))[0])
    seen, real = [], testset.run_items

    def spy(*a, **kw):
        seen.append(gc.get_freeze_count())
        return real(*a, **kw)

    monkeypatch.setattr(testset, "run_items", spy)
    before = gc.get_freeze_count()
    for flag in (["--fast"], []):
        assert main(["transcribe", str(run), wav, "--max-new-tokens", "4", "--no-progress", *flag]) == 0
        assert gc.get_freeze_count() == before
    assert seen[0] > before and seen[1] == before, seen


def test_frozen_gc_leaves_a_callers_own_freeze_as_it_was(monkeypatch):
    """An in-process caller that froze objects itself (gc.freeze, e.g. before forking workers) gets them back
    frozen: the decode neither freezes nor unfreezes then (gc.unfreeze would thaw the caller's objects too), also
    when the body raises; without such a caller it freezes once and unfreezes once. (Counted by calls: the
    permanent generation's size moves by itself when frozen objects die.)"""
    import gc

    from brisk.eval.evaluate import frozen_gc

    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 10)  # the caller's frozen objects
    with frozen_gc(True):
        pass
    with pytest.raises(KeyError), frozen_gc(True):
        raise KeyError("x")
    assert calls == []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
    with pytest.raises(KeyError), frozen_gc(True):
        raise KeyError("x")
    assert calls == ["freeze", "unfreeze"]


def test_evals_of_two_sets_of_one_name_and_of_an_export_keep_their_files(tiny_run, tmp_path, capsys):
    """Without --out: a/valid.jsonl and b/valid.jsonl each keep their own file in the run's eval/; a second eval of
    a set resumes into its own; the export's eval lives in the run's eval/ (`brisk export` rewrites the export)."""
    run, valid, _ = tiny_run
    sets = []
    for name, n in (("a", 2), ("b", 3)):
        (tmp_path / name).mkdir()
        lines = valid.read_text(encoding="utf-8").splitlines()[:n]
        sets.append(tmp_path / name / "valid.jsonl")
        sets[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    for s in sets + sets[:1]:
        assert main(["eval", str(run), str(s), "--batch-size", "4", "--max-new-tokens", "4"]) == 0
        assert capsys.readouterr().out.count("weights: ") == 1  # said once, before the decode
    first, second = run / "eval" / "valid.jsonl", run / "eval" / "valid-2.jsonl"
    assert len(first.read_text().splitlines()) == 2 and len(second.read_text().splitlines()) == 3
    assert not (run / "eval" / "valid-3.jsonl").exists()
    assert main(["eval", str(run / "model-funasr"), str(sets[0]), "--batch-size", "4", "--max-new-tokens", "4"]) == 0
    assert (run / "eval" / "model-funasr" / "valid.jsonl").is_file() and not (run / "model-funasr" / "eval").exists()
    capsys.readouterr()
