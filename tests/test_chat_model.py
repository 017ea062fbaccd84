"""task: chat models: Qwen3 (dense) and Qwen3.5 (Gated DeltaNet + gated full attention) from inline configs;
packed rows give the padded loss and gradients for both layer types; the hidden-state path feeds lm_head;
the HF export loads in AutoModelForCausalLM with the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.config import load_config
from brisk.data.chat import build_chat_dataset
from brisk.data.collate import Collator
from brisk.models.build import build_model
from brisk.models.speech_llm import lm_loss
from brisk.speed.llm_kernels import apply_linear_attention_per_sequence, linear_attention_layers

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "chat_demo"
QWEN3 = ["model.llm.config.num_hidden_layers=2"]
QWEN3_5 = ["model.llm.config={model_type: qwen3_5_text, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
           "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, "
           "linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 16, linear_value_head_dim: 16, "
           "linear_conv_kernel_dim: 4, tie_word_embeddings: false, "
           "layer_types: [linear_attention, full_attention, linear_attention, full_attention]}"]


def chat_cfg(overrides):
    return load_config(ROOT / "configs" / "sft_demo.yaml", overrides)


@pytest.fixture(scope="module")
def samples():
    tok = AutoTokenizer.from_pretrained(str(DEMO / "tokenizer"), local_files_only=True)
    ds, _ = build_chat_dataset(str(DEMO / "valid.jsonl"), tok, max_len=512, overlong="truncate", skip_bad=False)
    return [ds[i] for i in range(6)]


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, _, count = lm_loss(model(batch), batch.labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, count


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_packed_equals_padded(arch, samples):
    model = build_model(chat_cfg(QWEN3 if arch == "qwen3" else QWEN3_5).model, task="chat")
    keys = list(model.state_dict())
    layers = linear_attention_layers(model.llm)
    assert (len(layers) == 2) == (arch == "qwen3_5")
    note = apply_linear_attention_per_sequence(model)
    assert list(model.state_dict()) == keys and ("2 Gated DeltaNet" in note) == (arch == "qwen3_5")
    padded = Collator()(samples)
    packed = Collator(packed=True, token_buckets=(512,))(samples)
    l1, g1, c1 = loss_and_grads(model, padded)
    l2, g2, c2 = loss_and_grads(model, packed)
    assert int(c1) == int(c2) > 0
    assert torch.allclose(l1, l2, rtol=1e-5, atol=1e-6), (l1, l2)
    assert g1.keys() == g2.keys() and len(g1) == len(dict(model.named_parameters()))
    for n in g1:
        assert torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-6), n


def test_linear_attention_leaks_across_a_packed_row_without_the_swap(samples):
    """Why the swap exists: transformers' torch path cannot keep packed sequences apart."""
    model = build_model(chat_cfg(QWEN3_5).model, task="chat")
    padded, packed = Collator()(samples), Collator(packed=True, token_buckets=(512,))(samples)
    ref = lm_loss(model(padded), padded.labels)[0]
    try:
        got = lm_loss(model(packed), packed.labels)[0]
    except ValueError as e:  # transformers 5.24 refuses cu_seqlens on its torch path
        assert "packed" in str(e)
    else:
        assert not torch.allclose(ref, got, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_hidden_feeds_lm_head(arch, samples):
    model = build_model(chat_cfg(QWEN3 if arch == "qwen3" else QWEN3_5).model, task="chat").eval()
    batch = Collator()(samples)
    with torch.no_grad():
        hidden = model(batch, hidden=True)
        logits = model(batch)
    assert hidden.shape[:2] == logits.shape[:2] and hidden.shape[-1] == model.llm.config.hidden_size
    assert torch.allclose(model.llm.get_output_embeddings()(hidden), logits, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_hf_export_round_trip(arch, samples, tmp_path):
    from brisk.models.export import export_folder

    cfg = chat_cfg(QWEN3 if arch == "qwen3" else QWEN3_5)
    model = build_model(cfg.model, task="chat").eval()
    out = export_folder(model, cfg, tmp_path / "hf", "hf", "fp32")
    loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tok.chat_template and type(loaded).__name__ == type(model.llm).__name__
    batch = Collator()(samples)
    with torch.no_grad():
        ours = model(batch)
        theirs = loaded(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.equal(ours, theirs)
