"""Chat SFT on one GPU: the seed's loop, its stages, TRL + Liger, brisk's defaults and brisk's fast path, on the
same model (random init), the same data (ultrachat-like lengths) and the same GPU, in one call.

    python bench/sft_bench.py --wheels /path/to/.whl --out $OUT                  # everything, table printed last
    python bench/sft_bench.py --models qwen3_5_2b --arms a_loop,d_brisk_fast --steps 4
    python bench/sft_bench.py --one-pass --conversations 2000 --batch-tokens 8192 --arm-batch-tokens a_loop=4096 \
        --arms a_loop,b3_trl_liger_fla,d_brisk_fast --wheels .whl --out $OUT    # the seed's measure: one whole pass

--one-pass is seed 004's measure: every arm trains one pass over the same fixed set (every batch of the first
epoch once; the first steps of each shape count), and the headline is the pass's wall time from the arm's launch
to its exit. An arm's own budget (--arm-batch-tokens) changes its batches, never the set; the table says which
budget each arm used. Without it the bench times --steps steps after --warmup (quick A/Bs, never a headline).
    python bench/sft_bench.py --estimate --models qwen3_5_9b,qwen3_5_27b_lora --batch-tokens 8192   # memory floor, CPU
    python bench/sft_bench.py --models tiny --device cpu --set model.llm.lora.enabled=true model.llm.lora.only=true

LoRA models (qwen3_5_9b, qwen3_5_27b_lora; or any model with --set model.llm.lora.*): brisk's arms train its
adapters; the loop arms add peft's adapters on the same layers (and transformers' gradient checkpointing where
the config checkpoints), TRL gets them as its peft_config. The adapters' dtype follows model.llm.lora.dtype
(peft's autocast_adapter_dtype: fp32 adapters for dtype=fp32, the configs' setting; bf16 ones for ""); the loop
arms run without autocast, so peft computes their LoRA path in fp32 where brisk's and TRL's bf16 autocast
give its two GEMMs bf16 inputs. Each row says how many parameters trained. An arm
that runs out of device memory is one row, "out of memory at N tokens a batch", with its peak.

Arms (each a fresh process; real tokens/s = non-pad tokens of the timed steps over their time):
  a_loop          the seed's baseline: a plain transformers loop (bf16 weights, AdamW), padded batches,
                  default kernels (flash-linear-attention NOT importable: transformers' torch fallback)
  k_loop_kernels  the seed's stage 1: the same loop with flash-linear-attention importable (transformers
                  picks it up by itself)
  p_loop_packed   the seed's stage 2: kernels + packing (one row, per-conversation position_ids and
                  cu_seq_lens, as TRL's padding-free collator passes them). Without the causal-conv1d CUDA
                  package (no wheel) transformers' short conv ignores the boundaries (3 tokens of leak a
                  boundary): the same work, so the speed is comparable; brisk's fla swap keeps them apart
  b_trl_liger     TRL SFTTrainer as its users run it: assistant_only_loss, padding_free=True,
                  use_liger_kernel=True, bf16 (fla importable), TRL's default gradient checkpointing
  b2_trl_liger_nockpt  the same without gradient checkpointing (TRL tuned by a user with the memory)
  b3_trl_liger_fla  b_trl_liger with brisk's launcher of fla's gated backward registered in fla's backend
                  registry (brisk.speed.fla_hopper): on Hopper with Triton 3.4-3.7.0 fla alone refuses that
                  backward, so this is TRL + Liger with fla on its path where fla trains only through brisk
  c_brisk_default brisk's step with every switch off (padded, eager)
  d1_brisk_fast_per_sequence  d_brisk_fast with each packed conversation through the Gated DeltaNet layers on
                  its own (the reference path) instead of one padded batch: that lever's before/after
  d_brisk_fast    brisk's step: packing (varlen attention), fla varlen kernels for Gated DeltaNet (with
                  --no-fla: the row's conversations as one right-padded batch through transformers' torch
                  layer, speed.linear_attention_batched), liger RMSNorm/SwiGLU, label_head (LM head + loss on
                  labelled rows), fused AdamW
  d2_brisk_fast_batched  d_brisk_fast with flash-linear-attention off the path: the Gated DeltaNet layers run
                  the batched torch path (the chat preset's fallback where fla is refused)
  d3_brisk_fast_norms  d_brisk_fast + speed.fla_gated_norm: Qwen3.5's gated RMSNorm through fla's fused kernel
                  (the plain RMSNorms, 1 + weight ones included, are liger's already); a dense model has none
  d4_brisk_fast_compile  d_brisk_fast's switches without liger, + speed.compile (each decoder layer, dynamic
                  shapes; fla's calls eager between a layer's graphs): Inductor fuses the norms, SwiGLU, RoPE and
                  residual adds itself. Timed steps start after the warm-up steps, which compile
  d5_brisk_fast_compile_oib  d4 + speed.optimizer_in_backward: each decoder layer's fused AdamW update on a
                  side stream under the rest of the backward (optim.grad_clip by the previous step's norm); like
                  d4, without the preset's fla_gated_norm
  d6_brisk_fast_graph  d_brisk_fast + speed.cuda_graph and fresh_grads: each bucket's whole step (forward,
                  backward, fused AdamW) one CUDA graph, captured at the bucket's first batch; the same groups
                  as every arm, a hybrid's conversations each padded to fla's 64-token chunks in the row (a row
                  past 8,192 tokens then runs eagerly: the note counts them)
  d7_brisk_fast_compile_graph  d4 + speed.cuda_graph and fresh_grads: the compiled layers inside the graph
  d8_brisk_fast_compile_float8  d4 + speed.float8: the decoder layers' linear layers as float8 GEMMs (torchao,
                  rowwise scales; the embedding and LM head in bf16); needs compute capability 8.9+ and torchao
Every arm, TRL too, trains on the same batches in the same order (groups of whole conversations under a
padded-token budget; causal_lm.overlong=skip): TRL tokenises the same messages itself and its loader is handed the
groups.
Op tables (torch.profiler, one step after the timed ones) for a_loop and the d_brisk_fast arms go to $OUT/ops_*.txt
(top ops by CUDA time) and $OUT/ops_*_groups.md (every CUDA kernel of the step in groups: GEMM, attention,
linear attention, norms, loss, optimizer, elementwise/other; launches, CUDA ms, share; host time and launches).
Wheels: fla-core (fla arms), liger-kernel, trl, datasets, dill, multiprocess (TRL arm), installed with
--no-deps into private folders under --work (with the generated data), so the torch-path arms never
see them. Results, logs and op tables go to --out ($OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run in this order (every model's arm before the next arm), so a short time budget keeps the main comparison.
ARMS = ("a_loop", "d_brisk_fast", "d6_brisk_fast_graph", "d7_brisk_fast_compile_graph", "d8_brisk_fast_compile_float8", "d2_brisk_fast_batched", "b_trl_liger", "b2_trl_liger_nockpt", "b3_trl_liger_fla",
        "k_loop_kernels",
        "p_loop_packed",
        "c_brisk_default", "d1_brisk_fast_per_sequence", "d3_brisk_fast_norms", "d4_brisk_fast_compile",
        "d5_brisk_fast_compile_oib")
BRISK_ARMS = {"c_brisk_default", "d_brisk_fast", "d2_brisk_fast_batched", "d1_brisk_fast_per_sequence",
              "d3_brisk_fast_norms", "d4_brisk_fast_compile", "d5_brisk_fast_compile_oib", "d6_brisk_fast_graph",
              "d7_brisk_fast_compile_graph", "d8_brisk_fast_compile_float8"}
TRL_ARMS = {"b_trl_liger", "b2_trl_liger_nockpt", "b3_trl_liger_fla"}
FLA_ARMS = {"k_loop_kernels", "p_loop_packed", "d_brisk_fast", "d1_brisk_fast_per_sequence", "d3_brisk_fast_norms",
            "d4_brisk_fast_compile", "d5_brisk_fast_compile_oib", "d6_brisk_fast_graph", "d7_brisk_fast_compile_graph",
            "d8_brisk_fast_compile_float8"} | TRL_ARMS
MODELS = {"qwen3_5_2b": "configs/sft_qwen3_5_2b.yaml", "qwen3_1p7b": "configs/sft_qwen3_1p7b.yaml",
          "qwen3_5_9b": "configs/sft_qwen3_5_9b.yaml", "qwen3_8b": "configs/sft_qwen3_8b.yaml",
          "qwen3_5_27b_lora": "configs/sft_qwen3_5_27b_lora.yaml",  # 9b and 27b_lora: LoRA, every layer checkpointed
          "tiny": "configs/sft_demo.yaml"}  # tiny: a smoke test of this script (--device cpu)
DEVICE = "cuda"
PROFILED = {"a_loop", "d_brisk_fast", "d3_brisk_fast_norms", "d4_brisk_fast_compile", "d5_brisk_fast_compile_oib",
            "d6_brisk_fast_graph", "d7_brisk_fast_compile_graph", "d8_brisk_fast_compile_float8"}


# ------------------------------------------------------------------------------------------ worker
BATCH_TOKENS: int | None = None  # --batch-tokens: data.batch_tokens for every arm (the configs' 16,384 by default)
SETS: list[str] = []  # --set: config overrides for every arm (the HF arms read LoRA and checkpointing from them)
ARM_BATCH_TOKENS: dict[str, int] = {}  # --arm-batch-tokens: an arm's own budget (the loop at the largest that fits)
ARM = ""  # the worker's arm


def load_cfg(model: str, data: Path, extra: list[str]):
    sys.path.insert(0, str(REPO))
    from brisk.config import load_config

    tiny = ["model.llm.config.vocab_size=392", "causal_lm.max_len=1024", "data.batch_tokens=2048"] if model == "tiny" else []
    tiny += [f"data.batch_tokens={BATCH_TOKENS}"] if BATCH_TOKENS else []
    tiny += [f"data.batch_tokens={ARM_BATCH_TOKENS[ARM]}"] if ARM in ARM_BATCH_TOKENS else []
    # overlong=skip: every arm, TRL too, trains on whole conversations (TRL's padding-free rows do not truncate)
    return load_config(REPO / MODELS[model], [f"data.train={data / 'train.jsonl'}", "data.valid=null", "causal_lm.overlong=skip",
                                               f"data.tokenizer={data / 'tokenizer'}", f"train.device={DEVICE}",
                                               *tiny, *SETS, *extra])


def groups(cfg, n: int | None):
    """The first n batches of the sampler (n None: every batch of the first epoch, once), as lists of samples
    (identical in every arm at one batch budget)."""
    from brisk.data.collate import Collator
    from brisk.data.loader import build_split

    split = build_split(cfg, "train", Collator(), int(cfg.model.llm.config["vocab_size"]))
    batches = split.sampler.batches(0)
    chosen = batches if n is None else (batches * (1 + n // len(batches)))[:n]
    return [[split.dataset[(i, 0)] for i in idx] for idx in chosen]


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


STEP_GC_MS: list[float] = []  # Python's garbage collections inside each timed step (timed() fills it)
STEP_COMPILE_S: list[float] = []  # torch.compile's (Dynamo + Inductor) seconds inside each timed step
STEP_TRITON: list[int] = []  # Triton kernels compiled inside each timed step (new entries in Triton's cache)


def triton_cache_entries() -> int:
    """Entries in Triton's on-disk kernel cache (TRITON_CACHE_DIR, else ~/.triton/cache): one a kernel compiled
    in this or an earlier process, so a step's growth counts the kernels it compiled: a first launch, or an
    autotuner compiling its configurations for a new shape (fla's and liger's kernels, whose compiles
    torch.compile's seconds do not count)."""
    folder = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        return sum(1 for _ in os.scandir(folder))
    except OSError:
        return 0


def timed(run_step, batches, warmup: int, profile_to: Path | None):
    from brisk.diagnose.slow import GCWatch
    from brisk.speed.compile import compile_seconds

    times, tokens, watch = [], [], GCWatch()
    for record in (STEP_GC_MS, STEP_COMPILE_S, STEP_TRITON):
        record.clear()
    try:
        for i, (batch, n_tokens) in enumerate(batches):
            sync()
            gc0, c0, k0 = watch.seconds, compile_seconds(), triton_cache_entries()  # read before the clock starts
            t0 = time.perf_counter()
            run_step(batch)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                tokens.append(n_tokens)
                STEP_GC_MS.append(1000 * (watch.seconds - gc0))
                STEP_COMPILE_S.append(compile_seconds() - c0)
                STEP_TRITON.append(triton_cache_entries() - k0)
    finally:  # an out-of-memory row must not leave the callback behind
        watch.close()
    if profile_to is not None:
        from torch.profiler import ProfilerActivity, profile

        cuda = DEVICE == "cuda"
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            t0 = time.perf_counter()
            run_step(batches[-1][0])
            sync()
            wall = time.perf_counter() - t0
        averages = prof.key_averages()
        profile_to.write_text(averages.table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25),
                              encoding="utf-8")
        profile_to.with_name(profile_to.stem + "_groups.md").write_text(
            op_groups(averages, wall, profile_to.stem.removeprefix("ops_")), encoding="utf-8")
    return times, tokens


