"""model.family=qwen3_asr: labels against the official recipe's collator, loss and gradients against
transformers' Qwen3ASRForConditionalGeneration, features against its processor, the speech switches that run on
the CPU, the export, and decoding; all on a tiny random model (configs/qwen3_asr_demo.yaml) in fp32."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import soundfile as sf
import torch

from brisk.config import ConfigError, load_config
from brisk.data.collate import Collator
from brisk.families import family_of, folder_family
from brisk.families.qwen3_asr.model import from_hf, to_hf
from brisk.models.lm import lm_loss

from .conftest import REPO

CONFIG = REPO / "configs" / "qwen3_asr_demo.yaml"
DEMO = REPO / "data" / "demo"


# --------------------------------------------------------------------------------------- the recipe
# QwenLM/Qwen3-ASR, finetuning/qwen3_asr_sft.py (commit 7c6daf7): build_prefix_messages,
# make_preprocess_fn_prefix_only and DataCollatorForQwen3ASRFinetuning, line for line, with transformers'
# Qwen3ASRProcessor standing in for the qwen_asr package's (same chat template call, same left padding of the
# text, same audio token count for clips of 0.5 s or more: see test_short_clips_*) and soundfile for librosa.load (16 kHz mono files: the same samples).
def load_audio(path: str, sr: int = 16000):
    wav, file_sr = sf.read(path, dtype="float32")
    assert file_sr == sr and wav.ndim == 1
    return wav


def build_prefix_messages(prompt: str, audio_array):
    return [
        {"role": "system", "content": prompt or ""},
        {"role": "user", "content": [{"type": "audio", "audio": audio_array}]},
    ]


def make_preprocess_fn_prefix_only(processor):
    def _preprocess(ex: dict[str, Any]) -> dict[str, Any]:
        prompt = ex.get("prompt", "")
        dummy_audio = None
        prefix_msgs = build_prefix_messages(prompt, dummy_audio)
        prefix_text = processor.apply_chat_template([prefix_msgs], add_generation_prompt=True, tokenize=False)[0]
        return {"prompt": prompt, "audio": ex["audio"], "target": ex["text"], "prefix_text": prefix_text}

    return _preprocess


@dataclass
class DataCollatorForQwen3ASRFinetuning:
    processor: Any
    sampling_rate: int = 16000

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        audio_paths = [f["audio"] for f in features]
        prefix_texts = [f["prefix_text"] for f in features]
        targets = [f["target"] for f in features]

        eos = self.processor.tokenizer.eos_token or ""
        full_texts = [pfx + tgt + eos for pfx, tgt in zip(prefix_texts, targets)]
        audios = [load_audio(p, sr=self.sampling_rate) for p in audio_paths]

        full_inputs = self.processor(text=full_texts, audio=audios, return_tensors="pt", padding=True, truncation=False)
        prefix_inputs = self.processor(text=prefix_texts, audio=audios, return_tensors="pt", padding=True,
                                       truncation=False)

        prefix_lens = prefix_inputs["attention_mask"].sum(dim=1).tolist()
        labels = full_inputs["input_ids"].clone()
        for i, pl in enumerate(prefix_lens):
            labels[i, :pl] = -100

        pad_id = self.processor.tokenizer.pad_token_id
        if pad_id is not None:
            labels[labels == pad_id] = -100

        full_inputs["labels"] = labels
        return full_inputs


# --------------------------------------------------------------------------------------------- fixtures
def recipe_jsonl(tmp_path, n: int = 4) -> tuple[str, list[dict]]:
    """The recipe's jsonl for the first n validation utterances of the demo set."""
    lines = []
    for raw in (DEMO / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:n]:
        obj = json.loads(raw)
        audio = obj["messages"][1]["content"].split("!", 1)[1].split("<|endofspeech|>")[0]
        lines.append({"audio": str(DEMO / audio), "text": f"language English<asr_text>{obj['messages'][2]['content']}"})
    path = tmp_path / "recipe.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return str(path), lines


def config(tmp_path, *extra: str, data: str | None = None):
    over = [f"train.output_dir={tmp_path / 'run'}", "data.num_workers=0"] + ([f"data.train={data}"] if data else [])
    return load_config(CONFIG, over + list(extra))


