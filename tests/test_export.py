"""Exported model folders: FunASR's AutoModel and transformers' native Fun-ASR-Nano load them, and compute
what brisk computes; brisk loads them back (model.path); writes are atomic; `brisk export` and the end of
training write one format."""

from __future__ import annotations

import dataclasses

import json

import pytest
import torch

from brisk.config import load_config
from brisk.data.collate import Collator
from brisk.data.loader import build_split
from brisk.models.build import build_model, read_state_dict
from brisk.eval.load import load_for_inference
from brisk.models.export import export_folder
from brisk.models.lm import lm_loss
from brisk.families import section

from .conftest import REPO
from .test_prompt_parity import DATASET_CONF, funasr_dataset, write_folder, write_jsonl


@pytest.fixture(scope="module")
def source(tmp_path_factory, qwen3_folder, tokenizer):
    """A FunASR-shaped folder (real-shaped dataset_conf), a jsonl, and brisk's model built from the folder with
    its weights moved off the initialisation (so a lost tensor shows)."""
    tmp = tmp_path_factory.mktemp("export")
    write_folder(tmp / "src", qwen3_folder, tokenizer, DATASET_CONF)
    jsonl = tmp / "data.jsonl"
    write_jsonl(jsonl, "Speech transcription:", n=3)
    cfg = load_config(None, [f"model.path={tmp / 'src'}", f"data.train={jsonl}", "data.num_workers=0"])
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return tmp, jsonl, cfg, model


def brisk_batch(cfg, tokenizer):
    split = build_split(cfg, "train", Collator(), vocab_size=0, tokenizer=tokenizer)
    samples = [split.dataset[i] for i in range(len(split.dataset))]
    return samples, Collator()(samples)


def test_funasr_folder_loads_in_funasr_automodel_and_matches_brisk(source, tokenizer):
    tmp, jsonl, cfg, model = source
    out = export_folder(model, cfg, tmp / "funasr-fp32", "funasr", "fp32", tokenizer)
    for name in ("config.yaml", "configuration.json", "model.pt", "README.md", "Qwen3-0.6B/config.json",
                 "Qwen3-0.6B/tokenizer.json"):
        assert (out / name).is_file(), name
    from funasr import AutoModel

    am = AutoModel(model=str(out), device="cpu", disable_update=True)
    ref = am.model.eval()
    assert set(ref.state_dict()) == set(model.state_dict())
    assert all(torch.equal(ref.state_dict()[k], v) for k, v in model.state_dict().items())
    # The folder's dataset_conf reproduces the training prompt: FunASR's dataset built from it (as train_ds.py
    # does) and brisk's from model.path=<export> give the same tokens, and the two models the same loss.
    import yaml

    raw = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert raw["dataset_conf"]["prompt_classes"] == "MultiContextPrompt"
    assert raw["audio_encoder_conf"]["num_blocks"] == section(cfg).encoder.num_blocks
    raw["frontend_conf"]["dither"] = 0.0
    ds = funasr_dataset(raw, jsonl, tokenizer)
    ref_samples = [ds[i] for i in range(len(ds))]
    ref_batch = ds.collator(ref_samples)
    again = load_config(None, [f"model.path={out}", f"data.train={jsonl}", "data.num_workers=0"])
    samples, batch = brisk_batch(again, tokenizer)
    assert [s.tokens.input_ids for s in samples] == [r["input_ids"].tolist() for r in ref_samples]
    with torch.no_grad():
        ref_loss, _, _ = ref(**ref_batch)
        batch.speech = ref_batch["speech"]  # same features on both sides: the comparison is of the models
        loss, _, _ = lm_loss(model(batch), batch.labels)
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item()), (loss.item(), ref_loss.item())
    # FunASR's own inference path decodes from the folder.
    res = am.generate(input=[samples[0].tokens.audio_paths[0]], max_length=4, disable_pbar=True)
    assert isinstance(res, list) and "text" in res[0]


def test_default_export_is_bf16_and_one_format(source, tokenizer):
    tmp, _, cfg, model = source
    out = export_folder(model, cfg, tmp / "funasr-bf16", tokenizer=tokenizer)
    state = torch.load(out / "model.pt", weights_only=False)["state_dict"]
    assert {v.dtype for v in state.values()} == {torch.bfloat16}
    own = model.state_dict()
    assert all(torch.equal(v, own[k].to(torch.bfloat16)) for k, v in state.items())
    assert not list(out.glob("*.safetensors"))  # one format: no second copy of the weights
    # The tied lm_head is stored once, as in FunASR's own model.pt.
    assert state["llm.lm_head.weight"].data_ptr() == state["llm.model.embed_tokens.weight"].data_ptr()
    fp32 = tmp / "funasr-fp32"
    if fp32.exists():
        ratio = (out / "model.pt").stat().st_size / (fp32 / "model.pt").stat().st_size
        assert 0.45 < ratio < 0.6, ratio


def test_export_is_atomic(source, tokenizer, monkeypatch):
    tmp, _, cfg, model = source
    out = export_folder(model, cfg, tmp / "atomic", "funasr", "fp32", tokenizer)
    before = (out / "model.pt").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        export_folder(model, cfg, tmp / "atomic", "funasr", "fp32", tokenizer)
    assert (out / "model.pt").read_bytes() == before  # the previous folder is intact
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".atomic")) == []  # no temp left behind


