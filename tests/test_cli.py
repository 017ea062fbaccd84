"""End-to-end runs of the `brisk` command on named configs (CPU, bundled data)."""

from __future__ import annotations

import json
import os

import torch

from brisk.cli import main

from .conftest import DEMO, DEMO_CONFIG, REPO, tiny_overrides


def test_demo_trains_and_validation_loss_falls(tmp_path, capsys):
    """The demo config itself (not shrunk), 3 epochs: validation loss must fall clearly; decoding 8 validation
    utterances before the first step and after each epoch, it prints CER before and after and 3 transcripts."""
    rc = main(["train", str(DEMO_CONFIG), f"train.output_dir={tmp_path}", "train.max_epochs=3", "train.progress=false",
               "data.num_workers=0", "train.val_decode=8",
               f"data.train={DEMO / 'train.jsonl'}"])  # the 240 base utterances: 3 epochs in ~80 steps
    assert rc == 0
    hist = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hist][:1] == [0] and len(hist) == 4, hist  # before training, then each epoch
    assert hist[-1]["loss"] < hist[1]["loss"] < 0.8 * hist[0]["loss"], hist  # falls, and keeps falling
    out = capsys.readouterr().out
    assert "validation loss" in out and "->" in out
    assert "validation CER" in out and out.count(" ref: ") == 3 and out.count(" hyp: ") == 3
    for name in ("report.png", "report.md", "steps.jsonl", "accel.json", "config.yaml", "model-funasr/model.pt",
                 "model-funasr/config.yaml"):
        assert (tmp_path / name).exists(), name
    # The exported FunASR folder's model.pt: {"state_dict": {audio_encoder.*, llm.*, audio_adaptor.*}}.
    sd = torch.load(tmp_path / "model-funasr" / "model.pt", weights_only=False)["state_dict"]
    assert {k.split(".")[0] for k in sd} == {"audio_encoder", "llm", "audio_adaptor"}
    assert list((tmp_path / "tb").iterdir())


