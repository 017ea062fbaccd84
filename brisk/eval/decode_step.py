"""The fast decoder's own decode step for Llama-family LLMs (Qwen3, Qwen2, Llama): gpt-fast's shape.

The LLM's forward, called for one token a row, does more than the step needs: three q/k/v GEMMs and two
gate/up GEMMs a layer, the keys and values repeated to every query head (a copy of the whole cache a layer when
a mask is given), the cache's write position advanced a layer, the mask converted a layer, and attention over
every slot of the static cache however few are filled. ``FusedStep`` computes the same token from the same
modules' weights with:

- one q/k/v GEMM and one gate/up GEMM a layer, on weights concatenated (and cast to the decode dtype) when the
  step is built, and copied again in place whenever a source parameter changed (its ``_version``: an optimizer
  step between validations), so captured graphs keep their pointers; what is saved and the training model are
  untouched;
- grouped-query attention without the repeat: the queries of one key head are the "query length" of one SDPA
  call ([B, kv heads, group, D] against [B, kv heads, span, D]);
- attention over the first ``span`` slots only (the caller picks a bucket of the filled length), the mask
  prepared once a step;
- the keys and values written straight into transformers' static cache tensors (the prefill, which is still
  the LLM's own forward, fills the same tensors), at the step's slot held on the device.

The norms, the rotary embedding and the embedding are the LLM's own modules, so the arithmetic is the LLM's
own up to the GEMMs' partition. ``refusal`` says why an LLM cannot take this step (another layer class, LoRA
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
    act = getattr(llm.config, "hidden_act", None)
    if act not in ("silu", "swish"):
        return f"activation {act!r} (only SiLU)"
    if type(llm.lm_head) is not torch.nn.Linear:
        return f"a {type(llm.lm_head).__name__} head"
    return None


class FusedStep:
    """One greedy token for every row: ``__call__(tok, pos, slot, mask, caches, span)`` -> logits [B, V]."""

    def __init__(self, llm: torch.nn.Module, dtype: torch.dtype, attn: str):
        self.llm, self.dtype, self.attn = llm, dtype, attn
        base = llm.model
        self.embed, self.norm, self.rotary, self.head = base.embed_tokens, base.norm, base.rotary_emb, llm.lm_head
        self.layers = list(base.layers)
        a0 = self.layers[0].self_attn
        self.head_dim, self.scaling = a0.head_dim, a0.scaling
        text = llm.config.get_text_config() if hasattr(llm.config, "get_text_config") else llm.config
        self.kv_heads = text.num_key_value_heads
        self.q_width = text.num_attention_heads * self.head_dim
        self.kv_width = self.kv_heads * self.head_dim
        self.sources = [p for layer in self.layers for p in self._fused_sources(layer)]
        self.qkv = [self._cat([la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj]) for la in self.layers]
        self.gate_up = [self._cat([la.mlp.gate_proj, la.mlp.up_proj]) for la in self.layers]
        self.versions = self._versions()

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

    def _versions(self) -> list[int]:
        return [p._version for p in self.sources]

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the source weights into the fused ones, in place, if any changed since (graphs keep pointers)."""
        now = self._versions()
        if now == self.versions:
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

    def _attend(self, q, k, v, mask):
        """q [B, kv heads, group, D] against k, v [B, kv heads, span, D]; mask [B, 1, 1, span] (additive)."""
        if self.attn == "eager":  # transformers' eager attention: the softmax in fp32
            w = torch.matmul(q, k.transpose(2, 3)) * self.scaling + mask
            w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(w, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=self.scaling)

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor, mask: torch.Tensor, caches: list,
                 span: int) -> torch.Tensor:
        """tok, pos [B, 1]; slot [1] (where this token's key and value go); mask [B, L] bool (slots each row
        sees, this token's included); caches: the static cache's layers (``keys``/``values`` [B, kv, L, D]);
        attention over slots [0, span) -> the last position's logits [B, V]."""
        b = tok.shape[0]
        x = self.embed(tok)  # [B, 1, H]
        cos, sin = self.rotary(x, pos)  # [B, 1, D]
        m = mask[:, None, None, :span]
        add = torch.zeros(m.shape, dtype=self.dtype, device=m.device).masked_fill_(~m, torch.finfo(self.dtype).min)
        for layer, (wqkv, bqkv), (wgu, bgu), cache in zip(self.layers, self.qkv, self.gate_up, caches):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            qkv = F.linear(h, wqkv, bqkv)  # [B, 1, q + 2 kv]
            q, k, v = qkv.split([self.q_width, self.kv_width, self.kv_width], dim=-1)
            q = q.view(b, -1, self.head_dim)  # [B, heads, D]
            k = k.view(b, self.kv_heads, self.head_dim)
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.keys.index_copy_(2, slot, k[:, :, None].to(cache.keys.dtype))
            cache.values.index_copy_(2, slot, v.view(b, self.kv_heads, 1, self.head_dim).to(cache.values.dtype))
            o = self._attend(q.view(b, self.kv_heads, -1, self.head_dim), cache.keys[:, :, :span],
                             cache.values[:, :, :span], add)  # [B, kv, group, D]
            x = x + a.o_proj(o.reshape(b, 1, -1))
            h = layer.post_attention_layernorm(x)
            gate, up = F.linear(h, wgu, bgu).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        return self.head(self.norm(x))[:, -1]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
