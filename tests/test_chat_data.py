"""task: chat data: assistant-only labels equal TRL's SFTTrainer's (its own code path), truncation and skipping
with counts, file:line errors, and the collator's padded and packed layouts for text-only samples."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from brisk.config import ConfigError, load_config
from brisk.data.chat import training_template
from brisk.data.chat_store import build_chat_store
from brisk.data.collate import Collator
from brisk.formats.batch import Batch
from brisk.data.jsonl import DataError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "chat_demo"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(DEMO / "tokenizer"), local_files_only=True)


def conversations() -> list[list[dict]]:
    rows = [json.loads(line)["messages"] for line in (DEMO / "train.jsonl").read_text().splitlines()[:40]]
    # multi-turn with a system turn, and one whose answers hold newlines
    rows.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "count: dog cat"},
                 {"role": "assistant", "content": "two"}, {"role": "user", "content": "first: sun moon"},
                 {"role": "assistant", "content": "sun\nand moon"}])
    return rows


def store(path, tok, tmp: Path, **kw):
    """The chat data as training reads it, in a cache of its own under ``tmp`` (a cache keeps one entry a file:
    another max_len would replace this one's)."""
    return build_chat_store(str(path), tok, cache_dir=tempfile.mkdtemp(dir=tmp), **kw)


def write(tmp: Path, rows: list) -> Path:
    path = tmp / "chat.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps({"messages": r})) + "\n" for r in rows))
    return path


def trl_labels(tok, rows: list[list[dict]], max_length: int) -> dict[str, list[int]]:
    """TRL's SFTTrainer preparing the data set as its users run it (assistant_only_loss, max_length)."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen3", vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8))
    args = trl.SFTConfig(output_dir=tempfile.mkdtemp(), assistant_only_loss=True, max_length=max_length,
                         report_to=[], use_cpu=True)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(
        [{"messages": r} for r in rows]), processing_class=tok)
    return {json.dumps(ex["messages"]): ex["labels"] for ex in trainer.train_dataset}


@pytest.mark.parametrize("max_len", [4096, 40])
def test_labels_equal_trl(tok, tmp_path, max_len):
    rows = conversations()
    ds = store(write(tmp_path, rows), tok, tmp_path, max_len=max_len, overlong="truncate", skip_bad=False)
    theirs = trl_labels(tok, rows, max_len)
    ours = {}
    for i, key in enumerate(ds.keys):
        ours[json.dumps(rows[int(key.rsplit(":", 1)[1]) - 1])] = ds.tokens(i).labels
    assert len(ours) == len(theirs) == len(rows) - ds.counts["unlabelled"]
    assert ours == theirs
    assert (ds.counts["truncated"] > 0) == (max_len == 40)
    labelled = sum(x != -100 for i in range(len(ds)) for x in ds.tokens(i).labels)
    assert 0 < labelled < sum(ds.lengths())


def test_known_template_swapped_for_training_twin(tok):
    assert "{% generation %}" not in tok.chat_template and "generation" in training_template(tok)


def test_overlong_skip_counts(tok, tmp_path):
    rows = conversations()
    path = str(write(tmp_path, rows))
    ds = store(path, tok, tmp_path, max_len=40, overlong="skip", skip_bad=False)
    full = store(path, tok, tmp_path, max_len=4096, overlong="skip", skip_bad=False)
    assert ds.counts["skipped"] == sum(n > 40 for n in full.lengths()) > 0
    assert len(ds) == len(rows) - ds.counts["skipped"] and max(ds.lengths()) <= 40


def test_bad_line_names_file_and_line(tok, tmp_path):
    rows = conversations()[:3] + ['{"messages": [{"role": "user", "content": "hi"}]}', "not json"]
    path = write(tmp_path, rows)
    with pytest.raises(DataError, match=rf"{path}:4: no assistant message.*skip_bad"):
        store(path, tok, tmp_path, max_len=512, overlong="truncate", skip_bad=False)
    ds = store(path, tok, tmp_path, max_len=512, overlong="truncate", skip_bad=True)
    assert len(ds) == 3 and ds.counts["bad_rows"] == 2 and ds.bad_first[1].startswith(f"{path}:5: not valid JSON")


def test_collated_layouts(tok, tmp_path):
    ds = store(write(tmp_path, conversations()[:5]), tok, tmp_path, max_len=512, overlong="truncate", skip_bad=False)
    samples = [ds[i] for i in range(5)]
    padded = Collator()(samples)
    packed = Collator(packed=True, token_buckets=(256, 512))(samples)
    assert type(padded) is Batch and type(packed) is Batch  # a text family's batch is the shared core alone
    assert padded.n_tokens == packed.n_tokens == sum(ds.lengths()[:5])
    assert packed.input_ids.shape == (1, 512) and packed.cu_seqlens.tolist()[:6] == [0, *torch.tensor(ds.lengths()[:5]).cumsum(0).tolist()]
    flat = padded.labels[padded.attention_mask.bool()]
    assert torch.equal(flat, packed.labels[0, :packed.n_tokens])


def test_config_rules():
    with pytest.raises(ConfigError, match="train.export=funasr"):
        load_config(ROOT / "configs" / "sft_demo.yaml", ["train.export=funasr"])
    with pytest.raises(ConfigError, match="causal_lm.overlong"):
        load_config(ROOT / "configs" / "sft_demo.yaml", ["causal_lm.overlong=cut"])
    with pytest.raises(ConfigError, match="task: vision is no longer read"):
        load_config(ROOT / "configs" / "sft_demo.yaml", ["task=vision"])


@pytest.mark.parametrize("name", ["sft_qwen3_5_0p8b", "sft_qwen3_5_2b", "sft_qwen3_5_9b", "sft_qwen3_5_27b",
                                  "sft_qwen3_5_27b_lora", "sft_qwen3_1p7b", "sft_qwen3_8b"])
def test_sft_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.model.family == "causal_lm" and cfg.train.export == "hf" and cfg.model.llm.dtype == "bf16"
    assert (cfg.train.parallel == "fsdp") == name.endswith("27b")


def test_static_packed_text_batches_pad_to_a_common_shape(tok, tmp_path):
    from brisk.data.collate import pad_static, static_needs

    ds = store(write(tmp_path, conversations()[:4]), tok, tmp_path, max_len=512, overlong="truncate", skip_bad=False)
    batch = Collator(packed=True, token_buckets=(256, 512), pad_utts=6, static=True)([ds[i] for i in range(3)])
    need = static_needs(batch)
    assert need[1:3] == [0, 0] and need[3] == 8
    grown = pad_static(batch, 1024, 0, 0, 10)
    assert grown.input_ids.shape == (1, 1024) and type(grown) is Batch and grown.cu_seqlens.numel() == 10
    assert torch.equal(grown.labels[0, : batch.input_ids.shape[1]], batch.labels[0])
