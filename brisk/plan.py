"""The speed plan: every switch in one table, every rule about which switches go together, and the presets.

A switch is one entry of ``SWITCHES``: its key under ``speed``, what it changes (the model, the step, the data,
the optimizer or a process-wide flag) and whether it pays only on a GPU. ``RULES`` is the only place that says
which switches go together. The rules that need only the config run when the config is loaded
(``check_rules``, called by ``load_config``), before any model exists; ``make_plan`` runs the ones that need
the device and the number of ranks, resolves a preset for that device and returns the ``SpeedPlan`` that
assembling a run reads. Every broken rule is one ``ConfigError`` line that names the keys.

Adding a switch: a field in ``SpeedConfig`` (config/speed.py, with its meaning), an entry here, its rules here, and
its ``apply_*`` function in brisk/speed, called by ``speed.accelerate`` (model side) or by
``train.assemble.step_function`` (step side: ``speed.graph.GraphedStep``). Which switches a model family takes
and its preset values are the family's (brisk/families); the plan asks it. The acceleration line, accel.json and
the report list whatever ``SpeedPlan.on`` holds.

This module imports neither torch nor the config module (the report reads it in a process without torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import families
from .errors import ConfigError

if TYPE_CHECKING:  # config/ calls check_rules: a runtime import back would be a circle
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
    Switch("flex_attention", "model", True, "the LLM's packed-row attention as FlexAttention with a document-causal "
           "block mask"),
    Switch("audio_varlen", "model", True, "the audio tower's windowed attention as one varlen call a layer"),
    Switch("compile", "model", True, "torch.compile of each decoder layer (or the stack) and the frozen encoder"),
    Switch("packing", "data", False, "one packed row a batch, per-utterance positions, varlen attention"),
    Switch("label_head", "step", False, "LM head and loss on the labelled positions only"),
    Switch("sdpa_backends", "step", True, "the LLM's attention limited to the listed SDPA backends"),
    Switch("cuda_graph", "step", True, "each bucket's whole step captured once as a CUDA graph, then replayed"),
    Switch("fresh_grads", "step", True, "the graphed backward writes new gradients (no zeroing, no adding)"),
    Switch("fused_adamw", "optimizer", True, "torch's fused AdamW; non-finite steps skipped on the device"),
    Switch("tf32", "process", True, "TF32 matmuls and convolutions for fp32 work (process-wide, restored after)"),
    Switch("linear_attention_batched", "model", False, "a packed row's sequences as one padded batch in Gated DeltaNet "
           "layers"),
    Switch("fla_kernels", "model", True, "flash-linear-attention's kernels for Gated DeltaNet layers"),
    Switch("fla_gated_norm", "model", True, "flash-linear-attention's fused gated RMSNorm in Gated DeltaNet layers"),
    Switch("liger", "model", True, "liger-kernel's fused RMSNorm and SwiGLU in the decoder"),
    Switch("liger_loss", "step", True, "liger-kernel's fused linear cross-entropy"),
    Switch("float8", "model", True, "the decoder layers' linear layers as float8 GEMMs (torchao, rowwise scales)"),
    Switch("optimizer_in_backward", "optimizer", True, "each decoder layer updated by fused AdamW as soon as its "
           "gradients are final, under the rest of the backward"),
)
SWITCH_KEYS = tuple(s.key for s in SWITCHES)

# What ``speed.preset`` turns on: each family's own values (brisk/families), name -> family -> values. Single speed.* keys given in the config or on the command line win over it; on a device
# without CUDA the gpu_only switches stay off, and the frozen-audio switches need a frozen encoder and adaptor
# (the plan's notes say what was left off and why). A switch goes in when a probe against the shipped
# kernel_noise tolerances and an interleaved bench on the GPU show it keeps the numbers and pays.
def presets() -> dict[str, dict[str, dict[str, Any]]]:
    """Read on each call: a family registered later (an entry point, --family-module) brings its own."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for f in families.all_families():
        for name, values in f.presets.items():
            out.setdefault(name, {})[f.name] = values
    return out