# Kernel name -> group, first match wins: attention first (flash kernels' template arguments name cutlass types),
# the optimizer before norms (gradient clipping's LpNorm), fla's l2norm as linear attention, its gated norm a norm.
KERNEL_GROUPS = (
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk", "matmul")),
    ("linear attention", ("chunk", "delta", "conv1d", "l2norm", "wy_", "solve_tril", "cumsum", "kkt", "dhu", "dqkwg",
                          "recompute_w_u", "merge_16x16", "merge_32x32")),
    ("optimizer", ("adam", "multi_tensor", "lpnorm", "normtwo")),
    ("norms", ("rms", "rsqrt", "norm")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "softmax")),
)


def kernel_group(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in KERNEL_GROUPS if any(k in low for k in keys)), "elementwise / copies / other")


def op_groups(averages, wall_s: float, title: str) -> str:
    """Every CUDA kernel of one profiled step summed by group (launches, distinct kernels, CUDA ms, share), and
    the host side: the step's wall time, the ops' own CPU time, the kernel launches (the seed's op tables)."""
    from torch.autograd import DeviceType

    def self_device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    kernels = [e for e in averages if e.device_type == DeviceType.CUDA]
    host = [e for e in averages if e.device_type == DeviceType.CPU]
    groups: dict[str, list[float]] = {}
    for e in kernels:
        g = groups.setdefault(kernel_group(e.key), [0, 0, 0.0])
        g[0] += e.count
        g[1] += 1
        g[2] += self_device_us(e)
    total = sum(g[2] for g in groups.values()) or 1.0
    launches = sum(e.count for e in host if "LaunchKernel" in e.key or "cuLaunch" in e.key)
    out = [f"### {title}: CUDA kernels of one step by group", "",
           "| group | launches | distinct kernels | CUDA ms | share |", "|---|---|---|---|---|"]
    for name, (calls, distinct, us) in sorted(groups.items(), key=lambda kv: -kv[1][2]):
        out.append(f"| {name} | {calls:,} | {distinct} | {us / 1000:.1f} | {100 * us / total:.1f}% |")
    out.append(f"| all kernels | {sum(g[0] for g in groups.values()):,} | {len(kernels)} | {total / 1000:.1f} | 100% |")
    out += ["", f"step wall time (profiled): {1000 * wall_s:.1f} ms; CUDA kernel time: {total / 1000:.1f} ms "
            f"({100 * total / 1000 / max(1e-9, 1000 * wall_s):.0f}% of the wall)",
            f"host: {sum(e.count for e in host if e.key.startswith('aten::')):,} aten op calls, "
            f"{sum(e.self_cpu_time_total for e in host) / 1000:.1f} ms of ops' own CPU time, {launches:,} kernel "
            "launch calls", ""]
    return "\n".join(out)


