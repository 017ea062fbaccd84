"""Greedy decoding at the GPU's pace: a static KV cache, one decode step captured as a CUDA graph a batch bucket.

The LLM's own ``generate`` launches every kernel of every token from Python and grows a dynamic cache: at
batch 1 the host, not the GPU, sets the pace. Here:

- the batch is padded to a bucket (1, 2, 4, ... 64, then multiples of 64) with copies of its first row that
  start finished, so a few shapes serve every batch;
- transformers' ``StaticCache`` holds the keys and values, sized (bucket, cache length); the cache length is
  the prompt plus the new tokens, rounded up, and grows (a new room) only when a batch needs more;
- the prefill (the left-padded prompt with the spliced audio) is one eager pass of the LLM, its mask built by
  transformers from the 2-D padding mask, as ``generate`` does;
- each decode step feeds the last token with its position (real tokens count from 0 in every row, as
  ``generate`` derives them from the mask), marks its cache slot in the padding mask, takes the argmax and
  writes it into an output buffer at a step counter held on the device; finished rows (eos or <|im_end|>,
  checked on the device) are fed the pad token from then on. Every input of the step lives in a fixed
  buffer updated in place, so on CUDA the step is captured once a bucket and replayed; on the CPU (or with
  ``graphs=False``) the same function runs eagerly;
- the host reads the finished mask only every ``check_every`` steps;
- with ``multi_step`` (``--fast-multi-step``) one graph holds several consecutive steps (those of one check, cut
  where the span changes: ``replays``), so one replay makes several tokens: the same kernels in the same order
  on the same buffers, so the same ids, with a graph launch (and its gap on the GPU) a check instead of a token;
- for Qwen3, Qwen2 and Llama LLMs (without LoRA layers) the step is brisk's own (``fused``,
  brisk.eval.decode_step.FusedStep): grouped-query attention without repeating the cache, attention over the
  filled slots rounded up to SPAN_MIN x a power of two (one graph a span, the span picked by the host, which
  knows the step count without reading the device), and, with ``fuse`` (by default only when compiled), one
  q/k/v GEMM and one gate/up GEMM a layer on weights concatenated when the decoder is built. Unfused, the step
  runs the LLM's own GEMM shapes and elementwise operations, so in bf16 it rounds as the LLM's forward does;
  the concatenated GEMMs (and Inductor's fused elementwise kernels, which skip the intermediate bf16 roundings)
  round some values the other way, and a random model's near-tied logits then flip. Other LLMs (or
  ``fused=False``) run their own forward for the token, attending over the whole cache;
- optionally (``compile="inductor"``) the step is compiled first, which fuses the decoder's many small
  elementwise kernels (norms, rotary) before capture: with the fused step one layer's function (every layer's
  tensors are its arguments, so one graph serves the stack) and the tail; else the LLM's whole step. The first
  room compiles static shapes, the second a dynamic-shape version that later rooms reuse.

The decode-step mask is passed to the LLM as a prepared mapping {layer type: mask} (transformers' models accept
it and skip their own mask building, which would read values back to the host): a boolean [B, 1, 1, L] for
SDPA, an additive float one for eager attention. Other attention implementations and sliding-window layers are
refused. transformers 5.17 names the cache argument ``past_key_values``, 5.24 ``cache``; both keep the static
cache's write position in a device tensor (``cumulative_length``) that each update advances, which is what makes
the step capturable. A model it cannot decode raises ConfigError naming the switch (``--fast``,
``train.val_decode_fast``), so the command line prints one line.

With ``buckets=True`` (``--fast-buckets``) the prefill (the prompt into the cache, the first token) is captured
too, once a room and padded prompt length (prompts are left padded to a multiple of PROMPT_ROUND; positions
still count each row's real tokens from 0), its mask built on the device from the padding mask, and
``GraphedEncode`` captures the encoder and adaptor per (batch bucket, frame bucket) for the Recognizer. A batch
on CUDA is then: features, one encoder replay, the splice, one prefill replay, one replay a token, the host
reading the finished mask every ``check_every``. Those shapes differ from generate's, so in bf16 the ids may
part from generate's at near-ties (as generate's own ids do between batch sizes); without buckets the encoder
and the prefill run eagerly at generate's shapes.

Graphs draw on a memory pool of their own (never the training graphs' pool) and are dropped by ``release``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from ..config import ConfigError
from ..speed.capture import no_compiles, on_side_stream, settle
from .decode_step import FusedStep, compiled, refusal

log = logging.getLogger("brisk")

MAX_SMALL_BUCKET = 64
SPAN_MIN = 64  # the fused step attends over the filled slots rounded up to SPAN_MIN x a power of two
CACHE_ROUND = 64  # cache lengths are rounded up to this, so nearby prompt lengths share one room
PROMPT_ROUND = 32  # prompts are left padded to a multiple of this: one prefill graph serves nearby lengths
FRAME_ROUND = 64  # LFR frames the encoder's input is padded to a multiple of (GraphedEncode)
DROP = "decode without --fast / train.val_decode_fast"
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}  # warm-up and capture stream, one a device for the process


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream a device for every capture: cuBLAS keeps a workspace per (handle, stream) until the process
    ends, so a fresh stream at each validation's capture would leave a workspace behind each time."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


def bucket(n: int) -> int:
    """The padded batch size for ``n`` rows: the next power of two up to 64, then the next multiple of 64."""
    if n <= MAX_SMALL_BUCKET:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // MAX_SMALL_BUCKET) * MAX_SMALL_BUCKET


def cache_argument(llm: torch.nn.Module) -> str:
    """The keyword the LLM takes its KV cache by: ``cache`` (transformers 5.24) or ``past_key_values`` (5.17)."""
    for m in llm.modules():
        params = inspect.signature(type(m).forward).parameters
        for name in ("cache", "past_key_values"):
            if name in params:
                return name
    raise ConfigError(f"fast decode: {type(llm).__name__} takes no KV cache argument (cache or past_key_values); "
                      f"{DROP}")


@dataclass
class _Room:
    """The fixed buffers of one batch bucket: the graph reads and writes only these."""

    cache: object  # transformers.StaticCache
    length: int  # cache slots
    tok: torch.Tensor  # [B, 1] the token fed next
    pos: torch.Tensor  # [B, 1] its position (real tokens of the row count from 0)
    slot: torch.Tensor  # [1] its cache slot, the same for every row (left padding)
    step: torch.Tensor  # [1] where its successor goes in ``out``
    mask: torch.Tensor  # [B, L] bool, the slots each row attends to
    finished: torch.Tensor  # [B] bool
    out: torch.Tensor  # [B, L] generated ids
    graphs: dict = field(default_factory=dict)  # (attention span, steps) -> the graph of that many steps
    counters: list = field(default_factory=list)  # the cache layers' write positions
    kv: list = field(default_factory=list)  # the fused step's views of the cache tensors (FusedStep.kv_views)
    prefills: dict = field(default_factory=dict)  # padded prompt length -> _Prefill

    def buffers(self) -> list[torch.Tensor]:
        return [self.tok, self.pos, self.slot, self.step, self.mask, self.finished, self.out]

    def state(self) -> list[torch.Tensor]:
        """Everything one step changes."""
        return [*self.buffers(), *self.counters]


@dataclass
class _Prefill:
    """The fixed inputs of a room's prefill at one padded prompt length (its graph reads only these)."""

    embeds: torch.Tensor  # [B, T, D] left-padded prompt embeddings
    valid: torch.Tensor  # [B, T] bool, real prompt tokens
    live: torch.Tensor  # [B] bool, rows of the batch (False: bucket padding, finished from the start)
    graph: torch.cuda.CUDAGraph | None = None