def samples_of(cfg, path: str, n: int):
    ds, _, _ = family_of(cfg).dataset(cfg, "train", path, 0, None)
    return ds, [ds[i] for i in range(n)]


def processor_folder(tmp_path, pad_is_eos: bool) -> str:
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    from make_qwen3_asr_processor import make

    return str(make(tmp_path / ("proc_pad_eos" if pad_is_eos else "proc"), pad_is_eos))


# ----------------------------------------------------------------------------------------------- labels
def test_labels_equal_the_recipes_on_one_line(tmp_path):
    path, lines = recipe_jsonl(tmp_path, 3)
    cfg = config(tmp_path, data=path)
    ds, samples = samples_of(cfg, path, 3)
    pre = make_preprocess_fn_prefix_only(ds.prompt.processor)
    collate = DataCollatorForQwen3ASRFinetuning(ds.prompt.processor)
    for line, s in zip(lines, samples):
        ref = collate([pre(line)])
        assert s.tokens.input_ids == ref["input_ids"][0].tolist()
        assert s.tokens.labels == ref["labels"][0].tolist()
        assert s.tokens.labels[-1] == ds.tok.eos_token_id  # the eos is learned (pad != eos here)


def test_the_recipes_left_padding_labels_the_prefix_of_shorter_rows_brisk_does_not(tmp_path):
    """The recipe's processor pads on the left and then masks labels[i, :prefix_len] from the left edge, so on a
    row shorter than the longest the last (longest - own) prefix tokens keep their labels; brisk labels the
    target and its eos only. Everywhere else the labels are the recipe's."""
    path, lines = recipe_jsonl(tmp_path, 4)
    cfg = config(tmp_path, data=path)
    ds, samples = samples_of(cfg, path, 4)
    pre = make_preprocess_fn_prefix_only(ds.prompt.processor)
    ref = DataCollatorForQwen3ASRFinetuning(ds.prompt.processor)([pre(x) for x in lines])
    width = ref["input_ids"].shape[1]
    shorter = 0
    for i, s in enumerate(samples):
        pad = width - len(s.tokens.input_ids)  # left padding of this row
        assert ref["input_ids"][i, pad:].tolist() == s.tokens.input_ids
        theirs = ref["labels"][i, pad:].tolist()
        n_pre = s.tokens.labels.index(next(x for x in s.tokens.labels if x != -100))
        wrong = [j for j, (a, b) in enumerate(zip(theirs, s.tokens.labels)) if a != b]
        assert wrong == list(range(n_pre - pad, n_pre)), (i, pad, n_pre, wrong)  # the prefix's tail, nothing else
        assert all(theirs[j] == s.tokens.input_ids[j] for j in wrong)  # labelled with the prompt's own tokens
        shorter += pad > 0
    assert shorter >= 1


def test_with_pad_equal_to_eos_the_recipe_masks_the_final_eos_brisk_keeps_it(tmp_path):
    path, lines = recipe_jsonl(tmp_path, 2)
    proc = processor_folder(tmp_path, pad_is_eos=True)
    cfg = config(tmp_path, f"data.tokenizer={proc}", data=path)
    ds, samples = samples_of(cfg, path, 2)
    assert ds.tok.pad_token_id == ds.tok.eos_token_id
    pre = make_preprocess_fn_prefix_only(ds.prompt.processor)
    for line, s in zip(lines, samples):
        ref = DataCollatorForQwen3ASRFinetuning(ds.prompt.processor)([pre(line)])["labels"][0].tolist()
        assert ref[-1] == -100 and s.tokens.labels[-1] == ds.tok.eos_token_id
        assert ref[:-1] == s.tokens.labels[:-1]


def test_funasr_jsonl_becomes_the_recipes_prompt_with_the_chosen_language(tmp_path):
    cfg = config(tmp_path)
    ds, (s,) = samples_of(cfg, str(DEMO / "valid.jsonl"), 1)
    text = ds.tok.decode([t for t in s.tokens.labels if t != -100])
    assert text == f"language English<asr_text>{ds.utts[0].assistant[0]}<|im_end|>"


