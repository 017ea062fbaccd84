"""Qwen3-ASR in brisk's model interface, built from transformers' own modules.

transformers' ``Qwen3ASRForConditionalGeneration`` is ``model.audio_tower`` (a Whisper-like encoder run in
windows of 100 mel frames), ``model.multi_modal_projector`` (linear-GELU-linear) and ``model.language_model``
(a Qwen3 decoder stack) with ``lm_head``. Here the same module objects are held as ``audio_tower``,
``multi_modal_projector`` and ``llm`` (a ``Qwen3ForCausalLM`` around the decoder stack and lm_head), so the step
body, label_head, packing, compile and fused projections find the decoder where they find Fun-ASR-Nano's. The
state-dict keys map one to one onto transformers' (``to_hf``/``from_hf``): the export is its
``save_pretrained`` folder.

The audio tower's rows for a batch are flat ``[A, D]``, utterance after utterance, exactly the order of the
batch's audio slots; they are spliced at ``AudioBatch.audio_pos`` (transformers writes them where ``input_ids`` holds
the audio token: the same positions).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...config import ConfigError, ModelConfig
from .data import audio_token_count, rows_after_convs
from ...formats.batch import AudioBatch
from ...models.lm import DTYPES, SpeechLM

log = logging.getLogger("brisk")

# transformers' key prefixes <-> brisk's
_PREFIXES = (("model.audio_tower.", "audio_tower."), ("model.multi_modal_projector.", "multi_modal_projector."),
             ("model.language_model.", "llm.model."), ("lm_head.", "llm.lm_head."))


def _renamed(state: dict, pairs, what: str) -> dict:
    """``state`` with each key's prefix ``old`` replaced by ``new`` ((new, old) pairs); KeyError for a key none fits."""
    out = {}
    for k, v in state.items():
        key = next((new + k[len(old):] for new, old in pairs if k.startswith(old)), None)
        if key is None:
            raise KeyError(f"no {what} key for {k}")
        out[key] = v
    return out


def to_hf(state: dict) -> dict:
    return _renamed(state, _PREFIXES, "transformers")


def from_hf(state: dict) -> dict:
    return _renamed(state, [(ours, hf) for hf, ours in _PREFIXES], "brisk")


