"""Assemble a run from a config: device and ranks, model, speed plan, optimizer, data, trainer."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..config import Config, ConfigError, save_config
from ..data.loader import build_split, load_tokenizer
from ..diagnose.accel import acceleration_state, write_state
from ..diagnose.report import one_line
from ..files import SYNCER, gb
from ..models.build import build_model
from ..models.speech_llm import human, param_count
from ..speed import apply_speed
from ..speed.flags import tf32_scope
from . import run_dir as run_dirs
from .checkpoint import broadcast_from_rank0, disk_footprint
from .dist import close_process_group
from .optim import WarmupLR, build_optimizer
from .parallel import apply_parallel, attach_grad_sync
from .step import StepHooks, TrainStep
from .stop import StopOnSignal
from .threads import pick_threads
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
    if sys.stdout.isatty():
        logger.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    else:  # piped or redirected: one plain line per event (rich would wrap at 80 columns)
        plain = logging.StreamHandler(sys.stdout)
        plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(plain)
    if run_dir is not None:
        fh = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(fh)
    logger.propagate = False


def example_batches(cfg: Config, collator, vocab: int) -> list:
    """One synthetic batch per token bucket (for capturing CUDA graphs up front)."""
    from ..data.dataset import SyntheticDataset

    from ..speed.graph import MAX_GRAPH_TOKENS

    fe = cfg.model.frontend
    dim, low = fe.n_mels * fe.lfr_m, cfg.model.adaptor.use_low_frame_rate
    out = []
    # One sample of exactly t tokens lands in bucket t (a shorter one would fall into a smaller bucket and
    # leave bucket t to be captured, and compiled, in the middle of training).
    fixed = len(SyntheticDataset([(600, 0)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)[0].tokens.input_ids)
    for t in cfg.speed.pack_buckets:
        if t > MAX_GRAPH_TOKENS:
            break
        ds = SyntheticDataset([(600, max(0, t - fixed))], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    for f in cfg.speed.speech_buckets:  # also every speech bucket, so encoder graphs exist up front
        ds = SyntheticDataset([(max(1, f * fe.lfr_n - 1), 4)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    return out


def optimizer_and_schedule(cfg: Config, model, plan):
    optimizer = build_optimizer(model, cfg.optim, fused=plan.fused_adamw, capturable=plan.capturable)
    return optimizer, WarmupLR(optimizer, cfg.optim.lr, cfg.optim.warmup_steps)


def train_step(cfg: Config, net, optimizer, schedule, plan, hooks: StepHooks | None = None) -> TrainStep:
    hooks = hooks or StepHooks()
    hooks.context, hooks.audio, hooks.loss = plan.context, plan.audio, plan.loss
    return TrainStep(net, optimizer, schedule, grad_clip=cfg.optim.grad_clip, on_device_skip=plan.on_device_skip,
                     hooks=hooks)


def build_step(cfg: Config, model, plan, hooks: StepHooks | None = None):
    """The optimizer, FunASR's schedule and the eager training step for a model with its speed plan applied."""
    optimizer, schedule = optimizer_and_schedule(cfg, model, plan)
    return optimizer, schedule, train_step(cfg, model, optimizer, schedule, plan, hooks)


def graph_step(cfg: Config, step: TrainStep, plan, device: torch.device):
    """speed.cuda_graph: wrap the step and capture every bucket's graph up front."""
    from ..speed.graph import GraphedStep

    graphed = GraphedStep(step, plan.audio, fresh_grads=cfg.speed.fresh_grads)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        log.info(attach_grad_sync(graphed))
        log.warning("speed.cuda_graph with several ranks has not yet passed its 2-GPU test (docs/multigpu.md); "
                    "the eager path (packing, frozen_eval, fused_adamw) is the tested one")
    vocab = step.model.llm.get_input_embeddings().weight.shape[0]
    seconds = graphed.prepare([b.to(device) for b in example_batches(cfg, plan.collator, vocab)])
    log.info("cuda_graph: %d step graphs and %d encoder graphs captured up front in %.1f s",
             len(graphed.graphs), len(graphed.encoder.graphs), seconds)
    return graphed


