"""model.llm.lora: LoRA adapters on the LLM's linear layers, with FunASR 1.4.16's names and arithmetic.

FunASR's Fun-ASR-Nano (``llm_conf.use_lora``) swaps every ``nn.Linear`` of the LLM whose name has a
``target_modules`` entry as one dotted component for loralib's ``Linear``: the base ``weight`` (and ``bias``)
stay the same tensors under the same names, ``lora_A`` [r, in] and ``lora_B`` [out, r] are added beside
them, and the output is ``x W^T + b + (dropout(x) A^T B^T) * alpha / r``. ``LoraLinear`` below holds exactly
those four tensors under exactly those names, so a FunASR LoRA checkpoint loads here strictly and a brisk
checkpoint loads into FunASR strictly.

Why not PEFT's layers: PEFT names the same tensors ``base_layer.weight`` and ``lora_A.default.weight``, so a
FunASR checkpoint would need key renaming in every place brisk names parameters (frozen-weight references,
optimizer groups, probe norms, FSDP, exports). FunASR itself builds loralib layers, not PEFT's.

Two differences from loralib, both on purpose:
- loralib's ``eval()`` adds B A into the base weight in place (and ``train()`` subtracts it again), so a
  state dict taken in eval mode holds folded weights *and* the adapters. Here the base weight is never
  changed; folding is explicit (``fold_lora``, used by the transformers export).
- ``LoraLinear`` is not an ``nn.Linear``: code that reads ``.weight`` of every Linear (fused projections, a
  labelled-rows LM head) must not silently drop the adapters' update.

Frozen base: the base weights keep the trainability ``model.llm.freeze`` gave them (FunASR's behaviour:
with ``freeze: false`` the base trains too); the adapters always train. ``only`` freezes every non-adapter
weight of the whole model, as FunASR's ``lora_only`` (``mark_only_lora_as_trainable``) does.

The adapters' dtype (``model.llm.lora.dtype``): by default the base weight's, as loralib makes them, so over a
bf16 LLM the adapters, their gradients and AdamW's moments are bf16 and an update below half a bf16 step of a
weight (8 significant bits) is rounded away. ``fp32`` does what PEFT (peft 0.21) does for TRL's users:
``get_peft_model(..., autocast_adapter_dtype=True)``, the default, upcasts bf16/fp16 adapters to fp32
(peft/tuners/tuners_utils.py, ``cast_adapter_dtype``), and ``peft.tuners.lora.layer.Linear.forward`` computes
``result = base_layer(x)``, casts ``x`` to ``lora_A``'s dtype (``BaseTunerLayer._cast_input_dtype``), adds
``lora_B(lora_A(dropout(x))) * scaling`` and casts the sum back to the base output's dtype. ``LoraLinear``
with ``dtype`` set computes exactly that. Under the bf16 autocast a bf16 brisk LLM runs in (and accelerate's
autocast, TRL's ``bf16=True``, runs PEFT's layers in) the two small GEMMs take bf16 inputs either way; the
input is then not cast to fp32 first, which gives the same GEMM inputs without an fp32 copy of every adapted
layer's input kept for the backward (with lora.dropout > 0 the dropout then runs in the input's dtype, not
PEFT's fp32: the same distribution, not the same bits).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, LoraConfig

log = logging.getLogger("brisk")

LORA_TENSORS = ("lora_A", "lora_B")
ADAPTER_DTYPES = {"": None, "fp32": torch.float32}  # model.llm.lora.dtype -> LoraLinear's dtype (None: the base's)


class LoraLinear(nn.Module):
    """A linear layer with a low-rank update, holding the base layer's own weight and bias tensors."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float, dtype: torch.dtype | None = None):
        """``dtype``: the adapters' (model.llm.lora.dtype); None keeps the base weight's and loralib's arithmetic,
        a dtype gives PEFT's (the module docstring)."""
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # the same Parameter: state dict name and trainability unchanged
        self.bias = base.bias
        w = base.weight
        self.peft_arithmetic = dtype is not None
        dtype = dtype or w.dtype
        # loralib's initialisation: A as nn.Linear's default, B zero (the adapted layer starts as the base one).
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, dtype=dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, dtype=dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / r
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.peft_arithmetic:
            return self._peft_forward(x)
        # Same order of operations as loralib (x A^T first, then B^T, then the scale).
        return F.linear(x, self.weight, self.bias) + (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling

    def _peft_forward(self, x: torch.Tensor) -> torch.Tensor:
        """peft.tuners.lora.layer.Linear.forward for one adapter: the base output, plus B(A(dropout(x))) * scaling
        computed from ``x`` in the adapters' dtype, the sum cast to the base output's dtype."""
        result = F.linear(x, self.weight, self.bias)
        if not torch.is_autocast_enabled(x.device.type):  # under autocast the GEMMs cast x to its dtype anyway
            x = x.to(self.lora_A.dtype)
        delta = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling
        return (result + delta).to(result.dtype)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, r={self.lora_A.shape[0]}, scaling={self.scaling}"
                + (f", adapters {str(self.lora_A.dtype).removeprefix('torch.')}" if self.peft_arithmetic else ""))