def test_decoding_sees_the_training_prefix_for_funasr_lines(tmp_path):
    """FunASR lines carry FunASR's own system message; Qwen3-ASR trains under the empty system turn that decoding
    gives, so the decode prompt is the training row up to its first label."""
    from brisk.families.qwen3_asr.decode import Qwen3ASRRecognizer

    cfg = config(tmp_path)
    ds, (s,) = samples_of(cfg, str(DEMO / "valid.jsonl"), 1)
    assert ds.utts[0].system[0]  # the jsonl has a system message: the test is not vacuous

    class Model:  # what the recognizer reads of a model before decoding
        hf_config = type("C", (), {"text_config": type("T", (), {"eos_token_id": ds.tok.eos_token_id})()})()

    rec = Qwen3ASRRecognizer(Model(), ds.prompt.processor, language="English")
    ids = rec.prompt_ids(s.tokens.audio_slots[0][1])
    first_label = next(i for i, t in enumerate(s.tokens.labels) if t != -100)
    # the language prefill is the first part of the target: the decode prompt runs past the unlabelled prefix
    assert ids == s.tokens.input_ids[:len(ids)] and len(ids) > first_label


def test_short_clips_are_padded_to_half_a_second_as_transformers_processor_pads_them(tmp_path):
    """A clip under 0.5 s: transformers' Qwen3ASRFeatureExtractor zero-pads it to 8,000 samples (its min_length,
    "matching the original Qwen3-ASR library") and its processor counts the padding's frames and audio tokens; brisk
    gives the same 50 frames and 7 audio tokens for 0.3 s. The finetuning recipe's Whisper feature extractor does
    not pad (30 frames, 4 tokens): brisk follows transformers' processor and Qwen3-ASR's inference, not the recipe,
    here (docs/qwen3-asr.md)."""
    import numpy as np

    from brisk.families.qwen3_asr.data import audio_token_count, features

    cfg = config(tmp_path)
    ds, _ = samples_of(cfg, str(DEMO / "valid.jsonl"), 1)
    processor = ds.prompt.processor
    wave = np.random.default_rng(0).standard_normal(4800).astype(np.float32) * 0.1  # 0.3 s at 16 kHz
    feats = features(processor.feature_extractor, torch.from_numpy(wave))
    text = ds.prompt.prefix("")
    theirs = processor(text=[text], audio=[wave], return_tensors="pt", padding=True)
    audio_id = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.audio_token)
    assert feats.shape[0] == int(theirs["input_features_mask"].sum()) == 50
    assert audio_token_count(feats.shape[0]) == int((theirs["input_ids"] == audio_id).sum()) == 7


def test_samples_count_audio_tokens_with_the_towers_own_window(tmp_path):
    """With audio_config.n_window 52 (chunks of 104 frames) a 101-frame clip is one chunk for the tower but more
    than one at the default 50: the samples count what the model's tower gives."""
    from brisk.models.build import build_model

    cfg = config(tmp_path, "model.llm.config.audio_config.n_window=52")
    model = build_model(cfg).eval()
    ds, _ = samples_of(cfg, str(DEMO / "valid.jsonl"), 1)
    for frames in (101, 103, 230):
        feats = torch.randn(frames, 128)
        with torch.no_grad():
            rows = model.encode_audio(feats[None], torch.tensor([frames]))
        from brisk.families.qwen3_asr.data import audio_token_count

        assert audio_token_count(frames, ds.n_window) == rows.shape[0]


def test_features_are_the_processors_for_one_utterance(tmp_path):
    path, lines = recipe_jsonl(tmp_path, 1)
    cfg = config(tmp_path, data=path)
    ds, (s,) = samples_of(cfg, path, 1)
    out = ds.prompt.processor.feature_extractor(load_audio(lines[0]["audio"]), sampling_rate=16000, padding=True,
                                                return_attention_mask=True, return_tensors="pt")
    n = int(out["attention_mask"].sum())
    assert s.feats[0].shape == (n, 128)
    torch.testing.assert_close(s.feats[0], out["input_features"][0, :, :n].T, rtol=0, atol=0)


# ------------------------------------------------------------------------------------- loss, gradients
def hf_twin(model):
    from transformers import Qwen3ASRForConditionalGeneration

    hf = Qwen3ASRForConditionalGeneration(model.hf_config)
    hf.load_state_dict(to_hf(model.state_dict()))
    return hf


