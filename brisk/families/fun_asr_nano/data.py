"""Fun-ASR-Nano's data: FunASR jsonl indexed and checked once (``prepare``), its samples with FunASR's prompt,
labels and fbank + LFR features (``dataset``), and a synthetic batch per bucket for capturing graphs up front."""

from __future__ import annotations

from ...config import Config, ConfigError
from ...data.context import ContextPrompt
from ...data.loader import cache_dir, load_tokenizer
from ...data.prompt import PromptBuilder
from ..registry import section
from .dataset import SpeechDataset, SyntheticDataset, read_profile

def speech_prepare(cfg: Config, which: str, path: str, tokenizer=None):
    """A FunASR jsonl indexed once, every line and audio file checked (Fun-ASR-Nano's ``prepare``)."""
    from ...data.speech_index import build_speech_index

    d = cfg.data
    return build_speech_index(path, max_speech_length=d.max_speech_length, max_text_length=d.max_text_length,
                              skip_bad=d.skip_bad, cache_dir=cache_dir(cfg), check_audio=d.check_audio,
                              workers=d.prepare_workers, what=f"data.{which}")


def speech_dataset(cfg: Config, which: str, path: str | None, vocab_size: int, tokenizer=None, prepared=None):
    """Fun-ASR-Nano's split: FunASR jsonl (FunASR's prompt and labels, fbank + LFR), or synthetic batches of a
    length profile (the family's ``dataset``)."""
    d, own = cfg.data, section(cfg)
    skipped: list[str] = []
    counts: dict[str, int] = {}
    if path:
        index = prepared if prepared is not None else speech_prepare(cfg, which, path, tokenizer)
        skipped = index.skipped
        counts = {"bad_lines": len(skipped), "suspect_lines": index.meta["suspects"],
                  "missing_audio": index.meta["audio_missing"]}
        builder = PromptBuilder(tokenizer if tokenizer is not None else load_tokenizer(cfg), sys_prompt=d.sys_prompt,
                                do_think=d.do_think, multiturn_max=d.multiturn_max, max_token_length=d.max_token_length,
                                use_low_frame_rate=own.adaptor.use_low_frame_rate,
                                context=ContextPrompt(d.prompt_class, d.prompt_conf) if d.prompt_class else None)
        dataset = SpeechDataset(index.utterances, own.frontend, builder, seed=cfg.train.seed,
                                skip_bad=d.skip_bad, max_speech_length=d.max_speech_length)
    elif which == "train" and d.profile:
        fe = own.frontend
        dataset = SyntheticDataset(read_profile(d.profile), fe.n_mels * fe.lfr_m, vocab_size, fe.lfr_n,
                                   seed=cfg.train.seed, use_low_frame_rate=own.adaptor.use_low_frame_rate)
    else:
        if which == "train":
            raise ConfigError("data.train: give a FunASR jsonl (or data.profile for synthetic batches)")
        return None
    return dataset, skipped, counts


def graph_examples(cfg, collator, vocab: int, max_tokens: int) -> list:
    """One synthetic batch per packed bucket up to ``max_tokens`` of exactly the bucket's length, then one per
    speech bucket, in the collator's static shapes: Fun-ASR-Nano's ``graph_examples``, so that every step graph
    and every encoder graph is captured before training."""
    own = section(cfg)
    fe = own.frontend
    dim, low = fe.n_mels * fe.lfr_m, own.adaptor.use_low_frame_rate
    out = []
    # One sample of exactly t tokens lands in bucket t (a shorter one would fall into a smaller bucket and
    # leave bucket t to be captured, and compiled, in the middle of training).
    fixed = len(SyntheticDataset([(600, 0)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)[0].tokens.input_ids)
    for t in cfg.speed.pack_buckets:
        if t > max_tokens:
            break
        ds = SyntheticDataset([(600, max(0, t - fixed))], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    for f in cfg.speed.speech_buckets:  # also every speech bucket, so encoder graphs exist up front
        ds = SyntheticDataset([(max(1, f * fe.lfr_n - 1), 4)], dim, vocab, fe.lfr_n, use_low_frame_rate=low)
        out.append(collator([ds[0]]))
    return out
