"""speed.label_head: the LM head and the loss on the labelled positions only.

The loss needs the logits of the answer tokens only (a fraction of the positions of a step), yet the default runs the 151,936-wide LM head, the fp32 cast and the cross-entropy on every
position: a large share of the step's FLOPs and its largest activations. This switch asks the model for its
final hidden states (``model(batch, hidden=True)``, before lm_head), gathers the positions whose next-token
label is set, and runs head + fp32 cross-entropy on those rows only, in chunks of ``CHUNK_ROWS``, so the
[B, T, vocab] logits never exist. Same loss (sum over labelled rows / their count, fp32), same argmax-correct
count and the same logit statistics for the probe (computed from the gathered rows: exactly the labelled
positions), same gradients up to summation order.

How many rows, without a host sync:
- the collator counts the labelled positions on the host (``Batch.n_label_tokens``), so eager steps gather
  exactly that many;
- a captured CUDA graph needs one row count per graph: in the static layout a bucket of T tokens gathers
  ``static_rows(T)`` = frac x T rounded up to 64 (speed.label_rows_frac), padded with ignored rows; a batch
  with more labelled positions than that gathers all T rows and gets a graph of its own (``rows`` is part
  of the graph key).
The gather itself is a cumsum and a scatter on the device (fixed shapes, no ``nonzero``, capturable).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..formats.batch import Batch

CHUNK_ROWS = 512  # rows of logits alive at once: 512 x 151,936 fp32 = 311 MB
ROW_MULTIPLE = 64


def static_rows(t: int, frac: float) -> int:
    return min(t, ROW_MULTIPLE * math.ceil(t * frac / ROW_MULTIPLE))


def gather_labelled(labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat positions [k] of ``labels`` [B, T] whose next-token label is set, in order, and their targets [k].

    Rows past the labelled count point at position 0 with target -100 (ignored). Positions beyond ``k``
    (never, when k comes from ``LabelHead.rows``) would be dropped.
    """
    b, t = labels.shape
    # target[i] is the label of the token after flat position i; the last position of each row has none.
    target = torch.cat([labels[:, 1:], labels.new_full((b, 1), -100)], dim=1).reshape(-1)
    mask = target != -100
    slot = mask.cumsum(0) - 1
    slot = torch.where(mask & (slot < k), slot, k)  # unlabelled positions all land in scratch slot k
    idx = torch.zeros(k + 1, dtype=torch.long, device=labels.device)
    idx.scatter_(0, slot, torch.arange(b * t, device=labels.device))
    tgt = torch.full((k + 1,), -100, dtype=labels.dtype, device=labels.device)
    tgt.scatter_(0, slot, target)
    return idx[:k], tgt[:k]


def _chunk(h: torch.Tensor, tc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           llm_dtype: torch.dtype, stats: bool):
    """One chunk: (summed fp32 cross-entropy, argmax-correct count, fp64 moments or None)."""
    autocast = torch.autocast(h.device.type, dtype=llm_dtype) if llm_dtype != torch.float32 else nullcontext()
    with autocast:
        logits = F.linear(h, weight, bias)  # [C, vocab], the LLM's dtype as in its own lm_head
    loss = F.cross_entropy(logits.float(), tc, ignore_index=-100, reduction="sum")
    with torch.no_grad():
        valid = tc != -100
        correct = ((logits.argmax(-1) == tc) & valid).sum()
        sums = None
        if stats:
            # fp64 one-pass moments: the chunks are gone by the time a second pass could run.
            lf = logits.double() * valid.unsqueeze(-1)
            sums = torch.stack([lf.sum(), lf.pow(2).sum(), lf.abs().sum()])
    return loss, correct, sums


