"""Fun-ASR-Nano's own keys (the ``fun_asr_nano:`` section): its front end and the sizes of its SANM encoder,
adaptor and CTC branch. A FunASR or transformers-native model folder (model.path) sets them; a YAML file gives them
for a model built from scratch. Whether the encoder and adaptor train is the shared model.encoder / model.adaptor
policy, which Qwen3-ASR's tower reads too.

Read by the spec before torch is imported: it imports nothing but how keys are declared."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ConfigError
from ...keys import key

CMVN_NAME = "am.mvn"  # FunASR's own name for the CMVN file in a model folder (an export copies it there)
WINDOWS = ("hamming", "hanning", "povey", "rectangular", "blackman")


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
    dither: float = key(1.0, "fbank dither (FunASR's default: 1.0); 0 makes features deterministic (needed by "
                         "speed.encoder_cache)", inference=True)
    cmvn_file: str | None = key(None, "FunASR am.mvn file (mean/variance normalisation); none: no CMVN", path="in",
                                 exported=CMVN_NAME)
    upscale_samples: bool = key(True, "FunASR scales [-1, 1] audio to the int16 range before fbank", inference=True)

    def __post_init__(self):
        if self.window not in WINDOWS:
            raise ConfigError(f"fun_asr_nano.frontend.window={self.window!r}: use hamming, hanning, povey, "
                              "rectangular or blackman")


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


@dataclass
class AdaptorConfig:
    """Transformer adaptor between the encoder and the LLM."""

    downsample_rate: int = key(1, "frames merged before the adaptor's first linear")
    ffn_dim: int = key(2048, "adaptor hidden width")
    n_layer: int = key(2, "Transformer layers in the adaptor")
    attention_heads: int = key(8, "adaptor attention heads")
    dropout_rate: float = key(0.0, "adaptor dropout")
    use_low_frame_rate: bool = key(True, "only the first ~L/8 adaptor outputs reach the LLM", inference=True)

    def __post_init__(self):
        if self.downsample_rate < 1:
            raise ConfigError(f"fun_asr_nano.adaptor.downsample_rate={self.downsample_rate}: use 1 or more")
        if self.downsample_rate > 1 and not self.use_low_frame_rate:
            # The prompt holds one audio slot per LFR frame, the adaptor gives one output per downsample_rate frames.
            raise ConfigError(f"fun_asr_nano.adaptor.downsample_rate={self.downsample_rate} needs "
                              "fun_asr_nano.adaptor.use_low_frame_rate=true: without it the prompt has one audio "
                              f"slot per frame, more than the adaptor's 1/{self.downsample_rate} outputs; use "
                              "downsample_rate=1 or use_low_frame_rate=true")


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


@dataclass
class FunAsrNanoConfig:
    """Fun-ASR-Nano's own keys: its front end and the sizes of its audio path."""

    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    adaptor: AdaptorConfig = field(default_factory=AdaptorConfig)
    ctc: CTCConfig = field(default_factory=CTCConfig)
