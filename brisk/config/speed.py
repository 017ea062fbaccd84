"""The speed switches (every default torch's eager computation), the slow-step detector, the probe, the bench."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..plan import check_preset
from ..keys import key


@dataclass
class SpeedConfig:
    """Opt-in speed switches. Every default is torch's own eager computation. Which switches go together is
    decided in one place, brisk/plan.py."""

    preset: str | None = key(None, "fast: the measured-best set of switches for the device (packing, CUDA graphs, "
                             "frozen bf16 encoder, compile, fused AdamW, label_head, fresh_grads, fused projections); "
                             "single speed.* keys override it")
    sdpa_backends: list[str] | None = key(None, "e.g. [flash, efficient, math]; None: torch's own choice")
    compile: bool = key(False, "torch.compile the LLM decoder (CUDA inputs only)")
    compile_scope: str = key("layer", "layer: each decoder layer; stack: the whole decoder stack")
    compile_dynamic: bool | None = key(True, "passed to torch.compile; True: one graph for all lengths; None: a static "
                                       "graph first, a dynamic one at the second length; False: a static decoder-layer "
                                       "graph a row length (encoder blocks stay dynamic)")
    compile_on_error: str = key("warn", "warn: fall back to eager; raise")
    compile_encoder: bool = key(True, "compile the encoder's blocks too (fewer kernels a step; one more compile at "
                                "start-up): a frozen one with frozen_eval, a training one where the step graph holds it")
    inductor_cache_dir: str | None = key(None, "persistent Inductor/Triton cache; None: $TORCHINDUCTOR_CACHE_DIR or "
                                         "~/.cache/brisk/inductor", path="out")
    fused_adamw: bool = key(False, "torch's fused AdamW kernel (CUDA)")
    tf32: bool = key(False, "TF32 matmuls/convolutions for the fp32 parts (process-wide, restored at the end)")
    frozen_eval: bool = key(False, "frozen modules in eval mode (no dropout), run without autograd")
    packing: bool = key(False, "one row of tokens per batch, per-utterance positions, varlen attention")
    pack_buckets: list[int] = key(factory=lambda: [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 2560, 3072, 4096],
                                  help="packed row lengths (tokens)")
    speech_buckets: list[int] = key(factory=lambda: [64, 96, 128, 160, 192, 256, 320, 384, 512],
                                    help="padded LFR frame counts of the audio")
    cuda_graph: bool = key(False, "capture each bucket's whole step once, replay it after")
    graph_capture: str = key("ahead", "with cuda_graph: ahead: every bucket's graph before the first step; seen: a "
                             "bucket's graph at the first batch that reaches it (no compile or capture for buckets the "
                             "data never reaches; that first step is slower, and the slow-step log says why)")
    encoder_cache: bool = key(False, "reuse frozen encoder+adaptor outputs per utterance across epochs")
    encoder_dtype: str = key("fp32", "fp32 | bf16: dtype of the frozen encoder and adaptor")
    label_head: bool = key(False, "LM head + loss on the labelled positions only (chunked; no full logits)")
    label_rows_frac: float = key(0.5, "with cuda_graph: rows gathered per bucket, as a fraction of its length")
    label_head_recompute: bool = key(False, "with label_head: each chunk's head and loss run again in the backward "
                                     "instead of keeping every chunk's fp32 log-probabilities (rows x vocab x 4 bytes) "
                                     "for it; the same gradients, one more head GEMM a step; for large vocabularies "
                                     "and batches under a memory limit")
    fresh_grads: bool = key(False, "with cuda_graph: backward writes new gradients, no zeroing + adding into buffers")
    fuse_projections: bool = key(False, "one GEMM for q/k/v and one for gate/up in each decoder layer (same "
                                 "parameters)")
    flex_attention: bool = key(False, "with packing and compile (CUDA): the LLM's attention on a packed row as "
                               "FlexAttention with a document-causal block mask built once a forward, in place of "
                               "varlen_attn (brisk/speed/flex.py)")
    audio_varlen: bool = key(False, "model.family=qwen3_asr: the audio tower's windowed attention as one call a layer "
                             "for all windows (varlen_attn on CUDA in bf16), no host sync per layer")
    linear_attention_batched: bool = key(False, "causal_lm, packing: a packed row's sequences go through each Gated "
                                         "DeltaNet layer as one right-padded batch (torch path; exact for real tokens)")
    fla_kernels: bool = key(False, "causal_lm: flash-linear-attention's Triton kernels for Gated DeltaNet layers "
                            "(Qwen3.5), packed rows too (CUDA, fla-core)")
    fla_gated_norm: bool = key(False, "causal_lm: the gated RMSNorm of Qwen3.5's Gated DeltaNet layers (norm(x) * "
                               "weight * silu(gate)) as flash-linear-attention's fused kernel, same parameters (CUDA, "
                               "fla-core)")
    liger: bool = key(False, "liger-kernel's fused RMSNorm and SwiGLU in the decoder on the same parameters (CUDA, "
                      "liger-kernel; speech and chat)")
    liger_loss: bool = key(False, "causal_lm: liger-kernel's fused linear cross-entropy, no full logits (CUDA; not "
                           "with label_head)")
    float8: bool = key(False, "causal_lm: the decoder layers' linear layers as float8 GEMMs in training (torchao, "
                       "rowwise scales; compute capability 8.9+); moves the numbers: probe it against bf16")
    optimizer_in_backward: bool = key(False, "each decoder layer updated by fused AdamW as soon as its gradients are "
                                      "final, on a side stream under the rest of the backward (same optimizer state; "
                                      "needs fused_adamw, one rank; a non-finite layer skips itself and the layers "
                                      "below it)")
    clip_by_previous_norm: bool = key(False, "with optimizer_in_backward and optim.grad_clip > 0: clip by the last "
                                      "finite global norm of an earlier step (this step's is known only after the "
                                      "layers' updates); the first step of a run is not clipped (a checkpoint keeps "
                                      "the norm: a resume clips as the run would have)")

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
        if self.preset is not None:
            check_preset(self.preset)


@dataclass
class DiagnoseConfig:
    slow_factor: float = key(3.0, "a step over slow_factor x the running median is explained at once")
    warmup_steps: int = key(3, "steps before the detector starts judging")
    window: int = key(50, "steps in the running median")
    report: bool = key(True, "write the report (plots + markdown) at the end of `brisk train`")


@dataclass
class ProbeConfig:
    enabled: bool = key(False, "record per-step numbers to probe.rank<r>.jsonl (for `brisk probe compare`)")
    param_norm_steps: list[int] = key(factory=lambda: [1, 2, 10, 50, 100, 200, 300, 500, 1000],
                                      help="steps at which parameter and per-module gradient norms are recorded")


@dataclass
class BenchArm:
    name: str = key("arm", "the arm's name in the table")
    overrides: list[str] = key(factory=list, help="key=value overrides of this arm")


@dataclass
class BenchConfig:
    arms: list[BenchArm] = key(factory=list, help="the arms to compare: list of {name, overrides}")
    runs: int = key(2, "runs an arm, interleaved A B A B")
    steps: int = key(40, "timed steps a run")
    warmup: int = key(5, "steps a run before timing (shape plans, compile)")
    batches: int = key(0, "distinct batches in the stream (0: steps + warmup)")
    profile_steps: int = key(3, "steps under torch.profiler for the launch count")


