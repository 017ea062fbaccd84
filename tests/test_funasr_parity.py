"""Parity with FunASR 1.4.16 itself (installed from PyPI without its heavy extras).

FunASR's FunASRNano is built with random weights; its state_dict must load into brisk strictly (identical
keys); on the same utterances FunASR's own training dataset and brisk's must produce the same tokens,
labels, audio slots and (dither off) features; and the two models must give the same encoder output and
loss in fp32.
"""

from __future__ import annotations

import json

import pytest
import torch

from brisk.families import section
from brisk.families.fun_asr_nano.config import FrontendConfig
from brisk.data.collate import Collator
from brisk.families.fun_asr_nano.dataset import SpeechDataset
from brisk.data.jsonl import read_jsonl
from brisk.data.prompt import PromptBuilder
from brisk.models.build import build_model
from brisk.models.lm import lm_loss

from .conftest import DEMO, nano_config

ENC = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=2, tp_blocks=1, kernel_size=11)
AD = dict(ffn_dim=64, n_layer=1)


def funasr_nano(llm_folder):
    """FunASR's own FunASRNano at the tiny sizes above (seeded), in eval mode."""
    import funasr.models.llm_asr.adaptor  # noqa: F401  (registers the adaptor class)
    import funasr.models.sense_voice.model  # noqa: F401
    from funasr.models.fun_asr_nano.model import FunASRNano

    torch.manual_seed(0)
    return FunASRNano(
        audio_encoder="SenseVoiceEncoderSmall",
        audio_encoder_conf=dict(**ENC, sanm_shfit=0, dropout_rate=0.1, attention_dropout_rate=0.0, freeze=True),
        audio_adaptor="Transformer",
        audio_adaptor_conf=dict(**AD, downsample_rate=1, use_low_frame_rate=True, encoder_dim=32, llm_dim=64, freeze=True),
        llm="Qwen3-0.6b",
        llm_conf=dict(init_param_path=str(llm_folder), freeze=False, llm_dtype="fp32"),
        input_size=560,
    ).eval()


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """Five demo utterances with absolute audio paths (FunASR reads paths relative to the working dir)."""
    out = tmp_path_factory.mktemp("parity") / "data.jsonl"
    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    with out.open("w", encoding="utf-8") as f:
        for line in lines:
            obj = json.loads(line)
            user = obj["messages"][1]
            user["content"] = user["content"].replace("!audio/", f"!{DEMO}/audio/")
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return out


@pytest.fixture(scope="module")
def funasr_side(jsonl, qwen3_folder, tokenizer):
    import funasr.datasets.fun_asr_datasets.datasets  # noqa: F401  (registers the dataset classes)
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.register import tables

    model = funasr_nano(qwen3_folder)
    frontend = WavFrontend(fs=16000, window="hamming", n_mels=80, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6, dither=0.0)
    ds = tables.dataset_classes["FunASR"](str(jsonl), index_ds="FunASR", frontend=frontend, tokenizer=tokenizer)
    batch = ds.collator([ds[i] for i in range(len(ds))])
    return model, batch


@pytest.fixture(scope="module")
def brisk_side(jsonl, qwen3_folder, tokenizer, funasr_side):
    cfg = nano_config(qwen3_folder, ENC, AD)
    model = build_model(cfg).eval()
    ref_state = funasr_side[0].state_dict()
    assert set(model.state_dict()) == set(ref_state)
    model.load_state_dict(ref_state, strict=True)
    index = read_jsonl(jsonl, max_speech_length=8000, max_text_length=2048, skip_bad=False)
    ds = SpeechDataset(index.utterances, section(cfg).frontend, PromptBuilder(tokenizer), seed=0, skip_bad=False, max_speech_length=8000)
    batch = Collator()([ds[i] for i in range(len(ds))])
    return model, batch


