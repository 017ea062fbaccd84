"""FunASR's training prompt with the context header (dataset_conf.prompt_classes: MultiContextPrompt).

FunASR's dataset is built the way funasr/bin/train_ds.py builds it (DataloaderMapStyle from the config's
dataset/dataset_conf); brisk's from ``load_config(model.path=folder)`` alone, so the test shows whether brisk
reads the folder's dataset_conf and writes the same tokens.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil

import pytest
import yaml

from brisk.config import ConfigError, load_config
from brisk.data.collate import Collator
from brisk.data.loader import build_split

from .conftest import DEMO, REPO


def _nano_folder_tool():
    spec = importlib.util.spec_from_file_location("make_nano_folder", REPO / "tools" / "make_nano_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod



# The real Fun-ASR-Nano-2512 config.yaml's dataset_conf (tools/make_nano_folder.py keeps it), with
# data_split_num: 1 (one jsonl file, so the dataloader builds the training set at once).
DATASET_CONF = {**_nano_folder_tool().PUBLISHED_DATASET_CONF, "data_split_num": 1}
ENC = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=2, tp_blocks=1, kernel_size=11)


def write_folder(folder, qwen3_folder, tokenizer, dataset_conf: dict) -> dict:
    shutil.copytree(qwen3_folder, folder / "Qwen3-0.6B")
    tokenizer.save_pretrained(folder / "Qwen3-0.6B")
    raw = {
        "model": "FunASRNano",
        "audio_encoder": "SenseVoiceEncoderSmall",
        "audio_encoder_conf": {**ENC, "sanm_shfit": 0, "dropout_rate": 0.1, "attention_dropout_rate": 0.0, "freeze": True},
        "audio_adaptor": "Transformer",
        "audio_adaptor_conf": {"downsample_rate": 1, "use_low_frame_rate": True, "ffn_dim": 64, "llm_dim": 64,
                               "encoder_dim": 32, "n_layer": 1, "freeze": True},
        "llm": "Qwen3-0.6b",
        "llm_conf": {"hub": "hf", "freeze": True, "llm_dtype": "fp32", "init_param_path": "Qwen3-0.6B"},
        "frontend": "WavFrontend",
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6, "dither": 0.0},
        "dataset": "FunASR",
        "dataset_conf": dataset_conf,
        "tokenizer": "HuggingfaceTokenizer",
        "tokenizer_conf": {"init_param_path": "Qwen3-0.6B"},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return raw


def write_jsonl(path, task: str, n: int = 4, extra: dict | None = None):
    lines = (DEMO / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    with path.open("w", encoding="utf-8") as f:
        for i, line in enumerate(lines):
            obj = json.loads(line)
            user = obj["messages"][1]
            user["content"] = user["content"].replace("!audio/", f"!{DEMO}/audio/").replace("语音转写：", task)
            if extra and i % 2 == 0:  # half the utterances carry context, half do not
                obj.update(extra)
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def funasr_dataset(raw: dict, jsonl, tokenizer):
    """FunASR's training dataset, built as train_ds.py builds it from the folder's config."""
    import funasr.datasets.dataloader_entry  # noqa: F401  (registers DataloaderMapStyle)
    import funasr.datasets.fun_asr_datasets.datasets  # noqa: F401
    import funasr.datasets.fun_asr_datasets.multicontext_prompt  # noqa: F401
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.register import tables

    kwargs = copy.deepcopy(raw)
    kwargs.update(train_data_set_list=str(jsonl), valid_data_set_list=str(jsonl))
    # train_ds.py: kwargs["frontend"] and kwargs["tokenizer"] hold the built objects by then.
    kwargs.update(frontend=WavFrontend(**kwargs["frontend_conf"]), tokenizer=tokenizer)
    loader_class = tables.dataloader_classes.get(kwargs["dataset_conf"].get("dataloader", "DataloaderMapStyle"))
    return loader_class(**kwargs).dataset_tr


def funasr_samples(raw: dict, jsonl, tokenizer) -> list[dict]:
    ds = funasr_dataset(raw, jsonl, tokenizer)
    return [ds[i] for i in range(len(ds))]


def brisk_samples(folder, jsonl, tokenizer, overrides=()):
    cfg = load_config(None, [f"model.path={folder}", f"data.train={jsonl}", "data.num_workers=0", *overrides])
    split = build_split(cfg, "train", Collator(), vocab_size=0, tokenizer=tokenizer)
    return [split.dataset[i] for i in range(len(split.dataset))], cfg


def assert_same(ours, ref):
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.tokens.input_ids == r["input_ids"].tolist()
        assert o.tokens.labels == r["labels_ids"].tolist()
        assert [beg for beg, _ in o.tokens.audio_slots] == r["fbank_beg"].tolist()
        assert [n for _, n in o.tokens.audio_slots] == r["fake_token_len"].tolist()


CASES = {
    "chinese": ("语音转写：", {}),
    "english": ("Speech transcription:", {}),
    "no_system_prompt": ("Speech transcription:", {"sys_prompt": False, "do_think": False}),
    "context_lines": ("语音转写：", {"prompt_conf": {**DATASET_CONF["prompt_conf"], "use_hist": True}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_prompt_matches_funasr_dataset_from_folder_config(case, tmp_path, qwen3_folder, tokenizer):
    task, conf_extra = CASES[case]
    raw = write_folder(tmp_path / "folder", qwen3_folder, tokenizer, {**DATASET_CONF, **conf_extra})
    jsonl = tmp_path / "data.jsonl"
    context = {"hotwords": "black mice", "one_pass_result": "the blue box", "hist_context": "ten cars"}
    write_jsonl(jsonl, task, extra=context if case == "context_lines" else None)
    ref = funasr_samples(raw, jsonl, tokenizer)
    ours, cfg = brisk_samples(tmp_path / "folder", jsonl, tokenizer)
    assert_same(ours, ref)
    assert cfg.data.prompt_class == "MultiContextPrompt"
    # The header is there: each utterance carries ~60 more prompt tokens than a header-less prompt.
    plain, _ = brisk_samples(tmp_path / "folder", jsonl, tokenizer, ["data.prompt_class=null"])
    assert all(len(o.tokens.input_ids) > len(p.tokens.input_ids) + 20 for o, p in zip(ours, plain))


def test_header_language_follows_the_user_text(tokenizer):
    from brisk.data.context import ContextPrompt, detect_language

    assert detect_language("语音转写：") == "zh" and detect_language("Speech transcription:") == "en"
    assert detect_language("") == "zh" and detect_language("转写 the speech please") == "en"
    import random

    ctx = ContextPrompt("MultiContextPrompt", {})
    assert ctx.header({}, "语音转写：<|startofspeech|>!a.wav<|endofspeech|>", random.Random(0)).startswith("请结合")
    en = ctx.header({}, "Speech transcription:<|startofspeech|>!a.wav<|endofspeech|>", random.Random(0))
    assert en.startswith("Please combine") and en.endswith("blank.\n\n\n\n")


def test_yaml_and_command_line_override_the_folder(tmp_path, qwen3_folder, tokenizer):
    write_folder(tmp_path / "folder", qwen3_folder, tokenizer, DATASET_CONF)
    cfg = load_config(None, [f"model.path={tmp_path / 'folder'}"])
    assert cfg.data.prompt_class == "MultiContextPrompt" and cfg.data.prompt_conf["use_hist"] is False
    assert cfg.data.max_token_length == 3500
    y = tmp_path / "run.yaml"
    y.write_text("data: {prompt_conf: {use_hist: true}, sys_prompt: false}\n")
    cfg = load_config(y, [f"model.path={tmp_path / 'folder'}"])
    assert cfg.data.prompt_conf["use_hist"] is True and cfg.data.prompt_conf["use_hotwords"] is True
    assert cfg.data.sys_prompt is False
    cfg = load_config(y, [f"model.path={tmp_path / 'folder'}", "data.prompt_class=null"])
    assert cfg.data.prompt_class is None
    with pytest.raises(ConfigError, match="data.prompt_class"):
        load_config(None, ["data.prompt_class=MultiContextPromptNew"])


def test_unknown_prompt_conf_key_is_an_error(tmp_path, tokenizer):
    from brisk.data.context import ContextPrompt

    with pytest.raises(ConfigError, match="data.prompt_conf.use_hotword"):
        ContextPrompt("MultiContextPrompt", {"use_hotword": True})


def test_hotwords_and_distractors_match_funasr_as_sets(tmp_path):
    """Several hotwords: FunASR shuffles them with the process-wide RNG, brisk with a per-sample seeded one;
    the header carries the same words (and distractors from the list file, counted as FunASR draws them)."""
    import random

    import funasr.datasets.fun_asr_datasets.multicontext_prompt as mcp

    from brisk.data.context import ContextPrompt

    neg = tmp_path / "en.txt"
    neg.write_text("zebra\nyak\nxerus\nwolf\n", encoding="utf-8")
    conf = {**DATASET_CONF["prompt_conf"], "english_hotwords_list": str(neg), "max_neg_hotwords_num": 2,
            "min_neg_hotwords_num": 2}
    item = {"hotwords": "black mice, blue box, little car", "one_pass_result": "the box"}
    ref = mcp.MultiContextPrompt(**conf).get_prompt(item, "en")
    ours = ContextPrompt("MultiContextPrompt", conf).header(item, "Speech transcription:", random.Random(3))

    def words(text):
        line = next(x for x in text.splitlines() if x.startswith("Hotword list: "))
        return line.removeprefix("Hotword list: ").split(", ")

    assert ours.splitlines()[:2] == ref.splitlines()[:2]  # header sentence and the one-pass line
    given = sorted(item["hotwords"].split(", "))
    for w in (words(ours), words(ref)):  # the three given words and two distractors from the list
        assert sorted(x for x in w if " " in x) == given and len(w) == 5 and set(w) - set(given) <= {"zebra", "yak", "xerus", "wolf"}
    again = ContextPrompt("MultiContextPrompt", conf).header(item, "Speech transcription:", random.Random(3))
    assert again == ours  # reproducible from the sample's seed
