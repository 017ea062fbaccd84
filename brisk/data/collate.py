"""Samples -> a batch, padded (FunASR's layout) or packed (one row, varlen attention, bucketed length).

The tokens make the shared core (formats.batch.Batch); samples that carry audio (features, audio slots) make an
AudioBatch, the core plus the features and the slots they fill. A text family's batch is the core alone."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from ..families import family_of
from ..plan import FLA_CHUNK, chunk_align
from ..formats.batch import AudioBatch, Batch
from .dataset import Sample


def bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket >= n; past the largest, the next multiple of the largest bucket."""
    if not buckets:
        return n
    i = bisect.bisect_left(buckets, n)
    if i < len(buckets):
        return buckets[i]
    top = buckets[-1]
    return -(-n // top) * top


def _counts(good: list[Sample]) -> list[int]:
    return [sum(n for _, n in s.tokens.audio_slots) for s in good]


@dataclass
class Collator:
    """Picklable collate_fn for DataLoader workers.

    packed: one row per batch, padded up to a ``token_buckets`` length. For static shapes (CUDA graphs)
    also pad the audio slots to the row length and cu_seqlens to ``pad_utts + 2`` entries, and, with
    ``static_speech`` (audio graphed per speech shape), the speech to ``speech_buckets`` frames and ``pad_utts``
    segments.
    """

    packed: bool = False
    token_buckets: tuple[int, ...] = ()
    speech_buckets: tuple[int, ...] = ()
    pad_utts: int = 0  # 0: no padding of the utterance count
    static: bool = False
    static_speech: bool = True  # with static: pad the speech too (False: the audio path runs eagerly, unpadded)
    # packed: each sequence padded with label-free tokens to a multiple of ``align`` and the batch given its
    # ``chunk_indices`` (fla's chunks of ``align`` tokens), so a Gated DeltaNet layer's chunk count is the row
    # length / align whatever the batch; 0: sequences back to back
    align: int = 0

    def __call__(self, samples: list[Sample]) -> Batch | None:
        bad = [s.error for s in samples if s.error]
        good = [s for s in samples if not s.error]
        if not good:
            return Batch(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), bad=bad, n_utts=0)
        batch = self._packed(good) if self.packed else self._padded(good)
        if any(s.feats or s.tokens.audio_slots for s in good):
            batch = self._with_audio(batch, good)
        batch.bad = bad
        batch.notes = [n for s in good for n in s.notes]
        return batch

    # ----------------------------------------------------------------------------------- audio side
    def _with_audio(self, core: Batch, good: list[Sample]) -> AudioBatch:
        """The core and the samples' audio: features, and the slots their adaptor frames fill."""
        t = core.input_ids.shape[1]
        if core.layout == "packed":
            offsets = [0, *torch.tensor([len(s.tokens.input_ids) for s in good]).cumsum(0).tolist()[:-1]]
        else:
            offsets = [i * t for i in range(len(good))]
        speech, lengths, frames = self._speech(good)
        utt, frame, pos = self._slots(good, offsets)
        if self.packed and self.static:  # a fixed number of audio slots; the extra ones write to the scratch row (t)
            extra = t - len(pos)
            utt, frame, pos = utt + [0] * extra, frame + [0] * extra, pos + [t] * extra
        return AudioBatch(**{f.name: getattr(core, f.name) for f in dataclasses.fields(core)},
                          audio_utt=torch.tensor(utt, dtype=torch.long), audio_frame=torch.tensor(frame, dtype=torch.long),
                          audio_pos=torch.tensor(pos, dtype=torch.long), speech=speech, speech_lengths=lengths,
                          slot_counts=_counts(good), speech_frames=frames)

    def _speech(self, good: list[Sample]):
        feats = [f for s in good for f in s.feats]
        if not feats:
            return None, None, 0
        lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
        speech = pad_sequence(feats, batch_first=True)  # [N, F, D]
        if self.static and self.static_speech:
            frames = bucket(speech.shape[1], list(self.speech_buckets))
            n = max(self.pad_utts, speech.shape[0])
            pad = speech.new_zeros(n, frames, speech.shape[2])
            pad[: speech.shape[0], : speech.shape[1]] = speech
            # Padding segments get one (zero) frame so that no attention row is empty.
            lengths = torch.cat([lengths, torch.ones(n - len(feats), dtype=torch.long)])
            speech = pad
        return speech, lengths, int(sum(f.shape[0] for f in feats))

    @staticmethod
    def _slots(good: list[Sample], row_offsets: list[int]):
        utt, frame, pos = [], [], []
        seg = 0
        for s, off in zip(good, row_offsets):
            for beg, n in s.tokens.audio_slots:
                utt += [seg] * n
                frame += range(n)
                pos += range(off + beg, off + beg + n)
                seg += 1
        return utt, frame, pos

    # ---------------------------------------------------------------------------------------- padded
    def _padded(self, good: list[Sample]) -> Batch:
        t = max(len(s.tokens.input_ids) for s in good)
        b = len(good)
        ids = torch.zeros(b, t, dtype=torch.long)
        labels = torch.full((b, t), -100, dtype=torch.long)
        mask = torch.zeros(b, t, dtype=torch.long)
        for i, s in enumerate(good):
            n = len(s.tokens.input_ids)
            ids[i, :n] = torch.tensor(s.tokens.input_ids)
            labels[i, :n] = torch.tensor(s.tokens.labels)
            mask[i, :n] = 1
        return Batch(ids, labels, attention_mask=mask, layout="padded", keys=[s.key for s in good], n_utts=b,
                     n_tokens=int(mask.sum()), n_label_tokens=int((labels[:, 1:] != -100).sum()))

    # ---------------------------------------------------------------------------------------- packed
    def _packed(self, good: list[Sample]) -> Batch:
        lens = [len(s.tokens.input_ids) for s in good]
        # each sequence's span: its tokens, then (align) label-free padding whose positions go on counting; by
        # causality the padding changes nothing before it, and the next sequence starts afresh
        spans = [-(-n // self.align) * self.align for n in lens] if self.align else lens
        total = sum(spans)
        t = bucket(total, list(self.token_buckets))
        if self.align and t % self.align:
            raise ValueError(f"a packed row of {t} tokens is not a multiple of {self.align} (speed.pack_buckets)")
        ids = torch.zeros(1, t, dtype=torch.long)
        labels = torch.full((1, t), -100, dtype=torch.long)
        pos_ids = torch.zeros(1, t, dtype=torch.long)
        off = 0
        for s, n, span in zip(good, lens, spans):
            if s.tokens.labels[0] != -100:  # the shifted loss relies on it: no target crosses utterances
                raise ValueError(f"{s.key}: the first token of an utterance must carry no label")
            ids[0, off:off + n] = torch.tensor(s.tokens.input_ids)
            labels[0, off:off + n] = torch.tensor(s.tokens.labels)
            pos_ids[0, off:off + span] = torch.arange(span)
            off += span
        pos_ids[0, total:] = torch.arange(t - total)  # the padding tail is a sequence of its own
        cu = [0] + [sum(spans[: i + 1]) for i in range(len(spans))] + [t]
        if self.static:
            cu += [t] * (self.pad_utts + 2 - len(cu))  # empty sequences keep cu_seqlens' length fixed
        return Batch(ids, labels, position_ids=pos_ids, cu_seqlens=torch.tensor(cu, dtype=torch.int32),
                     layout="packed", keys=[s.key for s in good], n_utts=len(good), n_tokens=sum(lens),
                     n_label_tokens=int((labels[:, 1:] != -100).sum()),
                     chunk_indices=chunk_indices(cu, self.align) if self.align else None)


def example_rows(buckets, vocab: int, max_tokens: int) -> list[list[int]]:
    """Random token rows of each bucket's exact length up to ``max_tokens`` (seeded: the same rows every run), for
    the families' ``graph_examples``."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, vocab, (t,), generator=g).tolist() for t in buckets if t <= max_tokens]


def chunk_indices(cu: list[int], size: int) -> torch.Tensor:
    """fla's chunk indices of a packed row: a row (sequence, chunk within it) for every ``size``-token chunk of each
    sequence between the boundaries ``cu`` (empty sequences have none), [chunks, 2] int64, made on the host."""
    rows = [(i, j) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])) for j in range(-(-(b - a) // size))]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 2)


# ------------------------------------------------------------------------------ shapes shared by ranks
def static_needs(batch: Batch) -> list[int]:
    """What decides a static packed batch's shapes: [row length, speech frames, speech segments, cu_seqlens
    entries]. Each rank's maximum of these is the common shape (every entry is a bucket or a fixed count,
    so the maximum is one too)."""
    if batch.n_utts == 0 or batch.layout != "packed":
        return [0, 0, 0, 0]
    if not isinstance(batch, AudioBatch) or batch.speech is None:  # text only
        return [batch.input_ids.shape[1], 0, 0, batch.cu_seqlens.numel()]
    return [batch.input_ids.shape[1], batch.speech.shape[1], batch.speech.shape[0], batch.cu_seqlens.numel()]


def pad_static(batch: Batch, tokens: int, frames: int, segments: int, cu_len: int) -> Batch:
    """A static packed batch padded to larger shapes without changing what it computes.

    The row grows by label-free padding that continues the padding tail (its own sequence: positions keep
    counting from the tail's start, cu_seqlens' last real boundary stays); the extra audio slots write to the
    scratch position (= the new row length); new speech segments are one zero frame, as in collation.
    """
    t = batch.input_ids.shape[1]
    audio = isinstance(batch, AudioBatch)
    n, f, d = batch.speech.shape if audio and batch.speech is not None else (0, 0, 0)
    if (tokens, frames, segments, cu_len) == (t, f, n, batch.cu_seqlens.numel()):
        return batch
    if tokens < t or frames < f or segments < n or cu_len < batch.cu_seqlens.numel():
        raise ValueError(f"pad_static: cannot shrink {static_needs(batch)} to {[tokens, frames, segments, cu_len]}")
    real = int(batch.cu_seqlens[batch.n_utts])  # where the padding tail starts (past aligned sequences' padding)
    ids = batch.input_ids.new_zeros(1, tokens)
    ids[:, :t] = batch.input_ids
    labels = batch.labels.new_full((1, tokens), -100)
    labels[:, :t] = batch.labels
    pos_ids = batch.position_ids.new_zeros(1, tokens)
    pos_ids[:, :real] = batch.position_ids[:, :real]
    pos_ids[0, real:] = torch.arange(tokens - real)
    k = batch.n_utts + 1  # cu_seqlens[:k] are the utterances' boundaries; the rest close the padding tail
    cu = batch.cu_seqlens.new_full((cu_len,), tokens)
    cu[:k] = batch.cu_seqlens[:k]
    out = dataclasses.replace(batch, input_ids=ids, labels=labels, position_ids=pos_ids, cu_seqlens=cu)
    if batch.chunk_indices is not None:  # the longer tail's chunks too (aligned buckets keep every chunk whole)
        out = dataclasses.replace(out, chunk_indices=chunk_indices(cu.tolist(), FLA_CHUNK))
    if audio:
        out = _pad_audio(out, batch, tokens, frames, segments)
    return out.pin_memory() if batch.input_ids.is_pinned() else out


def _pad_audio(out: AudioBatch, batch: AudioBatch, tokens: int, frames: int, segments: int) -> AudioBatch:
    """pad_static's audio side: the extra slots write to the scratch position (= the new row length)."""
    t = batch.input_ids.shape[1]
    audio_pos = torch.where(batch.audio_pos == t, tokens, batch.audio_pos)  # the scratch position moves
    extra = tokens - batch.audio_pos.numel()
    audio_pos = torch.cat([audio_pos, audio_pos.new_full((extra,), tokens)])
    audio_utt = torch.cat([batch.audio_utt, batch.audio_utt.new_zeros(extra)])
    audio_frame = torch.cat([batch.audio_frame, batch.audio_frame.new_zeros(extra)])
    speech, lengths = batch.speech, batch.speech_lengths
    if speech is not None:
        n, f, d = batch.speech.shape
        speech = batch.speech.new_zeros(segments, frames, d)
        speech[:n, :f] = batch.speech
        lengths = torch.cat([batch.speech_lengths, batch.speech_lengths.new_ones(segments - n)])
    return dataclasses.replace(out, audio_pos=audio_pos, audio_utt=audio_utt, audio_frame=audio_frame, speech=speech,
                               speech_lengths=lengths)


def collator_for(cfg) -> Collator:
    """The collation a run's speed plan asks for: padded rows (the default), or packed rows padded to the
    bucket lengths, with static shapes (fixed audio slots and cu_seqlens entries) under speed.cuda_graph; the
    speech is padded to its buckets too where the model family graphs its audio path (``Family.audio_graphs``)."""
    s = cfg.speed
    if not s.packing:
        return Collator()
    return Collator(packed=True, token_buckets=tuple(s.pack_buckets), speech_buckets=tuple(s.speech_buckets),
                    pad_utts=cfg.data.max_utts if s.cuda_graph else 0, static=s.cuda_graph,
                    static_speech=family_of(cfg).audio_graphs, align=chunk_align(cfg))

