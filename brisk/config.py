"""One typed config tree for every brisk command.

A run is described by a YAML file plus ``key.sub=value`` overrides. Every key is checked against the
dataclasses below: an unknown key, a value of the wrong type or a missing file is a ``ConfigError`` that
names the key and says how to fix it. Relative paths in a YAML file are resolved against that file's folder,
relative paths given on the command line against the current directory. The resolved config is saved in
the run folder and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError  # noqa: F401 - re-exported: config errors are raised everywhere
from .formats.funasr import funasr_folder_config, funasr_folder_data_config
from .formats.brisk_keys import OLD_TASK_WORDS, keys_tree, read_keys_file
from .formats.hf import hf_folder_model_config, is_hf_folder
from . import families
from .plan import PRESETS, check_rules, expand_preset


# ----------------------------------------------------------------------------------------------- model
@dataclass
class FrontendConfig:
    """Kaldi fbank + low-frame-rate stacking, as FunASR's WavFrontend computes it."""

    fs: int = 16000  # sample rate (Hz) audio is resampled to
    n_mels: int = 80  # mel bins of the fbank
    frame_length: float = 25.0  # fbank window length, ms
    frame_shift: float = 10.0  # fbank hop, ms
    window: str = "hamming"  # fbank window: hamming | hanning | povey | rectangular | blackman
    lfr_m: int = 7  # low-frame-rate stacking: frames stacked into one
    lfr_n: int = 6  # low-frame-rate stacking: frames advanced between stacks
    dither: float = 1.0  # FunASR's default; 0 makes features deterministic (needed by speed.encoder_cache)
    cmvn_file: str | None = None  # FunASR am.mvn file (mean/variance normalisation); none: no CMVN
    upscale_samples: bool = True  # FunASR scales [-1, 1] audio to the int16 range before fbank

    def __post_init__(self):
        if self.window not in ("hamming", "hanning", "povey", "rectangular", "blackman"):
            raise ConfigError(f"model.frontend.window={self.window!r}: use hamming, hanning, povey, rectangular or blackman")


def _check_every(key: str, k: int) -> None:
    if k < 0:
        raise ConfigError(f"{key}={k}: use 0 (off), 1 (every layer) or k (every k-th layer)")


@dataclass
class EncoderConfig:
    """SANM audio encoder (FunASR's SenseVoiceEncoderSmall)."""

    output_size: int = 512  # encoder width (d_model)
    attention_heads: int = 4  # encoder attention heads
    linear_units: int = 2048  # encoder feed-forward width
    num_blocks: int = 50  # SANM blocks (the first maps LFR features to output_size)
    tp_blocks: int = 20  # SANM 'tp' blocks after the main stack
    kernel_size: int = 11  # FSMN depthwise convolution kernel
    sanm_shift: int = 0  # FSMN kernel shift (0: centred)
    dropout_rate: float = 0.1  # encoder dropout
    attention_dropout_rate: float = 0.0  # encoder attention dropout
    freeze: bool = True  # keep the encoder's weights fixed (no gradients)
    activation_checkpoint: int = 0  # FunASR audio_encoder_conf.activation_checkpoint: 0 off; k: recompute every k-th SANM block in the backward (1: all)

    def __post_init__(self):
        _check_every("model.encoder.activation_checkpoint", self.activation_checkpoint)


@dataclass
class AdaptorConfig:
    """Transformer adaptor between the encoder and the LLM."""

    downsample_rate: int = 1  # frames merged before the adaptor's first linear
    ffn_dim: int = 2048  # adaptor hidden width
    n_layer: int = 2  # Transformer layers in the adaptor
    attention_heads: int = 8  # adaptor attention heads
    dropout_rate: float = 0.0  # adaptor dropout
    use_low_frame_rate: bool = True  # only the first ~L/8 adaptor outputs reach the LLM
    freeze: bool = True  # keep the adaptor's weights fixed (no gradients)

    def __post_init__(self):
        if self.downsample_rate < 1:
            raise ConfigError(f"model.adaptor.downsample_rate={self.downsample_rate}: use 1 or more")
        if self.downsample_rate > 1 and not self.use_low_frame_rate:
            # The prompt holds one audio slot per LFR frame, the adaptor gives one output per downsample_rate frames.
            raise ConfigError(f"model.adaptor.downsample_rate={self.downsample_rate} needs model.adaptor.use_low_frame_rate=true: "
                              "without it the prompt has one audio slot per frame, more than the adaptor's "
                              f"1/{self.downsample_rate} outputs; use downsample_rate=1 or use_low_frame_rate=true")


@dataclass
class CTCConfig:
    """Optional CTC branch (FunASR's ctc_decoder + ctc). Built for checkpoint compatibility; not in the loss."""

    enabled: bool = False  # build the CTC branch
    n_layer: int = 5  # CTC decoder layers
    ffn_dim: int = 2048  # CTC decoder feed-forward width
    dim: int = 512  # CTC decoder width
    downsample_rate: int = 1  # frames merged before the CTC decoder
    vocab_size: int = 60515  # CTC output vocabulary
    freeze: bool = False  # keep the CTC branch's weights fixed


LORA_BIAS = ("none", "all", "lora_only")
LORA_DTYPES = ("", "fp32")  # model.llm.lora.dtype: "" keeps the base weight's dtype


