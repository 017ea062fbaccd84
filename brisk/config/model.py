"""The model's config sections: the audio frontend, encoder and adaptor (the speech families'), the LLM and its
LoRA adapters, and the model family that builds them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import CMVN_NAME
from ..keys import check_every, key


@dataclass
class FrontendConfig:
    """Kaldi fbank + low-frame-rate stacking, as FunASR's WavFrontend computes it."""

    fs: int = key(16000, "sample rate (Hz) audio is resampled to", inference=True)
    n_mels: int = key(80, "mel bins of the fbank", inference=True)
    frame_length: float = key(25.0, "fbank window length, ms", inference=True)
    frame_shift: float = key(10.0, "fbank hop, ms", inference=True)
    window: str = key("hamming", "fbank window: hamming | hanning | povey | rectangular | blackman", inference=True)
    lfr_m: int = key(7, "low-frame-rate stacking: frames stacked into one", inference=True)
    lfr_n: int = key(6, "low-frame-rate stacking: frames advanced between stacks", inference=True)
    dither: float = key(1.0, "FunASR's default; 0 makes features deterministic (needed by speed.encoder_cache)",
                         inference=True)
    cmvn_file: str | None = key(None, "FunASR am.mvn file (mean/variance normalisation); none: no CMVN", path="in",
                                 exported=CMVN_NAME)
    upscale_samples: bool = key(True, "FunASR scales [-1, 1] audio to the int16 range before fbank", inference=True)

    def __post_init__(self):
        if self.window not in ("hamming", "hanning", "povey", "rectangular", "blackman"):
            raise ConfigError(f"model.frontend.window={self.window!r}: use hamming, hanning, povey, rectangular or blackman")


@dataclass
class EncoderConfig:
    """SANM audio encoder (FunASR's SenseVoiceEncoderSmall)."""

    output_size: int = key(512, "encoder width (d_model)")
    attention_heads: int = key(4, "encoder attention heads")
    linear_units: int = key(2048, "encoder feed-forward width")
    num_blocks: int = key(50, "SANM blocks (the first maps LFR features to output_size)")
    tp_blocks: int = key(20, "SANM 'tp' blocks after the main stack")
    kernel_size: int = key(11, "FSMN depthwise convolution kernel")
    sanm_shift: int = key(0, "FSMN kernel shift (0: centred)")
    dropout_rate: float = key(0.1, "encoder dropout")
    attention_dropout_rate: float = key(0.0, "encoder attention dropout")
    freeze: bool = key(True, "keep the encoder's weights fixed (no gradients)")
    activation_checkpoint: int = key(0, "FunASR audio_encoder_conf.activation_checkpoint: 0 off; k: recompute every "
                                     "k-th SANM block in the backward (1: all)", resume="free")

    def __post_init__(self):
        check_every("model.encoder.activation_checkpoint", self.activation_checkpoint)


@dataclass
class AdaptorConfig:
    """Transformer adaptor between the encoder and the LLM."""

    downsample_rate: int = key(1, "frames merged before the adaptor's first linear")
    ffn_dim: int = key(2048, "adaptor hidden width")
    n_layer: int = key(2, "Transformer layers in the adaptor")
    attention_heads: int = key(8, "adaptor attention heads")
    dropout_rate: float = key(0.0, "adaptor dropout")
    use_low_frame_rate: bool = key(True, "only the first ~L/8 adaptor outputs reach the LLM", inference=True)
    freeze: bool = key(True, "keep the adaptor's weights fixed (no gradients)")

    def __post_init__(self):
        if self.downsample_rate < 1:
            raise ConfigError(f"model.adaptor.downsample_rate={self.downsample_rate}: use 1 or more")
        if self.downsample_rate > 1 and not self.use_low_frame_rate:
            # The prompt holds one audio slot per LFR frame, the adaptor gives one output per downsample_rate frames.
            raise ConfigError(f"model.adaptor.downsample_rate={self.downsample_rate} needs model.adaptor.use_low_frame_rate=true: "
                              "without it the prompt has one audio slot per frame, more than the adaptor's "
                              f"1/{self.downsample_rate} outputs; use downsample_rate=1 or use_low_frame_rate=true")


@dataclass
class CTCConfig:
    """Optional CTC branch (FunASR's ctc_decoder + ctc). Built for checkpoint compatibility; not in the loss."""

    enabled: bool = key(False, "build the CTC branch")
    n_layer: int = key(5, "CTC decoder layers")
    ffn_dim: int = key(2048, "CTC decoder feed-forward width")
    dim: int = key(512, "CTC decoder width")
    downsample_rate: int = key(1, "frames merged before the CTC decoder")
    vocab_size: int = key(60515, "CTC output vocabulary")
    freeze: bool = key(False, "keep the CTC branch's weights fixed")