def check_preset(name: str) -> None:
    """A speed.preset name that no family has is one line listing those that exist."""
    if name not in presets():
        raise ConfigError(f"speed.preset={name!r}: use one of {', '.join(sorted(presets()))} (or leave it unset)")


# a preset skips them if missing
PACKAGES = {"fla_kernels": "fla", "fla_gated_norm": "fla", "liger": "liger_kernel", "liger_loss": "liger_kernel",
            "float8": "torchao"}


@dataclass(frozen=True)
class Rule:
    keys: str  # the keys the message names
    when: str  # config | device | ranks
    broken: Callable[[Any, str, int], bool]  # (cfg, device type, world) -> True when the rule is broken
    message: str | Callable[[Any], str]  # formatted with world, device, cfg; or cfg -> the line

    def check(self, cfg, device: str = "", world: int = 1) -> None:
        if self.broken(cfg, device, world):
            if callable(self.message):
                raise ConfigError(self.message(cfg))
            raise ConfigError(self.message.format(world=world, device=device, cfg=cfg))


RULES: tuple[Rule, ...] = (
    Rule("optim.lr_scale, optim.warmup_step_tokens", "config",
         lambda c, d, w: c.optim.lr_scale != "none" and not c.optim.warmup_step_tokens and not c.data.auto_batch.enabled,
         "optim.lr_scale={cfg.optim.lr_scale} scales lr from the batch it was chosen for: give that batch as "
         "optim.warmup_step_tokens (data.batch_tokens x train.accum_grad of the recipe), or turn on "
         "data.auto_batch (which takes the configured batch as that)"),
    Rule("speed.cuda_graph, speed.packing", "config", lambda c, d, w: c.speed.cuda_graph and not c.speed.packing,
         "speed.cuda_graph needs speed.packing=true: graphs are captured per packed bucket"),
    Rule("speed.cuda_graph, speed.frozen_eval", "config",
         lambda c, d, w: (c.speed.cuda_graph and bool(families.family_of(c).audio_path) and not c.speed.frozen_eval
                          and not _audio_trains_in_graph(c)),
         lambda c: _graph_audio_refusal(c)),
    # Gated DeltaNet layers in a graph: fla's kernels, given each aligned row's chunk indices (Collator(align=64));
    # the torch fallbacks read the row's layout back to the host in every layer
    Rule("speed.cuda_graph, speed.fla_kernels", "config",
         lambda c, d, w: (c.speed.cuda_graph and not c.speed.fla_kernels and not families.family_of(c).audio_path
                          and _has_linear_attention(c)),
         "speed.cuda_graph: model.llm has Gated DeltaNet (linear_attention) layers, which a CUDA graph holds only "
         "through flash-linear-attention's kernels (the torch paths read each row's layout back to the host): set "
         "speed.fla_kernels=true, or speed.cuda_graph=false"),
    Rule("speed.float8, model.llm.lora.enabled", "config", lambda c, d, w: c.speed.float8 and c.model.llm.lora.enabled,
         "speed.float8 with LoRA adapters is untested (the frozen base GEMMs and the adapters' would both be cast); set "
         "speed.float8=false"),
    Rule("speed.float8, train.device", "device", lambda c, d, w: c.speed.float8 and d != "cuda",
         "speed.float8 needs a CUDA device with float8 GEMMs (this run's is {device}; elsewhere torchao emulates them, "
         "slowly)"),
    Rule("speed.pack_buckets, speed.cuda_graph", "config",
         lambda c, d, w: chunk_align(c) and any(b % chunk_align(c) for b in c.speed.pack_buckets),
         lambda c: (f"speed.pack_buckets: under speed.cuda_graph a Gated DeltaNet model's packed conversations start at "
                    f"multiples of fla's {chunk_align(c)}-token chunk, so every bucket must be one too (not "
                    f"{', '.join(str(b) for b in c.speed.pack_buckets if b % chunk_align(c))})")),
    # liger's fused linear cross-entropy reads its labelled-token count back to the host (a .item()), which no
    # graph holds; label_head is the graphed step's loss
    Rule("speed.cuda_graph, speed.liger_loss", "config", lambda c, d, w: c.speed.cuda_graph and c.speed.liger_loss,
         "speed.cuda_graph with speed.liger_loss: liger's fused cross-entropy reads a count back to the host in "
         "every step, which a CUDA graph cannot hold; set speed.liger_loss=false (speed.label_head=true is the "
         "graphed step's cheap loss)"),
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
    Rule("speed.flex_attention, speed.packing, speed.compile", "config",
         lambda c, d, w: c.speed.flex_attention and not (c.speed.packing and c.speed.compile),
         "speed.flex_attention replaces the packed rows' varlen attention and is fast only compiled (eagerly it runs "
         "an unfused reference): set speed.packing=true and speed.compile=true"),
    Rule("speed.flex_attention, model.llm.activation_checkpoint", "config",
         lambda c, d, w: c.speed.flex_attention and c.model.llm.activation_checkpoint,
         "speed.flex_attention with model.llm.activation_checkpoint is untested (the graph break around the "
         "attention makes Dynamo run a checkpointed layer's recompute eagerly); set one of them off"),
    # A static graph a shape: only the graphed step's static collation keeps the shapes to the buckets (plain packed
    # batches carry cu_seqlens of their own length, a new graph nearly every batch, then eager layers)
    Rule("speed.compile_dynamic, speed.cuda_graph", "config",
         lambda c, d, w: c.speed.compile and c.speed.compile_dynamic is False and not c.speed.cuda_graph,
         "speed.compile_dynamic=false compiles a graph for each batch shape, and only under speed.cuda_graph are the "
         "shapes the packed buckets (else nearly every batch recompiles, then the layers run eagerly); set "
         "speed.cuda_graph=true or speed.compile_dynamic=true"),
    # Under scope=stack the block mask's hook would be traced into the stack's graph: not tested.
    Rule("speed.flex_attention, speed.compile_scope", "config",
         lambda c, d, w: c.speed.flex_attention and c.speed.compile_scope != "layer",
         "speed.flex_attention is tested with speed.compile_scope=layer only; set it, or speed.flex_attention=false"),
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
    Rule("speed.label_head_recompute, speed.label_head", "config",
         lambda c, d, w: c.speed.label_head_recompute and not c.speed.label_head,
         "speed.label_head_recompute recomputes speed.label_head's chunks: set speed.label_head=true too, or "
         "speed.label_head_recompute=false"),
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
    # What a model family takes and needs is the family's (brisk/families); these rules ask it.
    Rule("model.family, speed switches", "config", lambda c, d, w: bool(_not_taken(c)),
         lambda c: families.family_of(c).refuse(_not_taken(c))),
    Rule("model.family, train.export", "config",
         lambda c, d, w: c.train.export != "none" and c.train.export not in families.family_of(c).exporters,
         lambda c: f"train.export={c.train.export}: model.family={c.model.family} writes "
                   f"{', '.join(families.family_of(c).exporters)} (or none); set train.export to one of them"),
    Rule("model.family, train.val_decode", "config",
         lambda c, d, w: c.train.val_decode and families.family_of(c).val_recognizer is None,
         "train.val_decode decodes speech; model.family={cfg.model.family} has no decoder: use train.val_decode=0 "
         "(brisk eval gives greedy answers)"),
    Rule("speed.cuda_graph, train.device", "device", lambda c, d, w: c.speed.cuda_graph and d != "cuda",
         "speed.cuda_graph needs a CUDA device (this run's is {device})"),
    Rule("speed.cuda_graph, train.parallel", "ranks",
         lambda c, d, w: w > 1 and c.speed.cuda_graph and c.train.parallel != "ddp",
         "train.parallel={cfg.train.parallel} with speed.cuda_graph: the graphed step averages gradients DDP-style "
         "only; use train.parallel=ddp"),
    Rule("speed.flex_attention, train.device", "device", lambda c, d, w: c.speed.flex_attention and d != "cuda",
         "speed.flex_attention needs a CUDA device: FlexAttention has no backward on the CPU (this run's is {device})"),
    Rule("speed.fla_kernels, speed.fla_gated_norm, speed.liger, speed.liger_loss, train.device", "device",
         lambda c, d, w: d != "cuda" and (c.speed.fla_kernels or c.speed.fla_gated_norm or c.speed.liger
                                          or c.speed.liger_loss),
         "speed.fla_kernels, speed.fla_gated_norm, speed.liger and speed.liger_loss run Triton kernels: they need a "
         "CUDA device (this run's is {device})"),
    Rule("model.llm.dtype, speed.fla_kernels", "device", lambda c, d, w: _fla_in_fp32(c, d),
         "model.llm.dtype=fp32 with flash-linear-attention on this model's Gated DeltaNet layers (speed.fla_kernels, "
         "or transformers itself, which binds fla for every such layer when fla-core is installed): in fp32 fla's "
         "gate gradient came 4.0e-2 relative off the fp64 recurrence on an H200, against 3.5e-3 in bf16 (likely "
         "TF32); brisk checks fla in bf16 only: set model.llm.dtype=bf16, "
         "or uninstall fla-core for transformers' torch path"),
    Rule("speed.optimizer_in_backward, ranks", "ranks", lambda c, d, w: w > 1 and c.speed.optimizer_in_backward,
         "speed.optimizer_in_backward with {world} ranks: each layer would be updated before its gradients are "
         "averaged over the ranks; set speed.optimizer_in_backward=false"),
    Rule("speed.graph_capture, ranks", "ranks",
         lambda c, d, w: w > 1 and c.speed.cuda_graph and c.speed.graph_capture == "seen",
         "speed.graph_capture=seen with {world} ranks is untested: a step graph holds the gradient all-reduce, so "
         "the ranks must capture together in the middle of training (the shape sync gives them the same key each "
         "step, but no multi-GPU run has checked it); set speed.graph_capture=ahead"),
    Rule("speed.fresh_grads, ranks", "ranks", lambda c, d, w: w > 1 and c.speed.fresh_grads,
         "speed.fresh_grads with {world} ranks: the in-graph all-reduce needs persistent gradient buffers; "
         "set speed.fresh_grads=false"),
    Rule("train.parallel, speed.cuda_graph, speed.compile", "ranks",
         lambda c, d, w: w > 1 and c.train.parallel == "fsdp" and (c.speed.cuda_graph or c.speed.compile),
         "train.parallel=fsdp runs the eager step; set speed.cuda_graph=false and speed.compile=false"),
    # Decoding at validation runs on rank 0 alone; each FSDP2 forward all-gathers its shard from every rank, so rank 0
    # would wait for ranks that never call it (a hang at the first validation).
    Rule("train.parallel, train.val_decode", "ranks",
         lambda c, d, w: w > 1 and c.train.parallel == "fsdp" and c.train.val_decode and c.data.valid,
         "train.val_decode with train.parallel=fsdp on {world} ranks: decoding runs on rank 0 alone and FSDP's "
         "sharded forward needs every rank; set train.val_decode=0 (and `brisk eval` the export), or "
         "train.parallel=ddp"),
)


