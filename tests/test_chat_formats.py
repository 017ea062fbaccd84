"""Chat data as users have it: parquet files, folders with splits, globs, datasets save_to_disk folders, and TRL's
conversational prompt/completion format; labels equal TRL 1.16's SFTTrainer's own preparation; bad rows named
by file:row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from brisk.data.chat_store import build_chat_store
from brisk.errors import DataError

from .test_chat_data import DEMO, conversations, trl_labels

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(DEMO / "tokenizer"), local_files_only=True)


def ultrachat_rows(rows: list[list[dict]], start: int = 0) -> list[dict]:
    """ultrachat_200k's columns: prompt (the first user turn), prompt_id, messages."""
    return [{"prompt": m[0]["content"] if m[0]["role"] == "user" else m[1]["content"], "prompt_id": f"id{start + i:05d}",
             "messages": m} for i, m in enumerate(rows)]


def write_parquet(path: Path, rows: list[dict], row_group_size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def store(path, tok, tmp_path, **kw):
    kw = {"max_len": 4096, "overlong": "truncate", "skip_bad": False, "cache_dir": tmp_path / "cache", "workers": 1,
          **kw}
    return build_chat_store(str(path), tok, **kw)


def labels_by_text(ds, rows_of_key) -> dict[str, list[int]]:
    return {json.dumps(rows_of_key[k]): ds.tokens(i).labels for i, k in enumerate(ds.keys)}


@pytest.mark.parametrize("max_len", [4096, 40])
def test_parquet_shards_with_splits_equal_trl(tok, tmp_path, max_len):
    rows = conversations()
    folder = tmp_path / "ultrachat_200k" / "data"  # the hub's layout
    write_parquet(folder / "train_sft-00000-of-00002-abc.parquet", ultrachat_rows(rows[:20]))
    write_parquet(folder / "train_sft-00001-of-00002-abc.parquet", ultrachat_rows(rows[20:], 20))
    write_parquet(folder / "test_sft-00000-of-00001-abc.parquet", ultrachat_rows(rows[:3], 900))
    (folder.parent / "README.md").write_text("card")
    ds = store(folder.parent, tok, tmp_path, split="train_sft", max_len=max_len, workers=2)
    theirs = trl_labels(tok, rows, max_len)
    by_key = {f"id{i:05d}": r for i, r in enumerate(rows)}
    assert labels_by_text(ds, by_key) == theirs
    assert len(ds) == len(rows) - ds.counts["unlabelled"] and (ds.counts["truncated"] > 0) == (max_len == 40)
    assert len(store(folder, tok, tmp_path, split="test_sft")) == 3
    with pytest.raises(DataError, match="holds splits test_sft, train_sft; pick one with data.train_split"):
        store(folder, tok, tmp_path)
    with pytest.raises(DataError, match="no split 'train'"):
        store(folder, tok, tmp_path, split="train")


def test_glob_and_single_file(tok, tmp_path):
    rows = conversations()
    for i in range(3):
        write_parquet(tmp_path / f"part{i}.parquet", ultrachat_rows(rows[i * 10:(i + 1) * 10], i * 10))
    ds = store(tmp_path / "part*.parquet", tok, tmp_path)
    assert len(ds) == 30 and ds.keys == [f"id{i:05d}" for i in range(30)]
    one = store(tmp_path / "part1.parquet", tok, tmp_path)
    assert one.keys == [f"id{i:05d}" for i in range(10, 20)]
    assert one.tokens(3).input_ids == ds.tokens(13).input_ids
    with pytest.raises(DataError, match="matches no files"):
        store(tmp_path / "nothing*.parquet", tok, tmp_path)
    with pytest.raises(DataError, match="a pattern names its files itself"):
        store(tmp_path / "part*.parquet", tok, tmp_path, split="train")


def test_datasets_save_to_disk(tok, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = conversations()
    dd = datasets.DatasetDict({"train_sft": datasets.Dataset.from_list(ultrachat_rows(rows)),
                               "test_sft": datasets.Dataset.from_list(ultrachat_rows(rows[:5], 100))})
    dd.save_to_disk(str(tmp_path / "dd"))
    dd["train_sft"].save_to_disk(str(tmp_path / "one"))
    ds = store(tmp_path / "dd", tok, tmp_path, split="train_sft")
    assert labels_by_text(ds, {f"id{i:05d}": r for i, r in enumerate(rows)}) == trl_labels(tok, rows, 4096)
    assert len(store(tmp_path / "dd", tok, tmp_path, split="test_sft")) == 5
    assert store(tmp_path / "one", tok, tmp_path).keys == ds.keys
    with pytest.raises(DataError, match="DatasetDict with splits"):
        store(tmp_path / "dd", tok, tmp_path)


def prompt_completion_rows() -> list[dict]:
    out = []
    for m in conversations():
        # the last assistant turn is the completion; everything before it the prompt (multi-turn prompts too)
        out.append({"prompt": m[:-1], "completion": m[-1:]})
    out.append({"prompt": [{"role": "user", "content": "count: dog cat"}],
                "completion": [{"role": "assistant", "content": "two"}, {"role": "user", "content": "and?"},
                               {"role": "assistant", "content": "done"}]})
    return out


def trl_prompt_completion_labels(tok, rows: list[dict], max_length: int) -> dict[str, list[int]]:
    """TRL's SFTTrainer on a prompt/completion set with its defaults (completion_only_loss)."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen3", vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8))
    args = trl.SFTConfig(output_dir=tempfile.mkdtemp(), max_length=max_length, report_to=[], use_cpu=True)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=tok)
    return {json.dumps(ex["prompt"] + ex["completion"]): ex["labels"] for ex in trainer.train_dataset}


@pytest.mark.parametrize("max_len", [4096, 30])
def test_prompt_completion_equals_trl(tok, tmp_path, max_len):
    rows = prompt_completion_rows()
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps({"key": f"k{i}", **r}) + "\n" for i, r in enumerate(rows)))
    ds = store(path, tok, tmp_path, max_len=max_len)
    theirs = trl_prompt_completion_labels(tok, rows, max_len)
    by_key = {f"k{i}": r["prompt"] + r["completion"] for i, r in enumerate(rows)}
    assert labels_by_text(ds, by_key) == theirs
    assert len(ds) == len(rows) - ds.counts["unlabelled"]
    first = ds.tokens(0)
    assert first.labels[0] == -100 and first.labels[-1] != -100  # the prompt unlabelled, the completion labelled
    # the same rows from parquet give the same tokens
    pq_ds = store(write_parquet(tmp_path / "pc.parquet", [{"key": f"k{i}", **r} for i, r in enumerate(rows)]), tok,
                  tmp_path, max_len=max_len)
    assert [pq_ds.tokens(i).labels for i in range(len(pq_ds))] == [ds.tokens(i).labels for i in range(len(ds))]


def test_bad_rows_name_file_and_row(tok, tmp_path):
    rows = ultrachat_rows(conversations()[:6])
    rows[4] = {**rows[4], "messages": [{"role": "user", "content": "hi"}]}
    path = write_parquet(tmp_path / "bad.parquet", rows, row_group_size=2)
    with pytest.raises(DataError, match=rf"{path}:row 4: no assistant message.*skip_bad"):
        store(path, tok, tmp_path)
    ds = store(path, tok, tmp_path, skip_bad=True)
    assert len(ds) == 5 and ds.counts["bad_rows"] == 1 and ds.bad_first[0].startswith(f"{path}:row 4:")
    plain = write_parquet(tmp_path / "plain.parquet", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(DataError, match=rf"{plain}:row 0: 'prompt' and 'completion' are plain text"):
        store(plain, tok, tmp_path)
    other = write_parquet(tmp_path / "other.parquet", [{"text": "a"}])
    with pytest.raises(DataError, match=rf"{other}:row 0: expected 'messages'"):
        store(other, tok, tmp_path)
    lines = tmp_path / "bad.jsonl"
    lines.write_text(json.dumps({"messages": conversations()[0]}) + "\nnot json\n")
    with pytest.raises(DataError, match=rf"{lines}:2: not valid JSON"):
        store(lines, tok, tmp_path)


def test_config_takes_a_glob_of_data_files(tmp_path):
    from brisk.config import ConfigError, load_config

    write_parquet(tmp_path / "train_sft-00000-of-00001.parquet", ultrachat_rows(conversations()[:2]))
    cfg = load_config(ROOT / "configs" / "sft_demo.yaml", [f"data.train={tmp_path}/train_sft-*.parquet"])
    assert cfg.data.train.endswith("train_sft-*.parquet")
    with pytest.raises(ConfigError, match="matches no files"):
        load_config(ROOT / "configs" / "sft_demo.yaml", [f"data.train={tmp_path}/none-*.parquet"])
