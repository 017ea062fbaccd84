"""flash-linear-attention's gated backward on Hopper with Triton 3.4 to 3.7.0, at the block widths the kernel
check proves right, entered through fla's own backend registry.

fla 0.6 refuses the gated ``chunk_bwd_dqkwg`` on Hopper with Triton >= 3.4 and < 3.7.1 (fla-org/flash-linear-attention#640: wrong
dk / dg / dbeta). The bisection in that thread pins the miscompile to one key-block width, BK = 64; fla's own
launcher picks BK = min(next_pow2(K), 128) on Hopper, so Qwen3.5's K = 128 heads run BK = 128. Here the same
Triton kernel of fla's is launched for the key head sizes in ``PROVEN``, at the width the kernel check proved
for them (fla's own, 128, for K = 128). Any other size is refused in one line.

The launcher is a backend of fla's ``common`` operation (``fla.backends.register``), fla's documented way to
put another implementation behind a dispatched function; its verifier accepts exactly the calls that fla
would refuse here (gated, Hopper, Triton in the window, K covered), so no call that fla runs itself changes
path. Nothing of fla's is reassigned. ``forced_block_width`` (a context manager) makes it accept every call
at one width, on any CUDA GPU: the kernel check's way to sweep BK 32 / 64 / 128.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

from ..errors import ConfigError

# Key head size -> the key-block width brisk launches it at, in the window: only what the kernel check
# (bench/gdn_check.py, tests/gpu/test_gdn_check_cuda.py) found within the bf16 bound, forward and backward,
# on an H200 with Triton 3.6 (docs/sft.md): Qwen3.5's K = 128 at fla's own
# width 128. BK 64 is the miscompiled width (fla-org/flash-linear-attention#640); that report's sweep also found BK 32 right, which
# would cover K = 64, but this check has not run it, so K = 64 is refused like every other size.
PROVEN = {128: 128}
WINDOW = ((3, 4, 0), (3, 7, 1))  # Triton versions [low, high) that fla 0.6 refuses on Hopper

_forced: contextvars.ContextVar[int | None] = contextvars.ContextVar("brisk_fla_forced_bk", default=None)


@functools.cache
def triton_version() -> tuple[int, ...] | None:
    try:
        import triton
    except ImportError:
        return None
    return tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3] if x.isdigit())


def in_window(capability: tuple[int, int] | None, triton: tuple[int, ...] | None) -> bool:
    """Whether fla 0.6 refuses its gated backward here: a Hopper GPU (sm_90) with Triton in ``WINDOW``."""
    return capability is not None and capability[0] == 9 and triton is not None and WINDOW[0] <= triton < WINDOW[1]


def fla_block_width(k: int) -> int:
    """The key-block width fla 0.6's launcher picks for head size k on Hopper (CONST_TILING 128)."""
    return min(max(1 << max(k - 1, 0).bit_length(), 16), 128)


def block_width(k: int) -> int | None:
    """The proven width brisk launches for key head size k in the window, or None (not covered)."""
    return PROVEN.get(k)


def coverage_refusal(head_k_dims) -> str | None:
    """One line for the first key head size the fix does not cover, or None."""
    for k in sorted(set(head_k_dims)):
        if block_width(k) is None:
            return (f"speed.fla_kernels: linear_key_head_dim={k} is not covered on Hopper with Triton 3.4-3.7.0 (fla "
                    f"refuses its gated backward there; brisk runs it only at the checked key head sizes "
                    f"{', '.join(map(str, PROVEN))}); upgrade Triton to >= 3.7.1 (torch >= 2.12.1) or set "
                    "speed.fla_kernels=false")
    return None


@contextlib.contextmanager
def forced_block_width(bk: int):
    """Every gated chunk_bwd_dqkwg call inside runs at key-block width bk through brisk's launcher (any CUDA
    GPU; the kernel check's sweep). Needs ``register_launcher()`` first."""
    token = _forced.set(bk)
    try:
        yield
    finally:
        _forced.reset(token)


