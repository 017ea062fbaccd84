"""The whole config: one section a part of the run, and the model family's own section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import families
from .data import DataConfig
from .model import ModelConfig
from .speed import BenchConfig, DiagnoseConfig, ProbeConfig, SpeedConfig
from .training import OptimConfig, TrainConfig


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    # The family's own section (Family.config), by family name: written in YAML as a top-level section of that
    # name, never as "sections" (brisk.families.section(cfg) reads it)
    sections: dict = field(default_factory=dict, metadata={"internal": True})

    def __post_init__(self):
        families.get(self.model.family)  # an unknown family: one line listing them

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(out.pop("sections"))  # each family section at the top level, as it was written
        return out


