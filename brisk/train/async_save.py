"""train.async_checkpoint: checkpoints that do not stop training.

A save takes a snapshot of what the checkpoint needs (trainable weights and buffers, optimizer state,
schedule, trainer position, RNG) into reused host buffers (pinned when CUDA is in use, so the copies
from the GPU are DMA and a single stream sync covers them), then hands the snapshot to one background
thread that writes it with the same atomic write as the synchronous path (temp file, rename, then index.json)
but does not wait for the disk: the files go to brisk.files.SYNCER, which fsyncs them in the background, in
order (a killed process leaves the previous checkpoint or the new one; after a power loss, resume skips a
newest checkpoint that did not reach the disk whole: ``Checkpoints.latest_intact``). At most one write is in
flight: the next save first waits for the previous write, since it reuses its buffers. close() joins the
writer; a write that failed raises on the next save or at close.

train.frozen_ref: weights that never change (parameters with requires_grad=False) are written once per
run to ``checkpoints/frozen-<sha256[:16]>.pt``; each checkpoint stores a reference (file name, content
hash, keys) instead of the tensors. ``brisk.models.build.read_checkpoint`` resolves the reference,
checks the hash, and hands back the full state dict, so resume and model.init are unchanged.

What the step waited (the stall), each checkpoint's size and write time, and the run's footprint are
logged; the stall is the "checkpoint" event of the step in steps.jsonl and the write time its
"checkpoint_write" event, reported on the step during which the write finished.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import torch

from ..files import SYNCER, atomic_save, file_sha256, gb
from ..models.build import FROZEN_REF_KEY

log = logging.getLogger("brisk")


def frozen_keys(model: torch.nn.Module) -> set[str]:
    """state_dict keys of parameters that training never changes (tied aliases included)."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


class HostSnapshot:
    """Copies a nested state (dicts, lists, tuples, tensors, plain values) into reused host buffers.

    Buffers are keyed by their place in the structure and reused when shape and dtype match. Tensors
    sharing storage (a tied lm_head) map to one buffer, so the file stores them once, as torch.save would.
    """

    def __init__(self, pin: bool):
        self.pin = pin
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, state, copy: bool = True) -> object:
        """The state with every tensor replaced by its host buffer (copy=False: only allocate the buffers)."""
        memo: dict[tuple, torch.Tensor] = {}
        self.copy = copy
        out = self._copy(state, "", memo)
        if self.pin and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non_blocking copies above are done before the writer reads them
        return out

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def _copy(self, x, where: str, memo: dict):
        if isinstance(x, torch.Tensor):
            return self._tensor(x, where, memo)
        if isinstance(x, dict):
            return {k: self._copy(v, f"{where}/{k}", memo) for k, v in x.items()}
        if isinstance(x, list):
            return [self._copy(v, f"{where}/{i}", memo) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return tuple(self._copy(v, f"{where}/{i}", memo) for i, v in enumerate(x))
        return x  # ints, floats, strings, numpy RNG arrays: fresh or immutable

    def _tensor(self, t: torch.Tensor, where: str, memo: dict) -> torch.Tensor:
        t = t.detach()
        alias = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and alias in memo:
            return memo[alias]
        buf = self.buffers.get(where)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin and t.is_cuda)
            self.buffers[where] = buf
        if self.copy:
            buf.copy_(t, non_blocking=t.is_cuda and buf.is_pinned())
        memo[alias] = buf
        return buf


