"""model.llm.activation_checkpoint and model.encoder.activation_checkpoint: the same loss and gradients,
bit for bit in fp32 on the CPU (dropout on), the same state-dict keys and tensors, every k-th layer, with LoRA
and with packing, and FunASR's keys read from a model folder."""

from __future__ import annotations

import pytest
import torch
import yaml

from brisk.config import ConfigError, load_config
from brisk.data.collate import Collator
from brisk.memory.checkpointing import apply_activation_checkpointing, is_checkpointed
from brisk.formats.funasr import funasr_folder_config
from brisk.models.build import build_model
from brisk.models.lm import lm_loss

from .conftest import DEMO_CONFIG, tiny_overrides
from .test_packing import _samples


def _pair(tmp_path, **extra):
    """The same model (same seed) built without and with checkpointing on every layer and block."""
    plain = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.encoder.freeze": False, **extra}))
    ckpt = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.encoder.freeze": False, **extra,
                                                                 "model.llm.activation_checkpoint": 1,
                                                                 "model.encoder.activation_checkpoint": 1}))
    return plain, build_model(plain), build_model(ckpt)


def _loss_and_grads(model, batch, seed=7):
    model.train()  # dropout on: the recomputation must draw the same masks
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss, _, _ = lm_loss(model(batch), batch.labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.equal(la, lb), (la.item(), lb.item())
    assert ga.keys() == gb.keys() and len(ga) > 10
    for k in ga:
        assert torch.equal(ga[k], gb[k]), k


def test_same_loss_and_gradients_exactly_fp32(tmp_path):
    cfg, plain, ckpt = _pair(tmp_path)
    layers = ckpt.llm.model.layers
    assert all(is_checkpointed(m) for m in layers) and not any(is_checkpointed(m) for m in plain.llm.model.layers)
    assert is_checkpointed(ckpt.audio_encoder.encoders0[0]) and is_checkpointed(ckpt.audio_encoder.tp_encoders[0])
    assert isinstance(layers[0], type(plain.llm.model.layers[0]))  # a subclass: isinstance checks still hold
    batch = Collator()(_samples(cfg))
    _assert_same(_loss_and_grads(plain, batch), _loss_and_grads(ckpt, batch))


def test_state_dict_keys_and_tensors_unchanged(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path))
    model = build_model(cfg)
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    cfg.model.llm.activation_checkpoint = cfg.model.encoder.activation_checkpoint = 1
    note = apply_activation_checkpointing(model, cfg.model)
    assert "2 of 2 decoder layers" in note and "encoder blocks" in note
    after = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert list(after) == list(before) and after == before  # same names, same order, same storage
    assert [id(p) for p in model.parameters()] == params  # the optimizer sees the same tensors
    assert not any("_checkpoint_wrapped_module" in k for k in after)
    model.load_state_dict(torch.load(_save(model.state_dict(), tmp_path), weights_only=True), strict=True)


def _save(state, tmp_path):
    path = tmp_path / "s.pt"
    torch.save(state, path)
    return path


def test_every_kth_layer(tmp_path):
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.config.num_hidden_layers": 5,
                                                                "model.llm.activation_checkpoint": 2}))
    model = build_model(cfg)
    assert [is_checkpointed(m) for m in model.llm.model.layers] == [False, True, False, True, False]
    assert not any(is_checkpointed(m) for m in model.audio_encoder.modules())
    with pytest.raises(ConfigError, match="model.llm.activation_checkpoint=-1"):
        load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.activation_checkpoint": -1}))


def test_composes_with_lora_and_packing(tmp_path):
    lora = {"model.llm.lora.enabled": True, "model.llm.freeze": True, "fun_asr_nano.frontend.dither": 0.0}
    cfg, plain, ckpt = _pair(tmp_path, **lora)
    q = ckpt.llm.model.layers[0].self_attn.q_proj
    assert type(q).__name__ == "LoraLinear" and is_checkpointed(ckpt.llm.model.layers[0])
    for m in (plain, ckpt):
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith("lora_B"):
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).view_as(p))
    samples = _samples(cfg)
    packed = Collator(packed=True, token_buckets=(64, 128, 256, 512))(samples)
    a, b = _loss_and_grads(plain, packed), _loss_and_grads(ckpt, packed)
    _assert_same(a, b)
    assert any(k.endswith("lora_A") for k in a[1]) and not any(k.endswith("q_proj.weight") for k in a[1])


def test_funasr_folder_keys(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "llm_conf": {"activation_checkpoint": True, "use_lora": False},
        "audio_encoder_conf": {"activation_checkpoint": False, "output_size": 32}}), encoding="utf-8")
    found = funasr_folder_config(tmp_path)
    model = found["model"]
    assert model["llm"]["activation_checkpoint"] == 1 and model["encoder"]["activation_checkpoint"] == 0
    assert model["llm"]["lora"] == {"enabled": False}
    assert found["fun_asr_nano"]["encoder"] == {"output_size": 32}  # the sizes go to the family's own section


def test_rng_state_is_kept_only_for_layers_that_draw_random_numbers(tmp_path):
    from brisk.memory.checkpointing import draws_random

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True}))
    model = build_model(cfg)
    layer, block = model.llm.model.layers[0], model.audio_encoder.encoders[0] if len(model.audio_encoder.encoders) else \
        model.audio_encoder.encoders0[0]
    model.train()
    assert draws_random(layer) and draws_random(block)  # LoRA dropout 0.05; encoder dropout 0.1
    model.eval()
    assert not draws_random(layer) and not draws_random(block)


def test_checkpointed_lora_layer_traces_in_one_graph(tmp_path):
    """speed.compile compiles each decoder layer: a checkpointed layer with adapters is one Dynamo graph (no
    break) and, compiled (aot_eager on the CPU), gives the same output and input gradient."""
    import torch._dynamo as dynamo

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.activation_checkpoint": 1,
                                                                "model.llm.lora.enabled": True,
                                                                "model.llm.lora.dropout": 0.0}))
    model = build_model(cfg).train()
    layer = model.llm.model.layers[0]
    assert is_checkpointed(layer)
    x = torch.randn(1, 12, cfg.model.llm.config["hidden_size"], requires_grad=True)
    pos = torch.arange(12)[None]
    rope = model.llm.model.rotary_emb(x, pos)

    def run(h):
        return layer(h, attention_mask=None, position_ids=pos, position_embeddings=rope)

    ref = run(x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    explained = dynamo.explain(run)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    dynamo.reset()
    out = torch.compile(run, backend="aot_eager")(x)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(g, g_ref, atol=1e-6)
