"""The speed plan: every switch in one table, every rule about which switches go together, and the presets.

A switch is one entry of ``SWITCHES``: its key under ``speed``, what it changes (the model, the step, the data,
the optimizer or a process-wide flag) and whether it pays only on a GPU. ``RULES`` is the only place that says
which switches go together. The rules that need only the config run when the config is loaded
(``check_rules``, called by ``load_config``), before any model exists; ``make_plan`` runs the ones that need
the device and the number of ranks, resolves a preset for that device and returns the ``SpeedPlan`` that
assembling a run reads. Every broken rule is one ``ConfigError`` line that names the keys.

Adding a switch: a field in ``SpeedConfig`` (config.py, with its comment), an entry here, its rules here, and
its ``apply_*`` function in brisk/speed, called by ``speed.accelerate`` (model side) or ``speed.wrap_step``
(step side). The acceleration line, accel.json and the report list whatever ``SpeedPlan.on`` holds.

This module imports neither torch nor the config module (the report reads it in a process without torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .errors import ConfigError

if TYPE_CHECKING:  # config.py calls check_rules: a runtime import back would be a circle
    from .config import Config


@dataclass(frozen=True)
class Switch:
    key: str  # field of SpeedConfig
    changes: str  # model | step | data | optimizer | process
    gpu_only: bool  # pays only on a CUDA device: a preset leaves it off elsewhere
    summary: str


SWITCHES: tuple[Switch, ...] = (
    Switch("frozen_eval", "model", False, "frozen encoder and adaptor in eval mode, run without autograd"),
    Switch("encoder_dtype", "model", True, "the frozen encoder and adaptor as bf16 copies"),
    Switch("encoder_cache", "model", False, "each utterance's audio rows reused in later epochs"),
    Switch("fuse_projections", "model", True, "one GEMM for q/k/v and one for gate/up in each decoder layer"),
    Switch("compile", "model", True, "torch.compile of each decoder layer (or the stack) and the frozen encoder"),
    Switch("packing", "data", False, "one packed row a batch, per-utterance positions, varlen attention"),
    Switch("label_head", "step", False, "LM head and loss on the labelled positions only"),
    Switch("sdpa_backends", "step", True, "the LLM's attention limited to the listed SDPA backends"),
    Switch("cuda_graph", "step", True, "each bucket's whole step captured once as a CUDA graph, then replayed"),
    Switch("fresh_grads", "step", True, "the graphed backward writes new gradients (no zeroing, no adding)"),
    Switch("fused_adamw", "optimizer", True, "torch's fused AdamW; non-finite steps skipped on the device"),
    Switch("tf32", "process", True, "TF32 matmuls and convolutions for fp32 work (process-wide, restored after)"),
    Switch("linear_attention_batched", "model", False, "a packed row's sequences as one padded batch in Gated DeltaNet "
           "layers (task chat)"),
    Switch("fla_kernels", "model", True, "flash-linear-attention's kernels for Gated DeltaNet layers (task chat)"),
    Switch("liger", "model", True, "liger-kernel's fused RMSNorm and SwiGLU in the decoder"),
    Switch("liger_loss", "step", True, "liger-kernel's fused linear cross-entropy (task chat)"),
    Switch("optimizer_in_backward", "optimizer", True, "each decoder layer updated by fused AdamW as soon as its "
           "gradients are final, under the rest of the backward"),
)
SWITCH_KEYS = tuple(s.key for s in SWITCHES)

# What ``speed.preset`` turns on. Single speed.* keys given in the config or on the command line win over it;
# on a device without CUDA the gpu_only switches stay off, and the frozen-audio switches need a frozen encoder
# and adaptor (the plan's notes say what was left off and why). A switch goes in when a probe against the
# shipped kernel_noise tolerances and an interleaved bench on the GPU show it keeps the numbers and pays:
# bench/results/2026-12-01-h200-round3b (speech: 17.4 ms against the round-2 fast path's 20.3; the probe meets
# the same 1,349 of 1,350 gates as that fast path).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {  # name -> task -> values
    "fast": {
        "speech": {"packing": True, "cuda_graph": True, "frozen_eval": True, "encoder_dtype": "bf16", "compile": True,
                   "fused_adamw": True, "label_head": True, "label_rows_frac": 0.3, "fresh_grads": True,
                   "fuse_projections": True,
                   # 1,792 and 2,304 too: FunASR's ~1,600-token steps pad to 1,741 positions, not 1,971 (28.0 ms
                   # against 30.1, bench/results/2026-12-01-h200-round3c)
                   "pack_buckets": [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2304, 2560, 3072,
                                    4096]},
        "chat": {"packing": True, "fused_adamw": True, "label_head": True, "fla_kernels": True,
                 "linear_attention_batched": True},  # the Gated DeltaNet path where fla is left off
    },
}
PACKAGES = {"fla_kernels": "fla", "liger": "liger_kernel", "liger_loss": "liger_kernel"}  # a preset skips them if missing
SPEECH_ONLY = ("frozen_eval", "encoder_dtype", "encoder_cache", "cuda_graph", "fresh_grads")
CHAT_ONLY = ("linear_attention_batched", "fla_kernels", "liger_loss")
FROZEN_AUDIO = ("frozen_eval", "encoder_dtype", "encoder_cache", "cuda_graph", "fresh_grads")  # need frozen audio


@dataclass(frozen=True)
class Rule:
    keys: str  # the keys the message names
    when: str  # config | device | ranks
    broken: Callable[[Any, str, int], bool]  # (cfg, device type, world) -> True when the rule is broken
    message: str

    def check(self, cfg, device: str = "", world: int = 1) -> None:
        if self.broken(cfg, device, world):
            speech_on = ", ".join(f"speed.{k}" for k in switches_on(cfg.speed) if k in SPEECH_ONLY)
            raise ConfigError(self.message.format(world=world, device=device, cfg=cfg, speech_on=speech_on))


RULES: tuple[Rule, ...] = (
    Rule("speed.cuda_graph, speed.packing", "config", lambda c, d, w: c.speed.cuda_graph and not c.speed.packing,
         "speed.cuda_graph needs speed.packing=true: graphs are captured per packed bucket"),
    Rule("speed.cuda_graph, speed.frozen_eval", "config", lambda c, d, w: c.speed.cuda_graph and not c.speed.frozen_eval,
         "speed.cuda_graph needs speed.frozen_eval=true (the graphed step covers the LLM; the frozen encoder and "
         "adaptor run in graphs of their own)"),
    Rule("speed.cuda_graph, train.accum_grad", "config", lambda c, d, w: c.speed.cuda_graph and c.train.accum_grad != 1,
         "speed.cuda_graph does not support train.accum_grad > 1 (one graph is one optimizer step); set train.accum_grad=1"),
    Rule("speed.fresh_grads, speed.cuda_graph", "config", lambda c, d, w: c.speed.fresh_grads and not c.speed.cuda_graph,
         "speed.fresh_grads needs speed.cuda_graph=true (eager steps already start from no gradients)"),
    Rule("speed.encoder_cache, speed.frozen_eval", "config",
         lambda c, d, w: c.speed.encoder_cache and not c.speed.frozen_eval,
         "speed.encoder_cache needs speed.frozen_eval=true: cached outputs must not depend on dropout"),
    Rule("speed.encoder_dtype, speed.frozen_eval", "config",
         lambda c, d, w: c.speed.encoder_dtype != "fp32" and not c.speed.frozen_eval,
         "speed.encoder_dtype=bf16 needs speed.frozen_eval=true"),
    Rule("speed.frozen_eval, model.encoder.freeze, model.adaptor.freeze", "config",
         lambda c, d, w: c.speed.frozen_eval and not (c.model.encoder.freeze and c.model.adaptor.freeze),
         "speed.frozen_eval computes the audio rows without autograd: it needs model.encoder.freeze=true and "
         "model.adaptor.freeze=true"),
    Rule("speed.fuse_projections, train.parallel", "config",
         lambda c, d, w: c.speed.fuse_projections and c.train.parallel == "fsdp",
         "speed.fuse_projections with train.parallel=fsdp is not tested; use one of them"),
    # The fused GEMM reads the projections' weights alone and would drop the adapters' update.
    Rule("model.llm.lora.enabled, speed.fuse_projections", "config",
         lambda c, d, w: c.model.llm.lora.enabled and c.speed.fuse_projections,
         "model.llm.lora.enabled with speed.fuse_projections: the fused q/k/v GEMM would skip the adapters; turn one "
         "of them off"),
    # FSDP2 here leaves the modules freeze_plan marks frozen unsharded and unsynchronised, adapters included.
    Rule("model.llm.lora.enabled, train.parallel", "config",
         lambda c, d, w: c.model.llm.lora.enabled and c.train.parallel == "fsdp",
         "model.llm.lora.enabled with train.parallel=fsdp is not supported (the adapters would not be synchronised); "
         "use train.parallel=ddp (LoRA leaves little to shard)"),
    Rule("speed.label_head, speed.liger_loss", "config", lambda c, d, w: c.speed.label_head and c.speed.liger_loss,
         "speed.label_head and speed.liger_loss are two ways to compute the loss without full logits; use one"),
    # speed/optim_in_backward.py: the layers are updated before the step's global gradient norm exists.
    Rule("speed.optimizer_in_backward, speed.fused_adamw", "config",
         lambda c, d, w: c.speed.optimizer_in_backward and not (c.speed.fused_adamw or c.speed.cuda_graph),
         "speed.optimizer_in_backward issues torch's fused AdamW kernel layer by layer: set speed.fused_adamw=true"),
    Rule("speed.optimizer_in_backward, optim.grad_clip", "config",
         lambda c, d, w: c.speed.optimizer_in_backward and c.optim.grad_clip > 0 and not c.speed.clip_by_previous_norm,
         "speed.optimizer_in_backward updates each layer before the step's gradient norm is known, so "
         "optim.grad_clip={cfg.optim.grad_clip} cannot clip by it: set optim.grad_clip=0, or "
         "speed.clip_by_previous_norm=true to clip by the previous step's norm"),
    Rule("speed.clip_by_previous_norm, speed.optimizer_in_backward", "config",
         lambda c, d, w: c.speed.clip_by_previous_norm and not c.speed.optimizer_in_backward,
         "speed.clip_by_previous_norm belongs to speed.optimizer_in_backward (the plain step clips by its own norm); "
         "set it false or turn speed.optimizer_in_backward on"),
    Rule("task, speech switches", "config",
         lambda c, d, w: c.task == "chat" and any(k in switches_on(c.speed) for k in SPEECH_ONLY),
         "task chat: {speech_on} act on the audio path or the speech fast path's graphs; set them false "
         "(the chat path takes packing, compile, fused_adamw, label_head, linear_attention_batched, fla_kernels, "
         "liger, liger_loss)"),
    Rule("task, chat switches", "config",
         lambda c, d, w: c.task == "speech" and any(k in switches_on(c.speed) for k in CHAT_ONLY),
         "speed.linear_attention_batched, fla_kernels and liger_loss are for task: chat (the speech-LLM's Qwen3 "
         "decoder has no linear attention, and speed.label_head is its loss without full logits); set them false"),
    Rule("task, model.encoder.activation_checkpoint", "config",
         lambda c, d, w: c.task == "chat" and c.model.encoder.activation_checkpoint,
         "model.encoder.activation_checkpoint recomputes the speech encoder's blocks; a task: chat model has no "
         "encoder (model.llm.activation_checkpoint recomputes its decoder layers)"),
    Rule("task, train.export", "config", lambda c, d, w: c.task == "chat" and c.train.export == "funasr",
         "train.export=funasr is a speech-LLM folder; with task: chat use train.export=hf or none"),
    Rule("task, train.val_decode", "config", lambda c, d, w: c.task == "chat" and c.train.val_decode,
         "train.val_decode decodes speech; with task: chat use train.val_decode=0 (brisk eval gives greedy answers)"),
    Rule("task, model.path", "config", lambda c, d, w: c.task == "chat" and c.model.path,
         "model.path is a speech-LLM folder; with task: chat give the causal LM's folder as model.llm.path (or "
         "model.llm.config for a random one)"),
    Rule("task, data.profile", "config", lambda c, d, w: c.task == "chat" and c.data.profile,
         "data.profile makes synthetic speech batches; with task: chat give data.train (chat jsonl)"),
    Rule("speed.cuda_graph, train.device", "device", lambda c, d, w: c.speed.cuda_graph and d != "cuda",
         "speed.cuda_graph needs a CUDA device (this run's is {device})"),
    Rule("speed.cuda_graph, train.parallel", "ranks",
         lambda c, d, w: w > 1 and c.speed.cuda_graph and c.train.parallel != "ddp",
         "train.parallel={cfg.train.parallel} with speed.cuda_graph: the graphed step averages gradients DDP-style "
         "only; use train.parallel=ddp"),
    Rule("speed.fla_kernels, speed.liger, speed.liger_loss, train.device", "device",
         lambda c, d, w: d != "cuda" and (c.speed.fla_kernels or c.speed.liger or c.speed.liger_loss),
         "speed.fla_kernels, speed.liger and speed.liger_loss run Triton kernels: they need a CUDA device (this run's "
         "is {device})"),
    Rule("speed.optimizer_in_backward, ranks", "ranks", lambda c, d, w: w > 1 and c.speed.optimizer_in_backward,
         "speed.optimizer_in_backward with {world} ranks: each layer would be updated before its gradients are "
         "averaged over the ranks; set speed.optimizer_in_backward=false"),
    Rule("speed.fresh_grads, ranks", "ranks", lambda c, d, w: w > 1 and c.speed.fresh_grads,
         "speed.fresh_grads with {world} ranks: the in-graph all-reduce needs persistent gradient buffers; "
         "set speed.fresh_grads=false"),
    Rule("train.parallel, speed.cuda_graph, speed.compile", "ranks",
         lambda c, d, w: w > 1 and c.train.parallel == "fsdp" and (c.speed.cuda_graph or c.speed.compile),
         "train.parallel=fsdp runs the eager step; set speed.cuda_graph=false and speed.compile=false"),
)


def check_rules(cfg: "Config", when: tuple[str, ...] = ("config",), device: str = "", world: int = 1) -> None:
    for rule in RULES:
        if rule.when in when:
            rule.check(cfg, device, world)


def _default(speed, key: str):
    f = next(f for f in dataclasses.fields(speed) if f.name == key)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def switches_on(speed) -> list[str]:
    """The switches whose value is not the eager default, in SWITCHES order."""
    return [k for k in SWITCH_KEYS if getattr(speed, k) != _default(speed, k)]


# ------------------------------------------------------------------------------------------ presets
def preset_values(name: str, frozen_audio: bool, lora: bool = False, task: str = "speech",
                  fsdp: bool = False) -> dict[str, Any]:
    """The preset's values for a task, for a model whose encoder and adaptor are (or are not) both frozen, with
    or without LoRA adapters (the fused projections would skip them) or FSDP (fused projections untested there)."""
    if name not in PRESETS:
        raise ConfigError(f"speed.preset={name!r}: use one of {', '.join(sorted(PRESETS))} (or leave it unset)")
    values = dict(PRESETS[name][task])
    for k in (() if frozen_audio else FROZEN_AUDIO) + (("fuse_projections",) if lora or fsdp else ()):
        values.pop(k, None)
    return values


def expand_preset(tree: dict) -> dict:
    """A config tree (as merged from the YAML file and the overrides) with its preset written out: every
    preset value the tree does not set itself. Runs before the dataclasses are built, so that a switch given
    explicitly (also one set to its default, to turn it off) wins over the preset."""
    speed = tree.get("speed") or {}
    name = speed.get("preset")
    if not name:
        return tree
    model = tree.get("model") or {}
    frozen = all((model.get(part) or {}).get("freeze", True) for part in ("encoder", "adaptor"))
    lora = bool(((model.get("llm") or {}).get("lora") or {}).get("enabled", False))
    out = dict(tree)
    fsdp = (tree.get("train") or {}).get("parallel") == "fsdp"
    out["speed"] = {**preset_values(name, frozen, lora, tree.get("task", "speech"), fsdp), **speed}
    return out


def _installed(package: str) -> bool:
    import importlib.util
    import sys

    return package in sys.modules or importlib.util.find_spec(package) is not None


# ------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class SpeedPlan:
    """What a run does for speed, decided before any model exists. ``speed`` is the effective SpeedConfig."""

    speed: Any
    device: str = "cpu"
    world: int = 1
    notes: tuple[str, ...] = ()
    on: tuple[str, ...] = field(default=())
    task: str = "speech"

    def __contains__(self, key: str) -> bool:
        return key in self.on

    @property
    def fused_adamw(self) -> bool:  # the graphed step needs the fused, capturable AdamW
        return self.speed.fused_adamw or self.speed.cuda_graph

    @property
    def capturable(self) -> bool:
        return self.speed.cuda_graph

    @property
    def on_device_skip(self) -> bool:  # found_inf and clipping inside the fused kernel: no host sync a step
        return self.fused_adamw

    @property
    def persistent_grads(self) -> bool:  # graphs replay into fixed gradient buffers unless fresh_grads
        return self.speed.cuda_graph and not self.speed.fresh_grads


def make_plan(cfg: "Config", device: str, world: int = 1,
              unusable: dict[str, str] | None = None) -> tuple["Config", SpeedPlan]:
    """(the config with its effective speed section, the plan) for a run on ``device`` with ``world`` ranks.

    A preset's switches that cannot run here are turned off with a note (``unusable``: switch -> why, what the
    caller found on this machine, such as a kernel package that refuses its GPU); a switch given explicitly that
    cannot run here is an error (the rules, or the switch's own apply function)."""
    speed, notes = cfg.speed, []
    if speed.preset:
        frozen = cfg.model.encoder.freeze and cfg.model.adaptor.freeze
        values = preset_values(speed.preset, frozen, cfg.model.llm.lora.enabled, cfg.task, cfg.train.parallel == "fsdp")
        off = {k: f"{p} is not installed" for k, p in PACKAGES.items() if k in values and not _installed(p)}
        off.update({k: why for k, why in (unusable or {}).items() if k in values and k not in off})
        if device != "cuda":
            off.update({s.key: "needs CUDA" for s in SWITCHES if s.gpu_only and s.key in values})
        if world > 1:
            off.update({k: f"not with {world} ranks" for k in ("fresh_grads",) if k in values})
            if cfg.train.parallel == "fsdp":
                off.update({k: "not with train.parallel=fsdp" for k in ("cuda_graph", "compile", "fresh_grads")
                            if k in values})
        changes = {k: _default(speed, k) for k in off if getattr(speed, k) == values[k]}
        if changes:
            speed = dataclasses.replace(speed, **changes)
        on = [k for k in switches_on(speed) if k in values]
        settings = [f"{k}={values[k]}" for k in values if k not in SWITCH_KEYS and getattr(speed, k) == values[k]]
        notes.append(f"preset {speed.preset}: on {', '.join(on) or 'nothing'}" +
                     (f"; with {', '.join(settings)}" if settings else "") +
                     "".join(f"; left off {k} ({why})" for k, why in off.items() if k in changes))
        if not frozen and cfg.task == "speech":
            notes.append(f"preset {speed.preset}: the frozen-audio switches ({', '.join(FROZEN_AUDIO)}) stay off: "
                         "model.encoder.freeze and model.adaptor.freeze are not both true")
        cfg = dataclasses.replace(cfg, speed=speed)
    check_rules(cfg, ("config", "device", "ranks"), device, world)
    return cfg, SpeedPlan(speed, device, world, tuple(notes), tuple(switches_on(speed)), cfg.task)
