"""brisk <-> transformers' native Fun-ASR-Nano (``FunAsrNanoForConditionalGeneration``, transformers >= 5.17).

Weights map both ways (the wheel ships no key table): the SANM blocks encoders0 + encoders + tp_encoders
form one ``audio_tower.layers`` list, after_norm / tp_norm become the final norms of the last transcription
layer and of the last layer, each fused ``linear_q_k_v`` splits into q/k/v, the adaptor becomes
``multi_modal_projector``, ``llm.model.*`` becomes ``model.language_model.*``; the CTC branch has no
counterpart and is dropped. Both versions (5.17, 5.24) use this layout.

The native runtime is only equivalent to training when it is fed FunASR's features (audio scaled to the
int16 range) and FunASR's splicing (the first ~L/8 adaptor outputs of each utterance, see
``native_inputs_embeds``); its own processor does neither.
"""

from __future__ import annotations

import re

import torch

from .config import FunAsrNanoConfig

ENC, PROJ, LM = "model.audio_tower.layers.", "model.multi_modal_projector.", "model.language_model."
AUDIO_TOKEN = "<|object_ref_start|>"  # the native processor's audio placeholder
_SANM = {"self_attn.linear_out.": "self_attn.o_proj.", "self_attn.fsmn_block.": "self_attn.fsmn.conv.",
         "feed_forward.w_1.": "mlp.fc1.", "feed_forward.w_2.": "mlp.fc2.", "norm1.": "input_layernorm.",
         "norm2.": "post_attention_layernorm."}
_ADAPTOR = {"self_attn.linear_q.": "self_attn.q_proj.", "self_attn.linear_k.": "self_attn.k_proj.",
            "self_attn.linear_v.": "self_attn.v_proj.", **_SANM}


def folder_overrides(path) -> list[str]:
    """A transformers-native Fun-ASR-Nano folder to load: model.path reads its config.json and weights."""
    return [f"model.path={path}"]


def hf_config(cfg: FunAsrNanoConfig, text_config: dict, audio_token_id: int):
    """The native ``FunAsrNanoConfig`` for this family's section of a run and its LLM's config dict."""
    from transformers import FunAsrNanoConfig as NativeConfig

    enc, ad, fe = cfg.encoder, cfg.adaptor, cfg.frontend
    llm_dim = text_config["hidden_size"]
    audio = dict(model_type="fun_asr_nano_encoder", num_mel_bins=fe.n_mels, num_stacked_frames=fe.lfr_m,
                 hidden_size=enc.output_size, num_attention_heads=enc.attention_heads,
                 intermediate_size=enc.linear_units, num_hidden_layers=enc.num_blocks + enc.tp_blocks,
                 num_timestamp_prediction_layers=enc.tp_blocks, fsmn_kernel_size=enc.kernel_size,
                 hidden_dropout=enc.dropout_rate, attention_dropout=enc.attention_dropout_rate,
                 layer_norm_eps=1e-5)  # SANM's LayerNorm: torch's default eps
    adaptor = dict(hidden_size=llm_dim, num_attention_heads=ad.attention_heads, intermediate_size=llm_dim // 4,
                   num_hidden_layers=ad.n_layer, hidden_dropout=ad.dropout_rate, attention_dropout=ad.dropout_rate,
                   layer_norm_eps=1e-12,  # FunASR's adaptor blocks use eps 1e-12
                   projector_hidden_size=ad.ffn_dim,
                   use_low_frame_rate=ad.use_low_frame_rate)  # brisk's own key: how many adaptor outputs are spliced
    return NativeConfig(audio_config=audio, adaptor_config=adaptor, text_config=dict(text_config),
                            audio_token_id=audio_token_id,
                            tie_word_embeddings=bool(text_config.get("tie_word_embeddings", True)))


def _encoder_layer(key: str, num_blocks: int) -> tuple[int, str] | None:
    m = re.match(r"audio_encoder\.(encoders0|encoders|tp_encoders)\.(\d+)\.(.*)", key)
    if not m:
        return None
    part, i, rest = m.group(1), int(m.group(2)), m.group(3)
    return {"encoders0": i, "encoders": i + 1, "tp_encoders": num_blocks + i}[part], rest


