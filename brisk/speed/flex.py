"""speed.flex_attention: the LLM's attention on a packed row as FlexAttention with a document-causal block mask.

Registered as ``brisk_flex`` in transformers' attention interface, like ``brisk_varlen`` (brisk/speed/varlen.py),
whose packed rows it takes over. At FunASR's step size (about ten sequences of 130-240 tokens in a 1,792-token row)
the row's tiles of 128 are mostly empty: FlexAttention skips them and runs the diagonal ones with the mask function,
where varlen attention computes every sequence in full (docs/finetune-speed.md has the timings). Compiled with
dynamic shapes the kernel is built for a symbolic length and loses most of that, so the call is compiled on its own,
static (``static_flex``): a graph break in each dynamically compiled layer, one graph per row length (the packed rows
come in speed.pack_buckets lengths) under a recompile limit of its own (``LENGTHS``). With
speed.compile_dynamic=false the layers themselves are static, one graph a row length, and FlexAttention is traced
into them with no break (``apply_flex_attention(inline=True)``, registered as ``brisk_flex_inline``;
``flags.run_scope`` raises Dynamo's recompile limit to room for every bucket, since past it a layer would run
eagerly; an inline call outside a compile takes varlen, not FlexAttention's unfused reference). That is the preset.

How the mask reaches the layers: a forward pre-hook on the decoder stack builds one ``BlockMask`` a forward from
the batch's ``cu_seq_lens_q`` (``document_block_mask``: a dozen small tensor ops on the device, no host read, so
the graphed step captures it and each replay rebuilds it from the static cu_seqlens buffer) and passes it down
as the keyword ``brisk_block_mask``, which transformers hands every attention call. The mask function closes
over the row's document ids; Dynamo lifts that tensor to a graph input, so a new batch does not recompile.

FlexAttention needs torch.compile to be fast (eagerly it runs an unfused reference) and has no CPU backward:
the plan asks for speed.compile (layer scope: the hook stays outside the compiled code) and a CUDA device
(brisk/plan.py). Forwards without autograd (validation, whose layers run eagerly: ``compile.eval_context``) take
brisk_varlen's kernel on the same row; decoding goes to SDPA with its padding mask, as under brisk_varlen
(``varlen.padded_attention``).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch

from .varlen import segment_of, varlen_attention

NAME = "brisk_flex"  # FlexAttention compiled apart (static_flex), out of dynamically compiled layers
INLINE = "brisk_flex_inline"  # FlexAttention traced into statically compiled layers
MASK_KEY = "brisk_block_mask"
BLOCK = 128  # FlexAttention's default tile (BlockMask.BLOCK_SIZE)


def document_block_mask(cu_seqlens: torch.Tensor, length: int, block: int = BLOCK):
    """The BlockMask of a packed row of ``length`` tokens whose sequences start at ``cu_seqlens`` (sorted, ending
    at ``length``; empty sequences allowed): token q sees token kv iff both are in one sequence and kv <= q.

    Worked out from the first and last sequence of each tile of ``block`` tokens, not from a [T, T] mask: in a
    sorted row, an earlier kv tile shares a sequence with a q tile iff the kv tile's last sequence is the q
    tile's first; the tile is full (no mask function needed) iff both tiles lie inside that one sequence; a
    diagonal tile is always partial (causal), and so is every tile of a last q tile cut short, as torch's own
    create_block_mask has them."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = cu_seqlens.device
    n = -(-length // block)
    pos = torch.arange(n * block, device=dev)
    # tokens past the row's end (a last tile cut short) get a sequence of their own: never seen by real ones
    doc = torch.where(pos < length, segment_of(cu_seqlens, pos), -1)
    tile = torch.arange(n, device=dev)
    ends = (tile + 1) * block
    first = doc[::block]
    last = doc[torch.clamp(ends, max=length) - 1]
    i, j = tile[:, None], tile[None, :]
    below = j < i
    some = (below & (last[None, :] == first[:, None])) | (i == j)
    whole = (ends <= length)[:, None]  # a q tile cut short stays partial
    full = (below & whole & (first[:, None] == last[:, None]) & (first[None, :] == last[None, :])
            & (first[:, None] == first[None, :]))
    partial = some & ~full

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(length, length))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, n] bool -> (the count of set tiles in each row [1, 1, n], their column indices first, in order
    [1, 1, n, n]), int32: BlockMask's layout."""
    count = tiles.sum(-1, dtype=torch.int32)
    index = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None], index[None, None]


