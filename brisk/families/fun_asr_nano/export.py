"""Fun-ASR-Nano's export folders: FunASR's (config.yaml, configuration.json, model.pt, the LLM's config and
tokenizer), which FunASR's AutoModel loads, and transformers' native fun_asr_nano folder (train.export=hf); each
with a README of how to load it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml

from ...adapters.lora import is_lora_key
from ...config import Config
from ...models.lm import DTYPES
from ..registry import section
from .config import CMVN_NAME

LLM_DIR = "Qwen3-0.6B"  # the LLM folder's name inside a FunASR model folder (FunASR's own layout)


def llm_config(model) -> dict:
    d = model.llm.config.to_dict()
    for k in ("_name_or_path", "transformers_version", "architectures"):
        d.pop(k, None)
    return d


# ---------------------------------------------------------------------------------------- FunASR
CONFIGURATION_JSON = {
    "framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
    "pipeline": {"type": "funasr-pipeline"},
    "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                        "tokenizer_conf": {"init_param_path": LLM_DIR}, "llm_conf": {"init_param_path": LLM_DIR}},
}


def funasr_yaml(cfg: Config, llm_dim: int) -> dict:
    """FunASR's config.yaml for the run: the source folder's (if any) with the run's sizes and dataset_conf."""
    m, d, own = cfg.model, cfg.data, section(cfg)
    raw: dict = {}
    if m.path and (Path(m.path) / "config.yaml").is_file():
        raw = yaml.safe_load((Path(m.path) / "config.yaml").read_text(encoding="utf-8")) or {}
    enc, ad, fe = own.encoder, own.adaptor, own.frontend
    raw["model"] = "FunASRNano"
    raw["audio_encoder"] = "SenseVoiceEncoderSmall"
    raw["audio_encoder_conf"] = {**(raw.get("audio_encoder_conf") or {}), **dict(
        output_size=enc.output_size, attention_heads=enc.attention_heads, linear_units=enc.linear_units,
        num_blocks=enc.num_blocks, tp_blocks=enc.tp_blocks, dropout_rate=enc.dropout_rate,
        attention_dropout_rate=enc.attention_dropout_rate, kernel_size=enc.kernel_size, sanm_shfit=enc.sanm_shift,
        input_layer="pe", pos_enc_class="SinusoidalPositionEncoder", normalize_before=True,
        selfattention_layer_type="sanm", freeze=m.encoder.freeze)}
    raw["audio_adaptor"] = "Transformer"
    raw["audio_adaptor_conf"] = {**(raw.get("audio_adaptor_conf") or {}), **dict(
        downsample_rate=ad.downsample_rate, use_low_frame_rate=ad.use_low_frame_rate, ffn_dim=ad.ffn_dim,
        llm_dim=llm_dim, encoder_dim=enc.output_size, n_layer=ad.n_layer, attention_heads=ad.attention_heads,
        dropout_rate=ad.dropout_rate, freeze=m.adaptor.freeze)}
    raw["llm"] = raw.get("llm") or "Qwen3-0.6b"
    lora = m.llm.lora
    # FunASR's inference builds its LoRA layers from these keys and ignores adapter tensors it has no layer
    # for: use_lora must say whether model.pt carries them.
    raw["llm_conf"] = {**(raw.get("llm_conf") or {}), "hub": "hf", "init_param_path": LLM_DIR,
                       "freeze": m.llm.freeze, "llm_dtype": m.llm.dtype,
                       "activation_checkpoint": bool(m.llm.activation_checkpoint), "use_lora": lora.enabled,
                       "lora_conf": {**((raw.get("llm_conf") or {}).get("lora_conf") or {}), "r": lora.r,
                                     "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                                     "target_modules": list(lora.target_modules), "init_param_path": ""}}
    raw["audio_encoder_conf"]["activation_checkpoint"] = bool(m.encoder.activation_checkpoint)
    raw["lora_only"], raw["lora_bias"] = lora.only, lora.bias
    raw["frontend"] = "WavFrontend"
    raw["frontend_conf"] = {**(raw.get("frontend_conf") or {}), **dict(
        fs=fe.fs, window=fe.window, n_mels=fe.n_mels, frame_length=fe.frame_length, frame_shift=fe.frame_shift,
        lfr_m=fe.lfr_m, lfr_n=fe.lfr_n, cmvn_file=CMVN_NAME if fe.cmvn_file else None,
        dither=0.0, upsacle_samples=fe.upscale_samples)}  # dither off: FunASR's runtime decodes as brisk eval does
    if own.ctc.enabled:
        c = own.ctc
        raw["ctc_decoder"] = raw.get("ctc_decoder") or "Transformer"
        raw["ctc_decoder_conf"] = {**(raw.get("ctc_decoder_conf") or {}), **dict(
            downsample_rate=c.downsample_rate, ffn_dim=c.ffn_dim, llm_dim=c.dim, encoder_dim=enc.output_size,
            n_layer=c.n_layer, freeze=c.freeze)}
        raw["ctc_vocab_size"] = c.vocab_size
    else:
        for k in ("ctc_decoder", "ctc_decoder_conf", "ctc_vocab_size"):
            raw.pop(k, None)
    raw["dataset"] = raw.get("dataset") or "FunASR"
    conf = dict(raw.get("dataset_conf") or {})
    conf.setdefault("index_ds", "FunASR")
    conf.update(batch_type="token", batch_size=d.batch_tokens, max_token_length=d.max_token_length,
                sort_size=d.sort_size, sys_prompt=d.sys_prompt, do_think=d.do_think, multiturn_num_max=d.multiturn_max)
    if d.prompt_class:
        conf.update(prompt_classes=d.prompt_class, prompt_conf=dict(d.prompt_conf))
    else:
        conf.pop("prompt_classes", None)
        conf.pop("prompt_conf", None)
    raw["dataset_conf"] = conf
    raw["tokenizer"] = "HuggingfaceTokenizer"
    raw["tokenizer_conf"] = {**(raw.get("tokenizer_conf") or {}), "init_param_path": LLM_DIR}
    raw.pop("init_param", None)  # the folder's model.pt is found by FunASR itself
    return raw


def write_funasr(model, cfg: Config, state: dict, out: Path, dtype: str, tokenizer) -> None:
    llm_dim = model.llm.get_input_embeddings().weight.shape[-1]
    raw = funasr_yaml(cfg, llm_dim)
    (out / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True), encoding="utf-8")
    conf = json.loads(json.dumps(CONFIGURATION_JSON))
    if section(cfg).frontend.cmvn_file:  # FunASR resolves the folder's files named here against the folder
        conf["file_path_metas"]["frontend_conf"] = {"cmvn_file": CMVN_NAME}
    (out / "configuration.json").write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")
    # FunASR builds its own LoRA layers and loads the adapters unfolded: every tensor in the export's dtype
    state = {k: v.to(DTYPES[dtype]) if is_lora_key(k) else v for k, v in state.items()}
    torch.save({"state_dict": state}, out / "model.pt")
    llm = out / LLM_DIR
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps(llm_config(model), indent=2) + "\n", encoding="utf-8")
    tokenizer.save_pretrained(llm)
    src = Path(cfg.model.path) if cfg.model.path else None
    if src is not None and src.is_dir():  # small side files FunASR may need (CTC vocabulary, README, ...)
        for f in src.iterdir():
            if f.is_file() and f.name not in ("model.pt", "config.yaml", "configuration.json", "README.md") \
                    and not f.name.endswith((".pt", ".safetensors", ".bin")) and f.stat().st_size < 20e6:
                shutil.copy2(f, out / f.name)