def test_state_dict_keys_identical_and_strict_load(brisk_side, funasr_side):
    ours, _ = brisk_side
    ref, _ = funasr_side
    assert list(ours.state_dict()) and set(ours.state_dict()) == set(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k


def test_tokens_labels_and_audio_slots_match_funasr_dataset(brisk_side, funasr_side):
    ours = brisk_side[1]
    ref = funasr_side[1]
    ref_ids = ref["input_ids"].clone()
    ref_ids[ref_ids < 0] = 0
    ref_labels = ref["labels_ids"].clone()
    ref_labels[ref_labels == -1] = -100
    assert torch.equal(ours.input_ids, ref_ids)
    assert torch.equal(ours.labels, ref_labels)
    assert torch.equal(ours.attention_mask.bool(), ref["attention_mask"] > 0)
    # FunASR: audio of utterance b starts at fbank_beg[b] and fills fake_token_len[b] slots.
    t = ours.input_ids.shape[1]
    expected = [b * t + int(ref["fbank_beg"][b, 0]) + j for b in range(len(ours.keys))
                for j in range(int(ref["fake_token_len"][b, 0]))]
    assert ours.audio_pos.tolist() == expected


def test_features_match_funasr_frontend(brisk_side, funasr_side):
    ours, ref = brisk_side[1], funasr_side[1]
    ref_lens = ref["speech_lengths"].reshape(-1)
    assert ours.speech_lengths.tolist() == ref_lens.tolist()
    diff = (ours.speech - ref["speech"]).abs()
    # Two Kaldi fbank implementations in float32 (FunASR's falls back to kaldi-native-fbank without torchaudio).
    assert diff.max().item() < 2e-3 and diff.mean().item() < 1e-5, (diff.max().item(), diff.mean().item())


def test_encoder_output_and_loss_match_funasr_fp32(brisk_side, funasr_side):
    ours_model, ours_batch = brisk_side
    ref_model, ref_batch = funasr_side
    with torch.no_grad():
        # Same input features for both, so the comparison is of the models alone.
        speech = ref_batch["speech"].clone()
        lens = ref_batch["speech_lengths"].reshape(-1)
        ref_enc, _ = ref_model.audio_encoder(speech.clone(), lens)
        enc, _ = ours_model.audio_encoder(speech.clone(), lens)
        mask = torch.arange(speech.shape[1])[None, :] < lens[:, None]
        rel = (enc - ref_enc).abs()[mask].max() / ref_enc.abs()[mask].max()
        assert rel.item() <= 1e-5, rel.item()

        batch = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in ref_batch.items()}
        ref_loss, stats, _ = ref_model(**batch)
        ours_batch.speech = speech
        logits = ours_model(ours_batch)
        loss, correct, count = lm_loss(logits, ours_batch.labels)
    assert abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()) <= 1e-5, (loss.item(), ref_loss.item())
    assert abs(correct.item() / count.item() - float(stats["acc"])) < 1e-6


def test_multiturn_and_do_think_match_funasr_dataset(tmp_path, tokenizer):
    """Two user turns with audio each, no system message, do_think=false: FunASR's dataset vs brisk's."""
    import funasr.datasets.fun_asr_datasets.datasets  # noqa: F401
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.register import tables

    a, b = DEMO / "audio/train/utt0001.flac", DEMO / "audio/train/utt0003.flac"
    obj = {"key": "mt", "speech_length": 300, "text_length": 9, "messages": [
        {"role": "user", "content": f"语音转写：<|startofspeech|>!{a}<|endofspeech|>"},
        {"role": "assistant", "content": "the blue box is little"},
        {"role": "user", "content": f"Speech transcription:<|startofspeech|>!{b}<|endofspeech|>"},
        {"role": "assistant", "content": "one more line"}]}
    p = tmp_path / "mt.jsonl"
    p.write_text(json.dumps(obj, ensure_ascii=False) + "\n", encoding="utf-8")
    fe = WavFrontend(fs=16000, window="hamming", n_mels=80, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6, dither=0.0)
    ref = tables.dataset_classes["FunASR"](str(p), index_ds="FunASR", frontend=fe, tokenizer=tokenizer, do_think=False)[0]
    index = read_jsonl(p, max_speech_length=8000, max_text_length=2048, skip_bad=False)
    ds = SpeechDataset(index.utterances, FrontendConfig(dither=0.0), PromptBuilder(tokenizer, do_think=False), seed=0,
                       skip_bad=False, max_speech_length=8000)
    ours = ds[0]
    assert ours.tokens.input_ids == ref["input_ids"].tolist()
    assert ours.tokens.labels == ref["labels_ids"].tolist()
    assert [beg for beg, _ in ours.tokens.audio_slots] == ref["fbank_beg"].tolist()
    assert [n for _, n in ours.tokens.audio_slots] == ref["fake_token_len"].tolist()