def flex_attention_fn(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, call=None,
                      **kwargs):
    """transformers attention signature: q [1, H, T, D], k/v [1, Hkv, T, D] -> ([1, T, H, D], None).

    Forwards with autograd (the training step) run FlexAttention through ``call`` (``static_flex`` unless
    apply_flex_attention chose ``flex``); forwards without it (validation, where the layers run eagerly and
    FlexAttention would be its unfused reference, a [H, T, T] score matrix a layer) run brisk_varlen on the same
    row, which computes the same attention (within bf16 rounding, the GPU test). So does an inline ``call``
    outside a compile: a static layer that Dynamo gave up on (a failed compile under compile_on_error=warn)
    runs eagerly, and eager FlexAttention is that unfused reference."""
    if not torch.is_grad_enabled() or (call is not None and not torch.compiler.is_compiling()):
        return varlen_attention(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    block_mask = kwargs.get(MASK_KEY)
    if block_mask is None or query.shape[0] != 1:
        raise ValueError("brisk_flex attention needs a packed batch (one row, and the decoder stack's block-mask "
                         "hook: speed.flex_attention)")
    return (call or static_flex)(query, key, value, block_mask, scaling).transpose(1, 2).contiguous(), None


def flex(query, key, value, block_mask, scale=None) -> torch.Tensor:
    """FlexAttention on a packed row: q [1, H, T, D], k/v [1, Hkv, T, D] (GQA in the kernel) -> [1, H, T, D]."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(query, key, value, block_mask=block_mask, scale=scale,
                          enable_gqa=key.shape[1] != query.shape[1])


# One graph per packed row length: speed.pack_buckets has 13 by default, and a run past the largest bucket adds
# its multiples. Dynamo's default limit (8 graphs a function) would send the 9th length to FlexAttention's
# unfused eager reference, a [H, T, T] score matrix a layer; past this limit the compile raises (fullgraph).
LENGTHS = 64
_compiled: dict[str, object] = {}


@torch.compiler.disable
def static_flex(query, key, value, block_mask, scale=None) -> torch.Tensor:
    """``flex`` compiled on its own with static shapes, called from inside the dynamically compiled layers.

    Inside a layer compiled with dynamic=True the FlexAttention kernel is built for a symbolic length, over twice
    as slow as a static one. ``torch.compiler.disable`` makes a graph break in the layer (its
    graph before and after the attention stay dynamic) and this function's own ``torch.compile`` runs instead.
    Under the graphed step the break costs nothing after capture. On the CPU (the tests: the plan asks for
    CUDA) the backend is aot_eager, Dynamo and AOTAutograd without Inductor's code: FlexAttention's own math."""
    backend = "inductor" if query.is_cuda else "aot_eager"
    fn = _compiled.get(backend)
    if fn is None:  # fullgraph: a graph break or a length past the limit raises instead of running unfused
        fn = _compiled[backend] = torch.compile(flex, dynamic=False, fullgraph=True, backend=backend)
    with torch._dynamo.config.patch(recompile_limit=max(LENGTHS, torch._dynamo.config.recompile_limit)):
        return fn(query, key, value, block_mask, scale)


def _add_block_mask(module, args, kwargs):
    """Forward pre-hook of the decoder stack: a packed batch's block mask, built once for all its layers."""
    cu = kwargs.get("cu_seq_lens_q")
    embeds = kwargs.get("inputs_embeds")
    if cu is None or embeds is None or not torch.is_grad_enabled():  # without autograd the layers take varlen_attn
        return None
    return args, {**kwargs, MASK_KEY: document_block_mask(cu, embeds.shape[1])}


def apply_flex_attention(llm, inline: bool = False) -> str:
    """Switch a transformers model to brisk_flex (packed rows only) and hook its decoder stack.

    ``inline``: the layers are compiled with static shapes (speed.compile_dynamic=false), so FlexAttention is traced
    into each layer's graph (one graph a row length, no break); otherwise ``static_flex`` breaks out of the
    dynamic layers."""
    from transformers import AttentionInterface

    from .compile import decoder_stack

    # two names, so that two models of one process can each keep their own way
    AttentionInterface.register(NAME, flex_attention_fn)
    AttentionInterface.register(INLINE, partial(flex_attention_fn, call=flex))
    previous, name = llm.config._attn_implementation, INLINE if inline else NAME
    llm.set_attn_implementation(name)
    decoder_stack(llm).register_forward_pre_hook(_add_block_mask, with_kwargs=True)
    how = "traced into the static layers" if inline else "compiled static on its own"
    return (f"flex_attention: attention {previous} -> {name} (FlexAttention {how}, a document-causal block mask "
            "built once a forward from cu_seqlens)")


@contextmanager
def varlen_for_counting(llm):
    """For its duration an LLM switched to brisk_flex (or brisk_flex_inline) runs brisk_varlen instead: the same
    attention on the same row. torch's FlopCounterMode (brisk bench's roofline, brisk profile) raises inside
    FlexAttention's higher-order op ("no implementation found for 'torch.ops.higher_order.flex_attention'"), eager
    or compiled, and the failed compile leaves ``static_flex`` marked skipped for the rest of the process (round
    12's ``brisk profile`` of speed.flex_attention exited 1)."""
    previous = getattr(getattr(llm, "config", None), "_attn_implementation", None)
    if previous not in (NAME, INLINE):
        yield
        return
    from .varlen import NAME as VARLEN, register

    register()
    llm.set_attn_implementation(VARLEN)
    try:
        yield
    finally:
        llm.set_attn_implementation(previous)