def _not_taken(cfg) -> list[str]:
    """The switches turned on that the config's model family does not take."""
    takes = families.family_of(cfg).switches
    return [k for k in switches_on(cfg.speed) if k not in takes]


def check_rules(cfg: "Config", when: tuple[str, ...] = ("config",), device: str = "", world: int = 1) -> None:
    for rule in RULES:
        if rule.when in when:
            rule.check(cfg, device, world)
    if "config" in when:  # the model family's own rules
        for r in families.family_of(cfg).rules:
            if r.broken(cfg):
                raise ConfigError(r.message)


def _default(speed, key: str):
    f = next(f for f in dataclasses.fields(speed) if f.name == key)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def switches_on(speed) -> list[str]:
    """The switches whose value is not the eager default, in SWITCHES order."""
    return [k for k in SWITCH_KEYS if getattr(speed, k) != _default(speed, k)]


# ------------------------------------------------------------------------------------------ presets
def preset_values(name: str, frozen_audio: bool, lora: bool = False, family: str = families.DEFAULT,
                  fsdp: bool = False) -> dict[str, Any]:
    """The preset's values for a model family, for a model whose encoder and adaptor
    are (or are not) both frozen, with or without LoRA adapters (the fused projections would skip them; static
    layers and FlexAttention have no GPU test with adapters) or FSDP (fused projections untested there)."""
    check_preset(name)
    fam = families.get(family)
    if name not in fam.presets:
        raise ConfigError(f"speed.preset={name}: model.family={fam.name} has no such preset (its presets: "
                          f"{', '.join(sorted(fam.presets)) or 'none'}); leave speed.preset unset")
    values = dict(fam.presets[name])
    untested = (("fuse_projections",) if lora or fsdp else ()) + (("flex_attention", "compile_dynamic") if lora else ())
    for k in (() if frozen_audio else fam.frozen_audio) + untested:
        values.pop(k, None)
    return values