def resume_path(cfg: Config, trainer: Trainer) -> Path | None:
    """The checkpoint to resume from: chosen by rank 0 (it holds the checkpoint list), the same on every rank."""
    path = None
    if cfg.train.resume_from:
        path = Path(cfg.train.resume_from)
    elif cfg.train.resume and trainer.ckpts is not None:
        path = trainer.ckpts.latest_intact()
    path = broadcast_from_rank0(str(path) if path else None)
    return Path(path) if path else None


def build_trainer(cfg: Config) -> Trainer:
    device = pick_device(cfg.train.device)
    rank, world = init_distributed(device)
    # Rank 0 checks the folder before any rank writes to it: another rank's train.log, opened first, made rank 0
    # refuse a fresh folder as "already holds a run" (seen on 2 H200s). The others wait for its verdict.
    run_dir = run_dirs.prepare(cfg) if rank == 0 else None
    run_dir = Path(broadcast_from_rank0(str(run_dir) if run_dir is not None else None))
    run_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(run_dir, rank)
    if rank == 0:
        save_config(cfg, run_dir / "config.yaml")
    threads = pick_threads(cfg, device)
    if threads:
        log.info(threads)

    t0 = time.perf_counter()
    model = build_model(cfg.model, device)
    torch.manual_seed(cfg.train.seed + rank)  # training randomness (dropout), separate from the init
    log.info("model: %s parameters, %s trainable (built in %.1f s)", human(param_count(model)),
             human(param_count(model, trainable=True)), time.perf_counter() - t0)

    plan = apply_speed(model, cfg, device)
    for note in plan.notes:
        log.info("speed %s", note)
    with tf32_scope(cfg.speed.tf32):  # the flags as training will run them (fit enters the same scope)
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
    optimizer, schedule = optimizer_and_schedule(cfg, model, plan)  # after FSDP sharding: it sees the shards
    trainer = Trainer(cfg, run_dir, model, None, optimizer, schedule, train, valid, device, plan, rank, probe,
                      trap=state["plan_build_trap"], shape_sync=shape_sync, sharded=world > 1 and cfg.train.parallel == "fsdp")
    resume = resume_path(cfg, trainer)
    if resume is not None:  # every rank loads the same checkpoint
        trainer.resume(resume)
    run_dirs.after_resume(cfg, run_dir, resume, trainer.pos.step, rank)
    if rank == 0:
        check_disk(cfg, trainer)
    if trainer.saver is not None and not trainer.sharded:
        trainer.saver.start_frozen()  # written in the background while the graphs below compile

    hooks = StepHooks(logit_stats=probe is not None, grad_groups=probe.grad_groups if probe is not None else None,
                      mark=trainer.timer.mark)
    step = train_step(cfg, net, optimizer, schedule, plan, hooks)
    trainer.step_fn = graph_step(cfg, step, plan, device) if cfg.speed.cuda_graph else step
    return trainer


def check_disk(cfg: Config, trainer: Trainer) -> None:
    """Refuse a run whose checkpoints and export would not fit on the disk of its output folder."""
    t = cfg.train
    need, what = disk_footprint(trainer.model, trainer.optimizer, held_checkpoints(trainer), t.export != "none")
    free = shutil.disk_usage(trainer.run_dir).free
    if need > free:
        raise ConfigError(
            f"train.output_dir={trainer.run_dir}: this run needs about {gb(need)} of disk ({what}) but only "
            f"{gb(free)} are free there. Keep fewer checkpoints (train.keep_n={t.keep_n}), save less often "
            f"(train.save_every={t.save_every}), skip the export (train.export=none), "
            "or point train.output_dir at a larger disk")
    log.info("disk: the run needs about %s (%s); %s free in %s", gb(need), what, gb(free), trainer.run_dir)


