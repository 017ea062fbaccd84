"""The model's config sections: the model family that builds it, the LLM and its LoRA adapters, and whether a
speech family's audio encoder and adaptor train (their sizes are the family's own section)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import families
from ..errors import ConfigError
from ..keys import check_every, key


@dataclass
class AudioEncoderConfig:
    """Whether a speech family's audio encoder trains (Fun-ASR-Nano's SANM encoder, Qwen3-ASR's audio tower); its
    sizes are the family's own keys."""

    freeze: bool = key(True, "keep the audio encoder's weights fixed (no gradients)")
    activation_checkpoint: int = key(0, "FunASR audio_encoder_conf.activation_checkpoint: 0 off; k: recompute every "
                                     "k-th encoder block in the backward (1: all)", resume="free")

    def __post_init__(self):
        check_every("model.encoder.activation_checkpoint", self.activation_checkpoint)


@dataclass
class AudioAdaptorConfig:
    """Whether a speech family's adaptor (Fun-ASR-Nano's adaptor, Qwen3-ASR's projector) trains."""

    freeze: bool = key(True, "keep the adaptor's weights fixed (no gradients)")


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
    encoder: AudioEncoderConfig = field(default_factory=AudioEncoderConfig)
    adaptor: AudioAdaptorConfig = field(default_factory=AudioAdaptorConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