@dataclass
class LoraConfig:
    """LoRA adapters on the LLM's linear layers, as FunASR 1.4.16's Fun-ASR-Nano builds them (llm_conf.use_lora)."""

    enabled: bool = False  # FunASR llm_conf.use_lora: add trainable lora_A/lora_B beside the target layers' weights
    r: int = 16  # FunASR lora_conf.r: the adapters' rank
    alpha: float = 32.0  # FunASR lora_conf.lora_alpha: the update is scaled by alpha / r
    dropout: float = 0.05  # FunASR lora_conf.lora_dropout: dropout on the adapters' input (training only)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])  # FunASR lora_conf.target_modules: names of the LLM's linear layers that get adapters
    only: bool = False  # FunASR lora_only: train nothing but the adapters (every other weight frozen, encoder and adaptor too)
    bias: str = "none"  # FunASR lora_bias, with only=true: none | all (every bias trains) | lora_only (biases of adapted layers train)
    init_path: str | None = None  # FunASR lora_conf.init_param_path: a file whose lora_A/lora_B tensors start the adapters
    dtype: str = ""  # the adapters' dtype: "" the base weight's (FunASR loralib's) | fp32 (PEFT's default: fp32 adapters, gradients and AdamW moments over a bf16 base; see docs/sft.md)

    def __post_init__(self):
        if self.r < 1:
            raise ConfigError(f"model.llm.lora.r={self.r}: use a rank of 1 or more (FunASR's recipe: 16)")
        if not self.alpha > 0:
            raise ConfigError(f"model.llm.lora.alpha={self.alpha}: use a number above 0 (FunASR's recipe: 32)")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.llm.lora.dropout={self.dropout}: use a probability in [0, 1)")
        if not self.target_modules:
            raise ConfigError("model.llm.lora.target_modules is empty: name the linear layers, for example [q_proj, v_proj]")
        if {"lm_head", "embed_tokens"} & set(self.target_modules):
            raise ConfigError(f"model.llm.lora.target_modules={self.target_modules}: lm_head and embed_tokens take no "
                              "adapters here (tied weights; FunASR adapts linear layers); use projection names such as q_proj")
        if self.bias not in LORA_BIAS:
            raise ConfigError(f"model.llm.lora.bias={self.bias!r}: use none, all or lora_only")
        if self.dtype not in LORA_DTYPES:
            raise ConfigError(f"model.llm.lora.dtype={self.dtype!r}: use fp32 (adapters in fp32, as PEFT keeps them) "
                              "or \"\" (the base weight's dtype, FunASR's)")


@dataclass
class LLMConfig:
    """The decoder: any transformers causal LM, from a local folder or an inline config."""

    path: str | None = None  # local folder with config.json (and tokenizer, and optionally weights)
    config: dict = field(default_factory=dict)  # inline transformers config when path is None, else overrides
    dtype: str = "fp32"  # fp32 | bf16 (bf16 runs under autocast, as FunASR does)
    freeze: bool = False  # keep the LLM's weights fixed (no gradients)
    load_weights: bool = True  # load *.safetensors from path when present (a FunASR model.pt overrides them)
    lora: LoraConfig = field(default_factory=LoraConfig)
    activation_checkpoint: int = 0  # FunASR llm_conf.activation_checkpoint: 0 off; k: recompute every k-th decoder layer in the backward (1: all)

    def __post_init__(self):
        if self.dtype not in ("fp32", "bf16"):
            raise ConfigError(f"model.llm.dtype={self.dtype!r}: use fp32 or bf16")
        _check_every("model.llm.activation_checkpoint", self.activation_checkpoint)