class FastGreedy:
    """Greedy decoding of left-padded prompt embeddings; ``generate`` returns [B, max_new] ids, ``pad`` after
    a row stops (the stop token itself is kept)."""

    def __init__(self, llm: torch.nn.Module, stop: list[int], pad: int, dtype: torch.dtype, device: torch.device | str,
                 *, graphs: bool | None = None, check_every: int = 8, compile: str | None = None, buckets: bool = False,
                 fused: bool = True, fuse: bool | None = None, multi_step: bool = False):
        self.llm, self.pad, self.dtype = llm, pad, dtype
        self.device = torch.device(device)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("fast decode: CUDA graphs need a CUDA device")
        self.check_every = max(1, check_every)
        # multi_step: a graph (or eager run) of the consecutive steps one check covers that share a span, so a
        # replay makes several tokens; off: a replay a token. The same kernels either way.
        self.multi_step = multi_step
        self.replays = 0  # graph replays (or eager runs of a replay's steps) of the decode steps, for tests and benches
        # buckets: prompts left padded to a multiple of PROMPT_ROUND and the prefill replayed from a graph per
        # room and padded length. Other shapes than generate's (and a mask built here): in bf16 the ids can part
        # from generate's at near-ties. Off: the prefill runs eagerly at the prompt's own length with the mask
        # transformers builds, as generate does.
        self.buckets = buckets
        self.stop = torch.tensor(stop, dtype=torch.long, device=self.device)
        text = llm.config.get_text_config() if hasattr(llm.config, "get_text_config") else llm.config
        self.config = text
        kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ConfigError(f"fast decode: layer types {sorted(kinds)}, only full attention is supported; {DROP}")
        self.attn = llm.config._attn_implementation
        if self.attn not in ("sdpa", "eager"):
            raise ConfigError(f"fast decode needs sdpa or eager attention, this LLM uses {self.attn!r}; {DROP}")
        self.cache_kw = cache_argument(llm)
        # fused: brisk's own step (brisk.eval.decode_step: attention over a bucket of the filled slots, a graph
        # per bucket; with fuse, concatenated q/k/v and gate/up GEMMs) where the LLM's layers allow it; else the
        # LLM's own forward. fuse None: concatenated only when compiled (Inductor's kernels round otherwise than
        # the eager LLM anyway); the eager step keeps the LLM's GEMM shapes and so its bf16 rounding.
        self.fused = None
        if fused:
            why = refusal(llm)
            if why is None:
                fuse = bool(compile) if fuse is None else fuse
                self.fused = FusedStep(llm, dtype, self.attn, compile=compile, fuse=fuse)
                log.info("fast decode: brisk's decode step (%s GEMMs%s)", "concatenated" if fuse else "the LLM's own",
                         f", compiled with {compile}" if compile else "")
            else:
                log.info("fast decode: the LLM's own forward for each token (%s)", why)
        self.rooms: dict[int, _Room] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        # compile: a torch.compile backend for the step ("inductor", "inductor:MODE"; "eager" traces it with
        # Dynamo alone; brisk.eval.decode_step.compiled).
        # With the fused step, FusedStep compiles one layer and the tail instead (brisk.eval.decode_step).
        self.run_step = compiled(self._step, compile) if self.fused is None else self._step
        self.advance = compiled(advance, compile) if self.fused is not None else advance

    # ------------------------------------------------------------------------------------------- rooms
    def _room(self, rows: int, length: int) -> _Room:
        room = self.rooms.get(rows)
        if room is not None and room.length >= length:
            return room
        from transformers import StaticCache

        self.rooms.pop(rows, None)  # a longer one replaces it (its graph and cache go with it)
        length = -(-length // CACHE_ROUND) * CACHE_ROUND
        d = self.device
        long = dict(dtype=torch.long, device=d)
        room = _Room(cache=StaticCache(config=self.config, max_cache_len=length), length=length,
                     tok=torch.zeros(rows, 1, **long), pos=torch.zeros(rows, 1, **long), slot=torch.zeros(1, **long),
                     step=torch.zeros(1, **long), mask=torch.zeros(rows, length, dtype=torch.bool, device=d),
                     finished=torch.zeros(rows, dtype=torch.bool, device=d), out=torch.zeros(rows, length, **long))
        self.rooms[rows] = room
        return room

    def _autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        # No cast cache: a graph must not keep pointers to casts made outside it.
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=False)

    # ---------------------------------------------------------------------------------------- the step
    def _as_attn_mask(self, m: torch.Tensor) -> torch.Tensor:
        """A boolean mask as the attention takes it: boolean for SDPA, additive float for eager attention."""
        if self.attn == "eager":
            zero = torch.zeros((), dtype=self.dtype, device=m.device)
            m = torch.where(m, zero, torch.finfo(self.dtype).min)
        return m

    def _step_mask(self, mask: torch.Tensor):
        return {"full_attention": self._as_attn_mask(mask[:, None, None, :])}  # [B, 1, 1, L]

    def span(self, r: _Room, filled: int) -> int:
        """The slots a step attends over when ``filled`` are written (its own included): with the fused step
        SPAN_MIN x the next power of two (at most the room's length), one graph each; else the whole cache."""
        if self.fused is None:
            return r.length
        return min(SPAN_MIN << max(-(-filled // SPAN_MIN) - 1, 0).bit_length(), r.length)

    def _step(self, r: _Room, span: int) -> None:
        """One token for every row of the room, all in place on its buffers (capturable: no host reads)."""
        with self._autocast():
            if self.fused is not None:  # it marks the fed token's slot in the mask itself
                nxt = self.fused(r.tok, r.pos, r.slot, r.mask, r.kv, span)  # [B]
            else:
                r.mask.scatter_(1, r.slot.expand(r.mask.shape[0], 1), True)  # the fed token's own slot
                nxt = self.llm(input_ids=r.tok, attention_mask=self._step_mask(r.mask), position_ids=r.pos,
                               use_cache=True, logits_to_keep=1, **{self.cache_kw: r.cache}).logits[:, -1].argmax(-1)
        self.advance(nxt, r.finished, r.out, r.step, self.stop, r.tok, r.pos, r.slot, self.pad)

    def _capture(self, r: _Room, span: int, steps: int, saved: list[torch.Tensor]) -> None:
        """Warm the step up on a side stream, put its state back (``saved``), then capture ``steps`` of it in one
        graph (capture runs nothing)."""
        side = _capture_stream(self.device)

        def warm():
            # Compiles here, if at all. The cache slot it writes is written again, with the same values, by the
            # first replay.
            on_side_stream(lambda: self.run_step(r, span), side, self.device)
            for buf, old in zip(r.state(), saved):
                buf.copy_(old)

        settle(warm, what="the decode step")  # until a warm-up compiles nothing: the capture may not compile
        graph = torch.cuda.CUDAGraph()
        with no_compiles(), torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
            for _ in range(steps):
                self.run_step(r, span)
        r.graphs[span, steps] = graph

    def _graph(self, r: _Room, span: int, steps: int = 1) -> torch.cuda.CUDAGraph | None:
        """The room's graph of ``steps`` steps over ``span``, captured on first use; None where the step runs
        eagerly."""
        if not self.graphs:
            return None
        if (span, steps) not in r.graphs:
            saved = [buf.clone() for buf in r.state()]
            try:
                self._capture(r, span, steps, saved)
            except RuntimeError as e:  # a capture CUDA refuses: the same step, eagerly, is still correct
                log.warning("fast decode: capturing the decode step failed (%s); it runs eagerly from here",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
                self.graphs = False
                for buf, old in zip(r.state(), saved):
                    buf.copy_(old)
                return None
        return r.graphs[span, steps]

    def _prefill_mask(self, r: _Room, t: int):
        """[B, 1, T, L]: each prompt position sees the real slots up to its own (causal + padding); a padded
        position, which would see none, sees every slot (its output is never read; all-masked rows would give
        NaN), as transformers' own SDPA mask does."""
        q = torch.arange(t, device=r.mask.device)[:, None]  # [T, 1]
        k = torch.arange(r.length, device=r.mask.device)[None, :]  # [1, L]
        m = (k <= q)[None] & r.mask[:, None, :]  # [B, T, L]
        m = m | ~m.any(-1, keepdim=True)
        return {"full_attention": self._as_attn_mask(m[:, None])}

    def _prefill(self, r: _Room, p: _Prefill) -> None:
        """The prompt into the cache and the first token, all on the room's buffers (capturable)."""
        t = p.valid.shape[1]
        r.mask.zero_()
        r.mask[:, :t] = p.valid
        # Positions as generate derives them from the mask: 0, 1, ... over each row's real tokens.
        positions = p.valid.long().cumsum(-1) - 1
        positions.masked_fill_(~p.valid, 1)
        mask = self._prefill_mask(r, t) if self.buckets else r.mask.long()  # off: transformers builds it
        with self._autocast():
            out = self.llm(inputs_embeds=p.embeds, attention_mask=mask, position_ids=positions,
                           use_cache=True, logits_to_keep=1, **{self.cache_kw: r.cache})
        first = out.logits[:, -1].argmax(-1)  # [B]
        r.out.zero_()
        r.out[:, 0] = first
        r.finished.copy_(torch.isin(first, self.stop) | ~p.live)
        r.tok.copy_(first[:, None])
        r.pos.copy_(positions[:, -1:] + 1)
        r.slot.fill_(t)
        r.step.fill_(1)

    def _prefill_buffers(self, r: _Room, rows: int, t: int, dim: int) -> _Prefill:
        """The prefill's inputs: kept a padded length with buckets (its graph reads them); without, only the
        latest (every prompt length would otherwise keep its own)."""
        if t not in r.prefills:
            if not self.buckets:
                r.prefills.clear()
            d = self.device
            r.prefills[t] = _Prefill(embeds=torch.zeros(rows, t, dim, dtype=self.dtype, device=d),
                                     valid=torch.zeros(rows, t, dtype=torch.bool, device=d),
                                     live=torch.zeros(rows, dtype=torch.bool, device=d))
        return r.prefills[t]

    def _run_prefill(self, r: _Room, p: _Prefill) -> None:
        r.cache.reset()  # zeros in place (write positions too): the graphs' pointers stay valid
        if p.graph is not None:
            p.graph.replay()
            return
        self._prefill(r, p)
        if not (self.graphs and self.buckets):
            return
        try:  # the eager pass above was the warm-up (lazy cache allocation, cuBLAS workspaces)
            graph = torch.cuda.CUDAGraph()
            side = _capture_stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with no_compiles(), torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
                self._prefill(r, p)
            torch.cuda.current_stream(self.device).wait_stream(side)
            p.graph = graph
        except RuntimeError as e:
            log.warning("fast decode: capturing the prefill failed (%s); it runs eagerly",
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
        # The capture ran nothing, but the cache's state must be the eager pass's: run it again, replayed.
        r.cache.reset()
        if p.graph is not None:
            p.graph.replay()
        else:
            self._prefill(r, p)

    # ------------------------------------------------------------------------------------------ decode
    @torch.no_grad()
    def generate(self, embeds: torch.Tensor, mask: torch.Tensor, max_new: int) -> torch.Tensor:
        """embeds [B, T, D] and mask [B, T] (left padded) -> generated ids [B, max_new]."""
        n, t = mask.shape
        rows = bucket(n)
        tp = -(-t // PROMPT_ROUND) * PROMPT_ROUND if self.buckets else t  # the prompt, left padded to its bucket
        r = self._room(rows, tp + max_new)
        p = self._prefill_buffers(r, rows, tp, embeds.shape[2])
        p.embeds.zero_()
        p.valid.zero_()
        p.embeds[:n, tp - t:] = embeds
        p.valid[:n, tp - t:] = mask.bool()
        if rows > n:  # bucket padding: copies of row 0, finished from the start
            p.embeds[n:] = p.embeds[:1]
            p.valid[n:] = p.valid[:1]
        p.live.zero_()
        p.live[:n] = True
        if self.fused is not None:
            self.fused.refresh()  # the weights changed since the last call (training between validations)
        self._run_prefill(r, p)
        r.counters = [layer.cumulative_length for layer in r.cache.layers]
        if self.fused is not None and not r.kv:  # the cache's tensors exist from the first prefill on
            r.kv = self.fused.kv_views(r.cache.layers)
        done, todo = 0, max_new - 1
        while done < todo and not bool(r.finished.all()):  # the host looks every check_every tokens
            k = min(self.check_every, todo - done)
            # Step j writes slot tp + j: the host knows each step's span without a read.
            for span, steps in replays([self.span(r, tp + j + 1) for j in range(done, done + k)], self.multi_step):
                graph = self._graph(r, span, steps)
                if graph is not None:
                    graph.replay()
                else:
                    for _ in range(steps):
                        self.run_step(r, span)
                self.replays += 1
            done += k
        return r.out[:n, :max_new].clone()

    def release(self) -> None:
        """Drop every room (caches, buffers, graphs), the fused step's weight copies and the graphs' memory pool."""
        self.rooms.clear()
        if self.fused is not None:  # its weight copies go too: nothing of this decoder waits for the garbage collector
            self.fused.release()
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None


def replays(spans: list[int], multi_step: bool) -> list[tuple[int, int]]:
    """The consecutive steps of one check, by their spans, as (span, steps) replays in order: with ``multi_step``
    each run of equal spans is one replay; else a replay a step."""
    if not multi_step:
        return [(span, 1) for span in spans]
    return [(span, len(list(run))) for span, run in itertools.groupby(spans)]


def advance(nxt, finished, out, step, stop, tok, pos, slot, pad: int) -> None:
    """After a step: the picked tokens (``pad`` for finished rows) into ``out`` at ``step``, the finished mask,
    the next token and the counters, in place."""
    nxt = torch.where(finished, pad, nxt)
    out.index_copy_(1, step, nxt[:, None])
    finished.logical_or_(torch.isin(nxt, stop))
    tok.copy_(nxt[:, None])
    pos.add_(1)
    slot.add_(1)
    step.add_(1)


class GraphedEncode:
    """``model.encode_audio`` replayed as a CUDA graph per (batch bucket, frame bucket): the batch is padded to
    ``bucket(n)`` rows and its LFR frames to a multiple of FRAME_ROUND. Padded frames are masked in the encoder's
    attention and zeroed before its FSMN convolution, so real frames see only real frames, as in the eager
    batch (whose padding is the batch's longest utterance); padded rows have length 1 and are dropped."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.failed = False

    @torch.no_grad()
    def __call__(self, speech: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """speech [N, F, D], lengths [N] -> adaptor outputs [N, F', llm_dim] (views of the graph's output: use
        them before the next call)."""
        n, f, d = speech.shape
        if self.failed:
            return self.model.encode_audio(speech, lengths)
        key = (bucket(n), -(-f // FRAME_ROUND) * FRAME_ROUND)
        if key not in self.graphs:
            try:
                self.graphs[key] = self._capture(*key, d, speech.dtype)
            except RuntimeError as e:  # a capture CUDA refuses: the eager encoder is still correct
                log.warning("fast decode: capturing the encoder failed (%s); it runs eagerly from here",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
                self.failed = True
                return self.model.encode_audio(speech, lengths)
        graph, x, lens, out = self.graphs[key]
        x.zero_()
        x[:n, :f] = speech
        lens.fill_(1)
        lens[:n] = lengths
        graph.replay()
        return out[:n]

    def _capture(self, rows: int, frames: int, dim: int, dtype: torch.dtype):
        log.info("fast decode: capturing the encoder for %d utterances x %d frames", rows, frames)
        x = torch.zeros(rows, frames, dim, dtype=dtype, device=self.device)
        lens = torch.ones(rows, dtype=torch.long, device=self.device)
        side = _capture_stream(self.device)

        # warm-ups: lazy initialisation, cuBLAS workspaces, compiled blocks
        settle(lambda: on_side_stream(lambda: self.model.encode_audio(x, lens), side, self.device),
               what="the decode encoder")
        graph = torch.cuda.CUDAGraph()
        with no_compiles(), torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
            out = self.model.encode_audio(x, lens)
        torch.cuda.current_stream(self.device).wait_stream(side)
        return graph, x, lens, out
