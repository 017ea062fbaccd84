"""bench/whole_run.py reads every phase from a run's own files (no run needed: a made-up run folder)."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime

from .conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("whole_run", REPO / "bench" / "whole_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_phases_come_from_the_run_files(tmp_path):
    t = datetime(2026, 11, 29, 12, 0, 0).timestamp()
    stamp = lambda s: datetime.fromtimestamp(t + s).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]  # noqa: E731
    lines = [(1.0, "model: 1.0B parameters, 0.6B trainable (built in 4.5 s)"),
             (9.0, "cuda_graph: 3 step graphs and 2 encoder graphs captured up front in 3.0 s"),
             (10.0, "training from step 0 (epoch 0)"),
             (11.0, "speed.compile: compiled decoder layer for input (1, 512, 1024) in 2.5 s"),
             (20.0, 'time around the steps: {"validation": 1.5, "checkpoint": 0.25, "checkpoint_exit_wait": 2.0}'),
             (26.0, "exported /x/model.pt, /x/model.safetensors"), (27.0, "report: /x/report.md")]
    (tmp_path / "train.log").write_text("".join(f"{stamp(s)} INFO {m}\n" for s, m in lines))
    steps = [{"step": i, "data": 0.01, "compute": 0.02 * i} for i in (1, 2, 3)]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    ck = [{"step": 2, "stall": 0.1, "bytes": 10, "footprint": 30}, {"step": 3, "stall": 0.15, "bytes": 10, "footprint": 40}]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(c) + "\n" for c in ck))
    r = _bench().phases(tmp_path, launch=t - 2.0, end=t + 28.5, rc=0)
    assert abs(r["startup"] - 12.0) < 1e-3 and r["build_load"] == 4.5 and r["capture"] == 3.0 and r["compile"] == 2.5
    assert abs(r["steps"] - 0.15) < 1e-9 and r["steps_n"] == 3
    assert r["validation"] == 1.5 and r["checkpoint_stalls"] == 0.25 and r["checkpoint_max_stall"] == 0.15
    assert r["checkpoint_final_wait"] == 2.0 and r["footprint_bytes"] == 40
    assert abs(r["export"] - 6.0) < 1e-3 and abs(r["report"] - 1.0) < 1e-3 and abs(r["exit"] - 1.5) < 1e-3
    assert abs(r["wall"] - 30.5) < 1e-9


def test_a_failed_arm_is_failed_in_every_row_never_a_time():
    bench = _bench()
    ok = {"rc": 0, "wall": 30.0, "startup": 10.0, "steps_n": 3}
    failed = {"rc": 1, "wall": 22.3, "startup": 9.0, "steps_n": 3}  # the partial times a dead warm run left
    md = bench.table({"cold": ok, "warm": failed}, tiny=False)
    whole = next(line for line in md.splitlines() if line.startswith("| whole run"))
    assert "30.0 s" in whole and "FAILED (exit 1)" in whole and "22.3" not in md and "9.0 s" not in md


def test_funasr_arm_reads_its_steps_and_validation_from_funasrs_own_log_lines():
    """The lines FunASR 1.4.16's trainer_ds.log writes (its format string, filled in): each step's total_time and
    loss, and each validation pass's last average; the table then has FunASR's column from this call."""
    bench = _bench()
    line = ("[2026-12-08 10:00:0{i},000][root][INFO] - train, rank: 0, epoch: 0/4, data_slice: 0/1, step_in_slice: "
            "{s}/37, step_in_epoch: {s}, total step: {s}, (loss_avg_rank: {loss}), (loss_avg_slice: 6.000), "
            "(ppl_avg_slice: 4.034e+02), (acc_avg_slice: 0.100), (lr: 2.000e-04), [('loss', {loss}), ('acc', 0.1)], "
            "{{'data_load': '0.001', 'forward_time': '0.100', 'backward_time': '0.150', 'optim_time': '0.010', "
            "'total_time': '{t}'}}, GPU, memory: usage: 3.000 GB, peak: 9.000 GB, cache: 10.000 GB, cache_peak: 10.000 GB")
    val = ("[x][root][INFO] - val, rank: 0, epoch: 0/4, data_slice: 0/1, step_in_slice: {v}/5, step_in_epoch: {v}, "
           "total step: 3, (loss_avg_rank: 5.0), (loss_avg_slice: {loss}), (ppl_avg_slice: 1e+02), (acc_avg_slice: 0.2), "
           "(lr: 2.000e-04), [('loss', 5.0)], {{'data_load': '0.0', 'forward_time': '0.02', 'total_time': '0.03'}}, GPU, x")
    text = "\n".join([line.format(i=i, s=i, loss=f"{6 - i * 0.1:.3f}", t=f"{0.3 + i / 10:.3f}") for i in (1, 2, 3)]
                     + [val.format(v=1, loss="5.500"), val.format(v=5, loss="5.123")])
    r = bench.funasr_arm.parse(text)
    assert r["steps_n"] == 3 and abs(r["steps"] - (0.4 + 0.5 + 0.6)) < 1e-9 and r["step_median_ms"] == 500.0
    assert r["validation_losses"] == [{"epoch": 0, "step": 3, "loss": 5.123}]  # the pass's last line
    cmd = bench.funasr_arm.command(REPO / "m", REPO / "d", REPO / "o", 4)
    assert "funasr.bin.train_ds" in cmd and "++train_conf.max_epoch=4" in cmd and "++audio_encoder_conf.freeze=true" in cmd
    assert f"++llm_conf.init_param_path={REPO / 'm' / 'Qwen3-0.6B'}" in cmd
    md = bench.table({"funasr": {"rc": 0, "wall": 180.0, **r, "val_loss_last": 5.123},
                      "cold": {"rc": 0, "wall": 30.0, "steps_n": 3, "val_loss_last": 5.2}}, tiny=False)
    assert "FunASR 1.4.16's trainer (finetune.sh), this call" in md and "not this call" not in md
    assert "| validation loss after the last epoch | 5.1230 | 5.2000 |" in md