# Preset values that only work beside another setting: (section, key, the value they need, the key's default).
# Where the config sets that key otherwise, or the preset itself leaves it out (a trained encoder keeps the
# frozen-audio switches off), the value is left out too: `speed.preset=fast speed.compile=false` runs the rest of
# the preset instead of failing on a rule about a switch the user never named.
PRESET_NEEDS: dict[str, tuple[tuple[str, str, Any, Any], ...]] = {
    # FlexAttention pays only traced into static layers (with dynamic layers it was slower: docs/finetune-speed.md)
    "flex_attention": (("speed", "compile", True, False), ("speed", "packing", True, False),
                       ("speed", "compile_scope", "layer", "layer"), ("llm", "activation_checkpoint", 0, 0),
                       ("speed", "cuda_graph", True, False), ("speed", "compile_dynamic", False, True)),
    "compile_dynamic": (("speed", "cuda_graph", True, False),),
    "graph_capture": (("speed", "cuda_graph", True, False),),
    "fresh_grads": (("speed", "cuda_graph", True, False),),
}


def expand_preset(tree: dict) -> dict:
    """A config tree (as merged from the YAML file and the overrides) with its preset written out: every
    preset value the tree does not set itself (nor rules out: ``PRESET_NEEDS``). Runs before the dataclasses
    are built, so that a switch given explicitly (also one set to its default, to turn it off) wins over the
    preset."""
    speed = tree.get("speed") or {}
    name = speed.get("preset")
    if not name:
        return tree
    model = tree.get("model") or {}
    frozen = all((model.get(part) or {}).get("freeze", True) for part in ("encoder", "adaptor"))
    lora = bool(((model.get("llm") or {}).get("lora") or {}).get("enabled", False))
    out = dict(tree)
    fsdp = (tree.get("train") or {}).get("parallel") == "fsdp"
    family = model.get("family") or families.DEFAULT
    values = preset_values(name, frozen, lora, family, fsdp)
    merged = {"speed": {**values, **speed}, "llm": model.get("llm") or {}}
    values = {k: v for k, v in values.items() if needs_met(k, lambda part, key, default: merged[part].get(key, default))}
    out["speed"] = {**values, **speed}
    return out


