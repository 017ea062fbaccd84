"""speed.cuda_graph: each packed bucket's whole training step captured once as a CUDA graph, then replayed.

The step is thousands of small kernels; launched one by one the host sets the pace, not the GPU.
Replaying a graph launches them all at once. What makes the step capturable:

- packed batches padded to a few bucket lengths (speed.packing), with a fixed number of audio slots and
  cu_seqlens entries, so each bucket has one set of shapes (collate.Collator(static=True));
- no host sync inside: fused, capturable AdamW with lr as a device tensor; the captured body is the eager
  step's own (``TrainStep.body``: found_inf for the non-finite skip, clipping folded into the kernel's
  grad_scale, probe norms as device tensors); only the schedule runs on the host, between replays;
- gradients are persistent buffers, zeroed in place at the start of each replay and shared by every
  bucket's graph (``TrainStep.persistent_grads``, set from the plan); with speed.fresh_grads they are instead
  new tensors that backward writes in each replay, from the graph's pool (see ``GraphedStep.__init__``);
  activations of all graphs come from one shared memory pool;
- a training audio path (the encoder or adaptor not frozen) runs inside the step graph, with its gradients,
  where the model family allows (``Family.trained_audio_graph``): the same static inputs as below are the
  graph's inputs, and ``static_audio_rows`` on them is the first thing the captured body computes;
- the frozen audio path runs outside the step graph, without autograd, and its rows are copied into the
  graph's static input. Where the model family says its audio work depends on the features' shape alone
  (``Family.audio_graphs``) it runs in graphs of its own, one per speech bucket, through the graphed step's
  own copy of the frozen audio provider (``FrozenAudio.with_encoder``); where its inputs' shapes follow from the
  batch's static layout once the path itself pads them (``Family.audio_static_inputs``: the model class's
  ``static_audio_inputs``, whose index tensors are worked out on the host from each batch's counts and padded
  to a fixed number per bucket) it runs in a graph per bucket too (``GraphedAudioInputs``); otherwise it runs eagerly before each replay, which adds no host sync:
  the rows' count is the bucket's fixed number of audio slots;
- everything is captured inside the run's flag scope (``flags.run_scope``: TF32, SDPA backends), so the
  graphs hold the kernels those flags choose.

Graphs are captured up front for every bucket up to MAX_GRAPH_TOKENS (``prepare``, from the family's
``graph_examples``; a bucket no example covers is captured at its first batch, as under ``seen``), warming
each one with lr = 0 and then restoring the optimizer state, so the run's numbers are those of the eager step.
With speed.graph_capture=seen nothing is prepared: a bucket's graph is captured at the first batch that reaches
it, after that batch's step has run (warmed) as the real step; buckets the data never reaches cost nothing.
The graphs read the optimizer's lr tensor: after a resume it must be that same device tensor
(``load_optimizer_state``). A batch longer than every bucket (or than MAX_GRAPH_TOKENS) runs the same step
eagerly and is logged; its audio rows come from the plain provider too, so no audio graph is captured for a
one-off shape. CUDA's embedding backward reads a count back to the host above 3,072 indices, so under this
switch the LLM's embedding is swapped for a ``ChunkedEmbedding`` (same weight) that looks ids up in chunks of
3,072 and longer rows stay capturable. Gradient accumulation is not supported (config error).
Under speed.label_head the graphs are keyed by (length, gathered rows): the rows are fixed in a graph, and a
batch with more labelled positions than its bucket's rows gets a graph of its own (``_key``).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..formats.batch import AudioBatch
from ..swap import swapped
from .capture import capture_graph, compile_events, on_side_stream, settle
from .compile import compile_seconds

log = logging.getLogger("brisk")

MAX_GRAPH_TOKENS = 8192
EMBED_CHUNK = 3072  # CUDA's embedding backward syncs with the host (a sort) above this many indices


class ChunkedEmbedding(torch.nn.Embedding):
    """An embedding that looks token ids up in chunks of at most EMBED_CHUNK, so that every chunk's backward
    takes CUDA's direct kernel (the sort-based path for longer inputs reads a count back to the host, which no
    graph can hold). The gradient is the same sum, taken in pieces."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() <= EMBED_CHUNK:
            return super().forward(ids)
        flat = torch.cat([super(ChunkedEmbedding, self).forward(c) for c in ids.reshape(-1).split(EMBED_CHUNK)])
        return flat.view(*ids.shape, flat.shape[-1])