class Qwen3ASR(SpeechLM):
    """transformers' Qwen3-ASR, its modules taken over: the audio tower and projector give the audio rows, the text
    side (splicing, the causal LM) is every speech family's (``SpeechLM``)."""

    def __init__(self, cfg: ModelConfig, hf: nn.Module):
        """``hf``: a transformers Qwen3ASRForConditionalGeneration whose modules this model takes over."""
        super().__init__()
        from transformers import Qwen3ForCausalLM

        self.cfg = cfg
        self.hf_config = hf.config
        self.audio_tower = hf.model.audio_tower
        self.multi_modal_projector = hf.model.multi_modal_projector
        with torch.device("meta"):  # a shell: its decoder stack and head are the ones built already
            llm = Qwen3ForCausalLM(hf.config.text_config)
        llm.model, llm.lm_head = hf.model.language_model, hf.lm_head
        self.llm_dtype = DTYPES[cfg.llm.dtype]
        self.llm = llm.to(self.llm_dtype)
        self.n_window = hf.config.audio_config.n_window
        for module, frozen in self.freeze_plan().items():
            module.requires_grad_(not frozen)

    def freeze_plan(self) -> dict[nn.Module, bool]:
        return {self.audio_tower: self.cfg.encoder.freeze, self.multi_modal_projector: self.cfg.adaptor.freeze,
                self.llm: self.cfg.llm.freeze}

    # ------------------------------------------------------------------------------------ audio path
    def encode_audio(self, speech: torch.Tensor, lengths: torch.Tensor, counts: list[int] | None = None) -> torch.Tensor:
        """Log-mel frames [N, F, 128] (zero-padded) and their lengths -> the projected rows of every utterance,
        flat [A, D] in utterance order (A: the sum of each utterance's audio token count). ``counts``: each
        utterance's audio token count, when the caller knows it on the host (else read from ``lengths``)."""
        tower = self.audio_tower
        chunk = 2 * tower.n_window
        pad = -speech.shape[1] % chunk  # the tower runs in whole chunks of 2 * n_window frames
        feats = F.pad(speech, (0, 0, 0, pad)).transpose(1, 2)  # [N, 128, F']
        if counts is None:
            counts = [audio_token_count(n, tower.n_window) for n in lengths.tolist()]
        windows = audio_windows(counts, feats.shape[-1] // chunk, tower.config, feats.device)
        dtype = next(tower.parameters()).dtype
        return self.multi_modal_projector(run_audio_tower(tower, feats.to(dtype), *windows))

    def audio_rows(self, batch: AudioBatch) -> torch.Tensor:
        """The rows that fill the batch's audio slots, [A, D] (A: the length of ``audio_pos``).

        A static packed layout (CUDA graphs) has more slots than rows, the extra ones writing to the scratch
        position: they get zero rows. Its speech may hold padding segments (each rank padded to a common shape)
        and frames no utterance reaches: only the counted utterances and the chunks their rows come from are run
        (the same rows; a chunk's convolutions see that chunk alone)."""
        counts, speech, lengths = list(batch.slot_counts), batch.speech, batch.speech_lengths
        if counts and len(counts) <= speech.shape[0]:
            per_chunk = rows_after_convs(2 * self.audio_tower.n_window)
            frames = 2 * self.audio_tower.n_window * max(-(-c // per_chunk) for c in counts)
            speech, lengths = speech[: len(counts), :frames], lengths[: len(counts)]
        else:  # counts unknown: read from the lengths (a host sync)
            counts = None
        rows = self.encode_audio(speech, lengths, counts)
        pad = batch.audio_pos.numel() - rows.shape[0]
        return F.pad(rows, (0, 0, 0, pad)) if pad > 0 else rows

    # ------------------------------------------------------------- the audio path in shapes fixed per bucket
    def static_audio_inputs(self, batch: AudioBatch) -> tuple[tuple[int, int], tuple[torch.Tensor, ...]]:
        """``audio_rows``'s work as inputs whose shapes depend on the batch's static layout alone, for a CUDA
        graph of the frozen audio path per bucket (``static_audio_rows`` computes the rows from them).

        -> (key, inputs). The key is (A, C): A audio slots (the static row length) and C chunk places,
        ceil(A / rows a chunk) + the layout's segment entries, never fewer than the real chunks (an utterance
        of c rows spans at most c / rows-a-chunk + 1 chunks). The inputs: the real chunks' features
        [C, 2 * n_window, mel] (the places past the real chunks repeat chunk 0), and on the host: the index of
        each slot's row among the convolutions' C * rows-a-chunk rows [A] (a padding slot reads row 0), the
        windows' cu_seqlens [W + 1] (the padding slots in windows of their own, then zero-length windows up to
        W, ``static_windows``), and the real row count [1]. Nothing here reads the device."""
        tower = self.audio_tower
        chunk, per_chunk = 2 * tower.n_window, rows_after_convs(2 * tower.n_window)
        counts, speech = list(batch.slot_counts), batch.speech
        slots, room = batch.audio_pos.numel(), max(len(counts), batch.cu_seqlens.numel())
        places = -(-slots // per_chunk) + room
        feats = F.pad(speech, (0, 0, 0, -speech.shape[1] % chunk))
        per_utt = feats.shape[1] // chunk
        chunks, valid = [], []
        for i, count in enumerate(counts):
            for start in range(0, count, per_chunk):
                valid.extend(range(len(chunks) * per_chunk, len(chunks) * per_chunk + min(per_chunk, count - start)))
                chunks.append(i * per_utt + start // per_chunk)
        if len(chunks) > places or len(valid) > slots:
            raise ValueError(f"{len(chunks)} audio chunks and {len(valid)} rows do not fit {places} and {slots}")
        cu = static_windows(counts, slots, room, tower.config)
        host = [torch.tensor(chunks + [0] * (places - len(chunks))), torch.tensor(valid + [0] * (slots - len(valid))),
                cu, torch.tensor([len(valid)])]
        if speech.is_cuda:  # pinned and asynchronous: no wait for the device
            host = [x.pin_memory() for x in host]
        index = host[0].to(speech.device, non_blocking=True)
        real = feats.reshape(-1, chunk, feats.shape[-1]).index_select(0, index)  # [C, chunk, mel]
        return (slots, places), (real, *host[1:])

    def static_audio_rows(self, chunks: torch.Tensor, valid: torch.Tensor, cu_seqlens: torch.Tensor,
                          real: torch.Tensor) -> torch.Tensor:
        """The rows of the audio slots from ``static_audio_inputs``'s inputs (on this model's device): [A, D],
        the padding slots' rows zero, as ``audio_rows`` gives them. Every shape is fixed by the key and nothing
        is read back, so a CUDA graph can hold it."""
        tower = self.audio_tower
        dtype = next(tower.parameters()).dtype
        x = conv_rows(tower, chunks.to(dtype).transpose(1, 2).unsqueeze(1))
        hidden = tower_layers(tower, x.index_select(0, valid), cu_seqlens, _window([], tower.config, full=True))
        rows = self.multi_modal_projector(hidden)
        keep = torch.arange(rows.shape[0], device=rows.device) < real
        return torch.where(keep[:, None], rows, 0)


def audio_windows(counts: list[int], chunks: int, config, device) -> tuple[torch.Tensor, int, torch.Tensor]:
    """What transformers' audio encoder reads back from the device each batch, computed on the host from each
    utterance's output row count: the attention windows' boundaries (cu_seqlens, int32, as its
    get_audio_cu_seqlens), the longest window, and the flat indices of the real rows among the convolutions'
    [N * chunks * rows-per-chunk] output (its valid_indices), for a batch padded to ``chunks`` chunks."""
    per_chunk = rows_after_convs(2 * config.n_window)
    bounds, valid = [0, *window_lengths(counts, _window(counts, config))], []
    for i, count in enumerate(counts):
        base = i * chunks * per_chunk
        for start in range(0, count, per_chunk):  # chunk j holds rows j*per_chunk.. of the utterance
            valid.extend(range(base + start, base + min(start + per_chunk, count)))
    cu = torch.tensor(bounds, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    index = torch.tensor(valid, dtype=torch.long)
    if torch.device(device).type == "cuda":  # pinned and asynchronous: no wait for the device
        cu, index = (x.pin_memory().to(device, non_blocking=True) for x in (cu, index))
    else:
        cu, index = cu.to(device), index.to(device)
    return cu, max(bounds[1:], default=0), index


def run_audio_tower(tower: nn.Module, feats: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                    valid: torch.Tensor) -> torch.Tensor:
    """transformers' Qwen3ASREncoder.forward on features [N, 128, F'] (F' whole chunks), with the windows and
    real-row indices given (``audio_windows``) instead of read back from the device: the convolutions on every
    chunk, the real rows gathered flat, the layers with their windows, the final norm -> [A, d_model]."""
    n, mel, frames = feats.shape
    chunk = 2 * tower.n_window
    x = feats.view(n, mel, frames // chunk, chunk).permute(0, 2, 1, 3).reshape(-1, 1, mel, chunk)
    return tower_layers(tower, conv_rows(tower, x).index_select(0, valid), cu_seqlens, max_seqlen)


def conv_rows(tower: nn.Module, chunks: torch.Tensor) -> torch.Tensor:
    """The tower's convolutions and positions on chunks [C, 1, mel, 2 * n_window] -> their rows flat
    [C * rows-a-chunk, d_model] (each chunk on its own)."""
    x = chunks
    for conv in (tower.conv2d1, tower.conv2d2, tower.conv2d3):
        x = F.gelu(conv(x))
    c, channels, freq, steps = x.shape
    x = tower.conv_out(x.permute(0, 3, 1, 2).contiguous().view(c, steps, channels * freq))
    x = x + tower.positional_embedding.positional_embedding[:steps].to(x.dtype)
    return x.reshape(-1, x.shape[-1])


def tower_layers(tower: nn.Module, hidden: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """The tower's Transformer layers in their windows, then its final norm."""
    for layer in tower.layers:
        hidden = layer(hidden, cu_seqlens, max_seqlen=max_seqlen)[0]
    return tower.ln_post(hidden)


def window_lengths(counts: list[int], window: int) -> list[int]:
    """The attention windows' lengths in rows, utterance after utterance: each utterance of ``count`` rows cut into
    windows of ``window`` rows and a shorter last one."""
    out = []
    for count in counts:
        whole, rest = divmod(count, window) if window else (0, 0)
        out += [window] * whole + ([rest] if rest else [])
    return out


def _window(counts: list[int], config, full: bool = False) -> int:
    """transformers' attention window in rows: the longest chunk's rows (a full chunk's unless every utterance is
    shorter; ``full``: a full chunk's) times the chunks in an inference window."""
    per_chunk = rows_after_convs(2 * config.n_window)
    longest = per_chunk if full else min(per_chunk, max(counts, default=0))
    return longest * (config.n_window_infer // (2 * config.n_window))


def static_windows(counts: list[int], slots: int, room: int, config) -> torch.Tensor:
    """``audio_windows``'s cu_seqlens for a static layout of ``slots`` rows (int32, on the host): the real
    windows, the padding rows after them in windows of at most a full window, then zero-length windows (the
    last offset repeated) up to 2 * ceil(slots / full window) + ``room`` + 1 windows, more than any layout of
    ``slots`` rows and at most ``room`` utterances has. None longer than a full window (``_window(full=True)``):
    the graph's fixed max_seqlen."""
    full, window = _window(counts, config, full=True), _window(counts, config)
    if len(counts) > room:
        raise ValueError(f"{len(counts)} utterances do not fit a static layout of {room}")
    bounds = [0, *window_lengths(counts, window)]
    pad = slots - sum(bounds)
    bounds += [full] * (pad // full) + ([pad % full] if pad % full else [])
    bounds += [0] * (2 * -(-slots // full) + room + 2 - len(bounds))
    return torch.tensor(bounds, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def hf_config(cfg: ModelConfig):
    """The transformers Qwen3ASRConfig: model.llm.path's config.json, or model.llm.config (model_type qwen3_asr)."""
    from ...models.build import llm_hf_config

    llm = cfg.llm
    if not llm.path and llm.config.get("model_type") != "qwen3_asr":
        raise ConfigError("model.llm.config: model.family=qwen3_asr needs model_type: qwen3_asr (with audio_config "
                          "and text_config), or model.llm.path (a transformers Qwen3-ASR folder)")
    c = llm_hf_config(llm)
    if c.model_type != "qwen3_asr":
        raise ConfigError(f"model.llm.path={llm.path}: a {c.model_type} folder, not a transformers Qwen3-ASR (qwen3_asr)")
    return c


def build_qwen3_asr(cfg: ModelConfig, device: torch.device | str | None = None) -> Qwen3ASR:
    """Seeded random initialisation from the config (transformers' own init), or a local folder's weights
    (transformers' from_pretrained: its key conversions apply); then LoRA adapters, model.init, activation
    checkpointing, as for every family (brisk.models.build)."""
    from transformers import Qwen3ASRForConditionalGeneration

    from ...models.build import after_loading, with_adapters, load_weights
    from ...models.kernel_router import without_kernel_router

    config = hf_config(cfg)
    torch.manual_seed(cfg.seed)
    folder = Path(cfg.llm.path) if cfg.llm.path else None
    if folder is not None and cfg.llm.load_weights and any(folder.glob("*.safetensors")):
        # no device_map: transformers needs accelerate for it; the fp32 copy is moved once instead
        hf = Qwen3ASRForConditionalGeneration.from_pretrained(folder, config=config, local_files_only=True,
                                                              dtype=torch.float32)
        hf = hf.to(device) if device is not None else hf
        log.info("loaded Qwen3-ASR weights from %s", folder)
    else:
        with torch.device(device or "cpu"):
            hf = Qwen3ASRForConditionalGeneration(config)
    without_kernel_router(hf)
    model = with_adapters(Qwen3ASR(cfg, hf), cfg)
    if cfg.init:
        load_weights(model, Path(cfg.init))
    return after_loading(model, cfg)


# ------------------------------------------------------------------------------------------ export
def write_qwen3_asr_hf(model, cfg, state: dict[str, torch.Tensor], out: Path, dtype: str, tokenizer) -> None:
    """transformers' Qwen3ASRForConditionalGeneration folder: config.json, model.safetensors and the processor
    (tokenizer, feature extractor, chat template) of data.tokenizer (or model.llm.path)."""
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    from ...adapters.lora import is_lora_key

    if any(is_lora_key(k) for k in state):
        raise ConfigError("train.export=hf with LoRA adapters: transformers' Qwen3-ASR folder has no adapters; "
                          "merge them first or export none")
    config = model.hf_config
    config.dtype = DTYPES[dtype]
    with torch.device("meta"):
        hf = Qwen3ASRForConditionalGeneration(config)
    hf.load_state_dict(to_hf(state), strict=False, assign=True)
    hf.tie_weights()
    missing = [n for n, p in hf.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ConfigError(f"Qwen3-ASR export: no weights for {missing[:3]}")
    from transformers.utils import logging as hf_logging

    # save_pretrained's "Writing model shards" bar would put \r-redrawn lines in a piped training log
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        hf.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    AutoProcessor.from_pretrained(cfg.data.tokenizer or cfg.model.llm.path, local_files_only=True).save_pretrained(out)


def folder_overrides(path: Path) -> list[str]:
    """A transformers Qwen3-ASR folder (its export, or the released model) to load: weights, config and processor
    from the folder, and the LLM dtype its brisk.json recorded."""
    import json

    from ...formats.brisk_keys import read_keys_file

    found = read_keys_file(path) or {"keys": {}}
    keys = {k: v for k, v in found["keys"].items() if k.startswith("model.llm.")}
    return ["model.family=qwen3_asr", "train.export=hf", f"model.llm.path={path}", f"data.tokenizer={path}",
            *(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in keys.items())]


def write_readme(out: Path, fmt: str, dtype: str, cfg) -> None:
    (out / "README.md").write_text(f"""# Qwen3-ASR fine-tuned by brisk (model.family: qwen3_asr)

Load with transformers >= 5.17 (it has Qwen3-ASR): `Qwen3ASRForConditionalGeneration.from_pretrained("<this folder>")` and
`AutoProcessor.from_pretrained("<this folder>")`; brisk loads it back with `model.llm.path=<this folder>`.
Weights: `model.safetensors` ({dtype}). The prompt brisk trained on is the processor's chat template with an
empty system turn and the audio turn, then `language <Name><asr_text>` and the transcript, ended by the
tokenizer's eos token (as QwenLM/Qwen3-ASR's finetuning/qwen3_asr_sft.py trains).
""", encoding="utf-8")