def needs_met(key: str, value_of: Callable[[str, str, Any], Any]) -> bool:
    """Whether every setting that preset value ``key`` needs (``PRESET_NEEDS``) has the value it needs;
    ``value_of(section, key, default)`` reads the config."""
    return all(value_of(part, k, default) == need for part, k, need, default in PRESET_NEEDS.get(key, ()))


def _audio_trains(cfg) -> bool:
    """Whether some of the audio path trains (a family with audio, model.encoder.freeze or model.adaptor.freeze off)."""
    return bool(families.family_of(cfg).audio_path) and not (cfg.model.encoder.freeze and cfg.model.adaptor.freeze)


def _audio_trains_in_graph(cfg) -> bool:
    """speed.cuda_graph with the audio path training: the family's step graph holds that path too
    (``Family.trained_audio_graph`` says so for this config)."""
    return _audio_trains(cfg) and families.family_of(cfg).trained_audio_graph(cfg.speed, cfg.model) is None


def _graph_audio_refusal(cfg) -> str:
    fam = families.family_of(cfg)
    if _audio_trains(cfg):
        return (f"speed.cuda_graph with the audio path training (model.encoder.freeze or model.adaptor.freeze false): "
                f"model.family={fam.name}'s graphed step {fam.trained_audio_graph(cfg.speed, cfg.model)}; or set "
                "speed.cuda_graph=false")
    return ("speed.cuda_graph needs speed.frozen_eval=true (the graphed step covers the LLM; the frozen audio path runs "
            "before it, in graphs of its own where the model family allows)")


