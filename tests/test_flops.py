"""brisk.bench.flops: the model FLOPs of a training token by PaLM's convention, counted by hand on the chat
demo's tiny Qwen3 and a tiny hybrid Qwen3.5 (full fine-tuning and LoRA)."""

from __future__ import annotations

import pytest
from torch import nn

from brisk.bench.flops import attention_layers, training_flops
from brisk.config import load_config
from brisk.families import family_of

from .conftest import REPO

QWEN3_5 = ("model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
           "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, "
           "linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 16, linear_value_head_dim: 16, "
           "linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
           "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}")


def llm(tmp_path, *over):
    cfg = load_config(REPO / "configs" / "sft_demo.yaml", [f"train.output_dir={tmp_path}", *over])
    return family_of(cfg).build(cfg, "meta").llm


def by_hand(model, seq_lens, layers, width):
    """Linear layers (a LoRA layer: its base weight and its A and B) and the LM head, each weight 6 FLOPs a token
    when it trains, 4 when frozen; the causal attention of the full-attention layers."""
    weights = 0
    for name, m in model.named_modules():
        mats = [m.weight] if isinstance(m, nn.Linear) else \
            [m.weight, m.lora_A, m.lora_B] if hasattr(m, "lora_A") else []
        weights += sum(w.numel() * (6 if w.requires_grad else 4) for w in mats)
    return weights * sum(seq_lens) + 3 * layers * 2 * width * sum(s * s for s in seq_lens)


def test_dense_model_counts_every_linear_six_times_and_causal_attention(tmp_path):
    m = llm(tmp_path)
    cfg = m.config
    assert attention_layers(m) == (cfg.num_hidden_layers, cfg.num_attention_heads * cfg.head_dim)
    lens = [5, 17, 40]
    # the LM head is a Linear; the embedding (a lookup) is not
    head = m.get_output_embeddings().weight.numel()
    per_layer = sum(p.numel() for n, p in m.model.layers[0].named_parameters() if n.endswith("proj.weight"))
    matmul = cfg.num_hidden_layers * per_layer + head
    want = 6 * matmul * sum(lens) + 6 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * sum(
        s * s for s in lens)
    assert training_flops(m, lens) == pytest.approx(want, rel=0, abs=0)
    # twice the tokens in one sequence: the linear part doubles, the attention part quadruples
    one, two = training_flops(m, [64]), training_flops(m, [128])
    att = 6 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * 64 * 64
    assert two == pytest.approx(2 * (one - att) + 4 * att)


def test_hybrid_counts_attention_on_full_attention_layers_only(tmp_path):
    m = llm(tmp_path, QWEN3_5)
    assert attention_layers(m) == (2, 4 * 16)
    assert training_flops(m, [30, 9]) == by_hand(m, [30, 9], 2, 64)


def test_lora_base_weights_count_four_adapters_six(tmp_path):
    full = llm(tmp_path)
    lora = llm(tmp_path, "model.llm.lora.enabled=true", "model.llm.lora.only=true")
    adapted = [m for m in lora.modules() if hasattr(m, "lora_A")]
    assert adapted and not any(m.weight.requires_grad for m in adapted) and all(m.lora_A.requires_grad for m in adapted)
    lens = [12, 33]
    assert training_flops(lora, lens) == by_hand(lora, lens, *attention_layers(lora))
    assert training_flops(lora, lens) < training_flops(full, lens)


def test_stacked_expert_weights_are_refused_not_skipped(tmp_path):
    import torch

    m = llm(tmp_path)
    m.model.layers[0].mlp.register_parameter("experts", nn.Parameter(torch.empty(4, 8, 8, device="meta")))
    with pytest.raises(ValueError, match="experts"):
        training_flops(m, [10])