def hf_inputs(batch, n_window: int = 50) -> dict:
    """The brisk batch as transformers' forward takes it: the features in whole windows, channels first."""
    speech = batch.speech
    pad = -speech.shape[1] % (2 * n_window)
    feats = torch.nn.functional.pad(speech, (0, 0, 0, pad)).transpose(1, 2)
    mask = (torch.arange(feats.shape[-1]) < batch.speech_lengths[:, None]).long()
    return dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, input_features=feats,
                input_features_mask=mask, labels=batch.labels)


def test_loss_and_gradients_equal_transformers_qwen3asr_in_fp32(tmp_path):
    path, _ = recipe_jsonl(tmp_path, 4)
    cfg = config(tmp_path, data=path)
    model = family_of(cfg).build(cfg, "cpu")
    _, samples = samples_of(cfg, path, 4)
    batch = Collator()(samples)
    hf = hf_twin(model)
    assert set(from_hf(hf.state_dict())) == set(model.state_dict())
    loss, _, count = lm_loss(model(batch), batch.labels)
    loss.backward()
    ref = hf(**hf_inputs(batch)).loss
    ref.backward()
    assert count.item() == (batch.labels[:, 1:] != -100).sum().item()
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-6)
    theirs = dict(hf.named_parameters())
    mapped = to_hf({n: p for n, p in model.named_parameters()})
    worst = max((p.grad - theirs[n].grad).abs().max().item() for n, p in mapped.items())
    assert worst < 1e-6, worst
    assert all(p.grad is not None for p in mapped.values())

    packed = Collator(packed=True, token_buckets=(512,))(samples)  # one row, per-utterance positions
    model.zero_grad()
    loss_packed, _, _ = lm_loss(model(packed), packed.labels)
    torch.testing.assert_close(loss_packed, ref, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------- switches
def test_the_plan_says_which_switches_the_family_takes(tmp_path):
    with pytest.raises(ConfigError, match="model.family=qwen3_asr does not take speed.liger") as e:
        config(tmp_path, "speed.liger=true")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="train.export=funasr: model.family=qwen3_asr writes hf"):
        config(tmp_path, "train.export=funasr")
    from brisk.plan import make_plan

    cfg = config(tmp_path, "speed.preset=fast", "model.encoder.freeze=true", "model.adaptor.freeze=true")
    cfg, plan = make_plan(cfg, "cpu", 1)
    assert set(plan.on) == {"packing", "frozen_eval", "label_head"} and plan.family == "qwen3_asr"
    cfg, plan = make_plan(config(tmp_path, "speed.preset=fast", "model.encoder.freeze=true",
                                 "model.adaptor.freeze=true"), "cuda", 1)
    assert set(plan.on) == {"packing", "frozen_eval", "encoder_dtype", "compile", "fused_adamw", "label_head",
                            "fuse_projections", "audio_varlen", "cuda_graph", "fresh_grads"}


def test_unknown_family_is_one_line_listing_them(tmp_path):
    with pytest.raises(ConfigError, match="model.family='whisper': use one of the model families causal_lm, "
                                          "fun_asr_nano, qwen3_asr") as e:
        config(tmp_path, "model.family=whisper")
    assert "\n" not in str(e.value)


