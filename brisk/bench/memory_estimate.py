"""What a run must hold on the GPU at least, counted on the meta device before any weight exists.

The model is built exactly as `brisk train` builds it (its family's builder: dtype, LoRA adapters, frozen
weights, activation checkpointing), but on the meta device: shapes and dtypes, no memory, no init compute, so
a 27B config is counted on a laptop in a second. From that:

- weights: every parameter's bytes in its own dtype, frozen and trainable apart;
- gradients: one tensor per trainable parameter, in its dtype (frozen weights get none);
- optimizer: AdamW's two moments per trainable parameter, in the parameter's dtype (torch's AdamW and its fused
  variant keep ``exp_avg`` and ``exp_avg_sq`` like the parameter). LoRA adapters made in fp32 over a bf16 base
  (model.llm.lora.dtype=fp32) therefore count 4 bytes each for the weight, 4 for the gradient and 8 for the
  moments;
- checkpointed layer inputs: a checkpointed decoder layer keeps only its input ([tokens, hidden] in the
  decoder's dtype) until the backward recomputes it;
- the LM head and loss: with speed.label_head or speed.liger_loss the logits live in chunks of rows (label_head's
  CHUNK_ROWS; liger's chunk is no larger), fp32 logits and their gradient; without either, the whole
  [tokens, vocab] logits in the decoder's dtype plus their fp32 copy and its gradient. label_head without
  speed.label_head_recompute also keeps each gathered row's fp32 log-probabilities (vocab x 4 bytes) until the
  backward (the labelled rows; in the graphed layout the bucket's static rows): not in the floor (the count
  varies by batch), named in the line.

The sum is a floor, not a prediction: one layer's recomputed activations, layers that are not checkpointed,
kernel workspaces and the caching allocator's slack come on top; the GPU's peak says how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import Config
from ..families import family_of

GIB = 2**30


@dataclass
class MemoryEstimate:
    params: int  # parameters (tied ones once)
    trainable: int  # trainable parameters
    weights: dict[str, int] = field(default_factory=dict)  # bytes by "dtype frozen|trainable"
    grads: int = 0  # bytes of the trainable parameters' gradients
    optimizer: int = 0  # bytes of AdamW's moments
    layers: int = 0  # decoder layers
    checkpointed: int = 0  # of them recomputed in the backward
    checkpointed_inputs: int = 0  # bytes the checkpointed layers keep: their inputs
    head: int = 0  # bytes of the LM head's logits and their gradient alive at once
    head_how: str = ""
    tokens: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def floor(self) -> int:
        return self.weight_bytes + self.grads + self.optimizer + self.checkpointed_inputs + self.head

    def parts(self) -> list[tuple[str, int]]:
        return [*((f"weights, {k}", v) for k, v in self.weights.items()),
                ("gradients (trainable only)", self.grads), ("AdamW moments", self.optimizer),
                (f"inputs of {self.checkpointed} checkpointed layers of {self.layers} at {self.tokens:,} tokens",
                 self.checkpointed_inputs),
                (f"LM head + loss ({self.head_how})", self.head), ("floor (sum)", self.floor)]

    def table(self, name: str = "") -> str:
        rows = [f"| {name} | {label} | {v / GIB:,.2f} | {v / 1e9:,.2f} |" for label, v in self.parts()]
        return "\n".join(["| config | part | GiB | GB |", "|---|---|---|---|", *rows,
                          f"| {name} | parameters: {self.params:,}, trainable {self.trainable:,} | | |"])


def _bytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def estimate(cfg: Config, tokens: int | None = None) -> MemoryEstimate:
    """The floor of ``cfg``'s training memory for a batch of ``tokens`` (default data.batch_tokens)."""
    from ..speed.label_head import CHUNK_ROWS

    tokens = tokens or cfg.data.batch_tokens
    fam = family_of(cfg)
    model = fam.build(cfg, "meta")
    seen, params = set(), []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    est = MemoryEstimate(params=sum(p.numel() for p in params), trainable=sum(p.numel() for p in params if p.requires_grad),
                         tokens=tokens)
    for p in params:
        key = f"{str(p.dtype).removeprefix('torch.')} {'trainable' if p.requires_grad else 'frozen'}"
        est.weights[key] = est.weights.get(key, 0) + _bytes(p)
    trainable = sum(_bytes(p) for p in params if p.requires_grad)
    est.grads, est.optimizer = trainable, 2 * trainable
    from ..memory.checkpointing import is_checkpointed

    layers = fam.decoder_layers(model)
    est.layers, est.checkpointed = len(layers), sum(is_checkpointed(m) for m in layers)
    emb = model.llm.get_input_embeddings().weight
    vocab, hidden = emb.shape
    act = torch.finfo(getattr(model, "llm_dtype", emb.dtype)).bits // 8
    est.checkpointed_inputs = est.checkpointed * tokens * hidden * act
    if cfg.speed.label_head or cfg.speed.liger_loss:
        rows = min(tokens, CHUNK_ROWS)
        est.head, est.head_how = rows * vocab * 4 * 2, f"{rows}-row chunks, fp32 logits + gradient"
        if cfg.speed.label_head and not cfg.speed.label_head_recompute:  # not in the floor: the count varies
            est.head_how += (f"; + {vocab * 4 / 2**20:.2f} MiB a gathered row kept for the backward "
                             "(speed.label_head_recompute drops it)")
    else:
        est.head = tokens * vocab * (act + 4 + 4)
        est.head_how = "full logits, their fp32 copy and its gradient"
    return est