class AsyncCheckpointer:
    """save(state, step, val) returns after the snapshot; the write happens on a background thread."""

    def __init__(self, ckpts, model: torch.nn.Module, device: torch.device, asynchronous: bool = True,
                 frozen_ref: bool = True, record: Path | None = None):
        self.ckpts, self.model, self.record = ckpts, model, record
        self.asynchronous = asynchronous
        self.frozen = frozen_keys(model) if frozen_ref else set()
        self.frozen_ref: dict | None = None
        self.snapshot = HostSnapshot(pin=device.type == "cuda")
        self.threads: list[threading.Thread] = []  # the write in flight, the buffer allocation, the frozen file
        self.error: BaseException | None = None
        self.done: list[dict] = []  # finished writes, drained by the main thread (events, log lines)
        self.sizes: dict[str, int] = {}
        self.last: tuple[int, dict] | None = None  # (step, host state_dict) of the newest asynchronous snapshot

    # ---------------------------------------------------------------------------------- main thread
    def save(self, state: dict, step: int, val: dict | None) -> dict:
        """Wait for the previous write, snapshot, start the write. Returns the stall's parts in seconds."""
        t0 = time.perf_counter()
        self.wait()
        self.drain()
        t1 = time.perf_counter()
        state, frozen = self._split_frozen(state)
        # Synchronous: written as is (today's path). Asynchronous: the step may change the tensors next.
        snap = self.snapshot.take(state) if self.asynchronous else state
        self.last = (step, snap["state_dict"]) if self.asynchronous else None
        t2 = time.perf_counter()
        job = {"step": step, "stall": t2 - t0, "waited": t1 - t0, "snapshot": t2 - t1, "asynchronous": self.asynchronous}
        if self.asynchronous:
            self._spawn(self._write, snap, step, val, job, frozen)
        else:
            self._write(snap, step, val, job, frozen)
            self._raise()
        log.info("checkpoint step %d: step waited %.3f s (previous write %.3f s, snapshot %.3f s, %s in host buffers)%s",
                 step, t2 - t0, t1 - t0, t2 - t1, gb(self.snapshot.nbytes()),
                 ", writing in the background" if self.asynchronous else "")
        return job

    def host_weights(self, step: int) -> dict[str, torch.Tensor] | None:
        """The weights of the snapshot taken at ``step``, already in host memory (pinned on a GPU; the frozen
        ones are not in it). None when the newest snapshot is of another step. Read them only after close():
        the next save overwrites these buffers."""
        return dict(self.last[1]) if self.last is not None and self.last[0] == step else None

    def warm(self, state_fn) -> None:
        """Allocate the pinned buffers on the writer thread (pinning GBs takes seconds), so that the first
        checkpoint's step waits only for the copies. Called once the optimizer state exists."""
        if not (self.asynchronous and self.snapshot.pin) or self.snapshot.buffers:
            return  # (the frozen-weights write may still be running: allocation goes on beside it)
        state, _ = self._split_frozen(state_fn())
        t0 = time.perf_counter()

        def allocate():
            self.snapshot.take(state, copy=False)
            log.info("checkpoint host buffers (%s, pinned) allocated in the background in %.1f s",
                     gb(self.snapshot.nbytes()), time.perf_counter() - t0)

        self._spawn(allocate)

    def start_frozen(self) -> None:
        """Write the frozen-weights file now, in the background (they never change), so that no checkpoint waits
        for it: called before the CUDA graphs are captured, whose compiles take longer than this write. The
        host copy is taken here, on the calling thread; the writer touches no device memory."""
        if not (self.asynchronous and self.frozen) or self.frozen_ref is not None:
            return
        sd = self.model.state_dict()
        frozen = {k: sd[k].detach().cpu() for k in sorted(self.frozen) if k in sd}
        self._spawn(self._write_frozen, frozen)

    def _spawn(self, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.error = e

        t = threading.Thread(target=run, name=f"brisk-ckpt-{fn.__name__.strip('_')}", daemon=False)
        t.start()
        self.threads.append(t)

    def wait(self) -> float:
        t0 = time.perf_counter()
        for t in self.threads:
            t.join()
        self.threads = []
        self._raise()
        return time.perf_counter() - t0

    def drain(self) -> list[dict]:
        """Writes finished since the last call, appended to checkpoints.jsonl (one line a checkpoint)."""
        out, self.done = self.done, []
        if out and self.record is not None:
            with self.record.open("a", encoding="utf-8") as f:
                for job in out:
                    f.write(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in job.items()}) + "\n")
        return out

    def close(self) -> float:
        waited = self.wait()
        for job in self.done:
            job["exit_wait"] = waited  # the last write, waited for at the end of the run
        self.drain()
        on_disk = self.on_disk() if self.sizes else {}  # the run's, not only this process's
        if on_disk:
            log.info("checkpoints: %d files, %s on disk (%s)", len(on_disk), gb(sum(on_disk.values())),
                     ", ".join(f"{n} {gb(s)}" for n, s in sorted(on_disk.items())))
        return waited

    def on_disk(self) -> dict[str, int]:
        """Bytes of each checkpoint (and frozen-weights) file in the folder now."""
        out = {}
        for p in self.ckpts.dir.glob("*.pt"):
            try:
                out[p.name] = p.stat().st_size
            except FileNotFoundError:  # pruned meanwhile
                pass
        return out

    def _raise(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            raise RuntimeError(f"the background checkpoint write failed: {type(e).__name__}: {e}") from e

    def _split_frozen(self, state: dict) -> tuple[dict, dict | None]:
        """The state without frozen weights, and the frozen weights when their file is still to be written."""
        if not self.frozen:
            return state, None
        sd = state["state_dict"]
        rest = {**state, "state_dict": {k: v for k, v in sd.items() if k not in self.frozen}, FROZEN_REF_KEY: self.frozen_ref,
                "state_dict_keys": list(sd)}  # the model's key order, restored when the frozen weights are merged back
        return rest, (None if self.frozen_ref else {k: sd[k] for k in sorted(self.frozen) if k in sd})

    def _write_frozen(self, frozen: dict) -> dict:
        """Once per run, on the writer (frozen tensors never change, so the live ones are read there)."""
        t0 = time.perf_counter()
        tmp = self.ckpts.dir / "frozen.pending.pt"  # renamed to its hash once written
        atomic_save({k: v.detach().cpu() for k, v in frozen.items()}, tmp, sync=not self.asynchronous)
        sha = file_sha256(tmp)
        path = self.ckpts.dir / f"frozen-{sha[:16]}.pt"
        os.replace(tmp, path)
        if self.asynchronous:
            SYNCER.submit([path])  # under its final name (the syncer skips the temp name, renamed away)
        self.frozen_ref = {"file": path.name, "sha256": sha, "keys": sorted(frozen)}
        self.sizes[path.name] = path.stat().st_size
        log.info("frozen weights (%d tensors, %s) written once to %s in %.1f s; checkpoints reference them",
                 len(frozen), gb(self.sizes[path.name]), path, time.perf_counter() - t0)
        return self.frozen_ref

    # -------------------------------------------------------------------------------- writer thread
    def _write(self, snap: dict, step: int, val: dict | None, job: dict, frozen: dict | None) -> None:
        try:
            t0 = time.perf_counter()
            if frozen is not None:
                snap[FROZEN_REF_KEY] = self._write_frozen(frozen)
                job["frozen_write"] = time.perf_counter() - t0
                t0 = time.perf_counter()
            path = self.ckpts.save(snap, step, val, sync=not self.asynchronous)  # async: fsynced in the background
            job["write"] = time.perf_counter() - t0
            job["bytes"] = path.stat().st_size
            self.sizes = {**self.on_disk(), path.name: job["bytes"]}  # a resumed run's earlier files too
            job["footprint"] = sum(self.sizes.values())
            log.info("saved %s (%s, written in %.1f s; checkpoints on disk %s)", path, gb(job["bytes"]),
                     job["write"], gb(job["footprint"]))
            self.done.append(job)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self.error = e
