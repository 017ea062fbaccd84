"""speed.float8: the decoder layers' linear layers as float8 GEMMs in training (torchao's float8 training, rowwise
scales), as torchtitan trains Llama 3.1 8B on the H100 (+28% there).

Each nn.Linear inside a decoder layer whose in and out features are multiples of 16 (what the float8 GEMM takes)
becomes torchao's Float8Linear: the same weight parameter (the state dict, checkpoints and exports are unchanged),
its input, weight and output gradient cast to float8 e4m3 with one scale a row in each GEMM. The embedding, the LM
head (the loss reads its logits) and the norms keep their dtype. Float8 GEMMs need compute capability 8.9 or
later (Ada, Hopper); torchao runs an emulation elsewhere, which the CPU tests use and which is slow. It moves the
numbers: the probe against bf16 says by how much; it is in no preset.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..errors import ConfigError

MULTIPLE = 16  # float8 GEMMs take dimensions divisible by 16


def float8_filter(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and module.in_features % MULTIPLE == 0 and module.out_features % MULTIPLE == 0


def apply_float8(layers: nn.ModuleList, device: str) -> str:
    """Swap the linear layers inside ``layers`` (the family's decoder layers) for torchao's Float8Linear."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ConfigError("speed.float8 needs torchao (pip install 'brisk-train[float8]'); set speed.float8=false") from e
    if device == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            raise ConfigError(f"speed.float8: this GPU (compute capability {major}.{minor}) has no float8 GEMMs "
                              "(8.9 or later: Ada, Hopper); set speed.float8=false")
    # pad_inner_dim: the weight gradient's GEMM contracts over the tokens, whose count a batch decides; float8
    # GEMMs take multiples of 16, so that dimension is padded inside the GEMM (padded rows, odd buckets)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name("rowwise"), pad_inner_dim=True)
    before = sum(isinstance(m, nn.Linear) for m in layers.modules())
    for layer in layers:
        convert_to_float8_training(layer, config=config, module_filter_fn=float8_filter)
    after = sum(type(m).__name__ == "Float8Linear" for m in layers.modules())
    return (f"float8: {after} of the decoder layers' {before} linear layers as float8 GEMMs (torchao, rowwise scales); "
            "the embedding and LM head unchanged")