def head_loss(hidden: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              llm_dtype: torch.dtype, stats: bool = False, recompute: bool = False):
    """Chunked LM head + fp32 cross-entropy over gathered rows. hidden: [K, D], target: [K] (-100: ignore).
    ``recompute`` (speed.label_head_recompute): each chunk's head and loss run again in the backward, so one
    chunk's logits are alive at a time in the backward too, not every chunk's log-probabilities.

    Returns (loss, correct, count, (absmean, std) or None) as ``lm_loss`` and ``logit_stats`` compute them.
    """
    dev = hidden.device
    total = torch.zeros((), device=dev, dtype=torch.float32)
    correct = torch.zeros((), device=dev, dtype=torch.long)
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # sum, sum of squares, sum of |x| (labelled rows)
    for s in range(0, hidden.shape[0], CHUNK_ROWS):
        args = (hidden[s:s + CHUNK_ROWS], target[s:s + CHUNK_ROWS], weight, bias, llm_dtype, stats)
        # recompute: the chunk's fp32 log-probabilities (what cross-entropy keeps for its backward, rows x vocab
        # x 4 bytes) are not kept; the backward runs the chunk's head again. No RNG inside: nothing to preserve
        # (and reading the CUDA RNG state inside a graph capture would fail).
        loss, right, chunk_sums = (checkpoint(_chunk, *args, use_reentrant=False, preserve_rng_state=False)
                                   if recompute else _chunk(*args))
        total = total + loss
        correct += right
        if stats:
            sums += chunk_sums
    count = (target != -100).sum()
    loss = total / count
    out_stats = None
    if stats:
        n = count.double() * weight.shape[0]
        mean = sums[0] / n
        var = (sums[1] - n * mean * mean) / (n - 1)
        out_stats = ((sums[2] / n).float(), var.clamp(min=0).sqrt().float())
    return loss, correct, count, out_stats


def _unwrap(model):
    return getattr(model, "module", model)  # DDP keeps the plain model as .module


class LabelHead:
    """The loss hook (StepHooks.loss): hidden states -> labelled rows -> head and loss.

    Called inside the step's attention scope as ``hook(model, batch, rows, stats)``; returns
    (logit stats or None, loss, correct, count), the first item taking the place of the full logits.
    """

    def __init__(self, static: bool = False, frac: float = 0.5, recompute: bool = False):
        self.static, self.frac, self.recompute = static, frac, recompute

    def rows(self, batch: Batch) -> int:
        """Gathered rows for this batch: its labelled count, or in the static layout the bucket's fixed count (all
        positions when its labelled ones, or another rank's this step, do not fit: every rank the same graph)."""
        n = batch.n_label_tokens
        if not self.static:
            return n
        n = max(n, batch.label_rows_floor)
        positions = batch.labels.numel()  # one packed row of the bucket's length
        k = static_rows(positions, self.frac)
        return k if n <= k else positions

    def fit(self, batch: Batch) -> Batch:
        """An example batch for capturing up front, its labels past the bucket's static rows ignored, so that the
        graph captured for it is the bucket's common one, not the all-rows one of an overflowing batch."""
        if not self.static or batch.n_label_tokens <= static_rows(batch.labels.numel(), self.frac):
            return batch
        k = static_rows(batch.labels.numel(), self.frac)
        labels = batch.labels.clone()
        target = labels[:, 1:]  # a view: the positions n_label_tokens counts
        mask = target != -100
        target[mask & (mask.reshape(-1).cumsum(0).view_as(mask) > k)] = -100
        return dataclasses.replace(batch, labels=labels, n_label_tokens=k)

    def __call__(self, model, batch: Batch, rows: torch.Tensor | None, stats: bool = False):
        # [B, T, D]; a text family's model takes no audio rows
        hidden = model(batch, hidden=True) if rows is None else model(batch, audio_rows=rows, hidden=True)
        idx, target = gather_labelled(batch.labels, self.rows(batch))
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, idx)  # [K, D]
        m = _unwrap(model)
        head = m.llm.get_output_embeddings()
        loss, correct, count, st = head_loss(h, target, head.weight, head.bias, m.llm_dtype, stats, self.recompute)
        return st, loss, correct, count


def apply_label_head(s) -> tuple[LabelHead, str]:
    """``s``: the run's SpeedConfig."""
    hook = LabelHead(static=s.cuda_graph, frac=s.label_rows_frac, recompute=s.label_head_recompute)
    what = (f"label_head: LM head and loss on the labelled positions only, {CHUNK_ROWS}-row chunks"
            + (", recomputed in the backward" if s.label_head_recompute else "")
            + (f"; static layout gathers {s.label_rows_frac:g} x bucket rows (more: a graph of its own)" if s.cuda_graph else ""))
    return hook, what
