"""The HF export of a chat run: the causal LM's own ``save_pretrained`` layout (config.json, model.safetensors,
tokenizer), which ``AutoModelForCausalLM.from_pretrained`` loads as it would the original folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...config import Config


def write_chat_hf(model, cfg: Config, state: dict[str, torch.Tensor], out: Path, dtype: str, tokenizer) -> None:
    from safetensors.torch import save_file

    llm_cfg = model.llm.config
    llm_cfg.architectures = [type(model.llm).__name__]
    llm_cfg.save_pretrained(out)  # the dtype is recorded below, not set on the live model's config

    cfg_file = out / "config.json"
    written = json.loads(cfg_file.read_text(encoding="utf-8"))
    written["dtype"] = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    cfg_file.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if cfg.model.llm.lora.enabled:  # transformers' model has no adapter layers: W + (alpha / r) B A
        from ...adapters.lora import fold_lora

        state = fold_lora(state, cfg.model.llm.lora)
    weights = {k.removeprefix("llm."): v for k, v in state.items() if k.startswith("llm.")}
    if getattr(llm_cfg, "tie_word_embeddings", False):  # stored once, as transformers writes tied weights
        weights.pop("lm_head.weight", None)
    # clone: tied or viewed tensors share storage, which safetensors refuses
    save_file({k: v.contiguous().clone() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def chat_readme(dtype: str) -> str:
    return f"""# Causal LM fine-tuned on chat data by brisk (model.family: causal_lm)

Load with transformers: `AutoModelForCausalLM.from_pretrained("<this folder>")` and
`AutoTokenizer.from_pretrained("<this folder>")`; brisk trains it again with `model.llm.path=<this folder>`.
Weights: `model.safetensors` ({dtype}). The tokenizer keeps its own chat template; training labelled the
assistant turns as that template's training twin renders them (see brisk/data/chat.py).
"""


def write_chat_readme(out: Path, fmt: str, dtype: str, cfg) -> None:
    """The causal LM family's README beside its export."""
    (out / "README.md").write_text(chat_readme(dtype), encoding="utf-8")


def folder_overrides(path: Path) -> list[str]:
    """A causal LM folder as a chat model: its weights and tokenizer, and the keys its brisk.json recorded
    (the chat template, max_len, dtype the run trained with)."""
    from ...formats.brisk_keys import read_keys_file

    found = read_keys_file(path) or {"keys": {}}
    keys = {k: v for k, v in found["keys"].items() if k.startswith(("data.", "model.llm.", "causal_lm."))}
    return ["model.family=causal_lm", "train.export=hf", f"model.llm.path={path}", f"data.tokenizer={path}",
            *(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in keys.items())]