def _targets(llm: nn.Module, names: list[str]) -> list[tuple[str, nn.Linear]]:
    """FunASR's rule: an nn.Linear whose dotted name has a target as one of its components."""
    return [(n, m) for n, m in llm.named_modules()
            if isinstance(m, nn.Linear) and any(t in n.split(".") for t in names)]


def apply_lora(model: nn.Module, cfg: LoraConfig) -> str:
    """Swap the target linear layers of ``model.llm`` for ``LoraLinear``; with ``cfg.only`` freeze the rest."""
    if not cfg.enabled:
        return "lora: off"
    found = _targets(model.llm, cfg.target_modules)
    if not found:
        raise ConfigError(f"model.llm.lora.target_modules={cfg.target_modules}: no linear layer of the LLM has such a "
                          "name (Qwen3: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; Qwen3.5's "
                          "linear attention also in_proj_qkv, in_proj_z, out_proj)")
    for name, linear in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.llm.get_submodule(parent_name) if parent_name else model.llm
        setattr(parent, child, LoraLinear(linear, cfg.r, cfg.alpha, cfg.dropout, ADAPTER_DTYPES[cfg.dtype]))
    if cfg.only:
        mark_only_lora_trainable(model, cfg.bias)
    n = sum(p.numel() for name, p in model.named_parameters() if name.rpartition(".")[2] in LORA_TENSORS)
    return (f"lora: {len(found)} linear layers of the LLM ({', '.join(cfg.target_modules)}), r={cfg.r}, "
            f"alpha={cfg.alpha:g}, dropout={cfg.dropout:g}, {n:,} adapter parameters"
            + (f" in {cfg.dtype} (PEFT's arithmetic)" if cfg.dtype else "")
            + (f"; only the adapters train (bias={cfg.bias})" if cfg.only else "")
            + (f"; started from {cfg.init_path} (loaded after the model's weights)" if cfg.init_path else ""))


def mark_only_lora_trainable(model: nn.Module, bias: str = "none") -> None:
    """FunASR's ``mark_only_lora_as_trainable``: everything but the adapters (and, by ``bias``, biases) frozen."""
    for name, p in model.named_parameters():
        if "lora_" not in name:
            p.requires_grad_(False)
    if bias == "all":
        for name, p in model.named_parameters():
            if "bias" in name:
                p.requires_grad_(True)
    elif bias == "lora_only":
        for m in model.modules():
            if isinstance(m, LoraLinear) and m.bias is not None:
                m.bias.requires_grad_(True)


def is_lora_key(key: str) -> bool:
    return key.rpartition(".")[2] in LORA_TENSORS


def load_lora_weights(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """The adapters' tensors from ``state``, read from ``path`` (any file brisk reads: a FunASR model.pt, a
    checkpoint); every adapter of the model must be there, other tensors in the file are not used."""
    own = {k: v for k, v in model.state_dict().items() if is_lora_key(k)}
    missing = sorted(set(own) - set(state))
    if missing:
        raise ConfigError(f"model.llm.lora.init_path={path}: no {missing[0]} there ({len(missing)} adapter tensors "
                          "missing); give a checkpoint trained with the same model.llm.lora.target_modules")
    with torch.no_grad():
        for k, v in own.items():
            if v.shape != state[k].shape:
                raise ConfigError(f"model.llm.lora.init_path={path}: {k} has shape {tuple(state[k].shape)}, the "
                                  f"adapters here {tuple(v.shape)} (check model.llm.lora.r)")
            v.copy_(state[k])
    log.info("loaded %d adapter tensors from %s", len(own), path)


def fold_lora(state: dict[str, torch.Tensor], cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """A state dict without adapters: each adapted weight becomes W + (alpha / r) B A (what loralib's eval()
    computes, and PEFT's ``merge_and_unload``), in fp32, then back to W's dtype: with fp32 adapters
    (model.llm.lora.dtype=fp32) over a bf16 W, the one rounding is that of the sum. Tensors are not changed in
    place."""
    out = {k: v for k, v in state.items() if not is_lora_key(k)}
    scaling = cfg.alpha / cfg.r
    for k in state:
        if k.endswith(".lora_A"):
            prefix = k[: -len("lora_A")]
            w = state[prefix + "weight"]
            delta = state[prefix + "lora_B"].float() @ state[k].float()
            out[prefix + "weight"] = (w.float() + delta * scaling).to(w.dtype)
    return out


def write_peft_adapter(model: nn.Module, cfg: LoraConfig, folder: str | Path) -> Path:
    """The LLM's adapters as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors), for
    ``peft.PeftModel.from_pretrained(<the same causal LM, unfolded base weights>, folder)``. Same tensors, PEFT's
    names: ``llm.X.lora_A`` -> ``base_model.model.X.lora_A.weight``."""
    import json

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"base_model.model.{k.removeprefix('llm.').rpartition('.')[0]}.{k.rpartition('.')[2]}.weight":
               v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k.startswith("llm.") and is_lora_key(k)}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.r, "lora_alpha": cfg.alpha,
              "lora_dropout": cfg.dropout, "target_modules": list(cfg.target_modules), "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True, "base_model_name_or_path": None}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder
