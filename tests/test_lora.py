"""model.llm.lora against FunASR 1.4.16's own LoRA (llm_conf.use_lora, lora_conf, lora_only).

FunASR's FunASRNano is built from a config.yaml shaped like the published Fun-ASR-Nano-2512 one (tiny sizes,
use_lora: true), through FunASR's model table; brisk reads the same folder with model.path. Checked: the
keys map, the state dicts have the same keys and load strictly both ways, the loss and every gradient are the
same on the demo utterances (fp32), lora_only freezes the same tensors, checkpoints hold only the adapters,
the FunASR export loads into FunASR's own loader and gives the same loss after its eval() folding, the
transformers export folds the adapters, and packing on the CPU computes the padded loss with adapters.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from torch import nn

from brisk.adapters.lora import LoraLinear, fold_lora, is_lora_key
from brisk.config import ConfigError, load_config
from brisk.data.collate import Collator
from brisk.families.fun_asr_nano.dataset import SpeechDataset
from brisk.data.jsonl import read_jsonl
from brisk.data.prompt import PromptBuilder
from brisk.models.build import build_model, read_checkpoint
from brisk.models.lm import lm_loss
from brisk.families import section

from .conftest import DEMO_CONFIG, run_train, tiny_overrides
from .test_funasr_parity import AD, ENC, jsonl  # noqa: F401  (jsonl: the demo utterances fixture)

# The LoRA part of the published Fun-ASR-Nano-2512 config.yaml, with use_lora switched on.
LORA_CONF = {"freeze_lora": True, "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
             "bias": "none", "target_modules": ["q_proj", "v_proj"], "init_param_path": ""}


def funasr_yaml(lora_only: bool = False) -> dict:
    return {
        "model": "FunASRNano",
        "audio_encoder": "SenseVoiceEncoderSmall",
        "audio_encoder_conf": {**ENC, "sanm_shfit": 0, "dropout_rate": 0.1, "attention_dropout_rate": 0.0,
                               "freeze": True, "activation_checkpoint": False},
        "audio_adaptor": "Transformer",
        "audio_adaptor_conf": {**AD, "downsample_rate": 1, "use_low_frame_rate": True, "encoder_dim": 32,
                               "llm_dim": 64, "freeze": False},
        "llm": "Qwen3-0.6b",
        "llm_conf": {"hub": "hf", "init_param_path": "Qwen3-0.6B", "llm_dtype": "fp32", "freeze": True,
                     "activation_checkpoint": False, "use_lora": True, "lora_conf": dict(LORA_CONF)},
        "lora_only": lora_only,
        "frontend": "WavFrontend",
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6, "dither": 0.0},
    }


def funasr_from_folder(folder, checkpoint=None):
    """FunASR's model as its AutoModel builds it: the class from its table, the config.yaml's keys as kwargs,
    init_param_path taken from the folder, lora_only as its train.py applies it, weights by its own loader."""
    import funasr.models.fun_asr_nano.model  # noqa: F401  (registers FunASRNano)
    import funasr.models.llm_asr.adaptor  # noqa: F401
    import funasr.models.sense_voice.model  # noqa: F401
    from funasr.models.lora.utils import mark_only_lora_as_trainable
    from funasr.register import tables
    from funasr.train_utils.load_pretrained_model import load_pretrained_model

    kwargs = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    kwargs["llm_conf"]["init_param_path"] = str(folder / kwargs["llm_conf"]["init_param_path"])
    torch.manual_seed(0)
    model = tables.model_classes[kwargs["model"]](**kwargs, input_size=560)
    if kwargs.get("lora_only"):
        mark_only_lora_as_trainable(model, bias=kwargs.get("lora_bias", "none"))
    if checkpoint is not None:
        load_pretrained_model(path=str(checkpoint), model=model)
    return model


def write_folder(root, qwen3_folder, tokenizer, lora_only=False):
    folder = root / "Fun-ASR-Nano-lora"
    shutil.copytree(qwen3_folder, folder / "Qwen3-0.6B")
    tokenizer.save_pretrained(folder / "Qwen3-0.6B")
    (folder / "config.yaml").write_text(yaml.safe_dump(funasr_yaml(lora_only)), encoding="utf-8")
    return folder


def no_dropout(model: nn.Module) -> nn.Module:
    """Training mode (FunASR's LoRA layers fold themselves into the base weight in eval mode), dropout off."""
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.eval()
    return model


@pytest.fixture(scope="module")
def both(tmp_path_factory, qwen3_folder, tokenizer, jsonl):  # noqa: F811
    import funasr.datasets.fun_asr_datasets.datasets  # noqa: F401
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.register import tables

    root = tmp_path_factory.mktemp("lora")
    folder = write_folder(root, qwen3_folder, tokenizer)
    ref = funasr_from_folder(folder)
    with torch.no_grad():  # adapters that do something (B starts at zero)
        for name, p in ref.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05)
    torch.save({"state_dict": ref.state_dict()}, folder / "model.pt")
    bare = root / "bare.yaml"
    bare.write_text("data: {num_workers: 0}\n")
    cfg = load_config(bare, [f"model.path={folder}"])
    ours = build_model(cfg)

    fe = WavFrontend(fs=16000, window="hamming", n_mels=80, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6, dither=0.0)
    ds = tables.dataset_classes["FunASR"](str(jsonl), index_ds="FunASR", frontend=fe, tokenizer=tokenizer)
    ref_batch = ds.collator([ds[i] for i in range(len(ds))])
    index = read_jsonl(jsonl, max_speech_length=8000, max_text_length=2048, skip_bad=False)
    ours_ds = SpeechDataset(index.utterances, section(cfg).frontend, PromptBuilder(tokenizer), seed=0, skip_bad=False,
                            max_speech_length=8000)
    ours_batch = Collator()([ours_ds[i] for i in range(len(ours_ds))])
    ours_batch.speech = ref_batch["speech"].clone()  # the same features: the comparison is of the models
    return dict(folder=folder, cfg=cfg, ref=ref, ours=ours, ref_batch=ref_batch, ours_batch=ours_batch)


