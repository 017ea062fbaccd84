"""A causal LM's data: chat jsonl, parquet or datasets folders, tokenised once into the cache with assistant-only
labels."""

from __future__ import annotations

from ...config import Config, ConfigError
from ..registry import section
from ...data.loader import cache_dir, load_tokenizer

def chat_prepare(cfg: Config, which: str, path: str, tokenizer=None):
    """A causal LM's data (jsonl, parquet, datasets folders), tokenised once into the cache (its ``prepare``)."""
    from ...data.chat_store import build_chat_store

    d, own = cfg.data, section(cfg)
    return build_chat_store(path, tokenizer if tokenizer is not None else load_tokenizer(cfg),
                            max_len=own.max_len, overlong=own.overlong, skip_bad=d.skip_bad,
                            cache_dir=cache_dir(cfg), split=d.train_split if which == "train" else d.valid_split,
                            template_path=own.chat_template, workers=d.prepare_workers, what=f"data.{which}")


def chat_dataset(cfg: Config, which: str, path: str | None, vocab_size: int, tokenizer=None, prepared=None):
    """A causal LM's split: chat data with assistant-only labels (the family's ``dataset``)."""
    if not path:
        if which == "train":
            raise ConfigError("data.train: give chat data: a jsonl, parquet files (a file, folder or glob) or a "
                              "datasets save_to_disk folder, with 'messages' or 'prompt' + 'completion'")
        return None
    dataset = prepared if prepared is not None else chat_prepare(cfg, which, path, tokenizer)
    return dataset, dataset.bad_first, dict(dataset.counts)


def graph_examples(cfg, collator, vocab: int, max_tokens: int) -> list:
    """One batch per packed bucket up to ``max_tokens``, of exactly the bucket's length, in the collator's static
    shapes (aligned to fla's chunks where the collator aligns), for capturing the step graphs before training (the
    family's ``graph_examples``): one conversation of random tokens, labelled after a short prompt."""
    from ...data.collate import example_rows
    from ...data.dataset import Sample
    from ...data.prompt import Tokens

    prefix = 8
    return [collator([Sample(f"graph_example_{len(ids)}", [], Tokens(ids, [-100] * prefix + ids[prefix:]))])
            for ids in example_rows(cfg.speed.pack_buckets, vocab, max_tokens)]