def held_checkpoints(trainer: Trainer) -> int:
    """New checkpoint files the rest of the run holds at once at most: keep_n best + the latest + the one being
    written, less those already in the folder, and no more than the saves still to come."""
    t, pos = trainer.cfg.train, trainer.pos
    total = trainer.total_steps()
    per_epoch = max(1, len(trainer.train.sampler.batches(0)) // t.accum_grad)
    saves = sum(1 for s in range(pos.step + 1, total + 1) if (t.save_every and s % t.save_every == 0) or s % per_epoch == 0)
    saves += 1 if t.save_final else 0
    existing = len(trainer.ckpts.index) if trainer.ckpts else 0
    return max(0, min(t.keep_n + 2, existing + saves) - existing)


def start_report(run_dir: Path) -> subprocess.Popen:
    """The report (plots) in a process of its own: CPU work that would otherwise hold the GIL the export's
    Python loop needs; this module imports no torch, so it starts in about a second."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the brisk package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "brisk.diagnose.report", str(run_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_report(proc: subprocess.Popen) -> None:
    out, err = proc.communicate()
    if proc.returncode:
        log.warning("the report failed (brisk report %s retries it): %s", proc.args[-1], (err.strip().splitlines() or ["?"])[-1])
    else:
        log.info("report: %s", out.strip())


def train(cfg: Config) -> dict:
    """Train while holding the run folder's lock (brisk.train.run_dir.run_lock)."""
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(None, rank)  # what is said before the run folder is ready (a cleared failed start) is shown too
    with run_dirs.run_lock(cfg.train.output_dir, rank):
        return _train(cfg)


def _train(cfg: Config) -> dict:
    export = cfg.train.export
    if export == "hf":  # fail now, not after the run, if the native class cannot hold this model
        from ..models.hf_native import check_exportable

        check_exportable(cfg.model)
    trainer = build_trainer(cfg)
    if export != "none" and not (cfg.data.tokenizer or cfg.model.llm.path):
        log.warning("train.export=%s skipped: a model folder needs a tokenizer (data.tokenizer or model.llm.path)", export)
        export = "none"
    with StopOnSignal(enabled=not torch.distributed.is_initialized()) as stop:
        try:
            result = trainer.fit(stop)  # the final checkpoint is written here, before any export
        finally:
            trainer.close_data()
    if stop.requested:  # Ctrl-C or pre-emption: the checkpoint is on disk; no export, no report, exit soon
        return result
    run_dir = trainer.run_dir
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank's steps file is complete before rank 0 writes the report
    full = trainer.weights()[0] if trainer.sharded and export != "none" else None  # FSDP: a collective
    if full is None and export != "none" and trainer.rank == 0:
        full = trainer.export_state()  # the trained weights from the final checkpoint's host buffers, if they are there
    if trainer.rank == 0:
        report = start_report(run_dir) if cfg.diagnose.report else None  # plots while the export writes
        if export != "none":
            from ..models.export import export_folder

            try:
                export_folder(trainer.model, cfg, run_dir / f"model-{export}", export, cfg.train.export_dtype, state=full,
                              sync=False)
            except OSError:
                latest = trainer.ckpts.latest() if trainer.ckpts else None
                log.error("the export failed; the trained weights are in %s", latest or "no checkpoint (train.save_final=false)")
                raise
        if report is not None:
            finish_report(report)
        files, nbytes = SYNCER.pending()
        errors, SYNCER.errors = SYNCER.errors, []
        for err in errors:
            log.warning("fsync failed (the file is in place, but may not be on the disk): %s", err)
        if files:
            log.info("%s in %d file(s) handed to the OS and still being written to the disk in the background "
                     "(it finishes on its own; `sync` waits for it)", gb(nbytes), files)
    if torch.distributed.is_initialized():
        close_process_group(trainer.step_fn)
    return result