FLA_CHUNK = 64  # fla's chunk of a Gated DeltaNet layer


def chunk_align(cfg) -> int:
    """What each packed sequence is padded to a multiple of (``Collator.align``): fla's chunk under speed.cuda_graph
    with Gated DeltaNet layers (a graph needs the chunk count fixed a bucket, and fla reads it from the host
    otherwise), else 0."""
    if not (cfg.speed.cuda_graph and cfg.speed.packing) or families.family_of(cfg).audio_path:
        return 0
    return FLA_CHUNK if _has_linear_attention(cfg) else 0


def _has_linear_attention(cfg) -> bool:
    from .config.llm import linear_key_head_dims

    return bool(linear_key_head_dims(cfg.model.llm))


def _fla_in_fp32(cfg, device: str) -> bool:
    """fla's kernels would run an fp32 model's Gated DeltaNet layers on CUDA: through speed.fla_kernels, or through
    transformers, which binds fla for every such layer when the package is importable (speed.fla_kernels off
    does not keep it out; brisk.speed.llm_kernels)."""
    if device != "cuda" or cfg.model.llm.dtype == "bf16":
        return False
    from .config.llm import linear_key_head_dims

    return bool(linear_key_head_dims(cfg.model.llm)) and (cfg.speed.fla_kernels or _installed("fla"))


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
    family: str = families.DEFAULT  # model.family

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
        values = preset_values(speed.preset, frozen, cfg.model.llm.lora.enabled, cfg.model.family,
                               cfg.train.parallel == "fsdp")
        off = {k: f"{p} is not installed" for k, p in PACKAGES.items() if k in values and not _installed(p)}
        off.update({k: why for k, why in (unusable or {}).items() if k in values and k not in off})
        if device != "cuda":
            off.update({s.key: "needs CUDA" for s in SWITCHES if s.gpu_only and s.key in values})
        if world > 1:
            off.update({k: f"not with {world} ranks" for k in ("fresh_grads", "graph_capture") if k in values})
            if cfg.train.parallel == "fsdp":
                off.update({k: "not with train.parallel=fsdp" for k in ("cuda_graph", "compile", "fresh_grads",
                                                                         "flex_attention") if k in values})
        changes = {k: _default(speed, k) for k in off if getattr(speed, k) == values[k]}
        if changes:
            speed = dataclasses.replace(speed, **changes)
        on = [k for k in switches_on(speed) if k in values]
        llm = cfg.model.llm
        settings = [f"{k}={values[k]}" for k in values if k not in SWITCH_KEYS and getattr(speed, k) == values[k]
                    and needs_met(k, lambda part, key, _: getattr(speed if part == "speed" else llm, key))]
        notes.append(f"preset {speed.preset}: on {', '.join(on) or 'nothing'}" +
                     (f"; with {', '.join(settings)}" if settings else "") +
                     "".join(f"; left off {k} ({why})" for k, why in off.items() if k in changes))
        frozen_audio = families.family_of(cfg).frozen_audio
        if not frozen and frozen_audio:
            notes.append(f"preset {speed.preset}: the frozen-audio switches ({', '.join(frozen_audio)}) stay off: "
                         "model.encoder.freeze and model.adaptor.freeze are not both true")
        cfg = dataclasses.replace(cfg, speed=speed)
    check_rules(cfg, ("config", "device", "ranks"), device, world)
    return cfg, SpeedPlan(speed, device, world, tuple(notes), tuple(switches_on(speed)), cfg.model.family)