def _loss_with(tmp_path, samples, *over):
    """Loss and gradients of one step's forward with the plan's model-side switches (CPU)."""
    from brisk.plan import make_plan
    from brisk.speed import accelerate
    from brisk.train.step import StepHooks, model_loss

    cfg, plan = make_plan(config(tmp_path, *over), "cpu", 1)
    model = family_of(cfg).build(cfg, "cpu")
    accel = accelerate(model, plan)
    accel.train_mode()
    s = cfg.speed
    collate = Collator(packed=True, token_buckets=tuple(s.pack_buckets)) if s.packing else Collator()
    batch = collate(samples)
    _, loss, _, _ = model_loss(model, batch, StepHooks(audio=accel.audio, loss=accel.loss))
    loss.backward()
    return model, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("switches", [
    ["speed.packing=true"],
    ["speed.label_head=true"],
    ["speed.packing=true", "speed.label_head=true", "speed.frozen_eval=true", "speed.encoder_cache=true"],
    ["speed.fuse_projections=true"],
    ["model.llm.activation_checkpoint=1", "model.encoder.activation_checkpoint=1"],
])
def test_switches_that_run_on_the_cpu_keep_the_loss_and_gradients(tmp_path, switches):
    path, _ = recipe_jsonl(tmp_path, 4)
    frozen = ["model.encoder.freeze=true", "model.adaptor.freeze=true", f"data.train={path}"]
    cfg = config(tmp_path, *frozen)
    _, samples = samples_of(cfg, path, 4)
    _, ref_loss, ref_grads = _loss_with(tmp_path, samples, *frozen)
    model, loss, grads = _loss_with(tmp_path, samples, *frozen, *switches)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
    assert set(grads) == set(ref_grads)
    worst = max((grads[n] - ref_grads[n]).abs().max().item() for n in grads)
    assert worst < 1e-5, worst


def test_frozen_bf16_audio_copies_compute_the_rows(tmp_path):
    """speed.encoder_dtype=bf16 copies the family's audio modules (Family.audio_path) and runs the model class's
    own audio_rows on them; the originals stay fp32."""
    from brisk.speed.frozen import AudioPath, FrozenAudio

    path, _ = recipe_jsonl(tmp_path, 2)
    cfg = config(tmp_path, data=path)
    model = family_of(cfg).build(cfg, "cpu")
    _, samples = samples_of(cfg, path, 2)
    batch = Collator()(samples)
    audio = FrozenAudio(model, torch.bfloat16, names=family_of(cfg).audio_path)
    assert isinstance(audio.path, AudioPath) and audio.path.audio_tower is not model.audio_tower
    rows, ref = audio(batch), model.audio_rows(batch)
    assert rows.dtype == torch.bfloat16 and rows.shape == ref.shape == (batch.audio_pos.numel(), ref.shape[1])
    assert (rows.float() - ref).abs().max() < 0.05 * ref.abs().max()
    assert next(model.audio_tower.parameters()).dtype == torch.float32


def test_compile_marks_the_decoder_layers_and_the_frozen_audio_tower_layers(tmp_path):
    """What speed.compile does to the module tree on a CUDA device (the compiled code runs in tests/gpu)."""
    from brisk.plan import make_plan
    from brisk.speed.compile import apply_compile

    cfg = config(tmp_path, "speed.compile=true", "speed.frozen_eval=true", "model.encoder.freeze=true",
                 "model.adaptor.freeze=true", f"speed.inductor_cache_dir={tmp_path / 'ind'}")
    model = family_of(cfg).build(cfg, "cpu")
    apply_compile(model, make_plan(cfg, "cuda")[1].speed, "cuda")
    compiled = {n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None}
    assert {"llm.model.layers.0", "llm.model.layers.1", "audio_tower.layers.0", "audio_tower.layers.1"} <= compiled


# -------------------------------------------------------------------------------------- export, decode
def test_export_loads_in_transformers_with_equal_logits_and_decodes_the_same_ids(tmp_path):
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    from brisk.families.qwen3_asr.decode import qwen3_asr_recognizer
    from brisk.models.export import export_folder

    path, lines = recipe_jsonl(tmp_path, 2)
    cfg = config(tmp_path, data=path)
    model = family_of(cfg).build(cfg, "cpu").eval()
    _, samples = samples_of(cfg, path, 2)
    batch = Collator()(samples)
    out = export_folder(model, cfg, tmp_path / "hf", fmt="hf", dtype="fp32")
    hf = Qwen3ASRForConditionalGeneration.from_pretrained(out).eval()
    with torch.no_grad():
        ours = model(batch)
        theirs = hf(**{k: v for k, v in hf_inputs(batch).items() if k != "labels"}).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

    # `brisk eval FOLDER` / `brisk transcribe FOLDER`: the folder is the family's (config.json's model_type), loaded
    # back as a Qwen3-ASR with the same logits, not as a causal LM
    from brisk.eval.load import load_for_inference
    from brisk.formats.run_folder import folder_kind

    assert folder_kind(out) == "transformers" and folder_family(out).name == "qwen3_asr"
    back, _, back_cfg = load_for_inference(out)
    assert back_cfg.model.family == "qwen3_asr" and type(back) is type(model)
    with torch.no_grad():
        torch.testing.assert_close(back(batch), ours, rtol=0, atol=1e-5)

    # Greedy ids: brisk's recognizer against transformers' generate on the processor's own inputs.
    processor = AutoProcessor.from_pretrained(out)
    rec = qwen3_asr_recognizer(cfg, model, processor.tokenizer, "cpu", max_new_tokens=6)
    mine = rec.decode_features([rec.features(lines[0]["audio"])[0]])[0]
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "audio", "audio": None}]}]
    prompt = processor.apply_chat_template([msgs], add_generation_prompt=True, tokenize=False)[0]
    inputs = processor(text=[prompt + "language English<asr_text>"], audio=[load_audio(lines[0]["audio"])],
                       return_tensors="pt")
    gen = hf.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    stop = next((j for j, x in enumerate(gen) if x in rec.stop), len(gen))
    assert mine == gen[:stop]


