"""Fun-ASR-Nano: a SANM audio encoder, a Transformer adaptor and a Qwen3 decoder, on FunASR jsonl (the old
``task: speech``). Its model is brisk.models.speech_llm.SpeechLLM; its folders are FunASR's and transformers'
``fun_asr_nano``."""

from __future__ import annotations

from .registry import Family, Ref, register

# The switches that act on the frozen audio path or on the graphed step around it.
FROZEN_AUDIO = ("frozen_eval", "encoder_dtype", "encoder_cache", "cuda_graph", "fresh_grads")


def encoder_blocks(model, compile: bool = False) -> list:
    """The SANM blocks (of the model, or of the frozen path's copy). Compiling leaves out the first block
    (encoders0): it takes the 560-wide LFR features, a graph of its own for one block of 70."""
    enc = model.audio_encoder
    return [enc.encoders, enc.tp_encoders] if compile else [enc.encoders0, enc.encoders, enc.tp_encoders]


FAMILY = register(Family(
    name="fun_asr_nano",
    summary="a speech-LLM of Fun-ASR-Nano's architecture on FunASR jsonl",
    task="speech",
    switches=frozenset({"frozen_eval", "encoder_dtype", "encoder_cache", "fuse_projections", "compile", "packing",
                        "label_head", "sdpa_backends", "cuda_graph", "fresh_grads", "fused_adamw", "tf32", "liger",
                        "optimizer_in_backward",
                        "flex_attention"}),
    # Each value joined the preset when the probe against the eager step met its gates and an interleaved bench on
    # the GPU showed it paid (docs/finetune-speed.md has the measurements).
    presets={"fast": {"packing": True, "cuda_graph": True, "frozen_eval": True, "encoder_dtype": "bf16",
                      "compile": True, "fused_adamw": True, "label_head": True, "label_rows_frac": 0.3,
                      "fresh_grads": True, "fuse_projections": True,
                      # 1,792 and 2,304 too: FunASR's ~1,600-token steps pad to 1,741 positions, not 1,971
                      "pack_buckets": [256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2304, 2560,
                                       3072, 4096],
                      # static decoder layers with FlexAttention traced into them, each bucket's graph captured when
                      # the data first reaches it (buckets the data never reaches cost nothing)
                      "compile_dynamic": False, "flex_attention": True, "graph_capture": "seen"}},
    frozen_audio=FROZEN_AUDIO,
    refused=("{bad} are for task: chat (model.family=causal_lm; the speech-LLM's Qwen3 decoder has no linear "
             "attention, and speed.label_head is its loss without full logits) or for model.family=qwen3_asr "
             "(speed.audio_varlen: its audio tower's attention); set them false"),
    build=Ref("brisk.models.build:build_speech_model"),
    dataset=Ref("brisk.data.loader:speech_dataset"),
    prepare=Ref("brisk.data.loader:speech_prepare"),
    exporters={"funasr": Ref("brisk.models.export:_write_funasr"), "hf": Ref("brisk.models.export:_write_hf")},
    readme=Ref("brisk.models.export:_write_readme"),
    recognizer=Ref("brisk.eval.decode:funasr_recognizer"),
    val_recognizer=Ref("brisk.eval.decode:funasr_val_recognizer"),
    folder_types=("fun_asr_nano",),  # its transformers-native folder (train.export=hf)
    folder_overrides=Ref("brisk.models.hf_native:folder_overrides"),
    encoder_blocks=encoder_blocks,
    audio_path=("audio_encoder", "audio_adaptor"),
    audio_graphs=True,  # the SANM encoder and adaptor read nothing on the host: one graph per speech bucket
    graph_examples=Ref("brisk.data.dataset:graph_examples"),
))
