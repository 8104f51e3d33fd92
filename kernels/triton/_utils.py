"""Helpers shared by the Triton kernel files: op registration, device checks, GEMM routing, grid
sizing, every launcher's tile table, and the `@triton.jit` helpers used by more than one kernel.

The Triton decorators pick the interpreter or the GPU compiler when a kernel module is imported, so
`INTERPRETED` is read once, here, at that same moment.
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

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)


def registered_op(name: str, mutates_args: tuple[str, ...] = ()) -> Callable:
    """Register a host launcher as the custom op `name` (`torch.library.triton_op`, traceable by
    torch.compile and torch.export) and return a function that calls the launcher directly in plain
    eager mode, skipping the custom-op layers' host cost; otherwise the registered op runs."""
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
    """Launch on `tensor`'s GPU: Triton launches on the current device, so a tensor on cuda:1
    while cuda:0 is current would be an illegal memory access."""
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
    """torch's float32 matmul precision, a constant to torch.compile (reading it would break the
    graph; a compiled graph keeps the routing it was traced with)."""
    return torch.get_float32_matmul_precision()


def allow_tf32(tensor: torch.Tensor) -> bool:
    """Follow torch's own float32 matmul policy (`torch.set_float32_matmul_precision`)."""
    return tensor.dtype == torch.float32 and _float32_matmul_precision() != "highest"


def triton_gemm(tensor: torch.Tensor) -> bool:
    """Whether a GEMM over `tensor` runs as a Triton kernel: only where `tl.dot` uses tensor cores
    (16-bit, or float32 with TF32 allowed); strict float32 and float64 go to cuBLAS."""
    return INTERPRETED or tensor.dtype in (torch.float16, torch.bfloat16) or allow_tf32(tensor)


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count  # None: the current device


def row_splits(row_blocks: int, other_programs: int, device: torch.device) -> int:
    """Number of row ranges a batch reduction is split into (one fp32 partial each), so that the
    programs keep the device busy: 8 per SM (a short tail wave); a handful in the interpreter."""
    programs = 4 if INTERPRETED else 8 * _sm_count(device.index)
    return max(1, min(row_blocks, triton.cdiv(programs, max(other_programs, 1))))


# --- tile tables: (BLOCK_B, BLOCK_D) for elementwise kernels, (BLOCK_B, BLOCK_N, BLOCK_K,
# launch options) for the step's GEMMs. In the interpreter: few, large programs (it pays per program). The
# GPU GEMM tables cover float32 (TF32) and 16-bit only: other GEMMs run on cuBLAS (`triton_gemm`).


def actnorm_tiles(D: int) -> tuple[int, int]:
    """(BLOCK_B, BLOCK_D) of the ActNorm kernels for D features."""
    if INTERPRETED:
        return 128, min(triton.next_power_of_2(D), 512)
    return 16, min(triton.next_power_of_2(D), 256)


def actnorm_bwd_tiles(D: int) -> tuple[int, int]:
    """(BLOCK_B, BLOCK_D) of the ActNorm backward, narrower: its two partial-sum tiles live across its row loop."""
    if INTERPRETED:
        return actnorm_tiles(D)
    return 16, min(triton.next_power_of_2(D), 128)


def coupling_tiles(D2: int) -> tuple[int, int]:
    """(BLOCK_B, BLOCK_D) of the coupling kernels for a coupled half of width D2."""
    if INTERPRETED:
        return 128, min(triton.next_power_of_2(D2), 512)
    return 16, min(triton.next_power_of_2(D2), 64)  # 16 x 128 spilled registers in the fp32 backward


def interpreter_gemm_tiles(B: int, D: int) -> tuple[int, int, int, dict]:
    """Few, large tiles (the interpreter pays per program), shrunk to small inputs (it pays per padded element)."""
    block_b = min(max(triton.next_power_of_2(B), 16), 128)
    block_d = min(max(triton.next_power_of_2(D), 16), 128)
    return block_b, block_d, block_d, {}


def fused_step_tiles(dtype: torch.dtype, B: int, D: int) -> tuple[int, int, int, dict]:
    """Tiles of the step's GEMMs (narrow column blocks: the coupling epilogue)."""
    if INTERPRETED:
        return interpreter_gemm_tiles(B, D)
    return 128, 64, 32 if dtype == torch.float32 else 64, {"num_warps": 8, "num_stages": 3}


# --- @triton.jit helpers shared by kernels


@triton.jit
def row_block(block, BLOCK_B: tl.constexpr):
    """Rows block * BLOCK_B + [0, BLOCK_B) as int64, so that row x stride offsets past 2**31 do not wrap."""
    return block * BLOCK_B + tl.arange(0, BLOCK_B).to(tl.int64)


@triton.jit
def load_shift_logit(
    h_ptr, rows, col_start, B, D2, stride_hb, stride_hd,
    offset: tl.constexpr, compute: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """shift = h[rows, 2c], logit = h[rows, 2c + 1] + offset (the coupling's `SCALE_OFFSET`) for the
    BLOCK_D columns c from col_start, read as one contiguous (BLOCK_B, 2 * BLOCK_D) tile of h."""
    cols2 = 2 * col_start + tl.arange(0, 2 * BLOCK_D)
    mask = (rows[:, None] < B) & (cols2[None, :] < 2 * D2)
    h = tl.load(h_ptr + rows[:, None] * stride_hb + cols2[None, :] * stride_hd, mask=mask, other=0.0)
    shift, logit = tl.split(tl.reshape(h.to(compute), (BLOCK_B, BLOCK_D, 2)))
    return shift, logit + offset


@triton.jit
def affine_couple(inp, shift, logit, INVERSE: tl.constexpr):
    """The affine coupling of one tile, forward or INVERSE; returns (out, log sigmoid(logit))."""
    reciprocal_scale = 1.0 + tl.exp(-logit)
    if INVERSE:
        out = inp * reciprocal_scale - shift
    else:
        out = (inp + shift) / reciprocal_scale
    return out, tl.minimum(logit, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(logit)))  # finite for any logit
