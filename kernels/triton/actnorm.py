"""The Triton ActNorm kernels (the math: `reference.actnorm_ref`), forward and inverse, and the entry point
`actnorm`. The backward's batch reductions are per-program partial sums, summed in a fixed order (deterministic).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .._utils import accumulation_dtype, is_fp64, require_matrix, require_vector
from . import _utils
from ._utils import row_block


@triton.jit
def _actnorm_fwd_kernel(
    x_ptr, loc_ptr, logs_ptr, y_ptr,
    B, D, stride_xb, stride_xd, stride_loc, stride_logs,
    INVERSE: tl.constexpr, FP64: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    compute = tl.float64 if FP64 else tl.float32
    rows = row_block(tl.program_id(0), BLOCK_B)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = (rows[:, None] < B) & col_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xb + cols[None, :] * stride_xd, mask=mask, other=0.0).to(compute)
    loc = tl.load(loc_ptr + cols * stride_loc, mask=col_ok, other=0.0).to(compute)
    logs = tl.load(logs_ptr + cols * stride_logs, mask=col_ok, other=0.0).to(compute)
    if INVERSE:
        y = x * tl.exp(-logs)[None, :] - loc[None, :]
    else:
        y = (x + loc[None, :]) * tl.exp(logs)[None, :]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _actnorm_bwd_kernel(
    grad_ptr, inp_ptr, loc_ptr, logs_ptr, dinp_ptr, part_loc_ptr, part_logs_ptr,
    B, D, stride_gb, stride_gd, stride_ib, stride_id, stride_loc, stride_logs,
    INVERSE: tl.constexpr, FP64: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (split, column block) walks row blocks split, split + splits, ... and writes dinp plus its own
    partial column sums for dloc and dlogs."""
    compute = tl.float64 if FP64 else tl.float32
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    loc = tl.load(loc_ptr + cols * stride_loc, mask=col_ok, other=0.0).to(compute)
    logs = tl.load(logs_ptr + cols * stride_logs, mask=col_ok, other=0.0).to(compute)
    # Forward: dx = g * e^logs, dloc = sum dx, dlogs = sum dx * (x + loc).
    # Inverse (x = y e^-logs - loc): dy = g * e^-logs, dloc = -sum g, dlogs = -sum dy * y.
    scale = tl.exp(-logs) if INVERSE else tl.exp(logs)
    acc_loc = tl.zeros((BLOCK_B, BLOCK_D), dtype=compute)
    acc_logs = tl.zeros((BLOCK_B, BLOCK_D), dtype=compute)
    for block in range(split, tl.cdiv(B, BLOCK_B), splits):
        rows = row_block(block, BLOCK_B)
        mask = (rows[:, None] < B) & col_ok[None, :]
        g = tl.load(grad_ptr + rows[:, None] * stride_gb + cols[None, :] * stride_gd, mask=mask, other=0.0).to(compute)
        inp = tl.load(inp_ptr + rows[:, None] * stride_ib + cols[None, :] * stride_id, mask=mask, other=0.0).to(compute)
        dinp = g * scale[None, :]
        tl.store(dinp_ptr + rows[:, None] * D + cols[None, :], dinp.to(dinp_ptr.dtype.element_ty), mask=mask)
        if INVERSE:
            acc_loc -= g
            acc_logs -= dinp * inp
        else:
            acc_loc += dinp
            acc_logs += dinp * (inp + loc[None, :])
    out = split * D + cols
    tl.store(part_loc_ptr + out, tl.sum(acc_loc, axis=0), mask=col_ok)
    tl.store(part_logs_ptr + out, tl.sum(acc_logs, axis=0), mask=col_ok)


@_utils.registered_op("flowcore::actnorm_fwd", mutates_args=())
def _actnorm_fwd(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor, inverse: bool) -> torch.Tensor:
    B, D = x.shape
    y = torch.empty((B, D), dtype=x.dtype, device=x.device)
    block_b, block_d = _utils.elementwise_tiles("actnorm", D)
    grid = (triton.cdiv(B, block_b), triton.cdiv(D, block_d))
    wrap_triton(_actnorm_fwd_kernel)[grid](
        x, loc, logs, y, B, D, x.stride(0), x.stride(1), loc.stride(0), logs.stride(0),
        INVERSE=inverse, FP64=is_fp64(x), BLOCK_B=block_b, BLOCK_D=block_d,
    )
    return y


@_utils.registered_op("flowcore::actnorm_bwd", mutates_args=())
def _actnorm_bwd(grad: torch.Tensor, inp: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor,
                 inverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, D = inp.shape
    dinp = torch.empty((B, D), dtype=inp.dtype, device=inp.device)
    block_b, block_d = _utils.elementwise_tiles("actnorm_bwd", D)
    col_blocks = triton.cdiv(D, block_d)
    splits = _utils.row_splits(triton.cdiv(B, block_b), col_blocks, inp.device)
    part_loc, part_logs = torch.empty((2, splits, D), dtype=accumulation_dtype(inp), device=inp.device)
    wrap_triton(_actnorm_bwd_kernel)[(splits, col_blocks)](
        grad, inp, loc, logs, dinp, part_loc, part_logs, B, D, *grad.stride(), *inp.stride(), loc.stride(0),
        logs.stride(0), INVERSE=inverse, FP64=is_fp64(inp), BLOCK_B=block_b, BLOCK_D=block_d,
    )
    return dinp, part_loc.sum(dim=0).to(loc.dtype), part_logs.sum(dim=0).to(logs.dtype)


class _ActNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, loc, logs, inverse):
        ctx.save_for_backward(inp, loc, logs)
        ctx.inverse = inverse
        return _actnorm_fwd(inp, loc, logs, inverse)

    @staticmethod
    def backward(ctx, grad):
        return (*_actnorm_bwd(grad, *ctx.saved_tensors, ctx.inverse), None)


def actnorm(inp, loc, logs, inverse: bool):
    """ActNorm (or its inverse) on the Triton kernels, arguments checked."""
    op = "actnorm_inverse" if inverse else "actnorm"
    require_matrix(f"{op} input", inp)
    require_vector(f"{op} loc", loc, inp.shape[1])
    require_vector(f"{op} logs", logs, inp.shape[1])
    _utils.require_launchable(inp, op)
    return _ActNorm.apply(inp, loc, logs, inverse)