def test_funasr_lora_keys_map_to_brisk_keys(both):
    lora = both["cfg"].model.llm.lora
    assert (lora.enabled, lora.r, lora.alpha, lora.dropout, lora.target_modules, lora.only, lora.init_path) == \
        (True, 16, 32.0, 0.05, ["q_proj", "v_proj"], False, None)
    assert both["cfg"].model.llm.activation_checkpoint == 0 and both["cfg"].model.encoder.activation_checkpoint == 0


def test_funasr_lora_checkpoint_loads_strictly_with_the_same_keys(both):
    ref, ours = both["ref"], both["ours"]
    assert set(ours.state_dict()) == set(ref.state_dict())
    lora_keys = [k for k in ours.state_dict() if is_lora_key(k)]
    assert len(lora_keys) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    # Same tensors train: the adapters and the unfrozen adaptor; the LLM's base weights stay frozen.
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == \
        {n for n, p in ref.named_parameters() if p.requires_grad}
    q = ours.llm.model.layers[0].self_attn.q_proj
    assert isinstance(q, LoraLinear) and not q.weight.requires_grad and q.lora_A.requires_grad
    assert isinstance(q.lora_dropout, nn.Dropout) and q.lora_dropout.p == 0.05 and q.scaling == 2.0


def test_loss_and_gradients_match_funasr_fp32(both):
    ref, ours = no_dropout(both["ref"]), no_dropout(both["ours"])
    batch = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in both["ref_batch"].items()}
    ref_loss, _, _ = ref(**batch)
    ref_loss.backward()
    loss, _, _ = lm_loss(ours(both["ours_batch"]), both["ours_batch"].labels)
    loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item()), (loss.item(), ref_loss.item())
    theirs = dict(ref.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        if p.grad is None:
            assert theirs[name].grad is None, name
            continue
        g, r = p.grad, theirs[name].grad
        assert (g - r).abs().max().item() <= 1e-4 * r.abs().max().item() + 1e-9, name
        checked += 1
    assert checked == 8 + sum(1 for n, _ in ours.audio_adaptor.named_parameters())
    assert all(p.grad.abs().sum() > 0 for n, p in ours.named_parameters() if is_lora_key(n))


def test_lora_only_freezes_what_funasr_freezes(tmp_path, qwen3_folder, tokenizer):
    folder = write_folder(tmp_path, qwen3_folder, tokenizer, lora_only=True)
    ref = funasr_from_folder(folder)
    bare = tmp_path / "bare.yaml"
    bare.write_text("data: {num_workers: 0}\n")
    cfg = load_config(bare, [f"model.path={folder}"])
    assert cfg.model.llm.lora.only
    ours = build_model(cfg)
    trains = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert trains == {n for n, p in ref.named_parameters() if p.requires_grad} and trains and all(map(is_lora_key, trains))


def test_brisk_checkpoint_holds_only_adapters_and_loads_into_funasr(tmp_path, qwen3_folder, tokenizer):
    """A LoRA run on the demo: the checkpoint file carries the adapters (the frozen rest is referenced once),
    and the merged state loads into FunASR's model built with use_lora, strictly."""
    run = tmp_path / "run"
    # Through the trainer with activation checkpointing and packing too (the CPU's share of the fast path).
    run_train(run, **{"model.llm.lora.enabled": True, "model.llm.lora.only": True, "train.max_steps": 2,
                      "model.llm.config.vocab_size": 483, "model.llm.activation_checkpoint": 1, "speed.packing": True})
    path = run / "checkpoints" / "ckpt-00000002.pt"
    raw = torch.load(path, weights_only=False)
    assert raw["state_dict"] and all(is_lora_key(k) for k in raw["state_dict"])
    state = read_checkpoint(path)["state_dict"]
    cfg = load_config(DEMO_CONFIG, tiny_overrides(run, **{"model.llm.lora.enabled": True}))
    fresh = build_model(cfg)
    assert not all(torch.equal(state[k], v) for k, v in fresh.state_dict().items() if k.endswith("lora_B"))  # trained

    from funasr.models.fun_asr_nano.model import FunASRNano

    import funasr.models.llm_asr.adaptor  # noqa: F401
    import funasr.models.sense_voice.model  # noqa: F401

    m, e, a = cfg.model, section(cfg).encoder, section(cfg).adaptor
    llm_dir = tmp_path / "llm"
    fresh.llm.config.save_pretrained(llm_dir)
    ref = FunASRNano(
        audio_encoder="SenseVoiceEncoderSmall",
        audio_encoder_conf=dict(output_size=e.output_size, attention_heads=e.attention_heads, linear_units=e.linear_units,
                                num_blocks=e.num_blocks, tp_blocks=e.tp_blocks, kernel_size=e.kernel_size, freeze=True),
        audio_adaptor="Transformer",
        audio_adaptor_conf=dict(ffn_dim=a.ffn_dim, n_layer=a.n_layer, downsample_rate=1, use_low_frame_rate=True,
                                encoder_dim=e.output_size, llm_dim=m.llm.config["hidden_size"]),
        llm="Qwen3-0.6b", llm_conf=dict(init_param_path=str(llm_dir), llm_dtype="fp32", use_lora=True,
                                        lora_conf=dict(LORA_CONF)),
        input_size=560)
    ref.load_state_dict(state, strict=True)


def test_funasr_export_keeps_adapters_and_funasr_inference_gives_the_same_loss(both, tmp_path, tokenizer):
    """FunASR's inference builds the model from config.yaml (use_lora: true), loads model.pt with its own loader
    (extra keys ignored, missing ones only warned about: so the config must say use_lora) and calls eval(),
    which folds B A into the base weights. The export therefore keeps the adapters and writes use_lora."""
    from brisk.models.export import export_folder

    out = export_folder(both["ours"], both["cfg"], tmp_path / "export", "funasr", "fp32", tokenizer)
    raw = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert raw["llm_conf"]["use_lora"] is True and raw["llm_conf"]["lora_conf"]["r"] == 16
    assert raw["llm_conf"]["lora_conf"]["target_modules"] == ["q_proj", "v_proj"] and raw["lora_only"] is False
    state = torch.load(out / "model.pt", weights_only=True)["state_dict"]
    assert sum(map(is_lora_key, state)) == 8
    ref = funasr_from_folder(out, out / "model.pt").eval()  # FunASR's eval(): adapters folded in place
    ours = both["ours"].eval()
    batch = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in both["ref_batch"].items()}
    with torch.no_grad():
        ref_loss, _, _ = ref(**batch)
        loss, _, _ = lm_loss(ours(both["ours_batch"]), both["ours_batch"].labels)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item()), (loss.item(), ref_loss.item())


def test_fold_matches_the_adapted_layer():
    torch.manual_seed(0)
    base = nn.Linear(8, 6)
    layer = LoraLinear(base, r=4, alpha=8, dropout=0.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 8)
    folded = fold_lora({"l.weight": base.weight, "l.bias": base.bias, "l.lora_A": layer.lora_A, "l.lora_B": layer.lora_B},
                       load_config(None, ["model.llm.lora.r=4", "model.llm.lora.alpha=8"], check_paths=False).model.llm.lora)
    assert set(folded) == {"l.weight", "l.bias"}
    assert torch.allclose(nn.functional.linear(x, folded["l.weight"], folded["l.bias"]), layer(x), atol=1e-6)
    assert not torch.equal(folded["l.weight"], base.weight)  # a new tensor; the base weight is untouched


def test_packed_loss_equals_padded_loss_with_adapters(tmp_path):
    from .test_packing import _samples

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"fun_asr_nano.frontend.dither": 0.0,
                                                                 "model.llm.lora.enabled": True}))
    model = build_model(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.normal_(0, 0.1)
    samples = _samples(cfg)
    padded = Collator()(samples)
    packed = Collator(packed=True, token_buckets=(64, 128, 256, 512))(samples)
    with torch.no_grad():
        l1, _, _ = lm_loss(model(padded), padded.labels)
        l2, _, _ = lm_loss(model(packed), packed.labels)
    assert torch.allclose(l1, l2, rtol=1e-5, atol=1e-6), (l1.item(), l2.item())


def test_bad_lora_config_is_one_error_line(tmp_path):
    with pytest.raises(ConfigError, match="model.llm.lora.r=0"):
        load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.r": 0}))
    with pytest.raises(ConfigError, match="fuse_projections"):
        load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True,
                                                              "speed.fuse_projections": True}))
    with pytest.raises(ConfigError, match="train.parallel=fsdp"):
        load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True, "train.parallel": "fsdp"}))
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True,
                                                                "model.llm.lora.target_modules": ["qkv"]}))
    with pytest.raises(ConfigError, match="no linear layer"):
        build_model(cfg)