def hf_inputs(batch, packed: bool):
    if not packed:
        return dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
    cu = batch.cu_seqlens
    return dict(input_ids=batch.input_ids, position_ids=batch.position_ids, labels=batch.labels,
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=int((cu[1:] - cu[:-1]).max()),
                max_length_k=int((cu[1:] - cu[:-1]).max()))


def linear_attention_impl() -> str:
    """Which gated delta rule transformers bound (it decides at import time; fla-core when importable)."""
    return "flash-linear-attention" if "fla" in sys.modules else "transformers' torch fallback"


def hf_model(cfg):
    """The transformers model of the config, bf16 weights made on the device. Where the config has LoRA, the seed's
    way to add it: peft's adapters on the same target layers (base frozen), and transformers' gradient
    checkpointing where the config checkpoints its layers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    c = dict(cfg.model.llm.config)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(c.pop("model_type"), **c), dtype=torch.bfloat16)
    if cfg.model.llm.activation_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.model.llm.lora.enabled:
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora(cfg), autocast_adapter_dtype=fp32_adapters(cfg))
    return model


def fp32_adapters(cfg) -> bool:
    """peft's autocast_adapter_dtype for brisk's model.llm.lora.dtype: True (peft's default) upcasts the adapters
    of the bf16 model to fp32, as brisk's dtype=fp32 makes them; False leaves them bf16, as brisk's default does."""
    return cfg.model.llm.lora.dtype == "fp32"


def peft_lora(cfg):
    from peft import LoraConfig

    lora = cfg.model.llm.lora
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
                      task_type="CAUSAL_LM")


def worker(args) -> dict:
    import torch

    cfg = load_cfg(args.model, Path(args.data), [])
    from brisk.train.threads import pick_threads

    pick_threads(cfg, torch.device(DEVICE))  # every arm, the loop's and TRL's too, on the config's host threads
    if args.one_pass:  # the seed's measure: every batch of the set once, the first steps of each shape included
        args.warmup = 0
    sample_groups = groups(cfg, None if args.one_pass else args.warmup + args.steps)
    torch.manual_seed(0)
    arm, out = args.arm, Path(args.out)
    prof = out / f"ops_{args.model}_{arm}.txt" if arm in PROFILED and not args.no_profile else None
    try:
        times, tokens, note = run_arm(args, cfg, sample_groups, prof)
    except torch.OutOfMemoryError:
        # One line in the table, not a crash of the bench: what ran out, at which batch, and how far it got.
        return {"model": args.model, "arm": arm, "error": oom_text(cfg.data.batch_tokens), "peak_gib": peak_gib()}
    per_s = [k / t for k, t in zip(tokens, times)]
    return {"model": args.model, "arm": arm, "steps": len(times), "tokens_per_s": sum(tokens) / sum(times),
            "tps_steps": per_s, "ms_per_step": 1000 * statistics.mean(times), "tokens_per_step": statistics.mean(tokens),
            # timed() fills the three per-step records together (TRL's arm times its own steps)
            **({"gc_ms_steps": [round(x, 1) for x in STEP_GC_MS],
                "compile_s_steps": [round(x, 2) for x in STEP_COMPILE_S],
                "triton_kernels_steps": list(STEP_TRITON)} if len(STEP_GC_MS) == len(times) else {}),
            "peak_gib": peak_gib(), "note": note, "flops_per_token": flops_per_token(cfg, sample_groups[args.warmup:]),
            "peak_tflops": matmul_peak(), "torch_threads": torch.get_num_threads(),  # train.cpu_threads' A/B
            "one_pass": bool(args.one_pass), "batch_tokens": cfg.data.batch_tokens, "steps_s": sum(times),
            "conversations": sum(len(g) for g in sample_groups)}


def flops_per_token(cfg, timed_groups) -> float:
    """Model FLOPs of a training token on the timed batches (brisk.bench.flops: PaLM's convention), counted on
    the config's model built on the meta device: the same count for every arm of a model."""
    from brisk.bench.flops import training_flops
    from brisk.families import family_of

    lens = [len(s.tokens.input_ids) for g in timed_groups for s in g]
    return training_flops(family_of(cfg).build(cfg, "meta").llm, lens) / sum(lens)


def matmul_peak() -> float | None:
    """This GPU's measured bf16 matmul TFLOP/s (brisk.bench.harness.matmul_rate), after the arm with its memory
    released; None on the CPU or when it cannot run (the arm's row is kept either way)."""
    if DEVICE != "cuda":
        return None
    import torch

    from brisk.bench.harness import matmul_rate

    torch.cuda.empty_cache()
    try:
        return matmul_rate(torch.device("cuda"))[0] / 1e12
    except torch.OutOfMemoryError:
        return None


def trains(model) -> str:
    """How much of the model trains: the row's evidence that LoRA (or the full model) is what ran."""
    params = list({id(p): p for p in model.parameters()}.values())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad})
    trained = sum(p.numel() for p in params if p.requires_grad)
    return f"trainable in {'+'.join(dtypes)}; {trained:,} of {sum(p.numel() for p in params):,} parameters train"