LORA_BIAS = ("none", "all", "lora_only")
LORA_DTYPES = ("", "fp32")  # model.llm.lora.dtype: "" keeps the base weight's dtype


@dataclass
class LoraConfig:
    """LoRA adapters on the LLM's linear layers, as FunASR 1.4.16's Fun-ASR-Nano builds them (llm_conf.use_lora)."""

    enabled: bool = key(False, "FunASR llm_conf.use_lora: add trainable lora_A/lora_B beside the target layers' "
                        "weights")
    r: int = key(16, "FunASR lora_conf.r: the adapters' rank")
    alpha: float = key(32.0, "FunASR lora_conf.lora_alpha: the update is scaled by alpha / r")
    dropout: float = key(0.05, "FunASR lora_conf.lora_dropout: dropout on the adapters' input (training only)")
    target_modules: list[str] = key(factory=lambda: ["q_proj", "v_proj"],
                                    help="FunASR lora_conf.target_modules: names of the LLM's linear layers that get "
                                         "adapters")
    only: bool = key(False, "FunASR lora_only: train nothing but the adapters (every other weight frozen, encoder and "
                     "adaptor too)")
    bias: str = key("none", "FunASR lora_bias, with only=true: none | all (every bias trains) | lora_only (biases of "
                    "adapted layers train)")
    init_path: str | None = key(None, "FunASR lora_conf.init_param_path: a file whose lora_A/lora_B tensors start the "
                                "adapters", path="in")
    dtype: str = key("", "the adapters' dtype: \"\" the base weight's (FunASR loralib's) | fp32 (PEFT's default: fp32 "
                     "adapters, gradients and AdamW moments over a bf16 base; see docs/sft.md)")

    def __post_init__(self):
        if self.r < 1:
            raise ConfigError(f"model.llm.lora.r={self.r}: use a rank of 1 or more (FunASR's recipe: 16)")
        if not self.alpha > 0:
            raise ConfigError(f"model.llm.lora.alpha={self.alpha}: use a number above 0 (FunASR's recipe: 32)")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.llm.lora.dropout={self.dropout}: use a probability in [0, 1)")
        if not self.target_modules:
            raise ConfigError("model.llm.lora.target_modules is empty: name the linear layers, for example [q_proj, v_proj]")
        if {"lm_head", "embed_tokens"} & set(self.target_modules):
            raise ConfigError(f"model.llm.lora.target_modules={self.target_modules}: lm_head and embed_tokens take no "
                              "adapters here (tied weights; FunASR adapts linear layers); use projection names such as q_proj")
        if self.bias not in LORA_BIAS:
            raise ConfigError(f"model.llm.lora.bias={self.bias!r}: use none, all or lora_only")
        if self.dtype not in LORA_DTYPES:
            raise ConfigError(f"model.llm.lora.dtype={self.dtype!r}: use fp32 (adapters in fp32, as PEFT keeps them) "
                              "or \"\" (the base weight's dtype, FunASR's)")


@dataclass
class LLMConfig:
    """The decoder: any transformers causal LM, from a local folder or an inline config."""

    path: str | None = key(None, "local folder with config.json (and tokenizer, and optionally weights)", path="in")
    config: dict = key(factory=dict, help="inline transformers config when path is None, else overrides")
    dtype: str = key("fp32", "fp32 | bf16 (bf16 runs under autocast, as FunASR does)", inference=True)
    freeze: bool = key(False, "keep the LLM's weights fixed (no gradients)")
    load_weights: bool = key(True, "load *.safetensors from path when present (a FunASR model.pt overrides them)",
                             resume="free")
    lora: LoraConfig = field(default_factory=LoraConfig)
    activation_checkpoint: int = key(0, "FunASR llm_conf.activation_checkpoint: 0 off; k: recompute every k-th decoder "
                                     "layer in the backward (1: all)", resume="free")

    def __post_init__(self):
        if self.dtype not in ("fp32", "bf16"):
            raise ConfigError(f"model.llm.dtype={self.dtype!r}: use fp32 or bf16")
        check_every("model.llm.activation_checkpoint", self.activation_checkpoint)


@dataclass
class ModelConfig:
    family: str = key(families.DEFAULT, "the model family (brisk/families): fun_asr_nano | causal_lm | qwen3_asr")
    path: str | None = key(None, "a FunASR model folder (config.yaml, model.pt, the LLM folder); overrides sizes",
                            path="in")
    init: str | None = key(None, "weights to start from: FunASR model.pt, brisk checkpoint, or .safetensors",
                            path="in", resume="free")
    seed: int = key(0, "seed of the random initialisation (before any weights are loaded)", resume="free")
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    adaptor: AdaptorConfig = field(default_factory=AdaptorConfig)
    ctc: CTCConfig = field(default_factory=CTCConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