def test_transformers_export_folds_the_adapters(both, tmp_path, tokenizer):
    """The native Fun-ASR-Nano class has no adapter layers: its language model gets W + (alpha / r) B A and
    computes what brisk's adapted decoder computes."""
    from safetensors.torch import load_file
    from transformers import FunAsrNanoForConditionalGeneration

    from brisk.models.export import export_folder

    ours = both["ours"].eval()
    out = export_folder(ours, both["cfg"], tmp_path / "hf", "hf", "fp32", tokenizer)
    assert not any("lora" in k for k in load_file(str(out / "model.safetensors")))
    hf = FunAsrNanoForConditionalGeneration.from_pretrained(str(out)).eval()
    torch.manual_seed(1)
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        theirs = hf.model.language_model(inputs_embeds=x).last_hidden_state
        mine = ours.llm.model(inputs_embeds=x).last_hidden_state
        base = {k: v for k, v in ours.state_dict().items() if not is_lora_key(k)}
    assert (theirs - mine).abs().max().item() <= 1e-5
    q = "llm.model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base[q], fold_lora(ours.state_dict(), both["cfg"].model.llm.lora)[q])  # the adapters did count


def test_adapters_are_peft_adapters(tmp_path):
    """PEFT, given brisk's adapters under its names, computes the same logits and the same adapter gradients."""
    peft = pytest.importorskip("peft")
    from brisk.adapters.lora import write_peft_adapter

    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True,
                                                                "model.llm.lora.dropout": 0.0, "model.llm.freeze": True}))
    ours = build_model(cfg)
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if n.endswith("lora_B"):
                p.normal_(0, 0.1)
    folder = write_peft_adapter(ours, cfg.model.llm.lora, tmp_path / "adapter")
    from brisk.models.build import build_llm

    base = build_llm(cfg.model)
    base.load_state_dict({k.removeprefix("llm."): v for k, v in ours.state_dict().items()
                          if k.startswith("llm.") and not is_lora_key(k)}, strict=False)
    theirs = peft.PeftModel.from_pretrained(base, str(folder), is_trainable=True)
    torch.manual_seed(0)
    x = torch.randn(2, 7, cfg.model.llm.config["hidden_size"])
    a = ours.llm(inputs_embeds=x).logits
    b = theirs(inputs_embeds=x).logits
    assert (a - b).abs().max().item() <= 1e-5
    a.square().mean().backward()
    b.square().mean().backward()
    mine = {n.removeprefix("llm."): p.grad for n, p in ours.named_parameters() if is_lora_key(n)}
    peft_grads = {n: p.grad for n, p in theirs.named_parameters() if p.requires_grad}
    assert len(mine) == len(peft_grads) == 8
    for n, g in mine.items():
        mod, _, t = n.rpartition(".")
        assert torch.allclose(g, peft_grads[f"base_model.model.{mod}.{t}.default.weight"], atol=1e-6), n


def test_init_path_starts_the_adapters(tmp_path):
    """model.llm.lora.init_path (FunASR lora_conf.init_param_path): the adapters come from that file, after (and
    over) any other weights; a file without them is one error line."""
    cfg = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True}))
    src = build_model(cfg)
    with torch.no_grad():
        for n, p in src.named_parameters():
            if n.endswith("lora_B"):
                p.fill_(0.25)
    torch.save({"state_dict": src.state_dict()}, tmp_path / "lora.pt")
    started = load_config(DEMO_CONFIG, tiny_overrides(tmp_path, **{"model.llm.lora.enabled": True, "model.seed": 5,
                                                                    "model.llm.lora.init_path": str(tmp_path / "lora.pt")}))
    model = build_model(started)
    for k, v in src.state_dict().items():
        if is_lora_key(k):
            assert torch.equal(model.state_dict()[k], v), k
    assert not torch.equal(model.state_dict()["llm.model.layers.0.mlp.up_proj.weight"],
                           src.state_dict()["llm.model.layers.0.mlp.up_proj.weight"])  # only the adapters come from it
    torch.save({"state_dict": {k: v for k, v in src.state_dict().items() if not is_lora_key(k)}}, tmp_path / "base.pt")
    started.model.llm.lora.init_path = str(tmp_path / "base.pt")
    with pytest.raises(ConfigError, match="model.llm.lora.init_path=.*lora_A"):
        build_model(started)
