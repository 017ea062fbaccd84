"""The data section: which files, how they are batched and checked, and the batch budget sized to the GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..keys import key


@dataclass
class AutoBatchConfig:
    """Batches sized to the GPU: trial steps at start-up measure peak memory (NeMo's OOMptimizer idea)."""

    enabled: bool = key(False, "at start-up, pick the largest candidate data.batch_tokens whose trial step fits the "
                        "memory target (CUDA; cached)")
    memory_frac: float = key(0.85, "the target: peak allocated memory of a trial step, as a fraction of the GPU's "
                             "total memory")
    candidates: list[int] = key(factory=lambda: [2000, 3000, 4000, 6000, 8000, 12000, 16000, 24000, 32000, 48000, 64000],
                                help="data.batch_tokens values tried (data.max_utts scales with them)")
    trial_batches: int = key(16, "batches of each candidate looked at; the one with the most LLM tokens is the trial "
                             "step")
    cache: str | None = key(None, "json file of found budgets per (model, GPU, switches); none: "
                            "~/.cache/brisk/autobatch.json", path="out")

    def __post_init__(self):
        if not 0 < self.memory_frac <= 1:
            raise ConfigError(f"data.auto_batch.memory_frac={self.memory_frac}: use a fraction in (0, 1], for example 0.85")
        if not self.candidates or sorted(self.candidates) != self.candidates or self.candidates[0] < 1:
            raise ConfigError(f"data.auto_batch.candidates={self.candidates}: give positive budgets, sorted ascending")
        if self.trial_batches < 1:
            raise ConfigError(f"data.auto_batch.trial_batches={self.trial_batches}: use 1 or more")


@dataclass
class DataConfig:
    train: str | None = key(None, "FunASR jsonl; causal_lm: a jsonl, parquet file / folder / glob, or datasets "
                            "save_to_disk folder", path="in", resume="refused")
    valid: str | None = key(None, "the same, for validation; none: no validation", path="in")
    tokenizer: str | None = key(None, "a tokenizer folder; defaults to model.llm.path", path="in", resume="refused")
    profile: str | None = key(None, "a length profile (speech_length/text_length jsonl) for synthetic batches",
                              path="in", resume="refused")
    batch_tokens: int = key(6000, "budget on padded (speech_length + text_length), FunASR's batch_size")
    max_utts: int = key(10, "utterances a batch at most")
    sort_size: int = key(1024, "utterances sorted by length together before batching")
    shuffle: bool = key(True, "shuffle the batches every epoch (fixed seed)")
    num_workers: int = key(2, "DataLoader worker processes (0: load in the training process)")
    pin_memory: bool = key(True, "pinned host memory for faster copies to the GPU")
    max_speech_length: int = key(8000, "10 ms frames; longer utterances are bad input")
    max_text_length: int = key(2048, "tokens")
    max_token_length: int = key(1500, "LLM tokens of one utterance's prompt + answer", inference=True, resume="refused")
    skip_bad: bool = key(False, "skip (and count) malformed lines and unreadable audio instead of stopping")
    sys_prompt: bool = key(True, "FunASR dataset_conf.sys_prompt", inference=True, resume="refused")
    do_think: bool = key(True, "FunASR dataset_conf.do_think: False appends an empty <think></think>", inference=True,
                         resume="refused")
    multiturn_max: int = key(5, "FunASR dataset_conf.multiturn_num_max: turns kept of a multi-turn sample",
                              inference=True, resume="refused")
    # FunASR dataset_conf.prompt_classes / prompt_conf, read from model.path's folder (the real Fun-ASR-Nano-2512
    # config.yaml sets MultiContextPrompt): a context header before the first user prompt.
    prompt_class: str | None = key(None, "MultiContextPrompt (FunASR's context header) or null (no header)",
                                    inference=True, resume="refused")
    prompt_conf: dict = key(factory=dict, help="FunASR prompt_conf: use_hotwords, use_hist, ... (see docs/export.md)",
                             inference=True, resume="refused")
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)
    train_split: str | None = key(None, "a split of data.train where its layout has splits (train_sft of "
                                  "ultrachat_200k's parquet folder, a DatasetDict folder)")
    valid_split: str | None = key(None, "a split of data.valid (test_sft); data.valid may be the same folder as "
                                  "data.train")
    cache_dir: str | None = key(None, "prepared data (tokenised chats, indexed speech lists), reused by later runs; "
                                "none: .brisk-cache beside train.output_dir")
    prepare_workers: int = key(0, "processes that tokenise / index the data the first time; 0: one a CPU core")
    check_audio: bool = key(True, "stat every audio file of a speech list once, when it is indexed; false: the list is "
                            "known good (logged)")

    def __post_init__(self):
        if self.prompt_class not in (None, "MultiContextPrompt"):
            raise ConfigError(f"data.prompt_class={self.prompt_class!r}: brisk reproduces MultiContextPrompt (or null: no header)")
        if self.prepare_workers < 0:
            raise ConfigError(f"data.prepare_workers={self.prepare_workers}: use 0 (one a CPU core) or a count")
        for k in ("batch_tokens", "max_utts", "sort_size"):
            if getattr(self, k) < 1:
                raise ConfigError(f"data.{k}={getattr(self, k)}: must be at least 1")