@dataclass
class ModelConfig:
    family: str = families.DEFAULT  # the model family (brisk/families): fun_asr_nano | causal_lm | qwen3_asr
    path: str | None = None  # a FunASR model folder (config.yaml, model.pt, the LLM folder); overrides sizes
    init: str | None = None  # weights to start from: FunASR model.pt, brisk checkpoint, or .safetensors
    seed: int = 0  # seed of the random initialisation (before any weights are loaded)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    adaptor: AdaptorConfig = field(default_factory=AdaptorConfig)
    ctc: CTCConfig = field(default_factory=CTCConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


# ------------------------------------------------------------------------------------------------ data
@dataclass
class AutoBatchConfig:
    """Batches sized to the GPU: trial steps at start-up measure peak memory (NeMo's OOMptimizer idea)."""

    enabled: bool = False  # at start-up, pick the largest candidate data.batch_tokens whose trial step fits the memory target (CUDA; cached)
    memory_frac: float = 0.85  # the target: peak allocated memory of a trial step, as a fraction of the GPU's total memory
    candidates: list[int] = field(default_factory=lambda: [2000, 3000, 4000, 6000, 8000, 12000, 16000, 24000, 32000, 48000, 64000])  # data.batch_tokens values tried (data.max_utts scales with them)
    trial_batches: int = 16  # batches of each candidate looked at; the one with the most LLM tokens is the trial step
    cache: str | None = None  # json file of found budgets per (model, GPU, switches); none: ~/.cache/brisk/autobatch.json

    def __post_init__(self):
        if not 0 < self.memory_frac <= 1:
            raise ConfigError(f"data.auto_batch.memory_frac={self.memory_frac}: use a fraction in (0, 1], for example 0.85")
        if not self.candidates or sorted(self.candidates) != self.candidates or self.candidates[0] < 1:
            raise ConfigError(f"data.auto_batch.candidates={self.candidates}: give positive budgets, sorted ascending")
        if self.trial_batches < 1:
            raise ConfigError(f"data.auto_batch.trial_batches={self.trial_batches}: use 1 or more")


@dataclass
class DataConfig:
    train: str | None = None  # FunASR jsonl; causal_lm: a jsonl, parquet file / folder / glob, or datasets save_to_disk folder
    valid: str | None = None  # the same, for validation; none: no validation
    tokenizer: str | None = None  # a tokenizer folder; defaults to model.llm.path
    profile: str | None = None  # a length profile (speech_length/text_length jsonl) for synthetic batches
    batch_tokens: int = 6000  # budget on padded (speech_length + text_length), FunASR's batch_size
    max_utts: int = 10  # utterances a batch at most
    sort_size: int = 1024  # utterances sorted by length together before batching
    shuffle: bool = True  # shuffle the batches every epoch (fixed seed)
    num_workers: int = 2  # DataLoader worker processes (0: load in the training process)
    pin_memory: bool = True  # pinned host memory for faster copies to the GPU
    max_speech_length: int = 8000  # 10 ms frames; longer utterances are bad input
    max_text_length: int = 2048  # tokens
    max_token_length: int = 1500  # LLM tokens of one utterance's prompt + answer
    skip_bad: bool = False  # skip (and count) malformed lines and unreadable audio instead of stopping
    sys_prompt: bool = True  # FunASR dataset_conf.sys_prompt
    do_think: bool = True  # FunASR dataset_conf.do_think: False appends an empty <think></think>
    multiturn_max: int = 5  # FunASR dataset_conf.multiturn_num_max: turns kept of a multi-turn sample
    # FunASR dataset_conf.prompt_classes / prompt_conf, read from model.path's folder (the real Fun-ASR-Nano-2512
    # config.yaml sets MultiContextPrompt): a context header before the first user prompt.
    prompt_class: str | None = None  # MultiContextPrompt (FunASR's context header) or null (no header)
    prompt_conf: dict = field(default_factory=dict)  # FunASR prompt_conf: use_hotwords, use_hist, ... (see docs/export.md)
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)
    max_len: int = 2048  # causal_lm: tokens of one conversation at most (see data.overlong)
    overlong: str = "truncate"  # causal_lm: a conversation over data.max_len is truncated (its end dropped) or skipped
    chat_template: str | None = None  # causal_lm: a jinja chat template with {% generation %} markers; none: the tokenizer's own, or the training twin of a known one
    train_split: str | None = None  # a split of data.train where its layout has splits (train_sft of ultrachat_200k's parquet folder, a DatasetDict folder)
    valid_split: str | None = None  # a split of data.valid (test_sft); data.valid may be the same folder as data.train
    cache_dir: str | None = None  # prepared data (tokenised chats, indexed speech lists), reused by later runs; none: .brisk-cache beside train.output_dir
    prepare_workers: int = 0  # processes that tokenise / index the data the first time; 0: one a CPU core
    check_audio: bool = True  # stat every audio file of a speech list once, when it is indexed; false: the list is known good (logged)

    def __post_init__(self):
        if self.overlong not in ("truncate", "skip"):
            raise ConfigError(f"data.overlong={self.overlong!r}: use truncate or skip")
        if self.max_len < 2:
            raise ConfigError(f"data.max_len={self.max_len}: must be at least 2 tokens")
        if self.prompt_class not in (None, "MultiContextPrompt"):
            raise ConfigError(f"data.prompt_class={self.prompt_class!r}: brisk reproduces MultiContextPrompt (or null: no header)")
        if self.prepare_workers < 0:
            raise ConfigError(f"data.prepare_workers={self.prepare_workers}: use 0 (one a CPU core) or a count")
        for k in ("batch_tokens", "max_utts", "sort_size"):
            if getattr(self, k) < 1:
                raise ConfigError(f"data.{k}={getattr(self, k)}: must be at least 1")


# ------------------------------------------------------------------------------------------- training
@dataclass
class OptimConfig:
    lr: float = 2e-4  # peak learning rate of AdamW (> 0)
    weight_decay: float = 0.01  # torch.optim.AdamW's default, which FunASR inherits
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    warmup_steps: int = 2500  # FunASR's WarmupLR: peak lr at warmup_steps, then ~1/sqrt(step)
    warmup_step_tokens: int = 0  # the tokens an optimizer step held (data.batch_tokens x train.accum_grad) when warmup_steps was chosen: another batch size gets warmup_steps scaled to the same tokens, so the learning rate at each token seen is the recipe's (FunASR's schedule scales exactly); 0: warmup_steps as given
    grad_clip: float = 5.0  # 0 disables clipping (the grad norm is still measured)

    def __post_init__(self):
        if not self.lr > 0:
            raise ConfigError(f"optim.lr={self.lr}: must be a number above 0 (for example 2e-4)")
        for k in ("weight_decay", "eps", "warmup_steps", "warmup_step_tokens", "grad_clip"):
            if getattr(self, k) < 0:
                raise ConfigError(f"optim.{k}={getattr(self, k)}: must be 0 or more")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas={self.betas}: give two numbers in [0, 1), for example [0.9, 0.999]")


