"""Step timer, slow-step detector (each cause from a real trigger), report and doctor, on the CPU."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import soundfile as sf
import torch

from brisk.families.fun_asr_nano.dataset import SpeechDataset
from brisk.diagnose.doctor import doctor
from brisk.train.checkpoint import Checkpoints
from brisk.train.run import build_trainer

from .conftest import DEMO, run_train, tiny_config


def _data(tmp_path) -> str:
    """20 short demo utterances in file order, the 6th replaced by a 60 s one (a shape never seen before)."""
    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:20]
    waves = [sf.read(f)[0] for f in sorted((DEMO / "audio" / "train").glob("*.flac"))[:10]]
    long = np.concatenate(waves * 10)[: 16000 * 60]
    sf.write(tmp_path / "long.wav", long, 16000)
    out = []
    for i, text in enumerate(lines):
        obj = json.loads(text)
        user = obj["messages"][1]
        if i == 5:
            user["content"] = f"语音转写：<|startofspeech|>!{tmp_path / 'long.wav'}<|endofspeech|>"
            obj["speech_length"] = 5998
        else:
            user["content"] = user["content"].replace("!audio/", f"!{DEMO}/audio/")
        out.append(json.dumps(obj, ensure_ascii=False))
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(out) + "\n", encoding="utf-8")
    return str(p)


STALL = 4.0  # seconds a stalled data read or checkpoint write takes: far above any step of the tiny model


def test_slow_steps_are_explained_from_real_triggers(tmp_path, monkeypatch):
    data = _data(tmp_path)
    run = tmp_path / "run"
    cfg = tiny_config(run, **{
        "data.train": data, "data.valid": None, "data.shuffle": False, "data.sort_size": 1, "data.batch_tokens": 100000,
        "train.max_steps": 16, "train.save_every": 15, "train.save_final": False, "diagnose.warmup_steps": 3,
        "diagnose.report": True,
        "train.async_checkpoint": False})  # the checkpoint step must stall: a synchronous write
    slow_key = json.loads(open(data, encoding="utf-8").readlines()[8])["key"]
    load = SpeechDataset._load

    def slow_load(self, utt, gen):  # a data worker stuck on storage, for one sample
        if utt.key == slow_key:
            time.sleep(STALL)
        return load(self, utt, gen)

    monkeypatch.setattr(SpeechDataset, "_load", slow_load)
    # A checkpoint on slow storage: the real save plus a stall. Its time must dwarf what a loaded machine
    # adds to a step's compute (seconds at a load average of 8 on 2 cores), or "checkpoint" would rightly
    # not be the main cause; a heavy checkpoint file alone was not enough and made the test flaky.
    save = Checkpoints.save

    def slow_save(self, state, step, val, sync=True):
        time.sleep(STALL)
        return save(self, state, step, val, sync)

    monkeypatch.setattr(Checkpoints, "save", slow_save)
    trainer = build_trainer(cfg)
    step_fn = trainer.step_fn
    compiled = torch.compile(lambda x: (x.sin() * 2).sum())

    class StepWithRecompile:  # the step (a StepFunction: the rest is the real step's); step 12 runs freshly compiled code
        def __getattr__(self, name):
            return getattr(step_fn, name)

        def __call__(self, batches):
            if trainer.pos.step == 12:
                compiled(torch.randn(7, 3))  # a real Dynamo compile
            return step_fn(batches)

    trainer.step_fn = StepWithRecompile()
    # One thread: with two OpenMP threads on a loaded 2-core machine a step waits at every barrier for the
    # descheduled thread, so plain steps jitter by whole seconds and the running median loses its meaning.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.fit()
    finally:
        torch.set_num_threads(threads)
    slow = {s["step"]: s for s in trainer.detector.slow}
    assert slow[6]["cause"] == "new_shape", slow
    assert slow[9]["cause"] == "data", slow
    assert slow[12]["cause"] == "recompile", slow
    assert slow[15]["cause"] == "checkpoint", slow
    assert not ({1, 2, 3} & set(slow))  # warm-up steps are not judged

    records = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 17))
    r6 = records[5]
    assert r6["new_shape"] and r6["shape"]["speech_frames"] > 300 and r6["forward"] > 0 and r6["backward"] > 0
    assert records[8]["data"] > 1.0 and records[11]["compiles"] >= 1 and records[14]["events"]["checkpoint"] > STALL

    from brisk.diagnose.report import write_report

    md = write_report(run).read_text()
    assert (run / "report.png").stat().st_size > 10_000
    for cause in ("new_shape", "data", "recompile", "checkpoint"):
        assert f"| {cause} |" in md
    state = json.loads((run / "accel.json").read_text())
    assert state["speed"]["compile"] is False and state["plan_build_trap"] is None


def test_doctor_on_a_cpu_machine_says_what_it_could_not_check():
    text = doctor()
    assert "SDPA priority order" in text and "no CUDA device: GPU checks skipped" in text


def test_gc_watch_counts_collections_and_stops_at_the_end_of_its_block():
    import gc

    from brisk.diagnose.slow import GCWatch

    with GCWatch() as watch:
        gc.collect()
        gc.collect()
    assert watch.collections == 2 and watch.seconds > 0
    assert watch._callback not in gc.callbacks
    gc.collect()
    assert watch.collections == 2


def test_a_step_that_captured_a_graph_says_so_before_its_compiles():
    """speed.graph_capture=seen: a bucket's first step captures its graph (and compiles inside it under static
    layers); the slow step is explained as the capture, with the compiles in the same sentence."""
    from brisk.diagnose.slow import explain

    rec = {"total": 2.0, "events": {}, "data": 0.0, "gc": 0.0, "new_shape": True, "compiles": 28,
           "step_captures": 1, "audio_captures": 0,
           "shape": {"rows": 1, "len": 1792, "layout": "packed", "speech_shape": [10, 96]}}
    cause, why = explain(rec, 0.03, 0.001, None)
    assert cause == "graph_capture" and "a step graph for a batch key" in why and "(1x1792 tokens)" in why
    assert "compiling 28 graph(s)" in why and "speed.graph_capture=seen" in why and "audio graph" not in why
    cause, why = explain({**rec, "step_captures": 0, "audio_captures": 1, "compiles": 0}, 0.03, 0.001, None)
    assert cause == "graph_capture" and "an audio graph for a new speech shape" in why and "(speech [10, 96])" in why
    assert "step graph" not in why and "compiling" not in why
    cause, _ = explain({**rec, "step_captures": 0}, 0.03, 0.001, None)
    assert cause == "recompile"
    cause, _ = explain({**rec, "step_captures": -3, "audio_captures": -2}, 0.03, 0.001, None)  # after release()
    assert cause == "recompile"


def test_gc_is_frozen_again_after_a_step_that_captured_graphs(tmp_path, monkeypatch):
    """train.gc_every freezes what is alive after step 1; under speed.graph_capture=seen a later step's capture
    (and its compile) makes long-lived objects too, so the collector freezes again after it."""
    import brisk.train.trainer as trainer_module

    trainer = build_trainer(tiny_config(tmp_path, **{"train.max_steps": 4, "train.gc_every": 100}))
    frozen = []
    monkeypatch.setattr(trainer_module, "freeze_gc", lambda: frozen.append(trainer.pos.step))
    inner = trainer.step_fn

    class Capturing:  # a graphed step whose step 3 captured a graph (the rest is the real step's)
        captures = {"step_captures": 0, "audio_captures": 0}

        def __getattr__(self, name):
            return getattr(inner, name)

        def __call__(self, batches):
            if trainer.pos.step == 3:
                self.captures = {"step_captures": 1, "audio_captures": 0}
            return inner(batches)

    trainer.step_fn = Capturing()
    trainer.fit()
    assert frozen == [1, 3]


def test_the_timeline_accounts_for_the_run_from_the_process_start_to_the_export(tmp_path):
    """timeline.json holds the run's spans from the process's start; the first step starts where the spans before
    the training end; the export is a span; the report splits the training span into its steps and the work
    between them, and what it lists adds up to no more than the span."""
    from brisk.diagnose.report import write_report
    from brisk.diagnose.timeline import _IMPORTED, process_age

    assert process_age() >= time.perf_counter() - _IMPORTED  # the process started before this module was imported
    run = tmp_path / "run"
    run_train(run, **{"train.max_steps": 4, "train.export": "funasr", "diagnose.report": False})
    tl = json.loads((run / "timeline.json").read_text())
    names = [s["name"] for s in tl["spans"]]
    assert names[0] == "python, imports, config" and "model: load, freeze, speed plan" in names and names[-1] == "export"
    assert all(s["seconds"] >= 0 for s in tl["spans"])
    training = names.index("training: steps, validation, checkpoints")
    before = sum(s["seconds"] for s in tl["spans"][:training])
    first = tl["marks"]["first step start"]
    slack = 0.0005 * len(tl["spans"]) + 1e-6  # each span is rounded to the millisecond
    assert before - slack <= first < before + 0.5 and tl["marks"]["first step end"] > first
    assert tl["total"] >= sum(s["seconds"] for s in tl["spans"]) - slack

    md = write_report(run).read_text()
    section = md.split("## Where the run's time went")[1].split("\n## ")[0]
    rows = [r.split("|") for r in section.splitlines() if r.startswith("| –")]
    steps = [r for r in rows if r[1].startswith(" – steps:")]
    assert sum(int(r[3].split()[0]) for r in steps) == 4  # every step, in exactly one kind
    span = next(s["seconds"] for s in tl["spans"] if s["name"].startswith("training"))
    assert sum(float(r[2]) for r in rows) == pytest.approx(span, abs=0.02)  # the loop's own work closes the sum
    assert "| export |" in section


def test_steps_are_told_apart_by_what_made_them_cost():
    from brisk.diagnose.report import step_kinds

    base = {"data": 0.0, "compute": 0.01, "new_shape": False, "compiles": 0, "compile_s": 0.0, "step_captures": 0,
            "audio_captures": 0}
    steps = [{**base, "step": 1, "new_shape": True, "compiles": 3, "step_captures": 1},
             {**base, "step": 2, "new_shape": True, "compiles": 2},
             {**base, "step": 3, "new_shape": True},
             {**base, "step": 4},
             {**base, "step": 5, "step_captures": -1, "audio_captures": -2}]  # graphs released: nothing captured
    kinds = {k: [s["step"] for s in v] for k, v in step_kinds(steps)}
    assert kinds == {"captured a CUDA graph (a bucket's first batch)": [1], "compiled new graphs": [2],
                     "first batch of a new shape": [3], "steady": [4, 5]}


def test_compile_seconds_split_into_trace_backend_and_backward():
    """speed.compile.compile_split: Dynamo's trace, the backend (AOTAutograd + Inductor, or their caches) and the
    backward graphs add up to compile_seconds; a compiled forward and its first backward each add to their part."""
    from brisk.speed.compile import compile_seconds, compile_split

    total0, split0 = compile_seconds(), compile_split()
    f = torch.compile(lambda x: (x.sin() * x.cos()).sum(), backend="aot_eager")  # no C compiler needed
    x = torch.randn(16, requires_grad=True)
    f(x).backward()
    total1, split1 = compile_seconds(), compile_split()
    grown = {k: split1[k] - split0[k] for k in split1}
    assert grown["trace"] > 0 and grown["backend"] > 0
    assert sum(grown.values()) == pytest.approx(total1 - total0, rel=1e-6, abs=1e-9)


def test_the_time_budget_names_the_parts_of_a_kind_of_steps_compile():
    from brisk.diagnose.report import time_budget

    step = {"data": 0.0, "compute": 3.0, "new_shape": True, "compiles": 1, "compile_s": 2.5, "step_captures": 1,
            "audio_captures": 0, "compile_split": {"trace": 0.5, "backend": 1.75, "backward": 0.25}}
    rows = time_budget([{**step, "step": 1}, {**step, "step": 2}], {"spans": [{"name": "training", "seconds": 7.0}]})
    note = next(n for name, _, n in rows if name.startswith("– steps: captured"))
    assert "of which 5.0 s compiling (Dynamo's trace 1.0 s, AOTAutograd and Inductor or their cache 3.5 s, " \
           "backward graphs 0.5 s)" in note