def oom_text(batch_tokens: int | None) -> str:
    return f"out of memory at {batch_tokens:,} tokens a batch" if batch_tokens else \
        "out of memory at the config's data.batch_tokens"


def last_error(stderr: str) -> str:
    """The exception line of a dead worker's output (progress bars may print after it), else its last line."""
    lines = stderr.strip().splitlines() or ["?"]
    return next((x for x in reversed(lines) if re.match(r"^[\w.]+(Error|Exception)\b", x)), lines[-1])


def died_of_oom(log_text: str) -> bool:
    """An arm that ran out of device memory where the worker could not catch it (inside a library's own handler,
    a kernel launch): torch's OOM error or CUDA's message in its output."""
    return "OutOfMemoryError" in log_text or "CUDA out of memory" in log_text or "CUDA error: out of memory" in log_text


def peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0


def run_arm(args, cfg, sample_groups, prof):
    import torch

    from brisk.data.collate import Collator

    arm = args.arm
    note = ""
    if arm in ("a_loop", "k_loop_kernels", "p_loop_packed"):
        model = hf_model(cfg)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        packed = arm == "p_loop_packed"
        collate = Collator(packed=True, token_buckets=(1024,)) if packed else Collator()
        batches = [(collate(g).to(DEVICE), sum(len(s.tokens.input_ids) for s in g)) for g in sample_groups]

        def step(batch):
            loss = model(**hf_inputs(batch, packed), use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        times, tokens = timed(step, batches, args.warmup, prof)
        note = (f"gated delta rule from {linear_attention_impl()}" + ("; peft LoRA" if cfg.model.llm.lora.enabled else "")
                + f"; {trains(model)}")
    elif arm in BRISK_ARMS:
        from brisk.bench.harness import build_runner

        fast = ["speed.packing=true", "speed.label_head=true", "speed.fused_adamw=true", "speed.pack_buckets=[1024]"]
        if DEVICE == "cuda":  # Triton kernels (the CPU smoke test runs the rest)
            no_fla = os.environ.get("SFT_BENCH_NO_FLA") or arm == "d2_brisk_fast_batched"
            fast += ([] if arm.startswith(("d4_", "d5_", "d7_", "d8_")) else ["speed.liger=true"]) \
                + ([] if no_fla else ["speed.fla_kernels=true"]) \
                + (["speed.fla_gated_norm=true"] if arm == "d3_brisk_fast_norms" and not no_fla else [])
        if arm not in ("c_brisk_default", "d1_brisk_fast_per_sequence"):  # GDN layers where fla is off (fla wins when on)
            fast += ["speed.linear_attention_batched=true"]
        if arm.startswith(("d4_", "d5_", "d7_", "d8_")):  # each decoder layer, dynamic shapes (the CPU: nothing compiled)
            fast += ["speed.compile=true", "speed.compile_on_error=raise"]
        if arm == "d8_brisk_fast_compile_float8":  # the decoder layers' GEMMs in float8 (torchao, rowwise scales)
            fast += ["speed.float8=true"]
        if arm.startswith(("d6_", "d7_")):  # the whole step a CUDA graph a bucket, captured at its first batch (in
            fast += ["speed.cuda_graph=true", "speed.fresh_grads=true"]  # the warm-up, or counted in the pass)
        if arm == "d5_brisk_fast_compile_oib":  # clipping (optim.grad_clip) by the previous step's norm
            fast += ["speed.optimizer_in_backward=true", "speed.clip_by_previous_norm=true"]
        cfg = load_cfg(args.model, Path(args.data), [] if arm == "c_brisk_default" else fast)
        runner = build_runner(cfg)  # the run's parts as `brisk train` assembles them
        batches = [(runner.collate(g).to(DEVICE), sum(len(s.tokens.input_ids) for s in g)) for g in sample_groups]
        times, tokens = timed(runner.run, batches, args.warmup, prof)
        graphed = (f"cuda_graph: {len(runner.step.graphs)} bucket graphs, {runner.step.eager_fallbacks} steps eager",) \
            if hasattr(runner.step, "eager_fallbacks") else ()
        note = "; ".join(runner.parts.plan.notes + tuple(runner.parts.accel.notes) + graphed + (trains(runner.model),))
    else:  # TRL_ARMS
        times, tokens, note = trl_arm(args, cfg, sample_groups, checkpointing=arm != "b2_trl_liger_nockpt")
    return times, tokens, note


def trl_arm(args, cfg, sample_groups, checkpointing: bool = True):
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from brisk.data.chat_store import read_rows

    # The other arms' batches, conversation for conversation: TRL tokenises the same messages and its loader
    # is given the same groups (TRL's own loader would take a fixed number of conversations in file order).
    messages = {key: msgs for key, msgs, _ in read_rows(str(Path(args.data) / "train.jsonl"), what="data.train")}
    sizes = [len(g) for g in sample_groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    batches = [list(range(a, a + k)) for a, k in zip(starts, sizes)]
    n = args.warmup + args.steps
    tok = AutoTokenizer.from_pretrained(str(Path(args.data) / "tokenizer"), local_files_only=True)
    c = dict(cfg.model.llm.config)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(c.pop("model_type"), **c), dtype=torch.bfloat16)
    ds = Dataset.from_list([{"messages": messages[sample.key]} for g in sample_groups for sample in g])
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            sync()
            marks.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            sync()
            marks.append(time.perf_counter())

    counts: list[int] = []

    class Counting(SFTTrainer):
        def get_train_dataloader(self):
            from torch.utils.data import DataLoader

            keep = [k for k in self.train_dataset.column_names if k != "messages"]  # TRL's tokens and masks
            loader = DataLoader(self.train_dataset.select_columns(keep), batch_sampler=batches,
                                collate_fn=self.data_collator)
            return self.accelerator.prepare(loader)

        def training_step(self, model, inputs, *a, **kw):
            counts.append(int(inputs["input_ids"].numel()))  # padding-free: one row of real tokens
            return super().training_step(model, inputs, *a, **kw)

    targs = SFTConfig(output_dir=str(Path(args.out) / "trl"), assistant_only_loss=True, padding_free=True,
                      use_liger_kernel=DEVICE == "cuda",  # Triton kernels; the CPU smoke test runs without them
                      bf16=True, per_device_train_batch_size=max(sizes), max_steps=n,
                      max_length=None,  # padding_free without packing: TRL refuses a max_length
                      learning_rate=1e-5, logging_steps=1000, save_strategy="no", report_to=[],
                      gradient_checkpointing=checkpointing,  # True is TRL's own default
                      dataloader_num_workers=0, use_cpu=DEVICE == "cpu")
    peft = cfg.model.llm.lora.enabled
    kwargs = {}
    if peft and fp32_adapters(cfg):  # TRL's LoRA: peft, as its docs show (peft upcasts the adapters to fp32)
        kwargs["peft_config"] = peft_lora(cfg)
    elif peft:  # bf16 adapters, as brisk's model.llm.lora.dtype="" makes them: TRL's own get_peft_model call
        from peft import get_peft_model  # would upcast them, so the model comes wrapped already

        model = get_peft_model(model, peft_lora(cfg), autocast_adapter_dtype=False)
    launcher = ""
    if args.arm == "b3_trl_liger_fla":
        from brisk.speed import fla_hopper
        from brisk.speed.llm_kernels import available

        if DEVICE == "cuda" and available("fla"):
            fla_hopper.register_launcher()  # active only where fla refuses its own (Hopper, Triton 3.4-3.7.0)
            if fla_hopper.in_window(torch.cuda.get_device_capability(), fla_hopper.triton_version()):
                launcher = "; fla's gated backward through brisk's launcher"
    trainer = Counting(model=model, args=targs, train_dataset=ds, processing_class=tok, callbacks=[Clock()], **kwargs)
    trainer.train()
    times = [marks[2 * i + 1] - marks[2 * i] for i in range(len(marks) // 2)][args.warmup:]
    return times, counts[args.warmup:len(times) + args.warmup], ("the other arms' batches (padding_free row), gradient "
                                                                  f"checkpointing {'on' if checkpointing else 'off'}"
                                                                  + ("; peft LoRA" if peft else "") + launcher
                                                                  + f"; {trains(trainer.model)}")


def estimate_table(model: str) -> str:
    """The model's memory floor (brisk.bench.memory_estimate) with the loss as d_brisk_fast computes it (label_head),
    for data.batch_tokens (--batch-tokens), counted on the meta device."""
    sys.path.insert(0, str(REPO))
    from brisk.bench.memory_estimate import estimate
    from brisk.config import load_config

    tiny = ["model.llm.config.vocab_size=392", "data.batch_tokens=2048"] if model == "tiny" else []
    cfg = load_config(REPO / MODELS[model], ["train.device=cpu", "speed.label_head=true", *tiny, *SETS,
                                             *([f"data.batch_tokens={BATCH_TOKENS}"] if BATCH_TOKENS else [])])
    return estimate(cfg).table(model)


# ------------------------------------------------------------------------------------------ driver
def install(wheels: Path, target: Path, names: list[str]) -> Path:
    """The named wheels of ``wheels`` (and its subfolders: transformers 5.24 sits in .whl/t524) installed into
    ``target`` without dependencies, once; the folder to put on a worker's path."""
    if target.is_dir():
        return target
    files = [str(f) for n in names for f in sorted(wheels.rglob(f"{n}-*.whl"))]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *files],
                   check=True)
    return target


def baselines(rows: list[dict]) -> tuple[dict, float | None]:
    """Each model's a_loop row, and the table's one MFU denominator: the median of the rows' measured bf16 matmul
    peaks (so MFU follows tokens/s across the table)."""
    base = {r["model"]: r for r in rows if r["arm"] == "a_loop" and "tokens_per_s" in r}
    peaks = sorted(r["peak_tflops"] for r in rows if r.get("peak_tflops"))
    return base, peaks[len(peaks) // 2] if peaks else None


def model_tflops(r: dict, matmul: float | None) -> tuple[float | None, str]:
    """A row's model TFLOP/s at its all-steps rate and its MFU ("-" without a FLOPs count or a peak)."""
    tflops = r["tokens_per_s"] * r["flops_per_token"] / 1e12 if r.get("flops_per_token") else None
    return tflops, f"{tflops / matmul:.1%}" if tflops and matmul else "-"


def table(rows: list[dict]) -> str:
    """Real tokens/s of the timed steps (all tokens over all time), the per-step spread, and the median step's
    tokens/s (steadier when a few steps are much slower than the rest), each against the model's a_loop; the
    model FLOPs a second at the all-steps rate and their share of the GPU's measured bf16 matmul peak (MFU; the
    median of the rows' measurements, one denominator for the table)."""
    out = ["| model | arm | real tokens/s (all steps; sd over steps) | vs a_loop | median step tokens/s | vs a_loop "
           "| ms/step | tokens/step | peak GiB | model TFLOP/s | MFU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base, matmul = baselines(rows)
    for r in rows:
        if "error" in r:
            oom = r["error"].startswith("out of memory")
            peak = f"{r['peak_gib']:.1f} when it ran out" if oom and r.get("peak_gib") else ""
            out.append(f"| {r['model']} | {r['arm']} | {'' if oom else 'failed: '}{r['error'][:80]} | | | | | | {peak} | | |")
            continue
        sd = statistics.pstdev(r["tps_steps"]) if len(r["tps_steps"]) > 1 else 0.0
        med = statistics.median(r["tps_steps"])
        b = base.get(r["model"])
        ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else "-"
        med_ratio = f"{med / statistics.median(b['tps_steps']):.2f}x" if b else "-"
        tflops, mfu = model_tflops(r, matmul)
        out.append(f"| {r['model']} | {r['arm']} | {r['tokens_per_s']:,.0f} ± {sd:,.0f} | {ratio} | {med:,.0f} | "
                   f"{med_ratio} | {r['ms_per_step']:.0f} | {r['tokens_per_step']:,.0f} | {r['peak_gib']:.1f} | "
                   f"{'-' if tflops is None else f'{tflops:,.1f}'} | {mfu} |")
    slow = [(r, i) for r in rows if "tps_steps" in r for i, t in enumerate(r["tps_steps"])
            if t < 0.6 * statistics.median(r["tps_steps"])]
    for r, i in slow:  # a step much slower than its arm's median: Python's garbage collector? a compile?
        def seen(key: str, fmt: str) -> str:
            v = r.get(key, [None] * len(r["tps_steps"]))[i]
            return "not recorded" if v is None else fmt.format(v)

        out.append(f"\n{r['model']} {r['arm']}: timed step {i + 1} ran at {r['tps_steps'][i]:,.0f} tokens/s "
                   f"(median {statistics.median(r['tps_steps']):,.0f}); garbage collection in it: "
                   f"{seen('gc_ms_steps', '{:.1f} ms')}; torch.compile in it: {seen('compile_s_steps', '{:.2f} s')}; "
                   f"Triton kernels compiled in it: {seen('triton_kernels_steps', '{:d}')}")
    return "\n".join(out)


def driver(args) -> None:
    out = Path(args.out or os.environ.get("OUT") or REPO / "bench/tmp/sft_bench")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)  # data and wheel folders: large, and not results
    data = work / "data"
    if not (data / "train.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "brisk", "data", "chat", "ultrachat", "--out", str(data),
                        "--n", str(args.conversations), "--n-valid", "8", "--seed", "7"], check=True, cwd=REPO)
    wheels = Path(args.wheels) if args.wheels else None
    kernels = (["liger_kernel"] if args.no_fla else ["fla_core", "liger_kernel"]) \
        + (["torchao"] if "d8_brisk_fast_compile_float8" in args.arms.split(",") else [])  # a missing wheel: skipped
    fla = install(wheels, work / "site_fla", kernels) if wheels else None
    trl = install(wheels, work / "site_trl", kernels + ["trl", "datasets", "dill", "multiprocess"]) \
        if wheels and TRL_ARMS & set(args.arms.split(",")) else None
    liger = install(wheels, work / "site_liger", ["liger_kernel"]) if wheels else None  # the arms without fla
    rows, deadline = [], time.time() + args.budget_s
    for arm in args.arms.split(","):
        for model in args.models.split(","):
            if time.time() > deadline:
                rows.append({"model": model, "arm": arm, "error": "skipped: out of the time budget"})
                continue
            paths = [str(REPO)] + ([str(trl)] if arm in TRL_ARMS and trl else [str(fla)] if arm in FLA_ARMS and fla
                                   else [str(liger)] if arm == "d2_brisk_fast_batched" and liger else [])
            # The caller's PYTHONPATH (brisk's own needs, such as soundfile) goes last: an arm's kernels come first.
            paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TOKENIZERS_PARALLELISM": "false",
                   "SFT_BENCH_NO_FLA": "1" if args.no_fla else ""}
            cmd = [sys.executable, __file__, "--worker", "--arm", arm, "--model", model, "--data", str(data),
                   "--out", str(out), "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device,
                   *(["--batch-tokens", str(args.batch_tokens)] if args.batch_tokens else []),
                   *(["--one-pass"] if args.one_pass else []),
                   *(["--arm-batch-tokens", args.arm_batch_tokens] if args.arm_batch_tokens else []),
                   *(["--set", *args.set] if args.set else []), *(["--no-profile"] if args.no_profile else [])]
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=max(30, deadline + 60 - time.time()))
                log_text, err = proc.stdout + proc.stderr, last_error(proc.stderr)
                line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
            except subprocess.TimeoutExpired as e:
                log_text, err, line = str(e.stdout or "") + str(e.stderr or ""), "timed out", None
            (out / f"log_{model}_{arm}.txt").write_text(log_text, encoding="utf-8")
            if not line and died_of_oom(log_text):
                err = oom_text(args.batch_tokens)
            row = json.loads(line[7:]) if line else {"model": model, "arm": arm, "error": err}
            row["wall_s"] = time.time() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
    order = {a: i for i, a in enumerate(args.arms.split(","))}
    rows.sort(key=lambda r: (args.models.split(",").index(r["model"]), order[r["arm"]]))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for f in sorted(out.glob("ops_*.txt")):
        print(f"\n### {f.name} (top CUDA kernels of one step)\n```\n" + "\n".join(f.read_text().splitlines()[:18]) + "\n```")
    for f in sorted(out.glob("ops_*_groups.md")):
        print("\n" + f.read_text())
    print("\n" + (pass_table(rows) if args.one_pass else table(rows)))


