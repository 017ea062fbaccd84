"""model.llm.lora.dtype: "" keeps loralib's adapters in the base weight's dtype (unchanged); fp32 gives PEFT's
(fp32 adapters, gradients and AdamW moments over a bf16 base, PEFT's LoRA arithmetic), through building, a
training step, checkpoints and resume, and the exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from brisk.adapters.lora import LoraLinear, fold_lora, is_lora_key
from brisk.config import ConfigError, OptimConfig, load_config
from brisk.data.collate import Collator
from brisk.models.build import build_llm, build_model, read_checkpoint
from brisk.models.lm import lm_loss
from brisk.train.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "v_proj", "gate_proj", "down_proj"]


def chat_cfg(dtype: str, *extra: str):
    """The chat demo's tiny Qwen3 in bf16, as the chat configs run it, with adapters of ``dtype``."""
    value = dtype or '""'  # the YAML empty string: the default
    return load_config(ROOT / "configs/sft_demo.yaml", [
        "model.llm.dtype=bf16", "model.llm.lora.enabled=true", "model.llm.lora.only=true", "model.llm.lora.dropout=0.0",
        f"model.llm.lora.dtype={value}", f"model.llm.lora.target_modules=[{','.join(TARGETS)}]", *extra])


def adapters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if is_lora_key(n)}


def trained_b(model: nn.Module) -> nn.Module:
    """B starts at zero: an update to compare (values with more mantissa bits than bf16 holds)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape))
    return model


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    from transformers import AutoTokenizer

    from brisk.data.chat_store import build_chat_store

    tok = AutoTokenizer.from_pretrained(str(ROOT / "data/chat_demo/tokenizer"), local_files_only=True)
    ds = build_chat_store(str(ROOT / "data/chat_demo/valid.jsonl"), tok, max_len=256, overlong="truncate",
                          skip_bad=False, cache_dir=tmp_path_factory.mktemp("cache"))
    return Collator()([ds[i] for i in range(4)])


def test_bad_dtype_is_one_error_line():
    with pytest.raises(ConfigError, match=r"model.llm.lora.dtype='bf16': use fp32"):
        chat_cfg("bf16")
    assert chat_cfg("").model.llm.lora.dtype == "" and chat_cfg("fp32").model.llm.lora.dtype == "fp32"


@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16])
def test_default_keeps_loralib_arithmetic_bit_for_bit(base_dtype):
    """dtype "": adapters in the base weight's dtype and the output loralib's expression gives, to the bit."""
    torch.manual_seed(0)
    base = nn.Linear(16, 12).to(base_dtype)
    layer = LoraLinear(base, r=4, alpha=8, dropout=0.0)
    assert layer.lora_A.dtype == layer.lora_B.dtype == base_dtype and not layer.peft_arithmetic
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 16).to(base_dtype)
    expected = nn.functional.linear(x, base.weight, base.bias) + (x @ layer.lora_A.T @ layer.lora_B.T) * 2.0
    assert torch.equal(layer(x), expected)


def test_default_on_the_chat_model_is_bf16_adapters():
    model = build_model(chat_cfg(""))
    assert {p.dtype for p in adapters(model).values()} == {torch.bfloat16}


def test_fp32_adapters_over_a_bf16_base(batch):
    model = build_model(chat_cfg("fp32"))
    ad = adapters(model)
    assert len(ad) == 2 * len(TARGETS) * 2 and {p.dtype for p in ad.values()} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if not is_lora_key(n)} == {torch.bfloat16}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(ad)
    trained_b(model)
    loss, _, _ = lm_loss(model(batch), batch.labels)  # the model's own forward: under its bf16 autocast
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0 for p in ad.values())


@pytest.mark.parametrize("autocast", [False, True])
def test_fp32_adapters_compute_what_peft_computes(autocast):
    """A PEFT model of the same bf16 Qwen3 (get_peft_model's default autocast_adapter_dtype: fp32 adapters) with
    brisk's A and B copied in: the same logits and the same fp32 adapter gradients, with and without the bf16
    autocast (brisk's bf16 LLM runs under it; TRL's bf16=True runs PEFT under accelerate's)."""
    peft = pytest.importorskip("peft")
    cfg = chat_cfg("fp32")
    ours = trained_b(build_model(cfg))
    base = build_llm(cfg.model).to(torch.bfloat16)
    base.load_state_dict({k.removeprefix("llm."): v for k, v in ours.state_dict().items()
                          if k.startswith("llm.") and not is_lora_key(k)}, strict=False)
    lora = cfg.model.llm.lora
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=0.0,
                                                       target_modules=TARGETS))

    def twin(name: str) -> torch.Tensor:
        mod, _, t = name.removeprefix("llm.").rpartition(".")
        return theirs.get_parameter(f"base_model.model.{mod}.{t}.default.weight")

    with torch.no_grad():
        for n, p in adapters(ours).items():
            assert twin(n).dtype == torch.float32  # peft upcast them itself
            twin(n).copy_(p)
    torch.manual_seed(0)
    x = torch.randn(2, 7, cfg.model.llm.config["hidden_size"]).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        a = ours.llm(inputs_embeds=x).logits
        b = theirs(inputs_embeds=x).logits
    assert a.dtype == b.dtype == torch.bfloat16
    assert torch.equal(a, b)  # the same operations in the same order
    plain = build_model(chat_cfg(""))
    plain.load_state_dict(ours.state_dict())  # the same adapters rounded to bf16, loralib's arithmetic
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        rounded = plain.llm(inputs_embeds=x).logits
    # Without autocast the comparison tells bf16 adapters apart; under it the GEMMs see bf16 inputs either way, so
    # the forward is the same and only what the optimizer keeps differs (the next test).
    assert torch.equal(rounded, a) == autocast
    a.float().square().mean().backward()
    b.float().square().mean().backward()
    for n, p in adapters(ours).items():
        assert p.grad.dtype == torch.float32 and torch.allclose(p.grad, twin(n).grad, rtol=1e-3, atol=1e-8), n


