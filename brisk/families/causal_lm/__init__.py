"""A plain causal LM (Qwen3, the hybrid Qwen3.5) on chat data with assistant-only labels; its folder is the LLM's
own ``save_pretrained``.

This package holds all of it: model.py (ChatLM and its builder), data.py (chat jsonl, parquet, datasets folders),
eval.py (`brisk eval` of a chat model) and export.py. This module is its spec: the plan reads it before torch is
imported, so each part below imports its module when first called."""

from __future__ import annotations

from dataclasses import dataclass

from ...keys import key
from ...errors import ConfigError
from ..registry import Family, FamilyRule, register


@dataclass
class CausalLMConfig:
    """A causal LM's own keys (the ``causal_lm:`` section): how a conversation becomes tokens and labels."""

    max_len: int = key(2048, "tokens of one conversation at most (see causal_lm.overlong)", inference=True)
    overlong: str = key("truncate", "a conversation over causal_lm.max_len is truncated (its end dropped) or skipped",
                        inference=True)
    chat_template: str | None = key(None, "a jinja chat template with {% generation %} markers; none: the "
                                    "tokenizer's own, or the training twin of a known one", path="in",
                                    exported="chat_template_training.jinja")

    def __post_init__(self):
        if self.overlong not in ("truncate", "skip"):
            raise ConfigError(f"causal_lm.overlong={self.overlong!r}: use truncate or skip")
        if self.max_len < 2:
            raise ConfigError(f"causal_lm.max_len={self.max_len}: must be at least 2 tokens")


def build(cfg, device=None):
    from .model import build_chat_model

    return build_chat_model(cfg.model, device)


def dataset(cfg, which, path, vocab_size, tokenizer=None, prepared=None):
    from .data import chat_dataset

    return chat_dataset(cfg, which, path, vocab_size, tokenizer, prepared)


def prepare(cfg, which, path, tokenizer=None):
    from .data import chat_prepare

    return chat_prepare(cfg, which, path, tokenizer)


def write_hf(model, cfg, state, out, dtype, tokenizer):
    from .export import write_chat_hf

    write_chat_hf(model, cfg, state, out, dtype, tokenizer)


def readme(out, fmt, dtype, cfg):
    from .export import write_chat_readme

    write_chat_readme(out, fmt, dtype, cfg)


def eval_main(args, cfg, model, tokenizer, weights, device):
    from .eval import chat_eval_main

    return chat_eval_main(args, cfg, model, tokenizer, weights, device)


def graph_examples(cfg, collator, vocab, max_tokens):
    from .data import graph_examples

    return graph_examples(cfg, collator, vocab, max_tokens)


def folder_overrides(folder):
    from .export import folder_overrides

    return folder_overrides(folder)


FAMILY = register(Family(
    name="causal_lm",
    summary="a causal LM on chat jsonl (assistant-only loss)",
    switches=frozenset({"compile", "fuse_projections", "packing", "label_head", "sdpa_backends", "fused_adamw", "tf32",
                        "linear_attention_batched", "fla_kernels", "fla_gated_norm", "liger", "liger_loss",
                        "optimizer_in_backward", "cuda_graph", "fresh_grads", "float8"}),
    # linear_attention_batched: the Gated DeltaNet path where fla is left off; fla_gated_norm joined when it paid
    # on the hybrid's step
    presets={"fast": {"packing": True, "fused_adamw": True, "label_head": True, "fla_kernels": True,
                      "linear_attention_batched": True, "fla_gated_norm": True}},
    labelled="assistant",
    refused=("model.family={family}: {bad} act on the audio path or the speech decoder's FlexAttention; set them "
             "false (it takes {takes})"),
    rules=(
        FamilyRule("model.family, model.encoder.activation_checkpoint", lambda c: c.model.encoder.activation_checkpoint,
                   "model.encoder.activation_checkpoint recomputes the speech encoder's blocks; a causal LM has "
                   "no encoder (model.llm.activation_checkpoint recomputes its decoder layers)"),
        FamilyRule("model.family, model.path", lambda c: c.model.path,
                   "model.path is a speech-LLM folder; with model.family=causal_lm give the causal LM's folder as "
                   "model.llm.path (or model.llm.config for a random one)"),
        FamilyRule("model.family, data.profile", lambda c: c.data.profile,
                   "data.profile makes synthetic speech batches; with model.family=causal_lm give data.train "
                   "(chat data)"),
    ),
    build=build,
    dataset=dataset,
    prepare=prepare,
    exporters={"hf": write_hf},
    readme=readme,
    eval_main=eval_main,
    folder_types=("*",),  # any transformers causal LM folder (a chat run's export is one)
    folder_overrides=folder_overrides,
    graph_examples=graph_examples,
    config=CausalLMConfig,
))
