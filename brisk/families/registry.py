"""The family registry's types and its table (see brisk/families/__init__.py)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError

DEFAULT = "fun_asr_nano"


@dataclass(frozen=True)
class FamilyRule:
    """A config-time rule of one family (plan.check_rules runs it with the general ones)."""

    keys: str
    broken: Callable[[Any], bool]  # cfg -> True when broken
    message: str


def _llm_layers(model) -> Any:
    """The decoder layers of a transformers causal LM at ``model.llm`` (its base model's ``layers``)."""
    return model.llm.base_model.layers


def _no_blocks(model, compile: bool = False) -> list:
    return []


def _frozen_only(speed, model) -> str:
    return ("covers the LLM, and the audio path runs before it, frozen (model.encoder.freeze=true, "
            "model.adaptor.freeze=true)")


def trained_audio_rule(speed, model, needs: str | None = None) -> str | None:
    """The speech families' rule for the audio path training inside the step graph (``Family.trained_audio_graph``):
    it can, unless the encoder's blocks recompute under activation checkpointing (a block that draws random numbers
    saves the RNG state on the host there, which no graph holds) or the family needs a switch (``needs``)."""
    if needs:
        return f"holds the training audio path only with {needs}"
    if model.encoder.activation_checkpoint and not model.encoder.freeze:
        return ("cannot hold the training encoder's activation checkpointing (its recompute saves the RNG state on "
                "the host): set model.encoder.activation_checkpoint=0")
    return None


def _never(speed) -> bool:
    return False


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    switches: frozenset[str]  # the speed switches it takes (the plan refuses the others in one line)
    presets: dict[str, dict[str, Any]]  # speed.preset name -> values
    build: Callable  # (Config, device) -> the plain model: a contract.FamilyModel (SpeechModel with audio)
    dataset: Callable  # (cfg, which, path, vocab_size, tokenizer, prepared) -> (Dataset, skipped lines, counts), or None
    exporters: dict[str, Callable]  # train.export format -> writer(model, cfg, state, out, dtype, tokenizer)
    readme: Callable  # (out, fmt, dtype, cfg) -> writes out/README.md
    # (cfg, which, path, tokenizer) -> the split's data read, checked and cached before the model is built (handed
    # to ``dataset`` as ``prepared``); None: ``dataset`` reads its data itself
    prepare: Callable | None = None
    recognizer: Callable | None = None  # (cfg, model, tokenizer, device, **kw) -> eval.decode.Recognizer
    val_recognizer: Callable | None = None  # (model, valid dataset, device, fast) -> Recognizer for train.val_decode
    eval_main: Callable | None = None  # (args, cfg, model, tokenizer, weights, device) -> exit code: its own `brisk eval`
    eval_set: Callable | None = None  # (path, cfg) -> (keys, audio paths, references) of an eval jsonl; none: FunASR jsonl
    labelled: str = "transcript"  # what its labelled tokens are (the log's accuracy line)
    frozen_audio: tuple[str, ...] = ()  # switches that need model.encoder.freeze and model.adaptor.freeze
    refused: str = ("model.family={family} does not take {bad}; set them false (it takes {takes})")
    rules: tuple[FamilyRule, ...] = ()
    decoder_layers: Callable = _llm_layers  # model -> nn.ModuleList of decoder layers
    encoder_blocks: Callable = _no_blocks  # (model or its audio copy, compile) -> list of nn.ModuleList
    audio_path: tuple[str, ...] = ()  # attribute names of the audio modules (encoder first), () without audio
    # model -> the modules the loss never reaches (Fun-ASR-Nano's CTC branch): DDP looks for unused gradients only
    # when one of them trains
    outside_loss: Callable = _no_blocks
    # speed.cuda_graph: whether the frozen audio path is captured too, one graph per speech shape (its work depends
    # on the padded features' shape alone); False: it runs eagerly before each replay and its rows are copied into
    # the step graph's static input (the collator then leaves the features unpadded)
    audio_graphs: bool = False
    # speed.cuda_graph: (speed config) -> whether the frozen audio path makes its own inputs of fixed shapes per
    # step bucket (its model class's ``static_audio_inputs`` and ``static_audio_rows``) and runs in a graph per
    # bucket from them; the collator leaves the features unpadded either way
    audio_static_inputs: Callable = _never
    # speed.cuda_graph with the audio path training (model.encoder.freeze or model.adaptor.freeze false):
    # (speed config, model config) -> None where the step graph holds that path too, with its gradients (the model
    # class's ``static_audio_inputs`` before each replay, its ``static_audio_rows`` inside the captured body), else
    # why not, in the family's words (the plan's refusal: "model.family=X's graphed step <why>")
    trained_audio_graph: Callable = _frozen_only
    # (cfg, collator, vocab, max_tokens) -> one batch per packed bucket up to max_tokens, in the collator's static
    # shapes, for capturing the step graphs before training; None: each bucket's graph is captured when first met
    graph_examples: Callable | None = None
    # The transformers folders (config.json) it loads: their model_type values ("*": any other config.json)
    folder_types: tuple[str, ...] = ()
    folder_overrides: Callable | None = None  # (folder) -> config overrides that load the folder as this family's model
    # The family's own config keys: a dataclass whose fields are the keys of a top-level section named after the
    # family (``<name>.<key>`` in YAML and overrides), each with ``metadata={"help": ...}`` for --help-config.
    # Its values are ``section(cfg)``. None: the family reads only the shared sections.
    config: type | None = None

    def refuse(self, bad: list[str]) -> str:
        """The one line refusing switches this family does not take, with the families that do take each one."""
        def named(k: str) -> str:
            others = sorted(f.name for f in _REGISTRY.values() if k in f.switches and f is not self)
            return f"speed.{k}" + (f" (model.family={' or '.join(others)}'s)" if others else "")

        return self.refused.format(family=self.name, bad=", ".join(named(k) for k in bad),
                                   takes=", ".join(sorted(self.switches)))


_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in _REGISTRY:
        raise ValueError(f"model family {family.name} registered twice")
    _REGISTRY[family.name] = family
    return family


def names() -> list[str]:
    return sorted(_REGISTRY)


ENTRY_POINTS = "brisk.families"  # a package's entry points in this group name modules that register a family
_plugins_loaded = False


def load_plugins() -> None:
    """Import every module named by an installed package's ``brisk.families`` entry point (once): each registers
    its family with ``register``. A plugin that fails to import is one ConfigError line naming it."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - whatever the plugin raised, the line names the plugin
            raise ConfigError(f"model family plugin {ep.name} ({ep.value}, entry point group {ENTRY_POINTS}) failed "
                              f"to load: {type(e).__name__}: {e}") from None


def load_module(path: str) -> None:
    """``brisk --family-module MODULE``: import a module (dotted name, or a .py file) that registers a family."""
    import importlib
    import importlib.util
    from pathlib import Path

    try:
        if path.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(path).stem, path)
            if spec is None or not Path(path).is_file():
                raise FileNotFoundError(path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            importlib.import_module(path)
    except (ImportError, FileNotFoundError) as e:
        raise ConfigError(f"--family-module {path}: cannot import it ({e})") from None


def get(name: str, key: str = "model.family") -> Family:
    """The family called ``name``; one line listing the families otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    load_plugins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    close = difflib.get_close_matches(str(name), names(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"{key}={name!r}: use one of the model families {', '.join(names())}{hint}")


def section(cfg) -> Any:
    """The run's values of its family's own config section (``Family.config``), defaults where not set."""
    family = family_of(cfg)
    if family.config is None:
        raise ConfigError(f"model.family={family.name} has no config section of its own")
    return cfg.sections.get(family.name) or family.config()


def all_families() -> list[Family]:
    load_plugins()
    return [_REGISTRY[n] for n in names()]


def folder_family(folder) -> Family | None:
    """The family whose transformers folder ``folder`` is (its config.json's model_type; a family taking any
    config.json answers the rest); None without a config.json."""
    import json
    from pathlib import Path

    f = Path(folder) / "config.json"
    if not f.is_file():
        return None
    try:
        model_type = json.loads(f.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError):
        raise ConfigError(f"{f}: not a JSON object (a transformers folder's config.json)") from None
    for wanted in (model_type, "*"):
        for fam in _REGISTRY.values():
            if wanted in fam.folder_types and fam.folder_overrides is not None:
                return fam
    return None


def family_of(cfg) -> Family:
    """The family of a Config (or of its ModelConfig)."""
    model = getattr(cfg, "model", cfg)
    return get(model.family)

