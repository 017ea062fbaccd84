"""Metrics: kept on the device each step, read back in one sync every log interval.

Feeds the console (a rich progress bar with loss, lr and step time, plus a log line), TensorBoard
scalars, and any listener that wants the per-step host values (the probe).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger("brisk")


class Monitor:
    def __init__(self, run_dir: Path, total_steps: int | None, *, every: int, progress: bool, tensorboard: bool,
                 rank: int = 0, labelled: str = "transcript"):
        self.every = max(1, every)
        self.labelled = labelled  # what the labelled tokens are: transcript (speech) or assistant (chat)
        self.pending: list[tuple[int, dict, float]] = []  # (step, device metrics, lr)
        self.listeners: list[Callable[[int, dict], None]] = []
        self.step_times: list[float] = []
        self.last: dict = {}
        self.writer = None
        self.bar = None
        self.epoch: tuple[int, int] | None = None  # (current, total), 1-based; set by the trainer
        self.defined_acc = False
        # Per-step training metrics for the report's loss curve (one line per logged step).
        self.file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8") if rank == 0 else None
        if rank == 0 and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # pragma: no cover - tensorboard is a dependency, but stay usable
                log.warning("tensorboard is not installed; no TensorBoard scalars")
        if rank == 0 and progress and _terminal():  # piped output gets the log lines only
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                TextColumn("{task.fields[info]}"))
            self.task = self.bar.add_task("train", total=total_steps, info="")
            self.bar.start()

    def add(self, step: int, metrics: dict[str, torch.Tensor], lr: float) -> None:
        self.pending.append((step, metrics, lr))
        if len(self.pending) >= self.every:
            self.flush()

    def step_time(self, seconds: float) -> None:
        self.step_times.append(seconds)

    def flush(self) -> None:
        if not self.pending:
            return
        names = sorted(self.pending[0][1])
        # One device->host copy for the whole interval: this is the only sync the metrics cost.
        values = torch.stack([torch.stack([m[n].float() for n in names]) for _, m, _ in self.pending]).tolist()
        rows = []
        for (step, _, lr), vals in zip(self.pending, values):
            row = dict(zip(names, vals), lr=lr)
            row["acc"] = row["correct"] / max(row["count"], 1.0)
            rows.append((step, row))
            for fn in self.listeners:
                fn(step, row)
        self.pending.clear()
        n = len(rows)
        last_step = rows[-1][0]
        avg = {k: sum(r[k] for _, r in rows) / n for k in ("loss", "acc", "grad_norm")}
        skipped = int(sum(r["skipped"] for _, r in rows))
        recent = self.step_times[-n:] or [0.0]
        st = sorted(recent)[len(recent) // 2]
        self.last = {"step": last_step, **avg, "lr": rows[-1][1]["lr"], "step_time": st, "skipped": skipped}
        if self.writer:
            for step, r in rows:
                for k in ("loss", "acc", "grad_norm", "lr"):
                    self.writer.add_scalar(f"train/{k}", r[k], step)
            self.writer.add_scalar("train/step_time_median", st, last_step)
        if self.file:
            for step, r in rows:
                self.file.write(json.dumps({"step": step, **{k: r[k] for k in ("loss", "acc", "grad_norm", "lr")}}) + "\n")
            self.file.flush()
        info = f"loss {avg['loss']:.4f}  acc {avg['acc']:.3f}  lr {rows[-1][1]['lr']:.2e}  {st * 1000:.0f} ms/step"
        if skipped:
            info += f"  skipped {skipped}"
        if self.bar:
            self.bar.update(self.task, completed=last_step, info=info)
        self.define_acc()
        where = f" (epoch {self.epoch[0]}/{self.epoch[1]})" if self.epoch else ""
        log.info("step %d%s: %s", last_step, where, info)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer:
            self.writer.add_scalar(tag, value, step)

    def define_acc(self) -> None:
        """Say once, before the first line that shows acc, what it means."""
        if not self.defined_acc:
            self.defined_acc = True
            log.info("acc = share of %s tokens whose next token the model predicts right (argmax, "
                     "teacher-forced); loss = their mean cross-entropy", self.labelled)

    def close(self) -> None:
        self.flush()
        if self.file:
            self.file.close()
            self.file = None
        if self.bar:
            self.bar.stop()
        if self.writer:
            self.writer.close()


def _terminal() -> bool:
    from rich.console import Console

    return Console().is_terminal
