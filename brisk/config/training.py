"""The optimizer and the training run: steps, validation, checkpoints, export."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from ..keys import key


@dataclass
class OptimConfig:
    lr: float = key(2e-4, "peak learning rate of AdamW (> 0)")
    weight_decay: float = key(0.01, "torch.optim.AdamW's default, which FunASR inherits")
    betas: list[float] = key(factory=lambda: [0.9, 0.999], help="AdamW betas")
    eps: float = key(1e-8, "AdamW epsilon")
    warmup_steps: int = key(2500, "FunASR's WarmupLR: peak lr at warmup_steps, then ~1/sqrt(step)")
    warmup_step_tokens: int = key(0, "the tokens an optimizer step held (data.batch_tokens x train.accum_grad) when "
                                  "warmup_steps was chosen: another batch size gets warmup_steps scaled to the same "
                                  "tokens, so the learning rate at each token seen is the recipe's (FunASR's schedule "
                                  "scales exactly); 0: warmup_steps as given")
    grad_clip: float = key(5.0, "0 disables clipping (the grad norm is still measured)")
    lr_scale: str = key("none", "with optim.warmup_step_tokens, what another batch size does to lr: none (lr as "
                        "given) | sqrt (lr x sqrt(step tokens / warmup_step_tokens), the square-root rule for Adam)")

    def __post_init__(self):
        if not self.lr > 0:
            raise ConfigError(f"optim.lr={self.lr}: must be a number above 0 (for example 2e-4)")
        if self.lr_scale not in ("none", "sqrt"):
            raise ConfigError(f"optim.lr_scale={self.lr_scale!r}: use none or sqrt")
        for k in ("weight_decay", "eps", "warmup_steps", "warmup_step_tokens", "grad_clip"):
            if getattr(self, k) < 0:
                raise ConfigError(f"optim.{k}={getattr(self, k)}: must be 0 or more")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas={self.betas}: give two numbers in [0, 1), for example [0.9, 0.999]")


@dataclass
class TrainConfig:
    output_dir: str = key("runs/demo", "the run folder; a relative path is taken from the current folder",
                          path="out")
    device: str = key("auto", "auto | cpu | cuda | cuda:N")
    seed: int = key(1234, "seed of the training randomness (dropout, shuffling, dither)")
    deterministic: bool = key(True, "cuDNN's deterministic convolution algorithms: a rerun gives the same losses")
    max_epochs: int = key(1, "epochs to train (at least 1)")
    max_steps: int = key(0, "0: no limit")
    accum_grad: int = key(1, "batches accumulated into one optimizer step")
    log_every: int = key(10, "metrics are read from the device (one sync) every log_every steps")
    val_every: int = key(0, "steps; 0: only at epoch end")
    val_decode: int = key(0, ">0: also decode the first N validation utterances (greedy) at each validation and before "
                          "the first step: CER/WER into history.jsonl, TensorBoard and the report")
    val_decode_fast: bool = key(False, "fast decoder: static KV cache, CUDA graphs in their own pool (freed after); "
                                "same ids")
    save_every: int = key(0, "steps; 0: only at epoch end")
    keep_n: int = key(3, "keep the n best checkpoints (by keep_metric) plus the latest")
    keep_metric: str = key("loss", "loss | acc (validation)")
    average_best: int = key(0, ">0: at the end, average the N best kept checkpoints (by validation loss/acc, CER with "
                            "val_decode) into checkpoints/avg-best<N>.pt, validate it, export it (FunASR's "
                            "avg_nbest_model)")
    resume: bool = key(False, "continue from the latest checkpoint in output_dir")
    resume_from: str | None = key(None, "continue from this checkpoint file (instead of the latest)",
                                     path="in")
    overwrite: bool = key(False, "start afresh in an output_dir that holds a run, deleting that run's files")
    progress: bool = key(True, "show a progress bar on a terminal")
    tensorboard: bool = key(True, "write TensorBoard scalars to <run>/tb")
    gc_every: int = key(0, ">0: freeze+disable Python's GC after step 1 and collect every N steps (tagged)")
    export: str = key("funasr", "at the end: funasr (a FunASR model folder) | hf (transformers-native) | none")
    export_dtype: str = key("bf16", "bf16 (what FunASR stores) | fp32")
    save_final: bool = key(True, "checkpoint at the end of a run stopped by max_steps (false: measurement runs)")
    parallel: str = key("ddp", "under torchrun: ddp | fsdp (FSDP2 fully_shard of the decoder layers, then the root)")
    async_checkpoint: bool = key(True, "snapshot to host memory, write on a background thread (same file, same bytes)")
    frozen_ref: bool = key(True, "frozen weights written once per run; checkpoints reference them (path + sha256)")
    cpu_threads: int = key(-1, "torch's intra-op threads for the run: -1 torch's default (the count the process had "
                           "when brisk was imported: OMP_NUM_THREADS, else one a core); N: N threads; 0 auto: on the "
                           "CPU the usable cores less data.num_workers, at least 1 (a busy machine slows it less), on "
                           "a GPU one (the host only feeds the device). The process's count is put back after the "
                           "steps")

    def __post_init__(self):
        if self.cpu_threads < -1:
            raise ConfigError(f"train.cpu_threads={self.cpu_threads}: use -1 (torch's default), 0 (auto) or a count")
        if self.keep_metric not in ("loss", "acc"):
            raise ConfigError(f"train.keep_metric={self.keep_metric!r}: use loss or acc")
        if self.accum_grad < 1:
            raise ConfigError("train.accum_grad must be at least 1")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"train.device={self.device}: use auto, cpu, cuda or cuda:N (for example cuda:0)")
        if self.max_steps < 0:
            raise ConfigError(f"train.max_steps={self.max_steps}: must be 0 (no limit) or more")
        if self.max_epochs < 1:
            raise ConfigError(f"train.max_epochs={self.max_epochs}: must be at least 1 (train.max_steps can stop a run earlier)")
        if self.average_best > self.keep_n:
            raise ConfigError(f"train.average_best={self.average_best} averages more checkpoints than the run keeps "
                              f"(train.keep_n={self.keep_n}): raise keep_n to at least {self.average_best}")
        for k in ("log_every", "val_every", "save_every", "gc_every", "keep_n", "average_best"):
            if getattr(self, k) < 0:
                raise ConfigError(f"train.{k}={getattr(self, k)}: must be 0 or more")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(self.export)):  # the model family's formats: the plan checks
            raise ConfigError(f"train.export={self.export!r}: a format of the model family (funasr, hf, ...) or none")
        if self.export_dtype not in ("bf16", "fp32"):
            raise ConfigError(f"train.export_dtype={self.export_dtype!r}: use bf16 or fp32")
        if self.parallel not in ("ddp", "fsdp"):
            raise ConfigError(f"train.parallel={self.parallel!r}: use ddp or fsdp")
        if self.val_decode < 0:
            raise ConfigError(f"train.val_decode={self.val_decode}: give a number of validation utterances (0: off)")
        if self.val_decode_fast and not self.val_decode:
            raise ConfigError("train.val_decode_fast=true decodes nothing without train.val_decode: set train.val_decode=N "
                              "(utterances to decode) or drop train.val_decode_fast")


