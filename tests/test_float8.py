"""speed.float8 on the CPU (torchao emulates the float8 GEMMs there): the decoder layers' linear layers become
Float8Linear on the same parameters (state dict unchanged), the embedding and LM head stay; the loss and gradients
stay within float8's rounding of the plain model's; the plan takes the switch for a chat model on CUDA only, never
with LoRA, and refuses it for the speech families. Its speed and its probe against bf16: on the GPU (sft_bench's
d8 arm, tests/gpu/test_float8_cuda.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from brisk.config import ConfigError
from brisk.families import family_of
from brisk.models.lm import lm_loss
from brisk.plan import make_plan
from brisk.speed.float8 import apply_float8

from .test_chat_model import chat_cfg, samples  # noqa: F401 (a fixture)

pytest.importorskip("torchao.float8")

# dimensions the float8 GEMM takes (multiples of 16)
DENSE = ["model.llm.config={model_type: qwen3, vocab_size: 392, hidden_size: 64, intermediate_size: 128, "
         "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, tie_word_embeddings: false}"]


def test_float8_swaps_the_decoder_linears_on_the_same_parameters_and_keeps_the_loss(tmp_path, samples):  # noqa: F811
    from brisk.data.collate import Collator

    cfg = chat_cfg([f"train.output_dir={tmp_path}", *DENSE])
    plain = family_of(cfg).build(cfg, "cpu")
    fast = copy.deepcopy(plain)
    keys = list(fast.state_dict())
    note = apply_float8(family_of(cfg).decoder_layers(fast), "cpu")
    assert "14 of the decoder layers' 14 linear layers" in note  # 2 layers x (q, k, v, o, gate, up, down)
    assert list(fast.state_dict()) == keys
    kinds = {n: type(m).__name__ for n, m in fast.named_modules()}
    assert kinds["llm.model.layers.0.self_attn.q_proj"] == "Float8Linear"
    assert kinds["llm.lm_head"] == "Linear" and kinds["llm.model.embed_tokens"] == "Embedding"
    batch = Collator()(samples[:4])
    out = []
    for m in (plain, fast):
        m.zero_grad(set_to_none=True)
        loss, _, _ = lm_loss(m(batch), batch.labels)
        loss.backward()
        out.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (l0, g0), (l1, g1) = out
    assert abs(float(l1 - l0)) < 2e-2 * abs(float(l0)) and not torch.equal(l1, l0)  # float8 rounds: close, not equal
    rel = max(float((g1[n] - g0[n]).norm() / g0[n].norm()) for n in g0 if g0[n].norm() > 0)
    assert rel < 0.15, rel


def test_the_plan_takes_float8_for_a_chat_model_on_cuda_only(tmp_path):
    _, plan = make_plan(chat_cfg([f"train.output_dir={tmp_path}", *DENSE, "speed.float8=true"]), "cuda", 1)
    assert "float8" in plan.on
    with pytest.raises(ConfigError, match="speed.float8 needs a CUDA device"):
        make_plan(chat_cfg([f"train.output_dir={tmp_path}", *DENSE, "speed.float8=true"]), "cpu", 1)
    with pytest.raises(ConfigError, match="speed.float8 with LoRA"):
        chat_cfg([f"train.output_dir={tmp_path}", *DENSE, "speed.float8=true", "model.llm.lora.enabled=true"])
    from brisk.config import load_config

    from .conftest import REPO

    with pytest.raises(ConfigError, match="float8"):
        load_config(REPO / "configs" / "demo.yaml", [f"train.output_dir={tmp_path / 'n'}", "speed.float8=true"])
