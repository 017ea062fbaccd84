"""bench/sft_bench.py's own logic on the CPU: an arm that runs out of device memory becomes one table row (the
bench goes on), the memory estimate prints for a model, and the tiny model's brisk arm trains LoRA adapters only."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sft_bench", ROOT / "bench/sft_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_arm_out_of_memory_is_a_row_not_a_crash(bench, monkeypatch, tmp_path):
    cfg = bench.load_cfg("tiny", ROOT / "data/chat_demo", ["data.batch_tokens=4096"])
    monkeypatch.setattr(bench, "load_cfg", lambda *a, **k: cfg)
    monkeypatch.setattr(bench, "groups", lambda cfg, n: [])

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(bench, "run_arm", oom)
    args = type("A", (), dict(model="tiny", data=str(tmp_path), warmup=1, steps=1, arm="d_brisk_fast", one_pass=False,
                              out=str(tmp_path), no_profile=True))()
    row = bench.worker(args)
    assert row["error"] == "out of memory at 4,096 tokens a batch" and "tokens_per_s" not in row
    row["peak_gib"] = 131.7
    ok = {"model": "tiny", "arm": "a_loop", "steps": 1, "tokens_per_s": 10.0, "tps_steps": [10.0], "ms_per_step": 1.0,
          "tokens_per_step": 10, "peak_gib": 1.0}
    text = bench.table([ok, row])
    assert "| tiny | d_brisk_fast | out of memory at 4,096 tokens a batch |" in text and "131.7 when it ran out" in text
    assert text.splitlines()[2].endswith("| 1.0 | - | - |")  # no FLOPs count or peak in that row
    ok.update(tokens_per_s=10_000.0, flops_per_token=6e9, peak_tflops=600.0)  # 60 model TFLOP/s of 600
    assert bench.table([ok]).splitlines()[2].endswith("| 1.0 | 60.0 | 10.0% |")
    # an out-of-memory row before it leaves the MFU's denominator alone (its peak GiB is the row's own)
    assert bench.table([row, ok]).splitlines()[3].endswith("| 1.0 | 60.0 | 10.0% |")


def test_oom_found_in_a_dead_workers_output(bench):
    assert bench.died_of_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    assert not bench.died_of_oom("RuntimeError: shape mismatch")
    assert bench.oom_text(None) == "out of memory at the config's data.batch_tokens"


def test_a_dead_workers_error_line_skips_progress_bars(bench):
    stderr = "Traceback (most recent call last):\n  File x\nValueError: no conv\n  0%|    | 0/2 [00:00<?, ?it/s]\n"
    assert bench.last_error(stderr) == "ValueError: no conv"
    assert bench.last_error("just a line\n") == "just a line"


def test_estimate_flag_prints_the_floor(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench/sft_bench.py"), "--estimate", "--models", "tiny",
                          "--set", "model.llm.activation_checkpoint=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| tiny | inputs of 2 checkpointed layers of 2 at 2,048 tokens |" in out.stdout
    assert "| tiny | floor (sum) |" in out.stdout


@pytest.mark.slow
def test_tiny_lora_arms_train_adapters_only(tmp_path):
    """brisk fast and the seed's loop (peft) on the tiny model (bf16, as the loop's model) with fp32 LoRA and
    checkpointing: both rows trained only the adapters (the same count, both in fp32: peft's
    autocast_adapter_dtype follows model.llm.lora.dtype), so a LoRA row in the table is a LoRA run."""
    work, out = tmp_path / "work", tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/sft_bench.py"), "--models", "tiny", "--device", "cpu",
                           "--arms", "a_loop,d_brisk_fast", "--steps", "1", "--warmup", "1", "--no-profile",
                           "--conversations", "40", "--work", str(work), "--out", str(out), "--set",
                           "model.llm.lora.enabled=true", "model.llm.lora.only=true", "model.llm.dtype=bf16",
                           "model.llm.lora.dtype=fp32", "model.llm.activation_checkpoint=1"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["arm"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"a_loop", "d_brisk_fast"} and all("tokens_per_s" in r for r in rows.values())
    # each timed step's garbage-collection time, to explain a slow step (one a step, none negative)
    assert all(len(r["gc_ms_steps"]) == r["steps"] and min(r["gc_ms_steps"]) >= 0 for r in rows.values())
    assert all(len(r["compile_s_steps"]) == r["steps"] and min(r["compile_s_steps"]) >= 0 for r in rows.values())
    counts = {arm: r["note"].rpartition("; ")[2] for arm, r in rows.items()}
    trained, _, total = counts["d_brisk_fast"].partition(" of ")
    assert counts["a_loop"] == counts["d_brisk_fast"]  # peft's adapters and brisk's: same layers, same rank
    assert 0 < int(trained.replace(",", "")) < int(total.split()[0].replace(",", "")) / 5
    assert all("; trainable in float32; " in r["note"] for r in rows.values()), [r["note"] for r in rows.values()]


def test_kernel_groups_of_the_op_table(bench):
    """The grouped op table's classes for kernels the H200 profiles name (GEMM, flash attention, fla's linear
    attention and its gated norm, Inductor's fused norm, liger, the optimizer, the rest)."""
    names = {"nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "GEMM",
             "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, cutlass::bfloat16_t>>": "attention",
             "void multi_tensor_apply_kernel<TensorListMetadata<1>, LpNormFunctor<c10::BFloat16, 2>>": "optimizer",
             "cunn_SoftMaxForward<4, float>": "loss",
             "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "linear attention",
             "causal_conv1d_fwd_kernel": "linear attention", "l2norm_fwd_kernel": "linear attention",
             "layer_norm_gated_fwd_kernel": "norms", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norms",
             "_rms_norm_forward_kernel": "norms", "multi_tensor_apply_kernel<...FusedAdamMathFunctor>": "optimizer",
             "void at::native::vectorized_elementwise_kernel<4, ...>": "elementwise / copies / other",
             "triton_poi_fused_mul_silu_0": "elementwise / copies / other"}
    assert {n: bench.kernel_group(n) for n in names} == names