@pytest.mark.parametrize("fused", [False, True])
def test_an_update_below_bf16_resolution_survives_only_in_fp32(batch, fused):
    """AdamW's first step moves every weight with a gradient by lr (1e-4): below half a bf16 step of most of A's
    entries (|A| up to 1/sqrt(128)), so bf16 adapters keep most of them unchanged; fp32 ones move every one. The
    fused AdamW takes the same mixed-dtype parameters (a bf16 base that trains too, fp32 adapters)."""
    changed = {}
    for dtype in ("", "fp32"):
        model = trained_b(build_model(chat_cfg(dtype, "model.llm.lora.only=false")))
        opt = build_optimizer(model, OptimConfig(lr=1e-4, weight_decay=0.0), fused=fused)
        assert {p.dtype for g in opt.param_groups for p in g["params"]} == \
            ({torch.bfloat16} if dtype == "" else {torch.bfloat16, torch.float32})
        before = {n: p.detach().clone() for n, p in adapters(model).items()}
        loss, _, _ = lm_loss(model(batch), batch.labels)
        loss.backward()
        opt.step()
        moved = has_grad = 0
        for n, p in adapters(model).items():
            live = p.grad != 0
            moved += int((p.detach() != before[n])[live].sum())
            has_grad += int(live.sum())
            assert opt.state[p]["exp_avg"].dtype == opt.state[p]["exp_avg_sq"].dtype == p.dtype
        changed[dtype] = moved / has_grad
    assert changed["fp32"] == 1.0
    assert changed[""] < 0.6, changed


def test_fold_is_in_fp32_and_the_bf16_export_rounds_once(tmp_path):
    """The transformers export of a bf16 model with fp32 adapters: W + (alpha / r) B A from the fp32 adapters,
    rounded to bf16 once, not from adapters first rounded to the export's bf16."""
    from safetensors.torch import load_file

    from brisk.models.export import export_folder

    cfg = chat_cfg("fp32")
    model = trained_b(build_model(cfg)).eval()
    with torch.no_grad():  # adapters that bf16 cannot hold exactly
        for p in adapters(model).values():
            p.add_(torch.randn_like(p) * 1e-3)
    state = model.state_dict()
    folded = fold_lora(state, cfg.model.llm.lora)
    q = "llm.model.layers.0.self_attn.q_proj.weight"
    assert not any(map(is_lora_key, folded)) and folded[q].dtype == torch.bfloat16
    expected = (state[q].float() + 2.0 * state[q[:-6] + "lora_B"] @ state[q[:-6] + "lora_A"]).bfloat16()
    assert torch.equal(folded[q], expected)
    rounded = fold_lora({k: v.bfloat16() for k, v in state.items()}, cfg.model.llm.lora)
    assert not torch.equal(rounded[q], expected)  # rounding the adapters first gives other weights
    out = export_folder(model, cfg, tmp_path / "hf", "hf", "bf16")
    written = load_file(str(out / "model.safetensors"))
    assert written["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(written["model.layers.0.self_attn.q_proj.weight"], expected)


def test_peft_adapter_folder_holds_fp32_adapters(tmp_path):
    from safetensors.torch import load_file

    from brisk.adapters.lora import write_peft_adapter

    cfg = chat_cfg("fp32")
    model = trained_b(build_model(cfg))
    folder = write_peft_adapter(model, cfg.model.llm.lora, tmp_path / "adapter")
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == len(adapters(model)) and {t.dtype for t in tensors.values()} == {torch.float32}


def test_checkpoint_and_resume_keep_fp32_adapters(tmp_path):
    """A bf16 chat run with fp32 adapters (fused AdamW): the checkpoint holds fp32 adapters and fp32 moments, a
    run resumed from it takes the same steps as one that did not stop, and resuming with bf16 adapters is refused."""
    from brisk.train.run import train

    def run(folder: Path, *extra: str, dtype: str = "fp32"):
        train(chat_cfg(dtype, f"train.output_dir={folder}", "train.val_every=0", "diagnose.report=false",
                       "train.tensorboard=false", "train.export=none", "optim.lr=1e-4", "speed.fused_adamw=true",
                       *extra))

    run(tmp_path / "whole", "train.max_steps=4")
    run(tmp_path / "split", "train.max_steps=2")
    run(tmp_path / "split", "train.max_steps=4", "train.resume=true")
    ckpts = sorted((tmp_path / "split" / "checkpoints").glob("ckpt-*.pt"))
    ckpt = read_checkpoint(ckpts[-1])
    ad = {k: v for k, v in ckpt["state_dict"].items() if is_lora_key(k)}
    assert ad and {v.dtype for v in ad.values()} == {torch.float32}
    moments = [s[k] for s in ckpt["optimizer"]["state"].values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}

    def losses(folder: Path) -> list[float]:
        return [json.loads(x)["loss"] for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]

    assert len(losses(tmp_path / "whole")) == 4 and losses(tmp_path / "whole") == losses(tmp_path / "split")
    with pytest.raises(ConfigError, match=r"model.llm.lora.dtype: 'fp32' -> ''"):  # the numbers would change
        run(tmp_path / "split", "train.max_steps=6", "train.resume=true", dtype="")