def pass_table(rows: list[dict]) -> str:
    """One pass over the whole set an arm (--one-pass): its wall time from the process's launch to its exit (model
    load, data, every step: the seed's measure), the steps alone, tokens/s over every step and at the median step,
    MFU at the all-steps rate, peak memory; ratios against the model's a_loop. An arm that failed says so."""
    out = ["| model | arm | batch tokens | conversations | pass, launch to exit | vs a_loop | steps alone | "
           "tokens/s, every step | median step tokens/s | MFU | peak GiB |", "|---" * 11 + "|"]
    base, matmul = baselines(rows)
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['arm']} | | | FAILED: {r['error'][:80]} | | | | | | |")
            continue
        b = base.get(r["model"])
        ratio = f"{b['wall_s'] / r['wall_s']:.2f}x" if b else "-"
        _, mfu = model_tflops(r, matmul)
        out.append(f"| {r['model']} | {r['arm']} | {r['batch_tokens']:,} | {r['conversations']:,} | {r['wall_s']:.1f} s | "
                   f"{ratio} | {r['steps_s']:.1f} s ({r['steps']} steps) | {r['tokens_per_s']:,.0f} | "
                   f"{statistics.median(r['tps_steps']):,.0f} | {mfu} | {r['peak_gib']:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm")
    ap.add_argument("--model", default="qwen3_5_2b")
    ap.add_argument("--data")
    ap.add_argument("--models", default="qwen3_5_2b,qwen3_1p7b")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=6, help="timed steps an arm")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=600)
    ap.add_argument("--wheels", help="folder with the wheels (fla_core, liger_kernel, trl, datasets, dill, multiprocess)")
    ap.add_argument("--budget-s", type=float, default=500, help="no new arm starts after this many seconds")
    ap.add_argument("--no-fla", action="store_true", help="leave flash-linear-attention out of every arm (its gated "
                    "delta rule backward refuses Triton < 3.7.1 on Hopper: torch 2.11's Triton 3.6)")
    ap.add_argument("--batch-tokens", type=int, help="data.batch_tokens (padded tokens a batch) for every arm")
    ap.add_argument("--one-pass", action="store_true", help="every arm trains one pass over the whole set (every "
                    "batch of epoch 0 once, no warm-up left out): the pass's wall time, launch to exit, is the headline")
    ap.add_argument("--arm-batch-tokens", default="", metavar="ARM=N,...", help="an arm's own data.batch_tokens, "
                    "e.g. a_loop=4096 (the seed's loop at the largest padded budget that fits the GPU)")
    ap.add_argument("--out")
    ap.add_argument("--work", default="/tmp/sft_bench_work", help="generated data and wheel installs")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (--models tiny)")
    ap.add_argument("--table", nargs="+", help="print the table of these results.jsonl files (no run)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides for every arm, e.g. "
                    "model.llm.lora.enabled=true model.llm.activation_checkpoint=1 (the HF arms follow LoRA and "
                    "checkpointing too)")
    ap.add_argument("--no-profile", action="store_true", help="no op table (one step fewer: a 27B step takes seconds)")
    ap.add_argument("--estimate", action="store_true", help="print each model's memory floor as brisk fast would run "
                    "it (built on the meta device: no weights, no GPU) and stop")
    args = ap.parse_args()
    if args.table:
        rows = [json.loads(x) for f in args.table for x in Path(f).read_text().splitlines() if x.strip()]
        print(pass_table(rows) if any(r.get("one_pass") for r in rows) else table(rows))
        return
    global DEVICE, BATCH_TOKENS, SETS, ARM_BATCH_TOKENS, ARM
    DEVICE, BATCH_TOKENS, SETS, ARM = args.device, args.batch_tokens, args.set, args.arm or ""
    ARM_BATCH_TOKENS = {k: int(v) for k, v in (x.split("=") for x in args.arm_batch_tokens.split(",") if x)}
    if args.estimate:
        for model in args.models.split(","):
            print(f"\n{estimate_table(model)}")
        return
    if args.worker:
        sys.path.insert(0, str(REPO))
        print("RESULT " + json.dumps(worker(args)), flush=True)
    else:
        driver(args)


if __name__ == "__main__":
    main()
