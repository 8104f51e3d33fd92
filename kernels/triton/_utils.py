"""Helpers shared by the Triton kernel files: op registration, device checks, GEMM routing, grid sizing, the
tile tables, and the `@triton.jit` helpers used by more than one kernel. `INTERPRETED` is read once, as the
kernel modules are imported: that is when Triton's decorators pick the interpreter or the GPU compiler.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .._utils import BackendUnavailableError
from ..compat import plain_eager
from ..reference import SCALE_OFFSET

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)
LOGIT_OFFSET = tl.constexpr(SCALE_OFFSET)


def registered_op(name: str, mutates_args: tuple[str, ...] = ()) -> Callable:
    """Register a host launcher as the custom op `name` (`torch.library.triton_op`, traced by torch.compile
    and torch.export); the returned function calls the launcher directly in plain eager mode (less host cost)."""
    def decorate(launcher: Callable) -> Callable:
        @functools.wraps(launcher)
        def guarded(*args):
            with device_guard(next(a for a in args if isinstance(a, torch.Tensor))):
                return launcher(*args)

        op = triton_op(name, mutates_args=mutates_args)(guarded)

        @functools.wraps(launcher)
        def call(*args):
            return guarded(*args) if plain_eager(args) else op(*args)

        call.op = op
        return call
    return decorate


def device_guard(tensor: torch.Tensor):
    """Launch on `tensor`'s GPU: Triton launches on the current device (cuda:1 data from cuda:0 would fault)."""
    if tensor.device.type == "cuda" and tensor.device.index not in (None, torch.cuda.current_device()):
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def require_launchable(tensor: torch.Tensor, op: str) -> None:
    """Fail clearly when the kernels cannot run on `tensor`'s device."""
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise BackendUnavailableError(
            f"{op}: the Triton kernels were built for the GPU (TRITON_INTERPRET was not set when "
            f"the first Triton op ran) and cannot run on a {tensor.device.type} tensor"
        )


@torch.compiler.assume_constant_result
def _float32_matmul_precision() -> str:
    """torch's float32 matmul precision, a constant to torch.compile (a graph keeps the routing it was traced with)."""
    return torch.get_float32_matmul_precision()


def allow_tf32(tensor: torch.Tensor) -> bool:
    """Follow torch's own float32 matmul policy (`torch.set_float32_matmul_precision`)."""
    return tensor.dtype == torch.float32 and _float32_matmul_precision() != "highest"


def triton_gemm(tensor: torch.Tensor) -> bool:
    """A GEMM over `tensor` runs as a Triton kernel only where `tl.dot` uses tensor cores (16-bit, or TF32)."""
    return INTERPRETED or tensor.dtype in (torch.float16, torch.bfloat16) or allow_tf32(tensor)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count  # None: the current device


def row_splits(row_blocks: int, other_programs: int, device: torch.device) -> int:
    """Row ranges a batch reduction is split into (one partial each): 8 programs per SM, a few in the interpreter."""
    programs = 4 if INTERPRETED else 8 * _sm_count(device.index)
    return max(1, min(row_blocks, triton.cdiv(programs, max(other_programs, 1))))


# --- tile tables: (BLOCK_B, BLOCK_D) for elementwise kernels, (BLOCK_B, BLOCK_N, BLOCK_K, launch options) for the
# step's GEMMs. In the interpreter: few, large programs (it pays per program). The GPU GEMM tables cover float32
# (TF32) and 16-bit only: other GEMMs run on cuBLAS (`triton_gemm`).
ELEMENTWISE_BLOCK_D = {"actnorm": 256, "actnorm_bwd": 128, "coupling": 64}
"""The widest BLOCK_D of each elementwise kernel on a GPU (16 rows): narrower for the ActNorm backward, whose two
partial-sum tiles live across its row loop, and the coupling (16 x 128 spilled registers in the fp32 backward)."""


def elementwise_tiles(kernel: str, D: int) -> tuple[int, int]:
    """(BLOCK_B, BLOCK_D) of the elementwise `kernel` (a key of `ELEMENTWISE_BLOCK_D`) over D columns."""
    if INTERPRETED:
        return 128, min(triton.next_power_of_2(D), 512)
    return 16, min(triton.next_power_of_2(D), ELEMENTWISE_BLOCK_D[kernel])


def fused_step_tiles(dtype: torch.dtype, B: int, D: int) -> tuple[int, int, int, dict]:
    """Tiles of the step's GEMMs (narrow column blocks: the coupling epilogue), shrunk for small interpreted inputs."""
    if INTERPRETED:
        block_b = min(max(triton.next_power_of_2(B), 16), 128)
        block_d = min(max(triton.next_power_of_2(D), 16), 128)
        return block_b, block_d, block_d, {}
    return 128, 64, 32 if dtype == torch.float32 else 64, {"num_warps": 8, "num_stages": 3}


# --- @triton.jit helpers shared by kernels
@triton.jit
def row_block(block, BLOCK_B: tl.constexpr):
    """Rows block * BLOCK_B + [0, BLOCK_B) as int64, so that row x stride offsets past 2**31 do not wrap."""
    return block * BLOCK_B + tl.arange(0, BLOCK_B).to(tl.int64)


@triton.jit
def load_shift_logit(
    h_ptr, rows, col_start, B, D2, stride_hb, stride_hd,
    compute: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """shift = h[rows, 2c], logit = h[rows, 2c + 1] + `SCALE_OFFSET` for the BLOCK_D columns c from col_start,
    read as one contiguous (BLOCK_B, 2 * BLOCK_D) tile of h."""
    cols2 = 2 * col_start + tl.arange(0, 2 * BLOCK_D)
    mask = (rows[:, None] < B) & (cols2[None, :] < 2 * D2)
    h = tl.load(h_ptr + rows[:, None] * stride_hb + cols2[None, :] * stride_hd, mask=mask, other=0.0)
    shift, logit = tl.split(tl.reshape(h.to(compute), (BLOCK_B, BLOCK_D, 2)))
    return shift, logit + LOGIT_OFFSET


@triton.jit
def affine_couple(inp, shift, logit, INVERSE: tl.constexpr):
    """The affine coupling of one tile, forward or INVERSE; returns (out, log sigmoid(logit))."""
    reciprocal_scale = 1.0 + tl.exp(-logit)
    if INVERSE:
        out = inp * reciprocal_scale - shift
    else:
        out = (inp + shift) / reciprocal_scale
    return out, tl.minimum(logit, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(logit)))  # finite for any logit