@dataclass
class TrainConfig:
    output_dir: str = "runs/demo"  # the run folder; a relative path is taken from the current folder
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 1234  # seed of the training randomness (dropout, shuffling, dither)
    deterministic: bool = True  # cuDNN's deterministic convolution algorithms: a rerun gives the same losses
    max_epochs: int = 1  # epochs to train (at least 1)
    max_steps: int = 0  # 0: no limit
    accum_grad: int = 1  # batches accumulated into one optimizer step
    log_every: int = 10  # metrics are read from the device (one sync) every log_every steps
    val_every: int = 0  # steps; 0: only at epoch end
    val_decode: int = 0  # >0: also decode the first N validation utterances (greedy) at each validation and
    #                      before the first step: CER/WER into history.jsonl, TensorBoard and the report
    val_decode_fast: bool = False  # fast decoder: static KV cache, CUDA graphs in their own pool (freed after); same ids
    save_every: int = 0  # steps; 0: only at epoch end
    keep_n: int = 3  # keep the n best checkpoints (by keep_metric) plus the latest
    keep_metric: str = "loss"  # loss | acc (validation)
    average_best: int = 0  # >0: at the end, average the N best kept checkpoints (by validation loss/acc, CER with
    #                        val_decode) into checkpoints/avg-best<N>.pt, validate it, export it (FunASR's avg_nbest_model)
    resume: bool = False  # continue from the latest checkpoint in output_dir
    resume_from: str | None = None  # continue from this checkpoint file (instead of the latest)
    overwrite: bool = False  # start afresh in an output_dir that holds a run, deleting that run's files
    progress: bool = True  # show a progress bar on a terminal
    tensorboard: bool = True  # write TensorBoard scalars to <run>/tb
    gc_every: int = 0  # >0: freeze+disable Python's GC after step 1 and collect every N steps (tagged)
    export: str = "funasr"  # at the end: funasr (a FunASR model folder) | hf (transformers-native) | none
    export_dtype: str = "bf16"  # bf16 (what FunASR stores) | fp32
    save_final: bool = True  # checkpoint at the end of a run stopped by max_steps (false: measurement runs)
    parallel: str = "ddp"  # under torchrun: ddp | fsdp (FSDP2 fully_shard of the decoder layers, then the root)
    async_checkpoint: bool = True  # snapshot to host memory, write on a background thread (same file, same bytes)
    frozen_ref: bool = True  # frozen weights written once per run; checkpoints reference them (path + sha256)
    cpu_threads: int = -1  # torch's intra-op threads for the run: -1 torch's default (the count the process had when
    #                        brisk was imported: OMP_NUM_THREADS, else one a core); N: N threads; 0 auto: on the CPU
    #                        the usable cores less data.num_workers, at least 1 (a busy machine slows it less), on a
    #                        GPU one (the host only feeds the device). The process's count is put back after the steps

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


