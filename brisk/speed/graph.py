"""speed.cuda_graph: each packed bucket's whole training step captured once as a CUDA graph, then replayed.

The step is ~6,000 small kernels; launched one by one the host sets the pace (130-200 ms for ~4 ms of
math). Replaying a graph launches them all at once. What makes the step capturable:

- packed batches padded to a few bucket lengths (speed.packing), with a fixed number of audio slots and
  cu_seqlens entries, so each bucket has one set of shapes (collate.Collator(static=True));
- no host sync inside: fused, capturable AdamW with lr as a device tensor; the non-finite skip is the
  kernel's found_inf; gradient clipping is folded into the fused update as its grad_scale (the same
  coefficient, min(1, max_norm / (norm + 1e-6)), applied inside the kernel instead of a separate pass);
- gradients are persistent buffers, zeroed in place at the start of each replay and shared by every
  bucket's graph; activations of all graphs come from one shared memory pool;
- the frozen encoder and adaptor run in their own graphs, one per speech bucket, without autograd.

Graphs are captured up front for every bucket (``prepare``), warming each one with lr = 0 and then
restoring the optimizer state, so the run's numbers are those of the eager step. A batch
longer than every bucket (or than 3,072 tokens, where CUDA's embedding backward needs a sort with a host
sync) runs the same step eagerly and is logged. Gradient accumulation is not supported (config error).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..data.batch import Batch
from ..train.step import TrainStep, logit_stats, model_loss

log = logging.getLogger("brisk")

MAX_GRAPH_TOKENS = 3072


def _clone(batch: Batch) -> Batch:
    return batch._map(lambda t: t.clone())


def _copy_into(dst: Batch, src: Batch) -> None:
    for name in ("input_ids", "labels", "audio_utt", "audio_frame", "audio_pos", "position_ids", "cu_seqlens"):
        getattr(dst, name).copy_(getattr(src, name), non_blocking=True)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: Batch  # static inputs
    rows: torch.Tensor  # static audio rows
    out: torch.Tensor  # static metrics vector


class GraphedEncoder:
    """Frozen encoder + adaptor per speech bucket [utterances, frames], no autograd."""

    def __init__(self, model, pool):
        self.model, self.pool = model, pool
        self.graphs: dict[tuple, tuple] = {}

    @torch.no_grad()
    def capture(self, speech: torch.Tensor, lengths: torch.Tensor):
        speech, lengths = speech.clone(), lengths.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model.encode_audio(speech, lengths)  # warm-up: lazy init, cuBLAS workspaces
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self.model.encode_audio(speech, lengths)
        self.graphs[tuple(speech.shape)] = (graph, speech, lengths, out)

    @torch.no_grad()
    def __call__(self, batch: Batch) -> torch.Tensor:
        key = tuple(batch.speech.shape)
        if key not in self.graphs:
            log.info("cuda_graph: capturing the encoder for speech shape %s", key)
            self.capture(batch.speech, batch.speech_lengths)
        graph, speech, lengths, out = self.graphs[key]
        speech.copy_(batch.speech, non_blocking=True)
        lengths.copy_(batch.speech_lengths, non_blocking=True)
        graph.replay()
        return out[batch.audio_utt, batch.audio_frame]


class GraphedStep:
    def __init__(self, step: TrainStep, audio, *, grad_clip: float):
        opt = step.optimizer
        group = opt.param_groups[0]
        if not (group.get("fused") and group.get("capturable") and isinstance(group["lr"], torch.Tensor)):
            raise ValueError("speed.cuda_graph needs the fused, capturable AdamW with a tensor lr (built by brisk)")
        self.step, self.audio, self.grad_clip = step, audio, grad_clip
        self.model, self.optimizer, self.params = step.model, opt, step.params
        for p in self.params:  # persistent gradients: every graph accumulates into the same buffers
            p.grad = torch.zeros_like(p)
        self.pool = torch.cuda.graph_pool_handle()
        self.encoder = GraphedEncoder(self.model, self.pool)
        audio.encode = self.encoder  # the frozen audio path now replays encoder graphs
        self.graphs: dict[int, _Captured] = {}
        self.sync_grads = None  # several ranks: train.dist.GradSync, captured between backward and clipping
        self.capture_seconds = 0.0
        self.eager_fallbacks = 0

    # -------------------------------------------------------------------------------------- the step
    def _body(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        h = self.step.hooks
        self.optimizer.zero_grad(set_to_none=False)
        logits, loss, correct, count = model_loss(self.model, batch, h, rows)
        with h.context():
            loss.backward()
        if self.sync_grads is not None:
            self.sync_grads()
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.params])
        found_inf = (~torch.isfinite(norm)).to(torch.float32)
        self.optimizer.found_inf = found_inf
        if self.grad_clip > 0:  # grads / scale == grads * min(1, clip / (norm + 1e-6))
            self.optimizer.grad_scale = torch.clamp((norm.float() + 1e-6) / self.grad_clip, min=1.0)
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
            if self.grad_clip > 0:
                del self.optimizer.grad_scale
        parts = [loss.detach().float(), correct.float(), count.float(), norm.detach().float(), found_inf]
        if h.logit_stats:
            parts += [s.float() for s in logit_stats(logits, batch.labels)]
        return torch.stack(parts)

    @staticmethod
    def _metrics(vec: torch.Tensor, logit: bool) -> dict[str, torch.Tensor]:
        names = ["loss", "correct", "count", "grad_norm", "skipped"] + (["logits_absmean", "logits_std"] if logit else [])
        return dict(zip(names, vec.unbind()))

    def _capture(self, batch: Batch, rows: torch.Tensor) -> _Captured:
        static, static_rows = _clone(batch), rows.clone()
        t0 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._body(static, static_rows)
        self.capture_seconds += time.perf_counter() - t0
        return _Captured(graph, static, static_rows, out)

    def _warm(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._body(batch, rows)
        torch.cuda.current_stream().wait_stream(side)
        return out

    # ------------------------------------------------------------------------------------- up front
    def prepare(self, batches: list[Batch]) -> float:
        """Capture a graph per bucket before training, from example batches of each bucket's shapes.

        Warm-ups run with lr = 0 (parameters unchanged); afterwards the optimizer state is put back as it
        was (zero moments and step counts for a fresh optimizer, the loaded ones after a resume).
        """
        t0 = time.perf_counter()
        saved = {p: {k: v.clone() for k, v in st.items() if torch.is_tensor(v)} for p, st in self.optimizer.state.items()}
        lr = [g["lr"].clone() for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"].zero_()
        for b in batches:
            rows = self.audio(b)
            t = b.input_ids.shape[1]
            if t not in self.graphs and t <= MAX_GRAPH_TOKENS:
                self._warm(b, rows)
                cap = self._capture(b, rows)
                cap.graph.replay()  # the first replay of a graph pays its upload; do it here, at lr = 0
                self.graphs[t] = cap
        for g, v in zip(self.optimizer.param_groups, lr):
            g["lr"].copy_(v)
        for p, st in self.optimizer.state.items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    v.copy_(saved[p][k]) if p in saved else v.zero_()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    # ---------------------------------------------------------------------------------------- call
    def __call__(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        if len(batches) != 1:
            raise ValueError("speed.cuda_graph does not support gradient accumulation (train.accum_grad must be 1)")
        batch = batches[0]
        h = self.step.hooks
        rows = self.audio(batch)
        t = batch.input_ids.shape[1]
        cap = self.graphs.get(t)
        if cap is None:
            if t > MAX_GRAPH_TOKENS or batch.layout != "packed":
                self.eager_fallbacks += 1
                log.info("cuda_graph: no graph for a %d-token row; this step runs eagerly", t)
                vec = self._body(batch, rows)
            else:
                log.info("cuda_graph: capturing a graph for a %d-token bucket (not prepared up front)", t)
                vec = self._warm(batch, rows)
                self.graphs[t] = self._capture(batch, rows)
        else:
            _copy_into(cap.batch, batch)
            cap.rows.copy_(rows, non_blocking=True)
            cap.graph.replay()
            vec = cap.out.clone()  # the static output is overwritten by the next replay
        h.mark("optimizer")
        for fn in h.on_grads:
            fn()
        self.step.schedule.step()
        return self._metrics(vec, h.logit_stats)