def test_native_transformers_model_gives_brisk_logits(source, tokenizer):
    tmp, jsonl, cfg, model = source
    out = export_folder(model, cfg, tmp / "hf", "hf", "fp32", tokenizer)
    from transformers import FunAsrNanoForConditionalGeneration

    from brisk.families.fun_asr_nano.hf_native import native_inputs_embeds

    hf = FunAsrNanoForConditionalGeneration.from_pretrained(str(out)).eval()
    # Left unset, the adaptor does not mask padded frames (see the export's README).
    hf.model.multi_modal_projector.config._attn_implementation = hf.config._attn_implementation
    cfg0 = load_config(None, [f"model.path={tmp / 'src'}", f"data.train={jsonl}", "data.num_workers=0",
                              "fun_asr_nano.frontend.dither=0.0"])
    samples, batch = brisk_batch(cfg0, tokenizer)
    assert len(set(batch.speech_lengths.tolist())) > 1  # padded audio: the masks matter
    with torch.no_grad():
        ours = model(batch)
        emb = native_inputs_embeds(hf, batch.input_ids, batch.speech, batch.speech_lengths,
                                   [s.tokens.audio_slots for s in samples])
        theirs = hf(inputs_embeds=emb, attention_mask=batch.attention_mask).logits
    valid = batch.attention_mask.bool()
    diff = (ours - theirs).abs()[valid].max().item()
    assert diff <= 1e-5, diff
    assert ours[valid].abs().max().item() > 0.1  # not a comparison of zeros


def test_model_path_accepts_a_native_folder(source, tokenizer):
    tmp, _, cfg, model = source
    out = tmp / "hf-native"
    export_folder(model, cfg, out, "hf", "fp32", tokenizer)
    cfg2 = load_config(None, [f"model.path={out}"])
    assert cfg2.data.tokenizer == str(out) and cfg2.model.llm.path is None
    assert section(cfg2).encoder.num_blocks == section(cfg).encoder.num_blocks
    back = build_model(cfg2).state_dict()
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    loaded, tok, _ = load_for_inference(out)
    assert not loaded.training and tok.encode("<|im_start|>") == tokenizer.encode("<|im_start|>")
    assert section(cfg2).adaptor.use_low_frame_rate is True
    # How many adaptor outputs are spliced is not in the native config: brisk keeps its own key there.
    every = dataclasses.replace(cfg)
    every.sections = {"fun_asr_nano": dataclasses.replace(section(cfg), adaptor=dataclasses.replace(
        section(cfg).adaptor, use_low_frame_rate=False))}
    export_folder(model, every, tmp / "hf-every", "hf", "fp32", tokenizer)
    assert section(load_config(None, [f"model.path={tmp / 'hf-every'}"])).adaptor.use_low_frame_rate is False

def test_training_ends_with_one_export_and_cli_converts(tmp_path, capsys):
    from brisk.cli import main

    from .conftest import run_train

    run = tmp_path / "run"
    run_train(run, **{"train.max_steps": 2, "train.export": "funasr"})
    assert (run / "model-funasr" / "model.pt").is_file() and not (run / "model-hf").exists()
    assert not (run / "model.safetensors").exists() and not (run / "model.pt").exists()
    model, _, _ = load_for_inference(run)
    ckpt = read_state_dict(sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt.items())
    assert main(["export", str(run), "--format", "hf", "--dtype", "fp32"]) == 0
    assert "exported hf folder" in capsys.readouterr().out
    native, _, _ = load_for_inference(run / "model-hf")
    assert all(torch.equal(native.state_dict()[k], v) for k, v in model.state_dict().items())
    cfg = json.loads((run / "model-hf" / "config.json").read_text())
    assert cfg["model_type"] == "fun_asr_nano" and cfg["architectures"] == ["FunAsrNanoForConditionalGeneration"]


def test_what_the_native_class_cannot_hold_is_refused_at_load_and_by_the_exporter(tmp_path):
    """train.export=hf refuses, when the config is loaded, a model transformers' FunAsrNano cannot express; the hf
    exporter refuses it too (a later `brisk export --format hf` of a run trained with the FunASR export)."""
    from brisk.config import ConfigError, load_config
    from brisk.families import get

    base = [f"train.output_dir={tmp_path}", "fun_asr_nano.encoder.sanm_shift=1"]
    with pytest.raises(ConfigError, match=r"train.export=hf: fun_asr_nano.encoder.sanm_shift: the native FSMN is centred "
                                          r"\(needs 0\); or export funasr"):
        load_config(REPO / "configs" / "demo.yaml", base + ["train.export=hf"])
    cfg = load_config(REPO / "configs" / "demo.yaml", base + ["train.export=funasr"])
    with pytest.raises(ConfigError, match=r"^fun_asr_nano.encoder.sanm_shift=1: the native FSMN is centred \(needs 0\)$"):
        get("fun_asr_nano").exporters["hf"](None, cfg, {}, tmp_path, "bf16", None)