@dataclass
class SpeedConfig:
    """Opt-in speed switches. Every default is torch's own eager computation. Which switches go together is
    decided in one place, brisk/plan.py."""

    preset: str | None = None  # fast: the measured-best set of switches for the device (packing, CUDA graphs, frozen bf16 encoder, compile, fused AdamW, label_head, fresh_grads, fused projections); single speed.* keys override it
    sdpa_backends: list[str] | None = None  # e.g. [flash, efficient, math]; None: torch's own choice
    compile: bool = False  # torch.compile the LLM decoder (CUDA inputs only)
    compile_scope: str = "layer"  # layer: each decoder layer; stack: the whole decoder stack
    compile_dynamic: bool | None = True  # passed to torch.compile; True: one graph for all lengths; None: a static graph first, a dynamic one at the second length; False: a static decoder-layer graph a row length (encoder blocks stay dynamic)
    compile_on_error: str = "warn"  # warn: fall back to eager; raise
    compile_encoder: bool = True  # with frozen_eval: compile the frozen encoder's blocks too (fewer kernels a step; one more compile at start-up)
    inductor_cache_dir: str | None = None  # persistent Inductor/Triton cache; None: $TORCHINDUCTOR_CACHE_DIR or ~/.cache/brisk/inductor
    fused_adamw: bool = False  # torch's fused AdamW kernel (CUDA)
    tf32: bool = False  # TF32 matmuls/convolutions for the fp32 parts (process-wide, restored at the end)
    frozen_eval: bool = False  # frozen modules in eval mode (no dropout), run without autograd
    packing: bool = False  # one row of tokens per batch, per-utterance positions, varlen attention
    pack_buckets: list[int] = field(default_factory=lambda: [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 2560, 3072, 4096])  # packed row lengths (tokens)
    speech_buckets: list[int] = field(default_factory=lambda: [64, 96, 128, 160, 192, 256, 320, 384, 512])  # padded LFR frame counts of the audio
    cuda_graph: bool = False  # capture each bucket's whole step once, replay it after
    graph_capture: str = "ahead"  # with cuda_graph: ahead: every bucket's graph before the first step; seen: a bucket's graph at the first batch that reaches it (no compile or capture for buckets the data never reaches; that first step is slower, and the slow-step log says why)
    encoder_cache: bool = False  # reuse frozen encoder+adaptor outputs per utterance across epochs
    encoder_dtype: str = "fp32"  # fp32 | bf16: dtype of the frozen encoder and adaptor
    label_head: bool = False  # LM head + loss on the labelled positions only (chunked; no full logits)
    label_rows_frac: float = 0.5  # with cuda_graph: rows gathered per bucket, as a fraction of its length
    label_head_recompute: bool = False  # with label_head: each chunk's head and loss run again in the backward instead of keeping every chunk's fp32 log-probabilities (rows x vocab x 4 bytes) for it; the same gradients, one more head GEMM a step; for large vocabularies and batches under a memory limit
    fresh_grads: bool = False  # with cuda_graph: backward writes new gradients, no zeroing + adding into buffers
    fuse_projections: bool = False  # one GEMM for q/k/v and one for gate/up in each decoder layer (same parameters)
    flex_attention: bool = False  # with packing and compile (CUDA): the LLM's attention on a packed row as FlexAttention with a document-causal block mask built once a forward, in place of varlen_attn (brisk/speed/flex.py)
    audio_varlen: bool = False  # model.family=qwen3_asr: the audio tower's windowed attention as one call a layer for all windows (varlen_attn on CUDA in bf16), no host sync per layer
    linear_attention_batched: bool = False  # causal_lm, packing: a packed row's sequences go through each Gated DeltaNet layer as one right-padded batch (torch path; exact for real tokens)
    fla_kernels: bool = False  # causal_lm: flash-linear-attention's Triton kernels for Gated DeltaNet layers (Qwen3.5), packed rows too (CUDA, fla-core)
    fla_gated_norm: bool = False  # causal_lm: the gated RMSNorm of Qwen3.5's Gated DeltaNet layers (norm(x) * weight * silu(gate)) as flash-linear-attention's fused kernel, same parameters (CUDA, fla-core)
    liger: bool = False  # liger-kernel's fused RMSNorm and SwiGLU in the decoder on the same parameters (CUDA, liger-kernel; speech and chat)
    liger_loss: bool = False  # causal_lm: liger-kernel's fused linear cross-entropy, no full logits (CUDA; not with label_head)
    optimizer_in_backward: bool = False  # each decoder layer updated by fused AdamW as soon as its gradients are final, on a side stream under the rest of the backward (same optimizer state; needs fused_adamw, one rank; a non-finite layer skips itself and the layers below it)
    clip_by_previous_norm: bool = False  # with optimizer_in_backward and optim.grad_clip > 0: clip by the last finite global norm of an earlier step (this step's is known only after the layers' updates); the first step of a run is not clipped (a checkpoint keeps the norm: a resume clips as the run would have)

    def __post_init__(self):
        valid = {"flash", "efficient", "math", "cudnn"}
        if self.sdpa_backends is not None:
            bad = [b for b in self.sdpa_backends if b not in valid]
            if bad or not self.sdpa_backends:
                raise ConfigError(f"speed.sdpa_backends={self.sdpa_backends}: choose from {sorted(valid)}")
        if self.compile_scope not in ("layer", "stack"):
            raise ConfigError(f"speed.compile_scope={self.compile_scope!r}: use layer or stack")
        if self.compile_on_error not in ("warn", "raise"):
            raise ConfigError(f"speed.compile_on_error={self.compile_on_error!r}: use warn or raise")
        if self.graph_capture not in ("ahead", "seen"):
            raise ConfigError(f"speed.graph_capture={self.graph_capture!r}: use ahead or seen")
        if self.encoder_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"speed.encoder_dtype={self.encoder_dtype!r}: use fp32 or bf16")
        if sorted(self.pack_buckets) != self.pack_buckets or sorted(self.speech_buckets) != self.speech_buckets:
            raise ConfigError("speed.pack_buckets and speed.speech_buckets must be sorted ascending")
        if not 0 < self.label_rows_frac <= 1:
            raise ConfigError(f"speed.label_rows_frac={self.label_rows_frac}: use a fraction in (0, 1]")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(f"speed.preset={self.preset!r}: use one of {', '.join(sorted(PRESETS))} (or leave it unset)")


@dataclass
class DiagnoseConfig:
    slow_factor: float = 3.0  # a step over slow_factor x the running median is explained at once
    warmup_steps: int = 3  # steps before the detector starts judging
    window: int = 50  # steps in the running median
    report: bool = True  # write the report (plots + markdown) at the end of `brisk train`


@dataclass
class ProbeConfig:
    enabled: bool = False  # record per-step numbers to probe.rank<r>.jsonl (for `brisk probe compare`)
    param_norm_steps: list[int] = field(default_factory=lambda: [1, 2, 10, 50, 100, 200, 300, 500, 1000])  # steps at which parameter and per-module gradient norms are recorded


@dataclass
class BenchArm:
    name: str = "arm"  # the arm's name in the table
    overrides: list[str] = field(default_factory=list)  # key=value overrides of this arm


@dataclass
class BenchConfig:
    arms: list[BenchArm] = field(default_factory=list)  # the arms to compare: list of {name, overrides}
    runs: int = 2  # runs an arm, interleaved A B A B
    steps: int = 40  # timed steps a run
    warmup: int = 5  # steps a run before timing (shape plans, compile)
    batches: int = 0  # distinct batches in the stream (0: steps + warmup)
    profile_steps: int = 3  # steps under torch.profiler for the launch count


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    # The family's own section (Family.config), by family name: written in YAML as a top-level section of that
    # name, never as "sections" (brisk.families.section(cfg) reads it)
    sections: dict = field(default_factory=dict, metadata={"internal": True})

    def __post_init__(self):
        families.get(self.model.family)  # an unknown family: one line listing them

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(out.pop("sections"))  # each family section at the top level, as it was written
        return out


# Keys that moved into a family's own section: old dotted key -> new one. An older config or run folder that
# gives one is read as the new key, with one line in the log.
MOVED_KEYS = {"data.language": "qwen3_asr.language"}


