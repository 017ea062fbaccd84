"""The Gated DeltaNet kernel check on CUDA (skipped without CUDA or without fla-core): flash-linear-attention's
chunked gated delta rule and short conv, as brisk runs them (on Hopper with Triton 3.4-3.7.0: fla's refused
gated backward through brisk's launcher at a checked key-block width), forward and backward within the bf16
bound of the fp32 per-token recurrence at every shape of brisk/diagnose/gdn_check.SHAPES, and every width
brisk's launcher may pick within it too.

    python -m pytest tests/gpu/test_gdn_check_cuda.py -q      # on the GPU machine, with fla-core
"""

from __future__ import annotations

import pytest
import torch

from brisk.diagnose import gdn_check as G

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _fla():
    pytest.importorskip("fla")
    from brisk.speed import fla_hopper

    fla_hopper.register_launcher()
    return fla_hopper


def _assert_within(rows):
    assert rows and all(r.rel == r.rel for r in rows)
    bad = [r for r in rows if not r.ok]
    assert not bad, "\n" + G.table(bad)


@pytest.mark.parametrize("shape", G.SHAPES, ids=lambda s: s.name)
def test_fla_as_brisk_runs_it_is_within_the_bf16_bound(shape):
    fla_hopper = _fla()
    why = fla_hopper.hopper_refusal([shape.k])
    if why:
        pytest.skip(why)
    _assert_within(G.check_delta_rule(shape, "cuda") + G.check_conv(shape, "cuda"))


@pytest.mark.parametrize("width", [32, 128])
@pytest.mark.parametrize("name", ["qwen3_5_2b", "tiny_varlen_k64", "i640_b2_t1024_h4_k64"])
def test_every_width_brisk_launches_is_within_the_bound(name, width):
    fla_hopper = _fla()
    assert width in fla_hopper.PROVEN
    shape = next(s for s in G.SHAPES if s.name == name)
    _assert_within(G.check_delta_rule(shape, "cuda", bk=width))


def test_fla_refuses_nothing_brisk_runs_and_the_launcher_covers_qwen3_5():
    fla_hopper = _fla()
    assert fla_hopper.block_width(128) == 128 and fla_hopper.block_width(64) == 32
    for shape in G.SHAPES[:4]:
        assert fla_hopper.hopper_refusal([shape.k]) is None