def apply_chunked_embedding(llm: torch.nn.Module) -> str:
    """Swap the LLM's input embedding for a ChunkedEmbedding holding the same weight (tied heads stay tied,
    the state dict is unchanged)."""
    old = llm.get_input_embeddings()
    if type(old) is not torch.nn.Embedding:
        return f"cuda_graph: the input embedding is a {type(old).__name__}, left as it is (rows over {EMBED_CHUNK} tokens run eagerly)"
    llm.set_input_embeddings(swapped(old, ChunkedEmbedding))
    return f"cuda_graph: token ids looked up in chunks of {EMBED_CHUNK} (capturable backward for long rows)"


def _clone(batch: AudioBatch) -> AudioBatch:
    return batch._map(lambda t: t.clone())


# What a step graph reads of a packed batch (the speech is the audio path's, copied by its own provider)
_STATIC = ("input_ids", "labels", "position_ids", "cu_seqlens", "chunk_indices", "audio_utt", "audio_frame", "audio_pos")


def _copy_into(dst: AudioBatch, src: AudioBatch) -> None:
    for name in _STATIC:
        d = getattr(dst, name, None)
        if d is not None:
            d.copy_(getattr(src, name), non_blocking=True)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: AudioBatch  # static inputs
    audio: tuple[torch.Tensor, ...] | None  # static audio inputs: the frozen rows, or the training path's own
    # inputs; None: a text-only model
    out: torch.Tensor  # static metrics vector


class GraphedEncoder:
    """Frozen encoder + adaptor per speech bucket [utterances, frames], no autograd."""

    def __init__(self, model, pool):
        self.model, self.pool = model, pool
        self.graphs: dict[tuple, tuple] = {}
        self.capture_new = True  # False (validation): a shape without a graph runs eagerly, nothing is captured

    @torch.no_grad()
    def capture(self, speech: torch.Tensor, lengths: torch.Tensor):
        speech, lengths = speech.clone(), lengths.clone()

        def run():
            return self.model.encode_audio(speech, lengths)

        # warm-ups until nothing compiles: lazy init, cuBLAS workspaces, the compiled blocks' graphs and kernels
        settle(lambda: on_side_stream(run), what=f"the encoder at speech shape {tuple(speech.shape)}")
        graph, out = capture_graph(run, self.pool)
        self.graphs[tuple(speech.shape)] = (graph, speech, lengths, out)

    @torch.no_grad()
    def __call__(self, batch: AudioBatch) -> torch.Tensor:
        key = tuple(batch.speech.shape)
        if key not in self.graphs and not self.capture_new:
            return self.model.encode_audio(batch.speech, batch.speech_lengths)[batch.audio_utt, batch.audio_frame]
        if key not in self.graphs:
            log.info("cuda_graph: capturing the encoder for speech shape %s", key)
            self.capture(batch.speech, batch.speech_lengths)
        graph, speech, lengths, out = self.graphs[key]
        speech.copy_(batch.speech, non_blocking=True)
        lengths.copy_(batch.speech_lengths, non_blocking=True)
        graph.replay()
        return out[batch.audio_utt, batch.audio_frame]


class GraphedAudioInputs:
    """The frozen audio path in a graph per key of the static inputs it makes itself, no autograd: its
    ``static_audio_inputs(batch)`` -> (key, inputs) runs eagerly (a few launches: the real features gathered,
    index tensors built on the host), its ``static_audio_rows(*inputs)`` is what the graph holds. The rows of a
    replay are the graph's static output: the step copies them into its own static input before the next replay."""

    def __init__(self, model, pool):
        self.model, self.pool = model, pool
        self.graphs: dict[tuple, tuple] = {}
        self.capture_new = True  # False (validation): a key without a graph runs eagerly, nothing is captured

    @torch.no_grad()
    def capture(self, key, inputs):
        device = inputs[0].device
        static = tuple(x.to(device, copy=True) for x in inputs)

        def run():
            return self.model.static_audio_rows(*static)

        settle(lambda: on_side_stream(run), what=f"the audio path at {key}")  # lazy init, compiled blocks
        graph, out = capture_graph(run, self.pool)
        self.graphs[key] = (graph, static, out)

    @torch.no_grad()
    def __call__(self, batch: AudioBatch) -> torch.Tensor:
        key, inputs = self.model.static_audio_inputs(batch)
        if key not in self.graphs and not self.capture_new:
            return self.model.static_audio_rows(*inputs)
        if key not in self.graphs:
            log.info("cuda_graph: capturing the audio path for its static shape %s", key)
            self.capture(key, inputs)
        graph, static, out = self.graphs[key]
        for dst, src in zip(static, inputs):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return out