def _width_for(k, g, g_gamma) -> int | None:
    """The width brisk launches this call at, or None: fla's own path takes it."""
    forced = _forced.get()
    if forced is not None:
        return forced if g is not None else None
    if g is None or g_gamma is not None or not k.is_cuda:
        return None
    import torch

    if not in_window(torch.cuda.get_device_capability(k.device), triton_version()):
        return None
    return block_width(k.shape[-1])


def _backend_class():
    from fla.backends import BaseBackend

    class BriskHopperGatedBackward(BaseBackend):
        """fla's gated chunk_bwd_dqkwg Triton kernel launched at a proven key-block width."""

        backend_type = "brisk_hopper_gated_bwd"

        def chunk_bwd_dqkwg_verifier(self, q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None,
                                     state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None):
            if _width_for(k, g, g_gamma) is None:
                return False, "brisk launches only fla's refused gated backward (Hopper, Triton 3.4-3.7.0) or a forced width"
            return True, None

        def chunk_bwd_dqkwg(self, q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None,
                            state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None):
            return launch_dqkwg(q, k, v, do, h, dh, w, g, dv, scale, state_v_first, cu_seqlens, chunk_size,
                                chunk_indices, _width_for(k, g, g_gamma))

    return BriskHopperGatedBackward


def launch_dqkwg(q, k, v, do, h, dh, w, g, dv, scale, state_v_first, cu_seqlens, chunk_size, chunk_indices, bk):
    """dq, dk, dw, dg of the gated chunk: fla's kernel ``chunk_bwd_kernel_dqkwg`` on a grid of key blocks of
    width bk (the block width is a launch parameter of the kernel; the partial dg of each key block is summed)."""
    import torch
    import triton
    from fla.ops.common.chunk_o import chunk_bwd_kernel_dqkwg
    from fla.ops.utils import prepare_chunk_indices

    b, t, h_qk, kd = k.shape
    vd, hv = v.shape[-1], v.shape[2]
    if chunk_indices is None and cu_seqlens is not None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    n_chunks = triton.cdiv(t, chunk_size) if cu_seqlens is None else len(chunk_indices)
    bv = min(max(triton.next_power_of_2(vd), 16), 128 if torch.cuda.get_device_capability(k.device)[0] >= 9 else 64)
    nk = triton.cdiv(kd, bk)
    dq = q.new_empty(b, t, hv, kd)
    dk = k.new_empty(b, t, hv, kd)
    dg = torch.empty(nk, *g.shape, dtype=torch.float32, device=g.device)
    dw = torch.empty_like(w) if w is not None else None
    chunk_bwd_kernel_dqkwg[(nk * n_chunks, b * hv)](
        q=q, k=k, v=v, g=g, g_gamma=None, h=h, do=do, dh=dh, dq=dq, dk=dk, dw=dw, dv=dv, dg=dg,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, scale=k.shape[-1] ** -0.5 if scale is None else scale,
        B=b, T=t, H=h_qk, HV=hv, K=kd, V=vd, BT=chunk_size, BK=bk, BV=bv, STATE_V_FIRST=state_v_first)
    if h_qk != hv:  # grouped heads: each q/k head's gradient is the sum over the value heads it serves
        dq = dq.view(b, t, h_qk, hv // h_qk, kd).sum(3)
        dk = dk.view(b, t, h_qk, hv // h_qk, kd).sum(3)
    return dq, dk, dw, dg.sum(0)


_registered = False


def register_launcher() -> None:
    """Puts brisk's launcher behind fla's dispatched ``chunk_bwd_dqkwg`` (once a process; fla replaces a backend
    of the same type, so a second call changes nothing)."""
    global _registered
    if _registered:
        return
    from fla.backends import register as fla_register

    fla_register("common")(_backend_class())
    _registered = True


def hopper_refusal(head_k_dims=()) -> str | None:
    """Why fla's gated backward cannot train here even with brisk's launcher, or None (CUDA asked only when
    torch already has it initialised or can)."""
    import torch

    if not torch.cuda.is_available():
        return None
    if not in_window(torch.cuda.get_device_capability(), triton_version()):
        return None
    return coverage_refusal(head_k_dims)


def require_covered(head_k_dims) -> None:
    why = hopper_refusal(head_k_dims)
    if why:
        raise ConfigError(why)
