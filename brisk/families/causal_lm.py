"""A plain causal LM (Qwen3, the hybrid Qwen3.5) on chat jsonl with assistant-only labels (the old
``task: chat``). Its model is brisk.models.causal_lm.ChatLM; its folder is the LLM's own ``save_pretrained``."""

from __future__ import annotations

from .registry import Family, FamilyRule, Ref, register

FAMILY = register(Family(
    name="causal_lm",
    summary="a causal LM on chat jsonl (assistant-only loss)",
    task="chat",
    switches=frozenset({"compile", "fuse_projections", "packing", "label_head", "sdpa_backends", "fused_adamw", "tf32",
                        "linear_attention_batched", "fla_kernels", "fla_gated_norm", "liger", "liger_loss",
                        "optimizer_in_backward"}),
    # linear_attention_batched: the Gated DeltaNet path where fla is left off; fla_gated_norm joined when it paid
    # on the hybrid's step
    presets={"fast": {"packing": True, "fused_adamw": True, "label_head": True, "fla_kernels": True,
                      "linear_attention_batched": True, "fla_gated_norm": True}},
    labelled="assistant",
    refused=("task chat: {bad} act on the audio path or the speech fast path (its graphs, its decoder's "
             "FlexAttention); set them false "
             "(model.family={family} takes {takes})"),
    rules=(
        FamilyRule("model.family, model.encoder.activation_checkpoint", lambda c: c.model.encoder.activation_checkpoint,
                   "model.encoder.activation_checkpoint recomputes the speech encoder's blocks; a task: chat model has "
                   "no encoder (model.llm.activation_checkpoint recomputes its decoder layers)"),
        FamilyRule("model.family, model.path", lambda c: c.model.path,
                   "model.path is a speech-LLM folder; with task: chat give the causal LM's folder as model.llm.path "
                   "(or model.llm.config for a random one)"),
        FamilyRule("model.family, data.profile", lambda c: c.data.profile,
                   "data.profile makes synthetic speech batches; with task: chat give data.train (chat jsonl)"),
    ),
    build=Ref("brisk.models.build:build_chat_model"),
    dataset=Ref("brisk.data.loader:chat_dataset"),
    prepare=Ref("brisk.data.loader:chat_prepare"),
    exporters={"hf": Ref("brisk.models.chat_export:write_chat_hf")},
    readme=Ref("brisk.models.chat_export:write_chat_readme"),
    eval_main=Ref("brisk.eval.chat_eval:chat_eval_main"),
    folder_types=("*",),  # any transformers causal LM folder (a chat run's export is one)
    folder_overrides=Ref("brisk.models.chat_export:folder_overrides"),
))