def _moved(tree: dict, where) -> dict:
    """``tree`` with each MOVED_KEYS key of an older config read as its new key: a value given for the family
    that now owns the key goes into its section (one line in the log); an unset one (every run folder an older
    brisk saved holds them all) or one for another family, which never read it, is dropped."""
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if key not in (tree.get(section) or {}):
            continue
        value = tree[section][key]
        tree = {**tree, section: {k: v for k, v in tree[section].items() if k != key}}
        owner, new_key = new.split(".")
        if value is None or ((tree.get("model") or {}).get("family") or families.DEFAULT) != owner:
            continue
        import logging

        logging.getLogger("brisk").info("config: %s: %s is now %s (read as that)", where, old, new)
        tree = {**tree, owner: {new_key: value, **(tree.get(owner) or {})}}
    return tree


def _without_task(tree: dict, where) -> dict:
    """The old top-level ``task:`` is no longer read. A run folder saved by an older brisk holds it beside its
    model.family, which says the same: it is dropped. Alone, or naming another family, it is one line."""
    if "task" not in tree:
        return tree
    word = tree["task"]
    meant = OLD_TASK_WORDS.get(word)
    if meant is not None and (tree.get("model") or {}).get("family") == meant:
        return {k: v for k, v in tree.items() if k != "task"}
    instead = f"model.family: {meant}" if meant else f"model.family (one of {', '.join(families.names())})"
    shipped = {"causal_lm": "; its shipped configs start at sft_demo", "fun_asr_nano": "; its demo config is demo"}
    raise ConfigError(f"{where}: task: {word} is no longer read; write {instead} instead{shipped.get(meant, '')}")


# Keys that hold file or folder paths, resolved against the folder of the YAML file they appear in.
PATH_KEYS = {
    "model.path", "model.init", "model.frontend.cmvn_file", "model.llm.path", "model.llm.lora.init_path",
    "data.train", "data.valid", "data.tokenizer", "data.profile", "data.chat_template",
    "train.output_dir", "train.resume_from", "speed.inductor_cache_dir", "data.auto_batch.cache",
}
# Run folders are where the user is, not where the config file is: a relative train.output_dir, in a YAML
# file too, is taken from the current folder (so two checkouts or two shells never share a run folder).
CWD_KEYS = {"train.output_dir"}
# Paths that must exist when given (outputs and caches are created).
MUST_EXIST = PATH_KEYS - {"train.output_dir", "speed.inductor_cache_dir", "data.auto_batch.cache"}


# ------------------------------------------------------------------------------------------- loading
def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def optional_keys(cls: Any = None, prefix: str = "") -> list[str]:
    """Dotted keys whose type admits None (--help-config prints their unset default as none)."""
    out = []
    for name, tp in typing.get_type_hints(cls or Config).items():
        key = f"{prefix}.{name}" if prefix else name
        if dataclasses.is_dataclass(tp):
            out += optional_keys(tp, key)
        elif typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
            out.append(key)
    return out


def _nulls(tree: dict) -> None:
    """`none` (as --help-config prints an unset default) -> null, for every key that may be null; before the
    paths are resolved, so data.valid=none is no file named none."""
    for key in optional_keys():
        node, parts = tree, key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and _none_word(node.get(parts[-1])):
            node[parts[-1]] = None


