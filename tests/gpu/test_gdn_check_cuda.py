"""The Gated DeltaNet kernel check on CUDA (skipped without CUDA or without fla-core): flash-linear-attention's
chunked gated delta rule and short conv, as brisk runs them (on Hopper with Triton 3.4-3.7.0: fla's refused
gated backward through brisk's launcher at a checked key-block width), forward and backward within the bf16
bound of the fp32 per-token recurrence at every shape of brisk/diagnose/gdn_check.SHAPES brisk runs here (a
key head size the launcher does not cover is skipped with its refusal), and the launcher's width within it too.

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


@pytest.mark.parametrize("name", ["qwen3_5_2b", "qwen3_5_27b", "i640_b2_t256_h4_k128"])
def test_the_width_brisk_launches_is_within_the_bound(name):
    """brisk's launcher forced (on any CUDA GPU) at the width it uses in fla's refused window."""
    fla_hopper = _fla()
    shape = next(s for s in G.SHAPES if s.name == name)
    _assert_within(G.check_delta_rule(shape, "cuda", bk=fla_hopper.PROVEN[shape.k]))


def test_the_launcher_covers_qwen3_5_and_nothing_unchecked():
    fla_hopper = _fla()
    for shape in G.SHAPES[:4]:
        assert fla_hopper.hopper_refusal([shape.k]) is None
    assert fla_hopper.block_width(64) is None and fla_hopper.coverage_refusal([64])


@pytest.mark.parametrize("shape", [s for s in G.SHAPES if s.k == s.v == 128], ids=lambda s: s.name)
def test_flashqla_is_within_the_bf16_bound(shape):
    """Qwen's FlashQLA (flash-qla, TileLang; skipped where it is not installed or refuses this GPU) at the K = V = 128
    shapes, forward and every input gradient, against the same fp32 recurrence and bound as fla."""
    why = G.flashqla_refusal()
    if why:
        pytest.skip(why)
    rows = G.check_delta_rule(shape, "cuda", kernel=G.flashqla_delta_rule(shape))
    assert {r.kernel for r in rows} == {"FlashQLA chunk_gated_delta_rule"}
    _assert_within(rows)