def test_grouped_op_table_sums_kernels_and_host(bench):
    from torch.autograd import DeviceType

    def ev(key, device, count, us=0.0, cpu_us=0.0):
        return type("E", (), dict(key=key, device_type=device, count=count, self_device_time_total=us,
                                  self_cpu_time_total=cpu_us))()

    events = [ev("nvjet_a", DeviceType.CUDA, 10, 6000.0), ev("cutlass_gemm_b", DeviceType.CUDA, 5, 2000.0),
              ev("flash_fwd_kernel", DeviceType.CUDA, 4, 1000.0),
              ev("triton_poi_fused_add_0", DeviceType.CUDA, 20, 1000.0),
              ev("aten::mm", DeviceType.CPU, 15, cpu_us=3000.0),
              ev("cudaLaunchKernel", DeviceType.CPU, 39, cpu_us=500.0)]
    text = bench.op_groups(events, 0.02, "m_arm")
    assert "| GEMM | 15 | 2 | 8.0 | 80.0% |" in text and "| attention | 4 | 1 | 1.0 | 10.0% |" in text
    assert "| all kernels | 39 | 4 | 10.0 | 100% |" in text
    assert "step wall time (profiled): 20.0 ms; CUDA kernel time: 10.0 ms (50% of the wall)" in text
    assert "15 aten op calls, 3.5 ms of ops' own CPU time, 39 kernel launch calls" in text


def test_a_slow_step_line_names_its_collections_and_compiles(bench):
    """Round 8's 9B arm spent about 22 s in its first timed step and the table could say only that no garbage
    collection explained it: a slow step's line now carries torch.compile's seconds and the Triton kernels
    compiled inside it too."""
    row = {"model": "m", "arm": "d_brisk_fast", "steps": 4, "tokens_per_s": 1199.0, "tps_steps": [343.0, 8144.0,
           7985.0, 8109.0], "ms_per_step": 6228.0, "tokens_per_step": 7468.0, "peak_gib": 24.0,
           "gc_ms_steps": [79.2, 3.2, 3.5, 2.8], "compile_s_steps": [0.0, 0.0, 0.0, 0.0],
           "triton_kernels_steps": [37, 0, 0, 0]}
    text = bench.table([row])
    assert "m d_brisk_fast: timed step 1 ran at 343 tokens/s (median 8,047); garbage collection in it: 79.2 ms; " \
           "torch.compile in it: 0.00 s; Triton kernels compiled in it: 37" in text
    assert "timed step 2" not in text
    old = {k: v for k, v in row.items() if k not in ("compile_s_steps", "triton_kernels_steps")}  # an older row
    assert "torch.compile in it: not recorded; Triton kernels compiled in it: not recorded" in bench.table([old])


def test_timed_steps_record_their_compiles(bench, monkeypatch, tmp_path):
    """timed() gives each timed step the torch.compile seconds (forward and the lazily compiled backward) and the
    Triton kernels (new entries in TRITON_CACHE_DIR) that happened inside it, and none to a step without them."""
    import torch

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager", dynamic=False)

    def step(batch):
        if batch == "compile":
            fn(torch.randn(5, requires_grad=True)).backward()
        if batch == "kernel":
            (tmp_path / "kernel_hash").mkdir()

    times, _ = bench.timed(step, [("warm", 1), ("compile", 1), ("kernel", 1), ("plain", 1)], 1, None)
    assert len(times) == 3
    assert bench.STEP_COMPILE_S[0] > 0 and bench.STEP_COMPILE_S[1:] == [0.0, 0.0]
    assert bench.STEP_TRITON == [0, 1, 0]


def test_one_pass_takes_every_batch_once_and_its_table_ranks_by_the_whole_pass(bench, tmp_path):
    """--one-pass: every batch of the first epoch exactly once (no repeats, no warm-up left out); the table's
    headline is the pass's wall time against a_loop's, and a failed arm says FAILED."""
    cfg = bench.load_cfg("tiny", ROOT / "data/chat_demo", ["data.batch_tokens=2048"])
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    batches = build_split(cfg, "train", Collator(), int(cfg.model.llm.config["vocab_size"])).sampler.batches(0)
    every = bench.groups(cfg, None)
    assert len(every) == len(batches) and sum(len(g) for g in every) == sum(len(b) for b in batches)
    assert len({s.key for g in every for s in g}) == sum(len(b) for b in batches)  # each conversation once

    loop = {"model": "m", "arm": "a_loop", "steps": 40, "tokens_per_s": 5000.0, "tps_steps": [4000.0, 6000.0],
            "peak_gib": 60.0, "one_pass": True, "batch_tokens": 4096, "steps_s": 400.0, "conversations": 2000,
            "wall_s": 460.0}
    fast = {**loop, "arm": "d_brisk_fast", "batch_tokens": 8192, "steps_s": 70.0, "wall_s": 92.0, "steps": 20}
    text = bench.pass_table([loop, fast, {"model": "m", "arm": "b_trl_liger", "error": "timed out"}])
    rows = text.splitlines()
    assert "| m | d_brisk_fast | 8,192 | 2,000 | 92.0 s | 5.00x | 70.0 s (20 steps) |" in rows[3]
    assert "FAILED: timed out" in rows[4] and " s |" not in rows[4]