def _none_word(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "none"


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert) ``value`` against the annotation ``tp``; raise naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if (value is None or _none_word(value)) and type(None) in args:
            return None  # `none`, as --help-config prints an unset default, means null
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return build(tp, value, key)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (tuple, list)):
            return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{key}: expected a list, got {value!r} (write it as [a, b, c])")
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Any:
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def build(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a dict, refusing unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; valid keys under {prefix or 'the top level'}: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as e:  # pragma: no cover - dataclass signature errors
        raise ConfigError(f"{prefix}: {e}") from e


def _known_path(key: str) -> bool:
    """Is ``key`` (dotted) a valid leaf or node of Config? Free-form dicts accept any sub-key."""
    cls: Any = Config
    parts = key.split(".")
    if parts[0] == "sections":
        return False
    own = _family_sections()
    if parts[0] in own:
        cls, parts = own[parts[0]], parts[1:]
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        tp = hints[part]
        if tp is dict:
            return True  # e.g. model.llm.config.hidden_size
        cls = tp
    return True


def _family_sections() -> dict[str, type]:
    """{family name: its config dataclass} of every registered family that has keys of its own."""
    return {f.name: f.config for f in families.all_families() if f.config is not None}


def build_config(tree: dict) -> Config:
    """A Config from a merged tree: the shared sections, then the run's family's own (``Config.sections``)."""
    rest, sections = _with_sections(tree)
    cfg = build(Config, rest)
    cfg.sections = sections
    return cfg


def _with_sections(tree: dict) -> tuple[dict, dict]:
    """The tree without the family sections, and those sections built: only the run's family's may be given."""
    own = _family_sections()
    given = {k: tree[k] for k in tree if k in own}
    rest = {k: v for k, v in tree.items() if k not in own}
    family = families.get((rest.get("model") or {}).get("family") or families.DEFAULT).name
    for name in given:
        if name != family:
            raise ConfigError(f"{name}: the config section of model.family={name}, but model.family is {family}")
    built = {}
    if family in own:
        data = given.get(family) or {}
        if not isinstance(data, dict):
            keys = ", ".join(f.name for f in dataclasses.fields(own[family]))
            raise ConfigError(f"{family}: give a mapping of its keys ({keys})")
        built[family] = build(own[family], data, prefix=family)
    return rest, built


def leaf_keys(cls: Any = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the config tree (a free-form mapping is one leaf), the families' own sections
    included."""
    out = []
    if cls is None:
        for name, section in _family_sections().items():
            out += leaf_keys(section, name)
    for name, tp in typing.get_type_hints(cls or Config).items():
        if cls is None and name == "sections":
            continue  # written as the families' own sections
        key = f"{prefix}.{name}" if prefix else name
        out += leaf_keys(tp, key) if dataclasses.is_dataclass(tp) else [key]
    return out


def did_you_mean(key: str) -> str:
    """' (did you mean x.y?)' for a misspelt dotted key, or ''."""
    close = difflib.get_close_matches(key, leaf_keys(), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        if _known_path(text.strip()):
            raise ConfigError(f"{text} has no value: did you mean key=value, for example {text.strip()}=VALUE?")
        raise ConfigError(f"override {text!r} is not key=value: did you mean key=value (for example train.max_steps=100)?")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if key == "task":
        _without_task({"task": raw.strip()}, f"override {text!r}")
    if key in MOVED_KEYS:
        raise ConfigError(f"override {text!r}: {key} is now {MOVED_KEYS[key]}; give {MOVED_KEYS[key]}={raw.strip()}")
    if not _known_path(key):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        raise ConfigError(f"unknown config key {key} (from override {text!r}){did_you_mean(key)}; "
                          "`brisk train --help-config` lists every key"
                          + (f" (those under {parent} too)" if parent and _known_path(parent) else ""))
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({getattr(e, 'problem', None) or e}); "
                          "quote it: key='value'") from None
    return key, value


def yaml_error(e: yaml.YAMLError) -> str:
    """':line:column: not valid YAML: what PyYAML found' (one line; PyYAML's own message takes eight)."""
    mark = getattr(e, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    what = " ".join(x for x in (getattr(e, "problem", None), getattr(e, "context", None)) if x) or str(e).splitlines()[0]
    return f"{where}: not valid YAML: {what}"


def _resolve_paths(tree: dict, base: Path, keys: set[str]) -> None:
    for key in keys:
        node = tree
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict) and isinstance(node.get(parts[-1]), str) and not _none_word(node[parts[-1]]):
            p = Path(node[parts[-1]]).expanduser()
            full = p if p.is_absolute() else (base / p).resolve()
            if not full.exists() and not p.is_absolute():  # data/demo/... as the docs write it: the shipped set
                full = shipped_data(p) or full
            node[parts[-1]] = str(full)


def _flatten(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        out.add(key)
        if isinstance(v, dict):
            out |= _flatten(v, key)
    return out


SHIPPED = Path(__file__).resolve().parent / "configs"  # the configs/ of the repository, shipped in the package


def shipped_config(name: str) -> Path | None:
    """A config shipped with brisk, by name (``fun_asr_nano`` or ``fun_asr_nano.yaml``); None if there is none."""
    if "/" in name or "\\" in name:
        return None
    path = SHIPPED / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    return path if path.is_file() else None


BUNDLED = Path(__file__).resolve().parent / "bundled"  # the repository's data/: the demo sets, shipped too


def shipped_data(path: str | Path) -> Path | None:
    """``data/demo/...`` or ``data/chat_demo/...`` (as the docs write them) -> the file shipped with brisk, when the
    path names one; None otherwise. Used only where the path does not exist as given, so a user's own data/
    always wins."""
    parts = Path(path).parts
    if len(parts) < 2 or parts[0] != "data":
        return None
    found = BUNDLED.joinpath(*parts[1:])
    return found if found.exists() else None


def data_path(path: str) -> str:
    """A data file named on the command line: as given if it exists, else the shipped file of that name."""
    if Path(path).exists():
        return path
    found = shipped_data(path)
    return str(found) if found is not None else path


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def read_yaml(path: Path, _seen: tuple = ()) -> dict:
    """A config file as a dict, its paths resolved; ``include: other.yaml`` pulls in a base file first."""
    if not path.is_file():
        if not _seen and path.parent == Path(".") and path.suffix in ("", ".yaml", ".yml"):  # maybe a shipped name
            import difflib

            close = difflib.get_close_matches(path.stem, shipped_names(), n=1, cutoff=0.75)
            raise ConfigError(f"config file {path} does not exist, nor a shipped config of that name "
                              f"({', '.join(shipped_names())})" + (f"; did you mean {close[0]}?" if close else ""))
        shipped = path.stem if not _seen and path.stem in shipped_names() else None  # e.g. configs/x.yaml elsewhere
        raise ConfigError(f"config file {path} does not exist" +
                          (f" here; brisk ships one of that name: brisk train {shipped}" if shipped else ""))
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: include cycle")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 ({e.reason} at byte {e.start + 1}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{yaml_error(e)}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, data, train, ...)")
    _nulls(tree)
    _resolve_paths(tree, path.parent.resolve(), (PATH_KEYS - CWD_KEYS) & _flatten(tree))
    base = tree.pop("include", None)
    if base is not None:
        base_path = Path(base) if Path(base).is_absolute() else path.parent / base
        if not base_path.is_file():  # include: demo (a shipped config's name), as `brisk train demo` takes it
            shipped = shipped_config(str(base)) if Path(str(base)).parent == Path(".") else None
            if shipped is None:
                raise ConfigError(f"{path}: include: {base}: no file {base_path}, nor a shipped config of that "
                                  f"name ({', '.join(shipped_names())})")
            base_path = shipped
        tree = _merge(read_yaml(base_path, _seen + (path.resolve(),)), tree)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, check_paths: bool = True) -> Config:
    """YAML file (optional) + dotted overrides -> a checked ``Config``."""
    if path is not None and not Path(path).exists():
        path = shipped_config(str(path)) or path  # a shipped config's bare name, as `brisk train demo` takes it
    tree: dict = read_yaml(Path(path)) if path is not None else {}
    tree = _moved(_without_task(tree, path), path)
    unknown = sorted(k for k in _flatten(tree) if not _known_path(k))
    if unknown:  # named with its file here; build() below no longer knows where a key came from
        raise ConfigError(f"{path}: unknown config key {unknown[0]}{did_you_mean(unknown[0])}; "
                          "`brisk train --help-config` lists every key")
    cli: dict = {}
    for text in overrides or []:
        key, value = parse_override(text)
        _set_dotted(cli, key, value)
    _nulls(cli)
    _resolve_paths(cli, Path.cwd(), PATH_KEYS & _flatten(cli))
    folder = (_merge(tree, cli).get("model") or {}).get("path")
    if folder:
        tree = _with_model_folder(tree, folder)
    merged = expand_preset(_merge(tree, cli))
    _resolve_paths(merged, Path.cwd(), CWD_KEYS & _flatten(merged))
    cfg = build_config(merged)
    check_rules(cfg)  # which switches go together: before any model exists
    if not Path(cfg.train.output_dir).is_absolute():  # the default
        cfg.train.output_dir = str((Path.cwd() / cfg.train.output_dir).resolve())
    if check_paths:
        check_files(cfg)
    if check_paths or cfg.model.llm.path is None:
        from .config_llm import check_llm_config

        check_llm_config(cfg.model.llm)
    return cfg


POLICY_KEYS = {("encoder", "freeze"), ("adaptor", "freeze"), ("ctc", "freeze"), ("llm", "freeze"), ("llm", "dtype"),
               ("llm", "lora"), ("llm", "activation_checkpoint"), ("encoder", "activation_checkpoint")}


def _with_model_folder(tree: dict, folder: str) -> dict:
    """A FunASR model folder defines the architecture: its sizes, front end and LLM folder replace those of the
    YAML file (whose inline LLM config is dropped). Training policy (freeze flags, LLM dtype) and the data keys
    of its dataset_conf (prompt class, sys_prompt, ...) set in the YAML win over the folder's; command-line
    overrides win over both."""
    if is_hf_folder(folder):  # a transformers-native Fun-ASR-Nano folder: sizes and LLM config from config.json
        found = hf_folder_model_config(folder)
        tree = _merge(tree, {"model": found})
        tree["model"]["llm"].update(path=None, config=found["llm"]["config"])
        return _with_export_keys(_merge({"data": {"tokenizer": str(folder)}}, tree), folder)
    return _with_export_keys(_with_funasr_folder(tree, folder), folder)


def _with_export_keys(tree: dict, folder: str) -> dict:
    """A brisk export's brisk.json (brisk.formats.brisk_keys): its front end and splicing win over the YAML, as
    the folder's sizes do; its prompt keys and LLM dtype are defaults the YAML may change."""
    found = read_keys_file(folder)
    if found is None:
        return tree
    keys = keys_tree(found["keys"])
    model = keys.get("model", {})
    policy = {"llm": model.pop("llm", {})}
    tree = _merge(tree, {"model": model})
    return _merge({"model": policy, "data": keys.get("data", {})}, tree)


def _with_funasr_folder(tree: dict, folder: str) -> dict:
    found = funasr_folder_config(folder)
    policy: dict = {}
    for part, key in POLICY_KEYS:
        if key in found.get(part, {}):
            policy.setdefault(part, {})[key] = found[part].pop(key)
    tree = _merge(tree, {"model": found})
    if "path" in found.get("llm", {}):
        tree["model"]["llm"]["config"] = {}
    return _merge({"model": policy, "data": funasr_folder_data_config(folder)}, tree)


def _merge(a: dict, b: dict) -> dict:
    """``b`` over ``a``, dict by dict: also inside model.llm.config's free-form keys, so that
    ``model.llm.config.audio_config.n_window_infer=100`` changes that one key of a nested sub-config."""
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def get_dotted(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def check_files(cfg: Config) -> None:
    for key in sorted(MUST_EXIST):
        value = get_dotted(cfg, key)
        if value is None:
            continue
        if any(c in str(value) for c in "*?[") and key in ("data.train", "data.valid"):  # chat data: a glob of files
            if not glob.glob(os.path.expanduser(str(value)), recursive=True):
                raise ConfigError(f"{key}: {value} matches no files")
        elif not Path(value).exists():
            raise ConfigError(f"{key}: {value} does not exist")


def config_changes(saved: dict, now: dict, ignore: set[str] = frozenset()) -> list[str]:
    """'key: old -> new' for every dotted key that differs, a key one side lacks included (keys in ``ignore``
    aside). The keys are brisk.formats.run_config.flat's, as a resume's refusals name them."""
    from .formats.run_config import flat

    a, b = flat(saved), flat(now)
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key) == b.get(key):
            continue
        out.append(f"{key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}")
    return out



def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
