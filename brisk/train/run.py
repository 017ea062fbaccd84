"""`brisk train`: a run folder, the run's parts (assemble.py), its data, its trainer; at the end the export."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from ..config import Config, ConfigError, save_config
from ..data.loader import build_split, load_tokenizer, prepare_data
from ..diagnose.accel import acceleration_state, write_state
from ..diagnose.report import one_line
from ..diagnose.timeline import Timeline
from ..diagnose.timer import StepTimer
from ..distributed.ranks import broadcast_from_rank0
from ..distributed.sync import close_process_group
from ..files import SYNCER, gb
from ..speed.flags import run_scope
from . import run_dir as run_dirs
from .assemble import Parts, assemble, start_process, step_function, step_hooks, train_step
from .async_save import AsyncCheckpointer
from .average import use_average
from .checkpoint import Checkpoints, disk_footprint
from . import run_state
from .run_state import Position
from .trainer import Trainer, planned_steps, steps_per_epoch
from .stop import StopOnSignal
from .threads import pick_threads

log = logging.getLogger("brisk")


class PipeHandler(logging.StreamHandler):
    """Log lines to a pipe. When its reader goes away (`brisk train | head`) the run goes on and its train.log
    stays whole: the console lines stop, instead of an error block for every line after."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            self.stream = open(os.devnull, "w", encoding="utf-8")  # not setStream: it flushes the broken pipe
            return
        super().handleError(record)


def setup_logging(run_dir: Path | None, rank: int = 0) -> None:
    from rich.logging import RichHandler

    logger = logging.getLogger("brisk")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.handlers.clear()
    if sys.stdout.isatty():
        logger.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    else:  # piped or redirected: one plain line per event (rich would wrap at 80 columns)
        plain = PipeHandler(sys.stdout)
        plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(plain)
    if run_dir is not None:
        fh = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(fh)
    logger.propagate = False




def build_trainer(cfg: Config, timeline: Timeline | None = None) -> Trainer:
    timeline = timeline or Timeline()
    ranks = start_process(cfg)
    rank = ranks.rank
    # Rank 0 checks the folder before any rank writes to it: another rank's train.log, opened first, made rank 0
    # refuse a fresh folder as "already holds a run" (seen on 2 H200s). The others wait for its verdict.
    run_dir = run_dirs.prepare(cfg) if rank == 0 else None
    run_dir = Path(broadcast_from_rank0(str(run_dir) if run_dir is not None else None))
    run_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(run_dir, rank)
    pick_threads(cfg, ranks.device)

    tokenizer = load_tokenizer(cfg) if (cfg.data.train or cfg.data.valid) else None
    prepared = prepare_data(cfg, tokenizer)  # a bad line or audio file: one line now, before the model is built
    timeline.end("tokenizer and data checks")
    parts = assemble(cfg, ranks)
    timeline.end("model: load, freeze, speed plan")
    cfg = parts.cfg  # the effective config: what the plan resolved for this device is what the run saves
    if rank == 0:
        save_config(cfg, run_dir / "config.yaml")
    with run_scope(cfg):  # the flags as training will run them
        state = acceleration_state(cfg, ranks.device, parts.plan)
    log.info(one_line(state))
    if rank == 0:
        write_state(state, run_dir)

    vocab = parts.model.llm.get_input_embeddings().weight.shape[0]
    train = build_split(cfg, "train", parts.collator, vocab, rank, ranks.world, tokenizer, prepared["train"])
    valid = build_split(cfg, "valid", parts.collator, vocab, rank, ranks.world, tokenizer, prepared["valid"])
    probe = None
    if cfg.probe.enabled:
        from ..probe.record import ProbeRecorder

        probe = ProbeRecorder(run_dir / f"probe.rank{rank}.jsonl", parts.model, cfg.probe.param_norm_steps, rank,
                              cfg.to_dict())

    t = cfg.train
    ckpts = Checkpoints(run_dir, t.keep_n, t.keep_metric) if rank == 0 else None
    saver = AsyncCheckpointer(ckpts, parts.model, ranks.device, t.async_checkpoint, t.frozen_ref,
                              run_dir / "checkpoints.jsonl") if ckpts else None
    pos = run_state.resume(cfg, parts, ckpts, run_dir)  # every rank loads the same checkpoint
    if rank == 0:
        check_disk(cfg, parts, ckpts, train, pos, run_dir)
    if saver is not None and not parts.sharded:
        saver.start_frozen()  # written in the background while the graphs below compile

    timer = StepTimer(ranks.device, run_dir / f"steps{'' if rank == 0 else f'.rank{rank}'}.jsonl")
    hooks = step_hooks(parts, mark=timer.mark, logit_stats=probe is not None,
                       grad_groups=probe.grad_groups if probe is not None else None)
    timeline.end("data loaders, resume")
    step_fn = step_function(parts, train_step(parts, hooks))  # speed.graph_capture=ahead captures every bucket here
    timeline.end("step set-up")
    return Trainer(cfg, run_dir, parts, step_fn, train, valid, timer, ckpts, saver, probe, pos,
                   trap=state["plan_build_trap"], timeline=timeline)