class GraphedStep:
    """Wraps a step (``TrainStep``: its ``body``, optimizer, parameters and hooks) and a frozen audio provider;
    replays one graph per bucket. It owns its graphs, their pool and its graphed audio provider, and edits
    nothing else: the step's gradient mode and any gradient sync are the step's own, set when it was built.
    ``audio_graphs``: capture the audio path per speech shape too (the model family's ``audio_graphs``);
    ``static_audio``: capture it per key of the static inputs it makes itself (``GraphedAudioInputs``, the
    family's ``audio_static_inputs``); neither: the provider runs eagerly before each replay. ``trained_audio``:
    the model whose audio path trains inside the step graph (its ``static_audio_inputs`` before each replay, its
    ``static_audio_rows`` inside it; ``audio`` is then None); None: the audio is frozen."""

    def __init__(self, step, audio, audio_graphs: bool = True, static_audio: bool = False, trained_audio=None):
        opt = step.optimizer
        group = opt.param_groups[0]
        if not (group.get("fused") and group.get("capturable") and isinstance(group["lr"], torch.Tensor)
                and step.on_device_skip):
            raise ValueError("speed.cuda_graph needs the fused, capturable AdamW with a tensor lr (built by brisk)")
        self.step, self.fresh = step, not step.persistent_grads
        self.optimizer, self.params = opt, step.params
        # Persistent: every graph zeroes the same gradient buffers and backward adds into them (a zeroing
        # pass plus one add kernel per parameter), only so that the buffers keep their addresses; buffers that
        # exist already (a gradient all-reduce's flat views) are kept. fresh_grads: the body sets .grad to None,
        # so backward hands each parameter its gradient as computed, in the graph's pool; the update inside the
        # same replay reads it there.
        for p in self.params:
            if self.fresh:
                p.grad = None
            elif p.grad is None:
                p.grad = torch.zeros_like(p)
        self.pool = torch.cuda.graph_pool_handle()
        self.trained = trained_audio
        # no graphs in it unless the frozen audio is graphed
        self.encoder = (GraphedAudioInputs if static_audio else GraphedEncoder)(
            audio.path if audio is not None else trained_audio, self.pool)  # (a text-only model: None, never called)
        # the frozen audio rows from encoder graphs, or from the provider itself, eagerly
        self.plain_audio = audio
        self.audio = audio.with_encoder(self.encoder) if audio is not None and (audio_graphs or static_audio) else audio
        self.graphs: dict[object, _Captured] = {}
        self.capture_seconds = 0.0
        self.eager_fallbacks = 0

    @property
    def hooks(self):
        """The replayed step's hooks (brisk.train.step.StepFunction)."""
        return self.step.hooks

    def _audio_inputs(self, batch: AudioBatch, eager: bool = False) -> tuple[object, tuple[torch.Tensor, ...] | None]:
        """Before the body, eagerly: (audio key, audio inputs). Frozen audio: (None, (its rows,)). Training audio:
        the model's static inputs on the device and their key (one a bucket), or, for a step that runs eagerly,
        (None, None): the model computes its own rows."""
        if self.trained is None:
            provider = self.plain_audio if eager else self.audio
            return None, ((provider(batch),) if provider is not None else None)  # None: a text-only model
        if eager:
            return None, None
        key, inputs = self.trained.static_audio_inputs(batch)
        device = batch.input_ids.device
        return key, tuple(x.to(device, non_blocking=True) for x in inputs)

    def _body(self, batch: AudioBatch, audio: tuple[torch.Tensor, ...] | None) -> dict[str, torch.Tensor]:
        """The step's body on one batch (no marks: host callbacks would not replay). ``audio``: the frozen rows,
        or the training path's static inputs, whose rows are computed here, inside the graph and its autograd."""
        if audio is None:
            return self.step.body([batch])
        rows = self.trained.static_audio_rows(*audio) if self.trained is not None else audio[0]
        return self.step.body([batch], [rows])

    def _capture(self, batch: AudioBatch, audio: tuple[torch.Tensor, ...], key) -> _Captured | None:
        """The bucket's graph, its body warmed until nothing compiles (the caller ran it once). A capture that
        fails (a compile still needed, a launch CUDA refuses inside a capture) is warmed once more and tried again;
        failing twice, the bucket runs eagerly (None), said in one line."""
        static, static_audio = _clone(batch), (tuple(x.clone() for x in audio) if audio is not None else None)
        t0 = time.perf_counter()
        try:
            for attempt in (1, 2):
                try:
                    graph, out = capture_graph(lambda: self._body(static, static_audio), self.pool)
                    return _Captured(graph, static, static_audio, out)
                except RuntimeError as e:
                    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    self._drop_fresh_grads()
                    if attempt == 2:
                        log.warning("cuda_graph: bucket %s could not be captured (%s); its steps run eagerly", key, why)
                        return None
                    log.warning("cuda_graph: capturing bucket %s failed (%s); warming it again", key, why)
                    with self._dry():
                        settle(lambda: self._warm(static, static_audio), what=f"bucket {key}")
        finally:
            self.capture_seconds += time.perf_counter() - t0
            self._drop_fresh_grads()
        return None

    @contextmanager
    def _dry(self):
        """Inside, steps run every kernel of the step and update nothing: the fused AdamW is handed found_inf = 1,
        which skips its update and takes its step count back (``TrainStep.dry``), no copy of the optimizer's state
        needed. Under speed.optimizer_in_backward the layers update during the backward: ``_unchanged`` instead."""
        if self.step.hooks.in_backward is not None:
            with self._unchanged():
                yield
            return
        self.step.dry = True
        try:
            yield
        finally:
            self.step.dry = False

    @contextmanager
    def _unchanged(self):
        """Inside, steps change no parameter and leave no trace in the optimizer: lr = 0 on the device, and the
        optimizer's state (moments, step counts; zeros for parameters that had none) and the previous step's norm
        put back afterwards. For warm-ups that are not training steps (capturing up front, warming a bucket
        again)."""
        saved = {p: {k: v.clone() for k, v in st.items() if torch.is_tensor(v)} for p, st in self.optimizer.state.items()}
        in_backward = self.step.hooks.in_backward
        norm = in_backward.previous_norm() if in_backward is not None else 0.0
        lr = [g["lr"].clone() for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"].zero_()
        try:
            yield
        finally:
            for g, v in zip(self.optimizer.param_groups, lr):
                g["lr"].copy_(v)
            for p, st in self.optimizer.state.items():
                for k, v in st.items():
                    if torch.is_tensor(v):
                        v.copy_(saved[p][k]) if p in saved else v.zero_()
            if in_backward is not None:  # the warm-ups' norms are not a previous step's
                in_backward.set_previous_norm(norm)

    def _drop_fresh_grads(self) -> None:
        """fresh_grads: let go of the gradients a capture (or an eager step) left in ``.grad``. Each replay
        writes and consumes its own, so nothing reads them afterwards (the probe's norms are taken inside the
        body); held, a captured graph's gradients would keep their pool memory (a gradient of every parameter) from
        the next capture."""
        if self.fresh:
            for p in self.params:
                p.grad = None

    def _warm(self, batch: AudioBatch, audio: tuple[torch.Tensor, ...] | None) -> dict[str, torch.Tensor]:
        return on_side_stream(lambda: self._body(batch, audio))

    def _key(self, batch: AudioBatch, audio_key=None):
        """A graph per bucket length; under speed.label_head per (length, gathered rows), since the rows are
        fixed in the graph (a batch with more labelled positions than its bucket's rows gathers all of them); with
        the audio training inside, per (that, the audio inputs' key), which a bucket's static layout fixes."""
        t = batch.input_ids.shape[1]
        loss = self.step.hooks.loss
        key = (t, loss.rows(batch)) if loss is not None else t
        return (key, audio_key) if self.trained is not None else key

    # ------------------------------------------------------------------------------------- up front
    def prepare(self, batches: list[AudioBatch]) -> float:
        """Capture a graph per bucket before training, from example batches of each bucket's shapes.

        Warm-ups run with lr = 0 (parameters unchanged); afterwards the optimizer state is put back as it
        was (zero moments and step counts for a fresh optimizer, the loaded ones after a resume).
        """
        t0 = time.perf_counter()
        loss = self.step.hooks.loss
        with self._unchanged():
            # Longest first: the shared memory pool is sized by the first capture and the rest fit in it, and the
            # first compile sees the largest length (a dynamic graph compiled at a short length was bounded below
            # 2,560 tokens on the H200 and compiled again there).
            for b in sorted(batches, key=lambda b: -b.input_ids.shape[1]):
                b = loss.fit(b) if loss is not None else b  # speed.label_head: the bucket's common graph
                audio_key, audio = self._audio_inputs(b)
                t, key = b.input_ids.shape[1], self._key(b, audio_key)
                if key not in self.graphs and t <= MAX_GRAPH_TOKENS:
                    t1, c1 = time.perf_counter(), compile_seconds()
                    settle(lambda: self._warm(b, audio), what=f"bucket {key}")  # noqa: B023 (called here)
                    cap = self._capture(b, audio, key)
                    if cap is not None:
                        cap.graph.replay()  # the first replay of a graph pays its upload; do it here, at lr = 0
                    self.graphs[key] = cap
                    torch.cuda.synchronize()
                    # every bucket pays its own trace (static shapes), even from a warm compile cache: say each
                    log.info("cuda_graph: bucket %s up front in %.1f s, of which %.1f s compiling", key,
                             time.perf_counter() - t1, compile_seconds() - c1)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    # ---------------------------------------------------------------------------------------- call
    def __call__(self, batches: list[AudioBatch]) -> dict[str, torch.Tensor]:
        if len(batches) != 1:
            raise ValueError("speed.cuda_graph does not support gradient accumulation (train.accum_grad must be 1)")
        batch = batches[0]
        t = batch.input_ids.shape[1]
        # no graph can hold this batch: longer than every graph, or not packed in a bucket's static layout
        oversize = t > MAX_GRAPH_TOKENS or batch.layout != "packed"
        audio_key, audio = self._audio_inputs(batch) if self.trained is not None and not oversize else (None, None)
        key = self._key(batch, audio_key)
        cap = self.graphs.get(key)
        eager = cap is None and (oversize or key in self.graphs)  # or a bucket whose capture failed twice (None)
        if self.trained is None:  # a step that runs eagerly computes its frozen rows eagerly too (no audio graph
            audio = self._audio_inputs(batch, eager=eager)[1]  # for a one-off shape)
        if cap is None:
            if eager:
                self.eager_fallbacks += 1
                log.info("cuda_graph: no graph for a %d-token row; this step runs eagerly", t)
                metrics = self._body(batch, audio)
                self._drop_fresh_grads()
            else:
                log.info("cuda_graph: capturing a graph for bucket %s (not prepared up front)", key)
                before = compile_events()
                metrics = self._warm(batch, audio)  # the real step: its update and metrics are this step's
                if compile_events() != before:  # it compiled: warm again, changing nothing, until nothing does
                    with self._dry():
                        settle(lambda: self._warm(batch, audio), done=1, what=f"bucket {key}")
                    self._drop_fresh_grads()
                self.graphs[key] = self._capture(batch, audio, key)
        else:
            _copy_into(cap.batch, batch)
            for dst, src in zip(cap.audio or (), audio or ()):
                dst.copy_(src, non_blocking=True)
            cap.graph.replay()
            metrics = {k: v.clone() for k, v in cap.out.items()}  # static outputs: the next replay overwrites them
        self.step.hooks.mark("optimizer")
        self.step.advance(metrics)
        return metrics

    @contextmanager
    def no_new_audio_graphs(self):
        """Inside (validation): the audio graphs replay where a shape has one, and run the path eagerly where not.
        Validation runs the compiled blocks eagerly (``eval_context``), so an audio graph captured there would hold
        eager kernels, and every later training step of that shape would replay them (speed.graph_capture=seen
        meets new shapes in validation; ahead, a shape past every speech bucket)."""
        self.encoder.capture_new = False
        try:
            yield
        finally:
            self.encoder.capture_new = True

    @property
    def captures(self) -> dict[str, int]:
        """Graphs captured so far: step graphs (one a bucket) and audio graphs (one a speech shape), the
        slow-step detector's counters."""
        return {"step_captures": sum(c is not None for c in self.graphs.values()), "audio_captures": len(self.encoder.graphs)}

    def release(self) -> int:
        """Free every captured graph (step and encoder); returns how many. Call it before
        ``destroy_process_group``: a live graph holding a captured NCCL all-reduce keeps its communicator
        busy, and destroying the group then hangs (pytorch/pytorch#115388)."""
        torch.cuda.synchronize()
        graphs = [c.graph for c in self.graphs.values() if c is not None] + [g[0] for g in self.encoder.graphs.values()]
        for g in graphs:
            g.reset()
        self.graphs.clear()
        self.encoder.graphs.clear()
        # A reset graph's pool is not reused: the allocator asserts on a capture into a pool whose graphs
        # are gone. Any capture after this gets a new one.
        self.pool = torch.cuda.graph_pool_handle()
        self.encoder.pool = self.pool
        return len(graphs)
