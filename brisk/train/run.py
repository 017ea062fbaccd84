"""Assemble a run from a config: device and ranks, model, speed plan, optimizer, data, trainer."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from ..config import Config, ConfigError, save_config
from ..data.loader import build_split, load_tokenizer
from ..diagnose.accel import acceleration_state, one_line, write_state
from ..models.build import build_model, export_weights
from ..models.speech_llm import human, param_count
from ..speed import apply_speed
from .optim import WarmupLR, build_optimizer
from .parallel import apply_parallel, attach_grad_sync
from .step import StepHooks, TrainStep
from .trainer import Trainer

log = logging.getLogger("brisk")


def pick_device(name: str) -> torch.device:
    """train.device -> the device of this process. Under torchrun (WORLD_SIZE > 1) ``auto`` and ``cuda`` mean
    this rank's GPU, cuda:LOCAL_RANK; an explicit ``cuda:N`` must name that same GPU (each rank owns one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        if world > 1:
            name = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"train.device={name!r}: use auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={name}: no CUDA device is available")
        if world > 1:
            if dev.index is not None and dev.index != local:
                raise ConfigError(f"train.device={name} under torchrun: rank with LOCAL_RANK={local} owns cuda:{local}; "
                                  "use train.device=cuda (or auto) and let each rank take its own GPU")
            dev = torch.device("cuda", local)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device={name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise ConfigError(f"train.device={name!r}: use auto, cpu, cuda or cuda:N")
    return dev


def init_distributed(device: torch.device) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return torch.distributed.get_rank(), world


def setup_logging(run_dir: Path | None, rank: int = 0) -> None:
    from rich.logging import RichHandler

    logger = logging.getLogger("brisk")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.handlers.clear()
    logger.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    if run_dir is not None:
        fh = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(fh)
    logger.propagate = False


def example_batches(cfg: Config, collator, vocab: int) -> list:
    """One synthetic batch per token bucket (for capturing CUDA graphs up front)."""
    from ..data.dataset import SyntheticDataset

    fe = cfg.model.frontend
    out = []
    for t in cfg.speed.pack_buckets:
        if t > 3072:
            break
        text = max(1, t // 2 - 40)
        ds = SyntheticDataset([(600, text)], fe.n_mels * fe.lfr_m, vocab, fe.lfr_n)
        out.append(collator([ds[0]]))
    for f in cfg.speed.speech_buckets:  # also every speech bucket, so encoder graphs exist up front
        ds = SyntheticDataset([(max(1, f * fe.lfr_n - 1), 4)], fe.n_mels * fe.lfr_m, vocab, fe.lfr_n)
        out.append(collator([ds[0]]))
    return out


def build_step(cfg: Config, model, plan, net=None, hooks: StepHooks | None = None):
    """The optimizer, FunASR's schedule and the eager training step for a model with its speed plan applied."""
    optimizer = build_optimizer(model, cfg.optim, fused=plan.fused_adamw, capturable=plan.capturable)
    schedule = WarmupLR(optimizer, cfg.optim.lr, cfg.optim.warmup_steps)
    hooks = hooks or StepHooks()
    hooks.context, hooks.audio = plan.context, plan.audio
    step = TrainStep(net or model, optimizer, schedule, grad_clip=cfg.optim.grad_clip, on_device_skip=plan.on_device_skip,
                     hooks=hooks)
    return optimizer, schedule, step


def graph_step(cfg: Config, step: TrainStep, plan, device: torch.device):
    """speed.cuda_graph: wrap the step and capture every bucket's graph up front."""
    from ..speed.graph import GraphedStep

    graphed = GraphedStep(step, plan.audio, grad_clip=cfg.optim.grad_clip)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        log.info(attach_grad_sync(graphed))
    vocab = step.model.llm.get_input_embeddings().weight.shape[0]
    seconds = graphed.prepare([b.to(device) for b in example_batches(cfg, plan.collator, vocab)])
    log.info("cuda_graph: %d step graphs and %d encoder graphs captured up front in %.1f s",
             len(graphed.graphs), len(graphed.encoder.graphs), seconds)
    return graphed


def build_trainer(cfg: Config) -> Trainer:
    device = pick_device(cfg.train.device)
    rank, world = init_distributed(device)
    run_dir = Path(cfg.train.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(run_dir, rank)
    if rank == 0:
        save_config(cfg, run_dir / "config.yaml")

    t0 = time.perf_counter()
    model = build_model(cfg.model, device)
    torch.manual_seed(cfg.train.seed + rank)  # training randomness (dropout), separate from the init
    log.info("model: %s parameters, %s trainable (built in %.1f s)", human(param_count(model)),
             human(param_count(model, trainable=True)), time.perf_counter() - t0)

    plan = apply_speed(model, cfg, device)
    for note in plan.notes:
        log.info("speed %s", note)
    state = acceleration_state(cfg, device)
    log.info(one_line(state))
    if rank == 0:
        write_state(state, run_dir)

    tokenizer = load_tokenizer(cfg) if (cfg.data.train or cfg.data.valid) else None
    vocab = model.llm.get_input_embeddings().weight.shape[0]
    train = build_split(cfg, "train", plan.collator, vocab, rank, world, tokenizer)
    valid = build_split(cfg, "valid", plan.collator, vocab, rank, world, tokenizer)

    net, shape_sync, notes = apply_parallel(model, cfg, device, world)
    for note in notes:
        log.info(note)
    probe = None
    if cfg.probe.enabled:
        from ..probe.record import ProbeRecorder

        probe = ProbeRecorder(run_dir / f"probe.rank{rank}.jsonl", model, cfg.probe.param_norm_steps, rank, cfg.to_dict())
    hooks = StepHooks(logit_stats=probe is not None, on_grads=[probe.on_grads] if probe is not None else [])
    optimizer, schedule, step = build_step(cfg, model, plan, net, hooks)
    trainer = Trainer(cfg, run_dir, model, step, optimizer, schedule, train, valid, device, plan, rank, probe,
                      trap=state["plan_build_trap"], shape_sync=shape_sync, sharded=world > 1 and cfg.train.parallel == "fsdp")
    hooks.mark = trainer.timer.mark

    resume = Path(cfg.train.resume_from) if cfg.train.resume_from else (trainer.ckpts.latest() if cfg.train.resume and trainer.ckpts else None)
    if resume is not None:
        trainer.resume(resume)
    if cfg.speed.cuda_graph:
        trainer.step_fn = graph_step(cfg, step, plan, device)
    return trainer


def train(cfg: Config) -> dict:
    trainer = build_trainer(cfg)
    result = trainer.fit()
    run_dir = trainer.run_dir
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank's steps file is complete before rank 0 writes the report
    full = trainer.weights()[0] if trainer.sharded and cfg.train.export_safetensors else None  # FSDP: a collective
    if trainer.rank == 0:
        if cfg.train.export_safetensors:
            paths = export_weights(trainer.model, run_dir, full)
            log.info("exported %s", ", ".join(str(p) for p in paths))
        if cfg.diagnose.report:
            from ..diagnose.report import write_report

            out = write_report(run_dir)
            log.info("report: %s", out)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result
