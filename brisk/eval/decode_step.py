"""The fast decoder's own decode step for Llama-family LLMs (Qwen3, Qwen2, Llama): gpt-fast's shape.

The LLM's forward, called for one token a row, does more than the step needs: three q/k/v GEMMs and two
gate/up GEMMs a layer, the keys and values repeated to every query head (a copy of the whole cache a layer when
a mask is given), the cache's write position advanced a layer, the mask converted a layer, and attention over
every slot of the static cache however few are filled. ``FusedStep`` computes the same token from the same
modules' weights with:

- one q/k/v GEMM and one gate/up GEMM a layer, on weights concatenated (and cast to the decode dtype) when the
  step is built, and copied again in place before each batch while the weights are trainable (an optimizer
  step between validations; one copy of those weights a batch, not a token) or when a frozen one's version
  moved, so captured graphs keep their pointers; what is saved and the training model are untouched;
- grouped-query attention without the repeat: the queries of one key head are the "query length" of one SDPA
  call ([B, kv heads, group, D] against [B, kv heads, span, D]);
- attention over the first ``span`` slots only (the caller picks a bucket of the filled length), the mask
  prepared once a step;
- the keys and values written straight into transformers' static cache tensors (the prefill, which is still
  the LLM's own forward, fills the same tensors), at the step's slot held on the device;
- a layer's MLP output added to the residual at the start of the next layer (``layer_step``'s ``delta``), so
  that compiled, the add and that layer's first norm are one kernel (each layer is a graph of its own).

The norms, the rotary embedding and the embedding are the LLM's own modules, so the arithmetic is the LLM's
own up to the GEMMs' partition. ``fuse=False`` keeps that partition too: the q, k, v, gate and up GEMMs run
on the modules' own weights, at the LLM's own GEMM shapes (cuBLAS picks its kernel, and with it the order of
the fp32 sums, by shape, so a concatenated GEMM rounds some bf16 outputs the other way), no copies made. ``refusal`` says why an LLM cannot take this step (another layer class, LoRA
layers, an activation other than SiLU); the fast decoder then runs the LLM's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LAYERS = ("Qwen3DecoderLayer", "Qwen2DecoderLayer", "LlamaDecoderLayer")
HEADS = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


def refusal(llm: torch.nn.Module) -> str | None:
    """Why ``FusedStep`` cannot decode ``llm`` (None: it can)."""
    if type(llm).__name__ not in HEADS:
        return f"{type(llm).__name__} is not one of {', '.join(HEADS)}"
    layers = llm.model.layers
    if any(type(layer).__name__ not in LAYERS for layer in layers):
        return f"decoder layers of class {type(layers[0]).__name__}"
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            if type(lin) is not torch.nn.Linear:  # LoRA (peft) or quantized layers compute more than the weight
                return f"a {type(lin).__name__} projection (LoRA or quantized)"
        norms = [layer.input_layernorm, layer.post_attention_layernorm, getattr(a, "q_norm", None),
                 getattr(a, "k_norm", None)]
        if any(n is not None and not (hasattr(n, "variance_epsilon") and hasattr(n, "weight"))
               or getattr(n, "offset", 0) != 0 for n in norms):  # liger's with an offset: Gemma's (1 + w)
            return "a norm other than transformers' RMSNorm"
    if not hasattr(llm.model, "rotary_emb") or not hasattr(llm.model.norm, "variance_epsilon"):
        return "no model-level rotary embedding or final RMSNorm"
    act = getattr(llm.config, "hidden_act", None)
    if act not in ("silu", "swish"):
        return f"activation {act!r} (only SiLU)"
    if type(llm.lm_head) is not torch.nn.Linear:
        return f"a {type(llm.lm_head).__name__} head"
    return None


class FusedStep:
    """One greedy token for every row: ``__call__(tok, pos, slot, mask, kv, span)`` -> token ids [B]."""

    def __init__(self, llm: torch.nn.Module, dtype: torch.dtype, attn: str, compile: str | None = None,
                 fuse: bool = True):
        self.llm, self.dtype, self.attn, self.fuse = llm, dtype, attn, fuse
        base = llm.model
        self.embed, self.norm, self.rotary, self.head = base.embed_tokens, base.norm, base.rotary_emb, llm.lm_head
        self.layers = list(base.layers)
        a0 = self.layers[0].self_attn
        self.head_dim, self.scaling = a0.head_dim, a0.scaling
        text = llm.config.get_text_config() if hasattr(llm.config, "get_text_config") else llm.config
        self.kv_heads = text.num_key_value_heads
        self.q_width = text.num_attention_heads * self.head_dim
        self.kv_width = self.kv_heads * self.head_dim
        self.sources = [p for layer in self.layers for p in self._fused_sources(layer)] if fuse else []
        self._build()
        self.shape = dict(head_dim=self.head_dim, kv_heads=self.kv_heads, q_width=self.q_width,
                          kv_width=self.kv_width, scaling=self.scaling, eager=attn == "eager")
        # compile: one graph for a layer (every layer's tensors are its arguments), one for the prologue and one
        # for the tail, so Inductor compiles one layer, not the unrolled stack. Module-level functions: Dynamo's
        # compiled code is shared by every FusedStep (a bound method would compile again for each instance).
        self.layer = compiled(layer_step, compile)
        self.tail = compiled(tail_step, compile)
        self.prologue = compiled(prologue, compile)

    def _build(self) -> None:
        """The fused weight copies (or, unfused, the modules' own weights as lists) and each layer's arguments to
        layer_step after its inputs."""
        if self.fuse:
            self.qkv = [self._cat([la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj])
                        for la in self.layers]
            self.gate_up = [self._cat([la.mlp.gate_proj, la.mlp.up_proj]) for la in self.layers]
        else:
            self.qkv = [self._own([la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj])
                        for la in self.layers]
            self.gate_up = [self._own([la.mlp.gate_proj, la.mlp.up_proj]) for la in self.layers]
        self.versions = self._versions()
        self.weights = []
        for la, (wqkv, bqkv), (wgu, bgu) in zip(self.layers, self.qkv, self.gate_up):
            a, m = la.self_attn, la.mlp
            qn, kn = (a.q_norm, a.k_norm) if hasattr(a, "q_norm") else (None, None)
            self.weights.append((la.input_layernorm.weight, la.input_layernorm.variance_epsilon, wqkv, bqkv,
                                 None if qn is None else qn.weight, None if kn is None else kn.weight,
                                 None if qn is None else qn.variance_epsilon, a.o_proj.weight, a.o_proj.bias,
                                 la.post_attention_layernorm.weight, la.post_attention_layernorm.variance_epsilon,
                                 wgu, bgu, m.down_proj.weight, m.down_proj.bias))

    def release(self) -> None:
        """Drop the fused copies (the decoder's release drops the graphs that point at them); the next
        ``refresh`` makes them again."""
        self.qkv = self.gate_up = self.weights = None

    @staticmethod
    def _fused_sources(layer) -> list[torch.Tensor]:
        a, m = layer.self_attn, layer.mlp
        return [p for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj) for p in (lin.weight, lin.bias)
                if p is not None]

    def _cat(self, lins: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.no_grad():
            weight = torch.cat([lin.weight for lin in lins]).to(self.dtype)
            bias = None
            if lins[0].bias is not None:
                bias = torch.cat([lin.bias for lin in lins]).to(self.dtype)
        return weight, bias

    @staticmethod
    def _own(lins: list[torch.nn.Linear]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The modules' own weights and biases, one GEMM each (autocast casts them as the LLM's forward does)."""
        return [lin.weight for lin in lins], [lin.bias for lin in lins]

    def _versions(self) -> list[int]:
        return [p._version for p in self.sources]

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the source weights into the fused ones, in place (graphs keep their pointers): always while any
        of them is trainable (a CUDA-graphed optimizer step changes them without moving their version
        counters), else when a version moved (a checkpoint loaded into them)."""
        if self.weights is None:  # released
            self._build()
            return
        if not self.fuse:  # the modules' own weights: nothing to copy
            return
        now = self._versions()
        if now == self.versions and not any(p.requires_grad for p in self.sources):
            return
        for la, (w, b) in zip(self.layers, self.qkv):
            a = la.self_attn
            w.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            if b is not None:
                b.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        for la, (w, b) in zip(self.layers, self.gate_up):
            m = la.mlp
            w.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
            if b is not None:
                b.copy_(torch.cat([m.gate_proj.bias, m.up_proj.bias]))
        self.versions = self._versions()

    def kv_views(self, caches: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of the static cache's tensors, what the layer step writes and reads. transformers marks the
        tensors themselves static for Dynamo (a guard on each one's identity), which would recompile the one
        compiled layer for every layer; a view shares the memory without the mark."""
        return [(c.keys.view(c.keys.shape), c.values.view(c.values.shape)) for c in caches]

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor, mask: torch.Tensor, kv: list,
                 span: int) -> torch.Tensor:
        """tok, pos [B, 1]; slot [1] (where this token's key and value go); mask [B, L] bool (the slots each row
        sees; this token's is marked here); kv: ``kv_views`` of the static cache ([B, kv heads, L, D] each);
        attention over slots [0, span) -> the greedy token of each row [B]."""
        x, delta, cos, sin, add = self.prologue(self.embed, self.rotary, tok, pos, slot, mask, span, self.dtype)
        for w, (keys, values) in zip(self.weights, kv):
            x, delta = self.layer(x, delta, cos, sin, add, slot, keys, values, span, *w, **self.shape)
        return self.tail(x, delta, self.norm.weight, self.norm.variance_epsilon, self.head.weight, self.head.bias)


# Inductor's modes that leave the capture to the fast decoder (its own CUDA graph a bucket): "reduce-overhead"
# would capture graphs of its own inside ours.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


def compiled(fn, spec: str | None):
    """``fn`` under torch.compile as ``spec`` says: None (not compiled), a backend ("inductor"; "eager" and
    "aot_eager" trace without Inductor, as the CPU tests do), or "inductor:MODE" with MODE one of
    COMPILE_MODES (max-autotune-no-cudagraphs: Inductor times its GEMM templates against cuBLAS for each
    shape and may fuse the residual add into the GEMM; compiling takes longer)."""
    if not spec:
        return fn
    backend, _, mode = spec.partition(":")
    if backend == "cudagraphs":
        raise ValueError("fast decode compile backend 'cudagraphs' would capture graphs inside the decoder's own")
    if mode and (mode not in COMPILE_MODES or backend != "inductor"):
        raise ValueError(f"fast decode compile mode {mode!r}: Inductor's, one of {', '.join(COMPILE_MODES)}")
    return torch.compile(fn, backend=backend, mode=mode or None)


def prologue(embed, rotary, tok, pos, slot, mask, span: int, dtype: torch.dtype):
    """The fed token's slot marked in ``mask``; its embedding [B, 1, H] and a zero residual delta for the first
    layer (layer_step), rotary cos and sin [B, 1, D] and the additive mask of the span [B, 1, 1, span], shared
    by every layer."""
    mask.scatter_(1, slot.expand(mask.shape[0], 1), True)
    x = embed(tok)
    cos, sin = rotary(x, pos)
    m = mask[:, None, None, :span]
    add = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, torch.finfo(dtype).min)
    return x, torch.zeros_like(x), cos, sin, add


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of Qwen3, Qwen2 and Llama, to the operation."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def layer_step(x, delta, cos, sin, add, slot, keys, values, span: int, ln1, eps1, wqkv, bqkv, qn, kn, eps_qk, wo, bo,
               ln2, eps2, wgu, bgu, wd, bd, *, head_dim: int, kv_heads: int, q_width: int, kv_width: int,
               scaling: float, eager: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer for one token a row: (x, delta) [B, 1, H] each -> (x, delta) of the next layer; the
    token's key and value written at ``slot`` of ``keys``/``values`` [B, kv heads, L, D], attention over their
    first ``span`` slots. The layer's input is x + delta: the previous layer's MLP output is added here, not at
    its own end, so that the residual add and this layer's norm are one fused kernel when compiled (a layer
    boundary is a graph boundary); eagerly the same operations in the same order. Every weight an argument, so
    that one compiled graph serves every layer. ``wqkv``/``wgu`` (and their biases): one concatenated weight, or
    lists of the q, k, v (gate, up) weights (unfused)."""
    b = x.shape[0]
    x = x + delta
    h = rms_norm(x, ln1, eps1)
    if isinstance(wqkv, torch.Tensor):  # one GEMM for q, k, v
        q, k, v = F.linear(h, wqkv, bqkv).split([q_width, kv_width, kv_width], dim=-1)
    else:  # unfused: the LLM's own three GEMMs
        q, k, v = (F.linear(h, w, bias) for w, bias in zip(wqkv, bqkv))
    q = q.view(b, -1, head_dim)  # [B, heads, D]
    k = k.view(b, kv_heads, head_dim)
    if qn is not None:
        q, k = rms_norm(q, qn, eps_qk), rms_norm(k, kn, eps_qk)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys.index_copy_(2, slot, k[:, :, None].to(keys.dtype))
    values.index_copy_(2, slot, v.view(b, kv_heads, 1, head_dim).to(values.dtype))
    # Grouped-query attention without repeating the cache: a key head's queries are one SDPA call's rows.
    q = q.view(b, kv_heads, -1, head_dim)
    k, v = keys[:, :, :span], values[:, :, :span]
    if eager:  # transformers' eager attention: the softmax in fp32
        w = torch.matmul(q, k.transpose(2, 3)) * scaling + add
        o = torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=add.to(q.dtype), scale=scaling)
    x = x + F.linear(o.reshape(b, 1, -1), wo, bo)
    h = rms_norm(x, ln2, eps2)
    if isinstance(wgu, torch.Tensor):  # one GEMM for gate and up
        gate, up = F.linear(h, wgu, bgu).chunk(2, dim=-1)
    else:
        gate, up = (F.linear(h, w, bias) for w, bias in zip(wgu, bgu))
    return x, F.linear(F.silu(gate) * up, wd, bd)


def tail_step(x, delta, norm_w, eps, head_w, head_b) -> torch.Tensor:
    """The last layer's residual add, the last norm, the head and the greedy pick: x, delta [B, 1, H] -> token
    ids [B]."""
    return F.linear(rms_norm(x + delta, norm_w, eps), head_w, head_b)[:, -1].argmax(-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
