"""One way to put a run together from a config, shared by `brisk train`, `brisk bench` and `brisk profile`.

    ranks = start_process(cfg)            # this process's device and rank (torch.distributed under torchrun)
    parts = assemble(cfg, ranks)          # the plan, the model with its switches, the parallel wrapper, the optimizer
    step = train_step(parts, hooks)       # the one step body, with the hooks of whoever runs it
    step_fn = step_function(parts, step)  # the step itself, or the same step captured per bucket as CUDA graphs

"Step" names: ``TrainStep`` is the step body (one optimizer step on a group of batches); ``step_fn`` is
what the loop calls per step (the TrainStep, or a GraphedStep replaying it); the loop's own ``train_step``
method times, logs and checkpoints around one call of ``step_fn``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..config import Config
from ..data.collate import Collator, collator_for
from ..distributed.parallel import apply_parallel
from ..distributed.ranks import init_distributed, pick_device
from ..models.lm import human, param_count
from ..families import family_of
from ..plan import SpeedPlan, make_plan, preset_values
from ..speed import Accelerated, accelerate
from ..speed.flags import run_scope
from .optim import WarmupLR, build_optimizer, schedule_for, trainable_params
from .step import StepHooks, TrainStep

log = logging.getLogger("brisk")


@dataclass(frozen=True)
class Ranks:
    device: torch.device
    rank: int = 0
    world: int = 1


def start_process(cfg: Config) -> Ranks:
    device = pick_device(cfg.train.device)
    rank, world = init_distributed(device)
    return Ranks(device, rank, world)


@dataclass
class Parts:
    """What a run is made of. ``cfg`` is the effective config: its speed section as the plan resolved it."""

    cfg: Config
    plan: SpeedPlan
    ranks: Ranks
    model: torch.nn.Module  # the plain model of cfg.model.family, with its model-side switches applied
    accel: Accelerated
    net: torch.nn.Module  # what the step calls: the model, or DDP around it
    shape_sync: object | None  # several ranks, static shapes: Batch -> Batch padded to the ranks' bucket
    grad_sync: object | None  # several ranks, graphed step: the in-graph gradient all-reduce
    optimizer: torch.optim.Optimizer
    schedule: WarmupLR
    collator: Collator

    @property
    def device(self) -> torch.device:
        return self.ranks.device

    @property
    def sharded(self) -> bool:  # train.parallel=fsdp over several ranks: state dicts are gathered collectives
        return self.ranks.world > 1 and self.cfg.train.parallel == "fsdp"


def unusable_here(cfg: Config, device: torch.device) -> dict[str, str]:
    """Switches a preset would turn on that this machine cannot run (asked only when a preset is set)."""
    if not cfg.speed.preset or device.type != "cuda":
        return {}
    values = preset_values(cfg.speed.preset, True, family=cfg.model.family)
    if "fla_kernels" not in values:
        return {}
    from ..config.llm import linear_key_head_dims
    from ..speed.llm_kernels import available, fla_refusal

    why = fla_refusal(linear_key_head_dims(cfg.model.llm)) if available("fla") else None
    return {"fla_kernels": why.split(": ", 1)[-1]} if why else {}


def assemble(cfg: Config, ranks: Ranks) -> Parts:
    cfg, plan = make_plan(cfg, ranks.device.type, ranks.world, unusable_here(cfg, ranks.device))
    for note in plan.notes:
        log.info("speed %s", note)
    t0 = time.perf_counter()
    model = family_of(cfg).build(cfg, ranks.device)
    torch.manual_seed(cfg.train.seed + ranks.rank)  # training randomness (dropout), separate from the init
    log.info("model: %s parameters, %s trainable (built in %.1f s)", human(param_count(model)),
             human(param_count(model, trainable=True)), time.perf_counter() - t0)
    accel = accelerate(model, plan)
    for note in accel.notes:
        log.info("speed %s", note)
    net, shape_sync, grad_sync, notes = apply_parallel(model, cfg, ranks.device, ranks.world)
    for note in notes:
        log.info(note)
    # After FSDP sharding: the optimizer sees the shards.
    optimizer = build_optimizer(model, cfg.optim, fused=plan.fused_adamw, capturable=plan.capturable)
    lr, warmup, notes = schedule_for(cfg)
    for note in notes:
        log.info(note)
    schedule = WarmupLR(optimizer, lr, warmup)
    return Parts(cfg, plan, ranks, model, accel, net, shape_sync, grad_sync, optimizer, schedule, collator_for(cfg))


def step_hooks(parts: Parts, **diagnostics) -> StepHooks:
    """The step's hooks: the speed parts (audio rows, loss, gradient sync, the optimizer in the backward) and the
    caller's diagnostics (``mark``, ``logit_stats``, ``grad_groups``). Called once a run."""
    extra = {"sync_grads": parts.grad_sync} if parts.grad_sync is not None else {}
    if parts.plan.speed.optimizer_in_backward:  # the parameters' hooks are registered once, here
        from ..speed.optim_in_backward import apply_optimizer_in_backward

        clip = parts.cfg.optim.grad_clip if parts.plan.speed.clip_by_previous_norm else 0.0
        layers = family_of(parts.cfg).decoder_layers(parts.model)
        extra["in_backward"], note = apply_optimizer_in_backward(layers, parts.optimizer, trainable_params(parts.net),
                                                                 clip)
        log.info("speed %s", note)
    return StepHooks(audio=parts.accel.audio, loss=parts.accel.loss, **extra, **diagnostics)


def train_step(parts: Parts, hooks: StepHooks) -> TrainStep:
    return TrainStep(parts.net, parts.optimizer, parts.schedule, grad_clip=parts.cfg.optim.grad_clip,
                     on_device_skip=parts.plan.on_device_skip, persistent_grads=parts.plan.persistent_grads,
                     hooks=hooks)


def step_function(parts: Parts, step: TrainStep):
    """The step, or under speed.cuda_graph a GraphedStep around it with every bucket's graph captured up front
    (speed.graph_capture=ahead), inside the run's flag scope (the graphs keep the kernels those flags choose);
    with graph_capture=seen nothing is captured here: each bucket's graph at the first batch that reaches it."""
    if not parts.plan.speed.cuda_graph:
        return step
    from ..speed.graph import MAX_GRAPH_TOKENS, GraphedStep

    family = family_of(parts.cfg)
    static = family.audio_static_inputs(parts.plan.speed)
    # the audio path training inside the step graph (the plan allowed it: Family.trained_audio_graph); else frozen
    trained = parts.model if parts.accel.audio is None and family.audio_path else None
    graphed = GraphedStep(step, parts.accel.audio, audio_graphs=family.audio_graphs, static_audio=static,
                          trained_audio=trained)
    if parts.ranks.world > 1:
        log.warning("speed.cuda_graph with several ranks has not yet passed its 2-GPU test (docs/multigpu.md); "
                    "the eager path (packing, frozen_eval, fused_adamw) is the tested one")
    if parts.plan.speed.graph_capture == "seen":
        log.info("cuda_graph: each bucket's graphs captured at the first batch that reaches it (speed.graph_capture=seen)")
        return graphed
    vocab = parts.model.llm.get_input_embeddings().weight.shape[0]
    made = family.graph_examples(parts.cfg, parts.collator, vocab, MAX_GRAPH_TOKENS) if family.graph_examples else []
    examples = [b.to(parts.device) for b in made]
    with run_scope(parts.cfg):
        seconds = graphed.prepare(examples)
    log.info("cuda_graph: %d step graphs and %d encoder graphs captured up front in %.1f s",
             len(graphed.graphs), len(graphed.encoder.graphs), seconds)
    return graphed