def check_disk(cfg: Config, parts: Parts, ckpts: Checkpoints | None, train, pos: Position, run_dir: Path) -> None:
    """Refuse a run whose checkpoints and export would not fit on the disk of its output folder."""
    t = cfg.train
    held = held_checkpoints(cfg, ckpts, train, pos) + (1 if t.average_best else 0)  # + checkpoints/avg-best<N>.pt
    need, what = disk_footprint(parts.model, parts.optimizer, held, t.export != "none")
    free = shutil.disk_usage(run_dir).free
    if need > free:
        raise ConfigError(
            f"train.output_dir={run_dir}: this run needs about {gb(need)} of disk ({what}) but only "
            f"{gb(free)} are free there. Keep fewer checkpoints (train.keep_n={t.keep_n}), save less often "
            f"(train.save_every={t.save_every}), skip the export (train.export=none), "
            "or point train.output_dir at a larger disk")
    log.info("disk: the run needs about %s (%s); %s free in %s", gb(need), what, gb(free), run_dir)


def held_checkpoints(cfg: Config, ckpts: Checkpoints | None, train, pos: Position) -> int:
    """New checkpoint files the rest of the run holds at once at most: keep_n best + the latest + the one being
    written, less those already in the folder, and no more than the saves still to come."""
    t = cfg.train
    per_epoch, total = steps_per_epoch(cfg, train), planned_steps(cfg, train)
    saves = sum(1 for s in range(pos.step + 1, total + 1) if (t.save_every and s % t.save_every == 0) or s % per_epoch == 0)
    saves += 1 if t.save_final else 0
    existing = len(ckpts.index) if ckpts else 0
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
    run_state.check(cfg, rank)  # a resume's config against the run's: before the folder is locked, logged to or rewritten
    threads = torch.get_num_threads()  # train.cpu_threads sets the process's count for the steps only
    with run_dirs.run_lock(cfg.train.output_dir, rank):
        try:
            return _train(cfg, threads)
        finally:  # the run's train.log is closed: what this process says later (another command) is not its
            setup_logging(None, rank)
            torch.set_num_threads(threads)


def _train(cfg: Config, threads: int) -> dict:
    export = cfg.train.export
    if cfg.train.average_best and cfg.train.parallel == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("train.average_best with train.parallel=fsdp is not supported yet: average after the run "
                          "with a single process, or use train.parallel=ddp")
    timeline = Timeline()
    timeline.end("python, imports, config")
    trainer = build_trainer(cfg, timeline)
    if export != "none" and not (cfg.data.tokenizer or cfg.model.llm.path):
        log.warning("train.export=%s skipped: a model folder needs a tokenizer (data.tokenizer or model.llm.path)", export)
        export = "none"
    with StopOnSignal(enabled=not torch.distributed.is_initialized()) as stop:
        try:
            result = trainer.fit(stop)  # the final checkpoint is written here, before any export
        finally:
            trainer.close_data()
            torch.set_num_threads(threads)  # averaging and export are host work: not on the steps' one GPU thread
    timeline.end("training: steps, validation, checkpoints")
    if stop.requested:  # Ctrl-C or pre-emption: the checkpoint is on disk; no export, no report, exit soon
        return result
    run_dir = trainer.run_dir
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank's steps file is complete before rank 0 writes the report
    full = use_average(trainer, cfg) if cfg.train.average_best else None  # the export then holds the average
    if full is not None:
        timeline.end("average of the best checkpoints")
    if full is None:
        full = trainer.weights()[0] if trainer.sharded and export != "none" else None  # FSDP: a collective
    if full is None and export != "none" and trainer.rank == 0:
        full = trainer.export_state()  # the trained weights from the final checkpoint's host buffers, if they are there
    if trainer.rank == 0:
        timeline.write(run_dir)  # what the report below reads; rewritten with the export's span at the end
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
            timeline.end("export")
        if report is not None:
            finish_report(report)
            timeline.end("report (plots, beside the export)")
        timeline.write(run_dir)
        log.info("where the time went: %s", timeline.summary())
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