def to_hf(state: dict[str, torch.Tensor], cfg: FunAsrNanoConfig) -> dict[str, torch.Tensor]:
    """brisk / FunASR keys -> native keys (CTC dropped)."""
    nb, last = cfg.encoder.num_blocks, cfg.encoder.num_blocks + cfg.encoder.tp_blocks - 1
    out = {}
    for k, v in state.items():
        if k.startswith(("ctc_decoder.", "ctc.")):
            continue
        if k.startswith("llm.lm_head."):
            out["lm_head." + k.removeprefix("llm.lm_head.")] = v
        elif k.startswith("llm.model."):
            out[LM + k.removeprefix("llm.model.")] = v
        elif k.startswith("audio_encoder.after_norm."):
            out[f"{ENC}{nb - 1}.final_layernorm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("audio_encoder.tp_norm."):
            out[f"{ENC}{last}.final_layernorm." + k.rsplit(".", 1)[1]] = v
        elif (found := _encoder_layer(k, nb)) is not None:
            i, rest = found
            if rest.startswith("self_attn.linear_q_k_v."):
                for name, part in zip(("q", "k", "v"), v.chunk(3, dim=0)):
                    out[f"{ENC}{i}.self_attn.{name}_proj." + rest.rsplit(".", 1)[1]] = part
            else:
                out[f"{ENC}{i}." + _rename(rest, _SANM, k)] = v
        elif k.startswith("audio_adaptor.linear1.") or k.startswith("audio_adaptor.linear2."):
            n = k.split(".")[1][-1]
            out[f"{PROJ}linear_{n}." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("audio_adaptor.blocks."):
            i, rest = k.removeprefix("audio_adaptor.blocks.").split(".", 1)
            out[f"{PROJ}layers.{i}." + _rename(rest, _ADAPTOR, k)] = v
        else:
            raise KeyError(f"{k}: no counterpart in the native Fun-ASR-Nano layout")
    return out


def from_hf(state: dict[str, torch.Tensor], cfg: FunAsrNanoConfig) -> dict[str, torch.Tensor]:
    """Native keys -> brisk / FunASR keys (the inverse of ``to_hf``)."""
    nb, last = cfg.encoder.num_blocks, cfg.encoder.num_blocks + cfg.encoder.tp_blocks - 1

    def enc_prefix(i: int) -> str:
        if i == 0:
            return "audio_encoder.encoders0.0."
        return f"audio_encoder.encoders.{i - 1}." if i < nb else f"audio_encoder.tp_encoders.{i - nb}."

    back_sanm = {v: k for k, v in _SANM.items()}
    back_ad = {v: k for k, v in _ADAPTOR.items()}
    out, qkv = {}, {}
    for k, v in state.items():
        if k.startswith("lm_head."):
            out["llm.lm_head." + k.removeprefix("lm_head.")] = v
        elif k.startswith(LM):
            out["llm.model." + k.removeprefix(LM)] = v
        elif k.startswith(ENC):
            i, rest = k.removeprefix(ENC).split(".", 1)
            i = int(i)
            if rest.startswith("final_layernorm."):
                norm = "after_norm" if i == nb - 1 else "tp_norm" if i == last else None
                if norm is None:
                    raise KeyError(f"{k}: a final norm on layer {i}, expected only on {nb - 1} and {last}")
                out[f"audio_encoder.{norm}." + rest.rsplit(".", 1)[1]] = v
            elif m := re.match(r"self_attn\.([qkv])_proj\.(weight|bias)", rest):
                qkv.setdefault((enc_prefix(i), m.group(2)), {})[m.group(1)] = v
            else:
                out[enc_prefix(i) + _rename(rest, back_sanm, k)] = v
        elif k.startswith(PROJ + "linear_"):
            n = k.removeprefix(PROJ + "linear_").split(".")[0]
            out[f"audio_adaptor.linear{n}." + k.rsplit(".", 1)[1]] = v
        elif k.startswith(PROJ + "layers."):
            i, rest = k.removeprefix(PROJ + "layers.").split(".", 1)
            out[f"audio_adaptor.blocks.{i}." + _rename(rest, back_ad, k)] = v
        else:
            raise KeyError(f"{k}: not a native Fun-ASR-Nano weight brisk knows")
    for (prefix, kind), parts in qkv.items():
        out[f"{prefix}self_attn.linear_q_k_v.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def _rename(rest: str, table: dict[str, str], key: str) -> str:
    for a, b in table.items():
        if rest.startswith(a):
            return b + rest[len(a):]
    raise KeyError(f"{key}: no counterpart in the other layout")






def load_hf_weights(folder) -> dict[str, torch.Tensor]:
    from pathlib import Path

    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(f)))
    if not state:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights in this native Fun-ASR-Nano folder")
    return state


def native_inputs_embeds(hf_model, input_ids: torch.Tensor, speech: torch.Tensor, speech_lengths: torch.Tensor,
                         audio_slots: list[list[tuple[int, int]]]) -> torch.Tensor:
    """Input embeddings for the native model, spliced as FunASR trains: the first n adaptor outputs of each
    audio fill its n placeholder slots. ``speech``: FunASR's LFR features [B, F, 560] (one audio a row);
    ``audio_slots[b]``: (first position, count) of row b's audio."""
    base = hf_model.model
    mask = (torch.arange(speech.shape[1], device=speech.device)[None] < speech_lengths[:, None]).long()
    enc = base.audio_tower(input_features=speech, input_features_mask=mask, return_dict=True).last_hidden_state
    audio = base.multi_modal_projector(enc, mask)  # [B, F, D]
    emb = base.get_input_embeddings()(input_ids).clone()
    for b, slots in enumerate(audio_slots):
        for start, n in slots:
            emb[b, start:start + n] = audio[b, :n].to(emb.dtype)
    return emb