def test_an_option_that_is_a_config_key_gets_the_key_value_form(capsys):
    assert main(["train", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --device is not an option") and "train.device=cuda" in err


def test_train_errors_name_the_key(capsys):
    assert main(["train", str(DEMO_CONFIG), "train.max_stepz=3"]) == 2
    assert "unknown config key train.max_stepz" in capsys.readouterr().err


def test_bench_prints_the_interleaved_table(tmp_path, capsys):
    rc = main(["bench", str(REPO / "configs/bench_demo.yaml"), *tiny_overrides(tmp_path), "bench.steps=3",
               "bench.warmup=1", "bench.profile_steps=1", "--out", str(tmp_path / "bench")])
    assert rc == 0
    table = (tmp_path / "bench" / "bench.md").read_text()
    out = capsys.readouterr().out
    assert table in out and f"wrote {tmp_path / 'bench' / 'bench.md'}" in out
    assert "bench: eager defaults run 1: mean" in out  # progress before the table
    assert "peak GiB" not in table and "launches" not in table  # GPU-only columns: not on the CPU
    rows = [line for line in table.splitlines() if line.startswith("| ") and "arm" not in line and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["eager defaults", "packing", "frozen_eval + fused_adamw"]
    assert rows[0].rstrip().endswith("| 1.00x |")
    data = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert all(len(v) == 2 for v in data["results"].values()) and data["flops"] > 0


def test_bench_batch_size_arm_trains_on_its_own_batches_and_is_compared_by_tokens_per_second(tmp_path):
    """An arm that sets data.batch_tokens gets its own stream (max_utts scaled as data.auto_batch scales it); arms
    without data overrides share the base stream; the table compares real LLM tokens a second, no roofline for
    the arm off the first arm's stream."""
    from types import SimpleNamespace

    from brisk.bench.bench import arm_streams, render, with_overrides
    from brisk.config import load_config

    cfg = load_config(REPO / "configs/bench_demo.yaml", tiny_overrides(tmp_path))
    arms = [with_overrides(cfg, []), with_overrides(cfg, ["speed.packing=true"]),
            with_overrides(cfg, ["data.batch_tokens=4800"])]
    assert (arms[2].data.batch_tokens, arms[2].data.max_utts) == (4800, 2 * cfg.data.max_utts)
    assert with_overrides(cfg, ["data.batch_tokens=4800", "data.max_utts=7"]).data.max_utts == 7
    streams = arm_streams(cfg, arms, 6)
    assert streams[0] is streams[1] and streams[2] is not streams[0] and len(streams[2]) == 6
    mean_utts = lambda s: sum(map(len, s)) / len(s)  # noqa: E731
    assert mean_utts(streams[2]) > 1.5 * mean_utts(streams[0])

    run = lambda mean, tokens: {"mean": mean, "median": mean, "slow": 0, "forward": 0.0, "backward": 0.0,  # noqa: E731
                                "optimizer": mean, "setup": 1.0, "first_step": 0.1, "phase_wall": 2.0,
                                "tokens": tokens, "label_tokens": 10.0, "positions": tokens}
    b = SimpleNamespace(runs=1, steps=3, warmup=1)
    table = render({"small": [run(0.100, 1000.0)], "large": [run(0.150, 3000.0)], "unfinished": []}, {}, 1e9, 1e11,
                   "x", b, gpu=False, own_stream={"large"})
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table.splitlines()
            if r.startswith("| ") and "---" not in r and "| arm |" not in r}
    assert list(rows) == ["small", "large *"]  # an arm with no finished run is left out
    assert rows["small"][-1] == "1.00x" and rows["small"][-2] == "10.0%" and rows["small"][5] == "10,000"
    assert rows["large *"][5] == "20,000" and rows["large *"][-2] == "-" and rows["large *"][-1] == "2.00x"


def test_profile_writes_op_tables_and_a_verdict(tmp_path):
    rc = main(["profile", str(DEMO_CONFIG), *tiny_overrides(tmp_path), "--steps", "2", "--warmup", "1",
               "--out", str(tmp_path / "prof")])
    assert rc == 0
    text = (tmp_path / "prof" / "profile.md").read_text()
    assert "Top operations by CPU time" in text and "verdict:" in text and "roofline" in text
    assert (tmp_path / "prof" / "trace.json").stat().st_size > 1000


def test_bench_phases_column_names_a_graphed_step_whole():
    from brisk.bench.bench import _phases

    assert _phases({"forward": 0.010, "backward": 0.020, "optimizer": 0.003}) == "10.0 / 20.0 / 3.0"
    # a graphed step is one replay: the timer's marks inside it never fire, the whole span lands in the last phase
    assert _phases({"forward": 0.0, "backward": 0.0, "optimizer": 0.0179}) == "whole graphed step 17.9"


def test_kernel_classes_sort_a_graphed_steps_kernels_by_name():
    from types import SimpleNamespace

    from brisk.bench.profile import kernel_class, kernel_classes

    names = {  # kernel names from the H200 fast-path profile (bench/results/2026-11-29-h200/profile_fastpath.md)
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(a": "optimizer and norms (multi-tensor)",
        "nvjet_sm90_tst_64x64_64x13_4x2_h_bz_NNT": "matmul (nvjet / cuBLAS / CUTLASS)",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kerne": "attention (flash / cuDNN / efficient)",
        "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel_generic<": "depthwise conv (encoder FSMN)",
        "triton_red_fused__to_copy__unsafe_view_add_mul_sum_view_9": "compiled (Triton, fused by Inductor)",
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c1": "elementwise add (residuals, gradient accumulation)",
        "triton_red_fused__softmax_bitwise_not_exp_masked_fill_prepare_softmax_online_sub": "compiled (Triton, fused by Inductor)",
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication (NCCL)",
        "void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>": "other",
        "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, fl": "softmax / cross-entropy",
        "some_kernel_nobody_named": "other",
    }
    assert {n: kernel_class(n) for n in names} == names
    ev = lambda name, us, dev="DeviceType.CUDA": SimpleNamespace(  # noqa: E731
        name=name, device_type=dev, time_range=SimpleNamespace(start=0, end=us))
    events = [ev("nvjet_a", 10), ev("nvjet_b", 30), ev("triton_poi_x", 4), ev("cudaGraphLaunch", 99, "DeviceType.CPU"),
              ev("Memcpy HtoD", 50)]
    rows = kernel_classes(events, steps=2)  # per step: matmul 2 kernels 0.02 ms, triton 1 kernel 0.002 ms
    assert [(c, k) for c, k, _ in rows] == [("matmul (nvjet / cuBLAS / CUTLASS)", 1.0), ("compiled (Triton, fused by Inductor)", 0.5)]
    assert abs(rows[0][2] - 0.02) < 1e-12 and abs(rows[1][2] - 0.002) < 1e-12


def test_device_timeline_splits_idle_time_into_kernel_gaps_and_host_waits():
    from types import SimpleNamespace

    from brisk.bench.profile import device_timeline

    ev = lambda s, e, name="k": SimpleNamespace(name=name, device_type="DeviceType.CUDA",  # noqa: E731
                                                time_range=SimpleNamespace(start=s, end=e))
    # us: [0, 10] and [5, 20] overlap (one busy span), a 2 us kernel-to-kernel gap, a 100 us wait for the host,
    # a copy (not a kernel) inside the wait
    events = [ev(0, 10), ev(5, 20), ev(22, 30), ev(130, 150), ev(40, 90, "Memcpy HtoD (Pinned -> Device)")]
    t = device_timeline(events, steps=2)
    assert t["busy"] == (20 + 8 + 20) / 150
    assert (t["short_gaps"], t["long_gaps"]) == (0.5, 0.5)
    assert abs(t["short_ms"] - 0.001) < 1e-12 and abs(t["long_ms"] - 0.05) < 1e-12
    assert device_timeline([], steps=1)["busy"] == 0.0


def test_probe_compare_exit_status(tmp_path, capsys):
    from .conftest import run_train

    for name, lr in (("a", 0.002), ("b", 0.002), ("c", 0.01)):
        run_train(tmp_path / name, **{"train.max_steps": 4, "probe.enabled": True, "optim.lr": lr, "optim.warmup_steps": 1})
    assert main(["probe", "compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert main(["probe", "compare", str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "t.md")]) == 1
    assert "unmet" in (tmp_path / "t.md").read_text()
    # the shipped kernel-noise gates (issue 15): identical runs meet them, another lr does not; a wrong name is one line
    assert main(["probe", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--tolerances", "kernel_noise",
                 "--out", str(tmp_path / "kn.md")]) == 0
    # kernel_noise was calibrated without validation: its missing val_* rules are said, not silently skipped
    line = (tmp_path / "kn.md").read_text().splitlines()[-1]
    assert line.startswith("Recorded but not gated") and all(m in line for m in ("batch.rows", "val_loss", "val_acc"))
    assert main(["probe", "compare", str(tmp_path / "a"), str(tmp_path / "c"), "--tolerances", "kernel_noise"]) == 1
    capsys.readouterr()
    assert main(["probe", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--tolerances", "nope"]) == 2
    assert "not a shipped name (default, kernel_noise)" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["probe", "calibrate", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "tol.yaml")]) == 0
    assert "warning: zero spread in every metric" in capsys.readouterr().err  # identical CPU runs
    assert main(["probe", "calibrate", str(tmp_path / "a"), str(tmp_path / "c")]) == 2  # another lr: not noise
    assert "differ in keys that change the numbers (optim.lr: 0.002 -> 0.01 (record 2))" in capsys.readouterr().err
    assert main(["probe", "calibrate", str(tmp_path / "a"), str(tmp_path / "c"), "--allow-config-diff"]) == 0
    assert "WARNING: the records' configs differ" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "a")]) == 0
    assert main(["doctor"]) == 0


def test_torchrun_two_processes_on_the_cpu(tmp_path):
    """Data parallel through torch.distributed (gloo on the CPU): both ranks step, rank 0 writes the run."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "brisk", "train",
           str(DEMO_CONFIG), *tiny_overrides(tmp_path), "train.max_steps=3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("3 steps") == 1  # printed by rank 0 only
    steps = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 3 and (tmp_path / "checkpoints" / "ckpt-00000003.pt").exists()


def test_a_closed_output_pipe_stops_quietly_and_the_log_goes_on(tmp_path):
    """`brisk ... | head`: the reader goes away. The command ends with one line on stderr and the shell's SIGPIPE
    code, no traceback; a run's console log stops while the run (and its train.log) goes on."""
    import logging
    import subprocess
    import sys

    from brisk.train.run import PipeHandler

    code = ("import brisk.cli as c\n"
            "def main():\n"
            "    for _ in range(100000):\n"
            "        print('x' * 100)\n"
            "    return 0\n"
            "c.main = main\n"
            "c.run()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # as `head -1` does
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in err and "output pipe was closed" in err
    other = ("import brisk.cli as c\n"
             "def main():\n"
             "    raise BrokenPipeError('a worker pipe')\n"
             "c.main = main\n"
             "c.run()\n")
    done = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" in done.stderr and "a worker pipe" in done.stderr  # not stdout's

    r, w = os.pipe()
    os.close(r)
    stream = os.fdopen(w, "w")
    handler = PipeHandler(stream)
    logger = logging.getLogger("brisk.test_pipe")
    logger.addHandler(handler)
    logger.propagate = False
    errors = []
    handler.handleError = lambda rec, h=handler: errors.append(sys.exc_info()[1]) or PipeHandler.handleError(h, rec)
    try:
        for i in range(3):
            logger.warning("line %d", i)
    finally:
        logger.removeHandler(handler)
    assert isinstance(errors[0], BrokenPipeError) and len(errors) == 1  # the first line found the pipe closed
    assert handler.stream is not stream  # then the console lines go nowhere
    try:
        stream.close()
    except BrokenPipeError:  # its buffered first line
        pass
