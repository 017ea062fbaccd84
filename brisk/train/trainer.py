"""The training loop. Timing, metrics, probe, slow-step detection and GC are components around the step."""

from __future__ import annotations

import gc
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import Config
from ..data.loader import Split
from ..diagnose.slow import GCWatch, SlowStepDetector
from ..diagnose.timeline import Timeline
from ..diagnose.timer import StepTimer
from ..distributed.ranks import gather_to_rank0
from ..families import family_of
from ..speed.compile import compile_counters, compile_seconds, compile_split
from ..speed.flags import run_scope
from .assemble import Parts
from .async_save import AsyncCheckpointer
from .checkpoint import Checkpoints, rng_state
from .monitor import Monitor
from .run_state import Position
from .step import StepFunction, StepHooks, model_loss
from .val_decode import ValDecoder

log = logging.getLogger("brisk")


def steps_per_epoch(cfg: Config, train: Split) -> int:
    """Optimizer steps an epoch of ``train`` takes, at least 1."""
    return max(1, len(train.sampler.batches(0)) // cfg.train.accum_grad)


def planned_steps(cfg: Config, train: Split) -> int:
    """Optimizer steps the run takes: its epochs (an epoch shorter than accum_grad counts none), cut at
    train.max_steps."""
    total = len(train.sampler.batches(0)) // cfg.train.accum_grad * cfg.train.max_epochs
    return min(total, cfg.train.max_steps) if cfg.train.max_steps else total


def freeze_gc() -> None:
    """train.gc_every's start: everything alive now (model, data) is never scanned again, and Python's collector
    runs only where the loop calls it (a collection over a large model's objects lands on an arbitrary step)."""
    gc.collect()
    gc.freeze()
    gc.disable()


@dataclass
class Trainer:
    """The loop around one ``step_fn`` (a TrainStep, or a GraphedStep replaying it), built whole by
    ``run.build_trainer``: the run's parts, its data, and where it writes (timer, checkpoints)."""

    cfg: Config
    run_dir: Path
    parts: Parts
    step_fn: StepFunction
    train: Split
    valid: Split | None
    timer: StepTimer
    ckpts: Checkpoints | None = None  # rank 0 only
    saver: AsyncCheckpointer | None = None  # rank 0 only
    probe: object | None = None
    pos: Position = field(default_factory=Position)
    trap: str | None = None  # the cuDNN plan-build explanation for this machine (acceleration_state has it)
    saved_step: int = -1
    phases: dict = field(default_factory=dict)  # seconds spent between/around steps: validation, checkpoint, gc
    stop: object | None = None  # brisk.train.stop.StopOnSignal: a SIGINT/SIGTERM ends the run after the step
    frozen_at: int = 0  # train.gc_every: the graphs captured when the collector last froze what was alive
    timeline: Timeline = field(default_factory=Timeline)  # the run's spans, launch to export (timeline.json)

    def __post_init__(self):
        c = self.cfg
        rank = "" if self.rank == 0 else f".rank{self.rank}"  # every rank logs its slow steps; the report merges them
        self.detector = SlowStepDetector(c.diagnose.slow_factor, c.diagnose.warmup_steps, c.diagnose.window,
                                         self.trap, self.run_dir / f"slow_steps{rank}.jsonl",
                                         cpu_device=self.device.type == "cpu")
        self.gcwatch = GCWatch()
        self.monitor = Monitor(self.run_dir, self.total_steps(), every=c.train.log_every, progress=c.train.progress,
                               tensorboard=c.train.tensorboard, rank=self.rank,
                               labelled=family_of(c).labelled)
        if self.probe is not None:
            self.monitor.listeners.append(self.probe.on_metrics)
        if self.clipping_by_previous and self.pos.clip_norm:  # after the graphs' capture, which keeps it
            self.in_backward.set_previous_norm(self.pos.clip_norm)
        self.decoder = (ValDecoder(self.valid, self.run_dir, c.train.val_decode, self.device, fast=c.train.val_decode_fast,
                                   recognizer=family_of(c).val_recognizer)
                        if c.train.val_decode else None)

    # The parts the loop reads, by name.
    model = property(lambda self: self.parts.model)  # the plain model (unwrapped)
    optimizer = property(lambda self: self.parts.optimizer)
    schedule = property(lambda self: self.parts.schedule)
    device = property(lambda self: self.parts.device)
    rank = property(lambda self: self.parts.ranks.rank)
    sharded = property(lambda self: self.parts.sharded)
    shape_sync = property(lambda self: self.parts.shape_sync)

    def total_steps(self) -> int:
        return planned_steps(self.cfg, self.train)

    def total_epochs(self) -> int:
        per_epoch = steps_per_epoch(self.cfg, self.train)
        steps = self.cfg.train.max_steps
        return min(self.cfg.train.max_epochs, -(-steps // per_epoch)) if steps else self.cfg.train.max_epochs

    def counters(self) -> dict:
        split = compile_split()  # read once: compile_seconds() is their sum
        return {**compile_counters(), "compile_seconds": sum(split.values()),
                **{f"compile_{k}_seconds": v for k, v in split.items()}, "gc_seconds": self.gcwatch.seconds,
                **self.step_fn.captures}  # a GraphedStep's graphs so far

    # ------------------------------------------------------------------------------------ the loop
    def fit(self, stop=None) -> dict:
        c = self.cfg.train
        self.stop = stop
        self.parts.accel.train_mode()
        log.info("training from step %d (epoch %d)", self.pos.step, self.pos.epoch)  # the first step's start, in train.log
        with run_scope(self.cfg):
            if self.pos.step == 0:  # the "before" of the validation curves (nothing without a validation set)
                self.validate()
            self.timeline.end("validation before the first step" if self.valid is not None and self.pos.step == 0
                              else "trainer set-up")
            while self.pos.epoch < c.max_epochs and not self.done():
                self.monitor.epoch = (self.pos.epoch + 1, self.total_epochs())
                self.train.sampler.set_epoch(self.pos.epoch, self.pos.batches_in_epoch)
                for batches, wait in self.groups(self.train.loader):
                    self.train_step(batches, wait)
                    if self.done():
                        break
                else:
                    self.end_epoch()
            if self.saved_step != self.pos.step:  # stopped by max_steps (or a signal) inside an epoch
                if not self.signalled():
                    self.timed("validation", self.validate)
                if c.save_final or self.signalled():
                    self.timed("checkpoint", self.save)
        return self.finish()

    def checkpoints_ahead(self) -> bool:
        """Will this run write a checkpoint? A measurement run (max_steps inside the first epoch, no save_every,
        no save_final) does not, and then no pinned host buffers are allocated: pinning them in the background
        (GBs at about 1 GB/s) holds up the launching thread's steps meanwhile (docs/bigger-decoders.md)."""
        c = self.cfg.train
        if c.save_every or c.save_final or not c.max_steps:
            return True
        return c.max_steps >= steps_per_epoch(self.cfg, self.train)  # an epoch ends first

    def done(self) -> bool:
        return (bool(self.cfg.train.max_steps) and self.pos.step >= self.cfg.train.max_steps) or self.signalled()

    def signalled(self) -> bool:
        return self.stop is not None and self.stop.requested

    def groups(self, loader):
        """Yield (batches for one optimizer step, seconds waited for them); skips batches left empty by skip_bad."""
        group, waited, t0 = [], 0.0, time.perf_counter()
        for batch in loader:
            waited += time.perf_counter() - t0
            if self.shape_sync is not None:  # every rank, every batch (empty ones too): a collective
                batch = self.shape_sync(batch)
            self.pos.bad_samples += len(batch.bad)
            for reason in batch.bad:
                log.warning("skipped a bad sample: %s", reason)
            if batch.n_utts == 0:
                self.pos.empty_batches += 1
                self.pos.batches_in_epoch += 1
            else:
                group.append(batch.to(self.device, non_blocking=True))
                if len(group) == self.cfg.train.accum_grad:
                    yield group, waited
                    group, waited = [], 0.0
            t0 = time.perf_counter()

    def train_step(self, batches, wait: float) -> None:
        p, c = self.pos, self.cfg.train
        p.step += 1
        t0 = time.perf_counter()
        self.timer.start(p.step, p.epoch, batches[0], wait, self.counters())
        if self.probe is not None:
            self.probe.on_batch(p.step, batches[0])
        lr = self.schedule.lr
        self.timeline.mark("first step start")
        metrics = self.step_fn(batches)
        self.timeline.mark("first step end")  # the host's view: a GPU may still be running it
        module_norms = metrics.pop("module_norms", None)  # a vector: for the probe, not the monitor
        if p.step == 1 and self.saver is not None and not self.sharded and self.checkpoints_ahead():
            self.saver.warm(self.state)  # pinned checkpoint buffers, allocated off the step's path
        p.batches_in_epoch += len(batches)
        self.monitor.add(p.step, metrics, lr)
        if self.probe is not None:
            self.probe.after_step(p.step, module_norms)
        if c.val_every and p.step % c.val_every == 0:
            self.timed("validation", self.validate)
        if c.save_every and p.step % c.save_every == 0:
            self.timed("checkpoint", self.save)
        if c.gc_every:
            captured = sum(self.step_fn.captures.values())
            if p.step == 1 or captured != self.frozen_at:  # a capture's compile made long-lived objects too
                self.frozen_at = captured
                freeze_gc()
            elif p.step % c.gc_every == 0:
                self.timed("gc", gc.collect)
        for rec in self.timer.end(self.counters()):
            self.monitor.step_time(rec["total"])
            self.detector.observe(rec)
        log.debug("step %d host time %.3f s", p.step, time.perf_counter() - t0)

    def timed(self, name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        self.timer.event(name, dt)
        self.phases[name] = self.phases.get(name, 0.0) + dt

    def end_epoch(self) -> None:
        self.timed("validation", self.validate)
        self.pos.epoch += 1
        self.pos.batches_in_epoch = 0
        self.timed("checkpoint", self.save)

    # ------------------------------------------------------------------------- validation and saving
    @torch.no_grad()
    def validate(self) -> dict | None:
        if self.valid is None:
            return None
        with self.parts.accel.eval_context():  # compiled modules run eagerly here (speed.compile)
            return self._validate()

    def _validate(self) -> dict:
        val = self.measure()
        self.pos.history.append({"step": self.pos.step, **val})
        if self.rank == 0:
            with (self.run_dir / "history.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps({"step": self.pos.step, **val}) + "\n")
        self.monitor.define_acc()
        log.info("validation at step %d: loss %.4f  acc %.4f  (%d tokens)", self.pos.step, val["loss"], val["acc"],
                 val["tokens"])
        self.monitor.scalar("valid/loss", val["loss"], self.pos.step)
        self.monitor.scalar("valid/acc", val["acc"], self.pos.step)
        if "cer" in val:
            log.info("validation decode at step %d: CER %.2f%%  WER %.2f%%  (%d utterances, %.1f s)", self.pos.step,
                     100 * val["cer"], 100 * val["wer"], val["decoded"], val["decode_seconds"])
            self.monitor.scalar("valid/cer", val["cer"], self.pos.step)
            self.monitor.scalar("valid/wer", val["wer"], self.pos.step)
        if self.probe is not None:
            self.probe.on_validation(self.pos.step, val)
        return val

    def measure(self, tag: str | None = None) -> dict:
        """Validation loss and accuracy (and CER/WER with train.val_decode) of the model's weights now, recorded
        nowhere; ``tag`` names the weights in valid_decode.jsonl (the averaged checkpoints)."""
        self.monitor.flush()
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        count = torch.zeros((), device=self.device, dtype=torch.long)
        # The step's own audio provider (the graphed step's replays encoder graphs), the step's loss.
        hooks = StepHooks(audio=self.step_fn.audio, loss=self.parts.accel.loss)
        with self.step_fn.no_new_audio_graphs():
            for batch in self.valid.loader:
                if batch.n_utts == 0:
                    continue
                batch = batch.to(self.device, non_blocking=True)
                _, loss, c, n = model_loss(self.model, batch, hooks)
                loss_sum += loss.double() * n
                correct += c
                count += n
        self.parts.accel.train_mode()
        if torch.distributed.is_initialized():
            for t in (loss_sum, correct, count):
                torch.distributed.all_reduce(t)
        n = max(int(count), 1)
        val = {"loss": float(loss_sum) / n, "acc": int(correct) / n, "tokens": int(count)}
        if self.cfg.train.val_decode and self.rank == 0:
            with self.parts.accel.decode_context():  # packed training: decoding takes padded rows
                val.update(self.decoder.run(self.model, self.pos.step, tag))
        return val

    @property
    def in_backward(self):
        """speed.optimizer_in_backward's updater, or None (a GraphedStep replays the TrainStep it holds)."""
        return self.step_fn.hooks.in_backward

    @property
    def clipping_by_previous(self) -> bool:
        return self.in_backward is not None and self.in_backward.grad_clip > 0

    def state(self) -> dict:
        p = self.pos
        model_sd, optim_sd = self.weights()
        return {
            "state_dict": model_sd,
            "optimizer": optim_sd,
            "schedule": self.schedule.state_dict(),
            "trainer": {"step": p.step, "epoch": p.epoch, "batches_in_epoch": p.batches_in_epoch,
                        "bad_samples": p.bad_samples, "history": p.history,
                        **({"clip_norm": self.in_backward.previous_norm()} if self.clipping_by_previous else {})},
            "config": self.cfg.to_dict(),
        }

    def weights(self) -> tuple[dict, dict]:
        """Model and optimizer state dicts; under FSDP the full ones, gathered to rank 0 (all ranks call this)."""
        if self.sharded:
            from ..distributed.fsdp import full_state

            return full_state(self.model, self.optimizer)
        return self.model.state_dict(), self.optimizer.state_dict()

    def export_state(self) -> dict | None:
        """model.state_dict() with every tensor the final checkpoint's snapshot holds taken from its host copy
        (the export then copies only the frozen weights from the device, where a pageable copy is slow). None (the export reads the model) unless that snapshot is of this very step."""
        if self.saver is None or self.sharded:
            return None
        self.saver.wait()
        host = self.saver.host_weights(self.pos.step)
        if not host:
            return None
        own = self.model.state_dict()
        if any(k in host and (host[k].shape != v.shape or host[k].dtype != v.dtype) for k, v in own.items()):
            return None
        return {k: host.get(k, v) for k, v in own.items()}

    def save(self) -> None:
        rngs = gather_to_rank0(rng_state())  # every rank's RNG (a collective: all ranks save together)
        if self.sharded and self.ckpts is None:
            self.weights()  # a collective: rank 0 gathers the shards
        if self.ckpts is None:  # only rank 0 writes
            self.saved_step = self.pos.step
            return
        self.monitor.flush()
        last = self.pos.history[-1] if self.pos.history and self.pos.history[-1]["step"] == self.pos.step else None
        state = {**self.state(), "rng": rngs[0], "rng_ranks": rngs}
        self.saver.save(state, self.pos.step, last and {k: last[k] for k in ("loss", "acc", "cer") if k in last})
        self.saved_step = self.pos.step

    def close_data(self) -> None:
        for split in (self.train, self.valid):
            if split is not None:
                split.close()

    def finish(self) -> dict:
        self.close_data()
        if self.saver is not None:
            self.phases["checkpoint_exit_wait"] = self.saver.close()  # the last write is on disk before the run ends
        if self.cfg.speed.compile:
            self.phases["compile"] = compile_seconds()  # inside steps (and capture), not added to them
        log.info("time around the steps: %s", json.dumps({k: round(v, 3) for k, v in self.phases.items()}))
        self.timeline.details["training"] = dict(self.phases)
        self.monitor.close()
        for rec in self.timer.close():
            self.monitor.step_time(rec["total"])
            self.detector.observe(rec)
        self.detector.close()
        self.gcwatch.close()
        if self.cfg.train.gc_every:
            gc.enable()
            gc.unfreeze()
        if self.probe is not None:
            self.probe.close()
        bad_lines = self.train.counts.get("bad_rows", len(self.train.skipped_lines))
        if self.pos.bad_samples or bad_lines:
            log.warning("data.skip_bad: skipped %d bad samples and %d bad %s in training", self.pos.bad_samples,
                        bad_lines, "rows" if "bad_rows" in self.train.counts else "jsonl lines")
        if any(self.train.counts.values()):  # nothing left out silently: the summary repeats the data's counts
            log.info("training data not used as written: %s",
                     ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in self.train.counts.items() if n))
        return {"step": self.pos.step, "history": self.pos.history, "slow_steps": self.detector.slow,
                "slow_in_run": self.detector.run_total(),
                "bad_samples": self.pos.bad_samples, "bad_lines": bad_lines, "data_counts": dict(self.train.counts),
                "last": self.monitor.last, "transcripts": self.decoder.last_rows if self.decoder else [],
                "stopped_by": self.stop.signum if self.signalled() else None,
                "checkpoint": self.ckpts.latest() if self.ckpts else None}