def test_funasr_model_folder_loads_and_checkpoints_go_back_to_funasr(tmp_path, funasr_side, qwen3_folder, tokenizer):
    """A FunASR model folder (config.yaml, model.pt, the Qwen3 folder with its tokenizer) loads by model.path;
    brisk's exported model.pt loads back into FunASR's FunASRNano strictly."""
    import shutil

    import yaml

    from brisk.config import load_config
    from brisk.models.export import export_folder

    from .conftest import DEMO_CONFIG

    ref = funasr_side[0]
    folder = tmp_path / "Fun-ASR-Nano-tiny"
    shutil.copytree(qwen3_folder, folder / "Qwen3-0.6B")
    tokenizer.save_pretrained(folder / "Qwen3-0.6B")
    torch.save({"state_dict": ref.state_dict()}, folder / "model.pt")
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "model": "FunASRNano",
        "audio_encoder": "SenseVoiceEncoderSmall",
        "audio_encoder_conf": {**ENC, "sanm_shfit": 0, "dropout_rate": 0.1, "attention_dropout_rate": 0.0, "freeze": True},
        "audio_adaptor": "Transformer",
        "audio_adaptor_conf": {**AD, "downsample_rate": 1, "use_low_frame_rate": True, "encoder_dim": 32, "llm_dim": 64,
                               "freeze": True},
        "llm": "Qwen3-0.6b",
        "llm_conf": {"init_param_path": "Qwen3-0.6B", "llm_dtype": "fp32", "freeze": True},
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6},
    }), encoding="utf-8")
    # The demo YAML sets other sizes and an inline LLM config: the folder's architecture replaces them.
    cfg = load_config(DEMO_CONFIG, [f"model.path={folder}", "data.tokenizer=null", "model.llm.freeze=false"])
    assert section(cfg).encoder.output_size == 32 and cfg.model.llm.path == str(folder / "Qwen3-0.6B")
    assert cfg.model.llm.config == {}
    # Training policy: the command line wins, then the YAML (demo: encoder trained), then the folder.
    assert cfg.model.llm.freeze is False and cfg.model.encoder.freeze is False and cfg.model.adaptor.freeze is False
    bare = tmp_path / "bare.yaml"
    bare.write_text("train: {max_steps: 1}\n")
    plain = load_config(bare, [f"model.path={folder}"])
    assert plain.model.encoder.freeze and plain.model.adaptor.freeze and plain.model.llm.freeze  # the folder's policy
    model = build_model(cfg)
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    from brisk.data.loader import load_tokenizer

    assert load_tokenizer(cfg).encode("<|im_start|>") == tokenizer.encode("<|im_start|>")

    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    out = export_folder(model, cfg, tmp_path / "export", "funasr", "fp32", tokenizer)
    state = torch.load(out / "model.pt", weights_only=False)["state_dict"]
    ref.load_state_dict(state, strict=True)
    assert torch.equal(ref.state_dict()["audio_adaptor.linear1.weight"], model.state_dict()["audio_adaptor.linear1.weight"])