# ----------------------------------------------------------------------------------------------- demo
@pytest.mark.slow
def test_the_cpu_demo_learns_validation_cer_falls(tmp_path):
    """configs/qwen3_asr_demo.yaml, shortened to 520 steps with the settings that fall fastest that early
    (lr 3e-3, weight decay 0.01; bench/LOG.md): the validation CER falls from 100% (train, checkpoints, the
    transformers export and val_decode all run through the general loop), and `brisk eval`'s path decodes."""
    import subprocess
    import sys

    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "brisk", "train", str(CONFIG), f"train.output_dir={run}",
                          "train.max_steps=520", "train.val_every=260", "train.val_decode=40", "train.progress=false",
                          "optim.lr=0.003", "optim.weight_decay=0.01",
                          "data.train=" + str(DEMO / "train_more.jsonl")],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    cers = [r["cer"] for r in rows if "cer" in r]
    assert cers[0] == 1.0 and cers[-1] < 0.9 and cers[-1] < min(cers[:2]), cers
    assert (run / "model-hf" / "model.safetensors").is_file()

    # `brisk eval`'s path on the run folder: its config, its newest weights, the family's eval set and decoding
    from brisk.eval.evaluate import evaluate, load_run, recognizer
    from brisk.eval.testset import items_of

    cfg, model, tok, _ = load_run(run)
    items = items_of(*family_of(cfg).eval_set(str(DEMO / "valid.jsonl"), cfg))[:8]
    rows, summary = evaluate(recognizer(cfg, model, tok, max_new_tokens=20), items, None)
    assert summary["utterances"] == 8 and summary["cer"] < 1.0 and any(r["hyp"] for r in rows)


def test_encoder_bf16_is_refused_in_one_line():
    """`brisk eval --encoder-bf16` copies Fun-ASR-Nano's encoder and adaptor; Qwen3-ASR's recognizer refuses it
    before touching the model (docs/troubleshooting.md)."""
    from brisk.families.qwen3_asr.decode import Qwen3ASRRecognizer

    with pytest.raises(ConfigError, match="--encoder-bf16: Qwen3-ASR's audio tower") as e:
        Qwen3ASRRecognizer(None, None, encoder_dtype=torch.bfloat16)
    assert "\n" not in str(e.value)


def test_an_hf_export_trains_again_from_the_shipped_config(tmp_path):
    """The demo config names its sizes in model.llm.config (audio_config and text_config as dicts); set on top of
    the export's own config they stay sub-configs, and no device_map (accelerate) is needed to load it."""
    from brisk.cli import main

    common = ["train.max_steps=1", "data.valid=null", f"data.train={DEMO / 'valid.jsonl'}", "train.val_decode=0",
              "train.progress=false", "train.tensorboard=false", "diagnose.report=false"]
    assert main(["train", str(CONFIG), *common, "train.export=hf", f"train.output_dir={tmp_path / 'a'}"]) == 0
    assert main(["train", str(CONFIG), *common, "train.export=none", f"model.llm.path={tmp_path / 'a' / 'model-hf'}",
                 f"train.output_dir={tmp_path / 'b'}"]) == 0