def write_hf(model, cfg: Config, state: dict, out: Path, dtype: str, tokenizer) -> None:
    from safetensors.torch import save_file

    from .hf_native import AUDIO_TOKEN, hf_config, to_hf

    text = llm_config(model)
    audio_id = tokenizer.convert_tokens_to_ids(AUDIO_TOKEN) if AUDIO_TOKEN in tokenizer.get_vocab() else None
    hc = hf_config(section(cfg), text, audio_id if audio_id is not None else min(151646, text["vocab_size"] - 1))
    hc.architectures = ["FunAsrNanoForConditionalGeneration"]
    hc.dtype = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    hc.save_pretrained(out)
    if cfg.model.llm.lora.enabled:  # the native model has no adapter layers: W + (alpha / r) B A
        from ...adapters.lora import fold_lora

        state = fold_lora(state, cfg.model.llm.lora)
    weights = to_hf(state, section(cfg))
    if hc.tie_word_embeddings:  # stored once, as transformers writes tied weights
        weights.pop("lm_head.weight", None)
    save_file({k: v.clone() for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    # Written as JSON, not through FunAsrNanoFeatureExtractor, which needs torchaudio just to be built.
    fe = section(cfg).frontend
    extractor = dict(feature_extractor_type="FunAsrNanoFeatureExtractor", processor_class="FunAsrNanoProcessor",
                     feature_size=fe.n_mels, sampling_rate=fe.fs, frame_length=int(fe.frame_length),
                     frame_shift=int(fe.frame_shift), num_frames_lfr=fe.lfr_m, stride_lfr=fe.lfr_n, window=fe.window,
                     padding_value=0.0, padding_side="right", return_attention_mask=True,
                     # FunASR's front end as trained (the native extractor ignores these; brisk reads brisk.json)
                     cmvn_file=CMVN_NAME if fe.cmvn_file else None, dither=0.0, upscale_samples=fe.upscale_samples)
    (out / "preprocessor_config.json").write_text(json.dumps(extractor, indent=2) + "\n", encoding="utf-8")
    if audio_id is not None:  # without the native audio placeholder in the tokenizer there is no processor
        processor = {"processor_class": "FunAsrNanoProcessor", "audio_token": AUDIO_TOKEN}
        (out / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n", encoding="utf-8")
    tokenizer.save_pretrained(out)


def spliced(cfg: Config) -> str:
    """Which adaptor outputs reach the LLM, as this model was trained (fun_asr_nano.adaptor.use_low_frame_rate)."""
    if section(cfg).adaptor.use_low_frame_rate:
        return "the first ~L/8 adaptor outputs (L: LFR frames; fun_asr_nano.adaptor.use_low_frame_rate true)"
    return "every adaptor output, one per LFR frame (fun_asr_nano.adaptor.use_low_frame_rate false)"


def processor_gap(cfg: Config) -> str:
    if section(cfg).adaptor.use_low_frame_rate:
        return "it inserts one audio token per LFR frame (training: ~1/8 of them)"
    return "its audio token count follows its own rule (training: one per LFR frame), so check it matches"


def write_readme(out: Path, fmt: str, dtype: str, cfg: Config) -> None:
    header = "with the context header (" + cfg.data.prompt_class + ")" if cfg.data.prompt_class else "without a context header"
    if fmt == "funasr":
        body = f"""# Fun-ASR-Nano model folder (FunASR layout), exported by brisk

Load with FunASR 1.4.x: `funasr.AutoModel(model="<this folder>")`; fine-tune again with FunASR's
`train_ds.py` or with brisk (`model.path=<this folder>`). Weights: `model.pt` ({{"state_dict": ...}}, {dtype}).
`{LLM_DIR}/` holds the LLM's config.json and tokenizer (its weights are in model.pt).
This runtime behaves like training: FunASR's own front end (with the run's CMVN file, `am.mvn`, when it had
one, and no dither), prompt and splicing. The model was trained {header}; FunASR's inference prompt carries
none. `brisk.json` holds the settings that change what the model computes (front end, prompt keys, LLM dtype);
brisk reads it back when it loads this folder.
"""
    else:
        body = f"""# Fun-ASR-Nano, transformers-native layout (FunAsrNanoForConditionalGeneration), exported by brisk

Load with transformers >= 5.17: `FunAsrNanoForConditionalGeneration.from_pretrained("<this folder>")`;
brisk loads it back with `model.path=<this folder>`. Weights: `model.safetensors` ({dtype}; the CTC branch,
if the run had one, is not part of this class).

Which runtime behaves like training: brisk, FunASR (the `funasr` export), and this class only when it is fed
FunASR's features and FunASR's splicing (`brisk.families.fun_asr_nano.hf_native.native_inputs_embeds`: {spliced(cfg)}
of each utterance into the prompt's audio slots, features from audio scaled to the int16 range), with
`model.model.multi_modal_projector.config._attn_implementation` set (left unset, padded frames are not masked in
the adaptor). The native processor differs from training: {processor_gap(cfg)} and its feature extractor uses unit-scale
audio. The model was trained {header}.
"""
    (out / "README.md").write_text(body, encoding="utf-8")
