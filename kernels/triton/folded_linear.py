"""The Triton GEMMs of the folded linear map z = x @ weight.T + bias (the math:
`flowcore.kernels.folded_linear`): kernels, launchers and the autograd Function.

The backward's dW GEMM is split over the batch, one partial per split, summed in a fixed order
(deterministic, no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .._utils import accumulation_dtype, is_fp64
from ..folded_linear import folded_linear_ref
from . import _utils
from ._utils import dot_operand, linear_tile, row_block


@triton.jit
def _linear_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, z_ptr,
    B, N, K, stride_xb, stride_xk, stride_wn, stride_wk, stride_bias,
    FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """z[rows, ns] = x[rows, :] @ W[ns, :].T + bias[ns]. Column blocks of one row block are
    neighbouring programs, so each x tile is read from DRAM once."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    col_blocks = tl.cdiv(N, BLOCK_N)
    rows = row_block(tl.program_id(0) // col_blocks, BLOCK_B)
    ns = (tl.program_id(0) % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = linear_tile(x_ptr, w_ptr, bias_ptr, rows, ns, B, N, K, stride_xb, stride_xk, stride_wn, stride_wk,
                      stride_bias, compute, TF32, BLOCK_B, BLOCK_N, BLOCK_K)
    mask = (rows[:, None] < B) & (ns[None, :] < N)
    tl.store(z_ptr + rows[:, None] * N + ns[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_bwd_dx_kernel(
    dz_ptr, w_ptr, dx_ptr,
    B, N, K, stride_db, stride_dn, stride_wn, stride_wk,
    FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dx[rows, ks] = dz[rows, :] @ W[:, ks]."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = dz_ptr.dtype.element_ty
    k_blocks = tl.cdiv(K, BLOCK_K)
    rows = row_block(tl.program_id(0) // k_blocks, BLOCK_B)
    ks = (tl.program_id(0) % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    acc = tl.zeros((BLOCK_B, BLOCK_K), dtype=compute)
    for n0 in range(0, N, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        dz = tl.load(dz_ptr + rows[:, None] * stride_db + ns[None, :] * stride_dn,
                     mask=(rows[:, None] < B) & (ns[None, :] < N), other=0.0)
        w = tl.load(w_ptr + ns[:, None] * stride_wn + ks[None, :] * stride_wk,
                    mask=(ns[:, None] < N) & k_ok[None, :], other=0.0)
        acc = tl.dot(dot_operand(dz, operand), dot_operand(w, operand), acc,
                     input_precision="tf32" if TF32 else "ieee", out_dtype=compute)
    mask = (rows[:, None] < B) & k_ok[None, :]
    tl.store(dx_ptr + rows[:, None] * K + ks[None, :], acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_bwd_dw_kernel(
    dz_ptr, x_ptr, part_dw_ptr, part_db_ptr,
    B, N, K, stride_db, stride_dn, stride_xb, stride_xk,
    FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (split, tile) sums dz[rows, ns].T @ x[rows, ks] over row blocks split,
    split + splits, ... into its own partial dW (and, for the first k tile, partial db)."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = dz_ptr.dtype.element_ty
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    k_blocks = tl.cdiv(K, BLOCK_K)
    n_block = tl.program_id(1) // k_blocks
    k_block = tl.program_id(1) % k_blocks
    ns = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = k_block * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=compute)
    acc_db = tl.zeros((BLOCK_N, BLOCK_B), dtype=compute)
    for block in range(split, tl.cdiv(B, BLOCK_B), splits):
        rows = row_block(block, BLOCK_B)
        dz_t = tl.load(dz_ptr + ns[:, None] * stride_dn + rows[None, :] * stride_db,
                       mask=(ns[:, None] < N) & (rows[None, :] < B), other=0.0)
        a = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < B) & (ks[None, :] < K), other=0.0)
        acc = tl.dot(dot_operand(dz_t, operand), dot_operand(a, operand), acc,
                     input_precision="tf32" if TF32 else "ieee", out_dtype=compute)
        acc_db += dz_t.to(compute)
    mask = (ns[:, None] < N) & (ks[None, :] < K)
    tl.store(part_dw_ptr + split * N * K + ns[:, None] * K + ks[None, :], acc, mask=mask)
    db_columns = tl.where(k_block == 0, N, 0)  # only the first k tile writes db
    tl.store(part_db_ptr + split * N + ns, tl.sum(acc_db, axis=1), mask=ns < db_columns)


@_utils.registered_op("flowcore::linear_fwd", mutates_args=())
def _linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    B, K = x.shape
    N = weight.shape[0]
    z = torch.empty((B, N), dtype=x.dtype, device=x.device)
    block_b, block_n, block_k, options = _utils.gemm_tiles(x.dtype, B, max(N, K))
    grid = (triton.cdiv(B, block_b) * triton.cdiv(N, block_n),)
    wrap_triton(_linear_fwd_kernel)[grid](
        x, weight, bias, z, B, N, K, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), bias.stride(0),
        FP64=is_fp64(x), TF32=_utils.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return z


@_utils.registered_op("flowcore::linear_bwd_dx", mutates_args=())
def _linear_bwd_dx(dz: torch.Tensor, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dx = dz @ weight (x gives the shape and dtype)."""
    B, K = x.shape
    N = weight.shape[0]
    dx = torch.empty((B, K), dtype=x.dtype, device=x.device)
    block_b, block_n, block_k, options = _utils.dx_tiles(x.dtype, B, max(N, K))
    wrap_triton(_linear_bwd_dx_kernel)[(triton.cdiv(B, block_b) * triton.cdiv(K, block_k),)](
        dz, weight, dx, B, N, K, dz.stride(0), dz.stride(1), weight.stride(0), weight.stride(1),
        FP64=is_fp64(x), TF32=_utils.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return dx


@_utils.registered_op("flowcore::linear_bwd_dw", mutates_args=())
def _linear_bwd_dw(dz: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split partials of dW = dz.T @ x and db = dz.sum(0)."""
    B, K = x.shape
    N = dz.shape[1]
    block_b, block_n, block_k, options = _utils.dw_tiles(x.dtype, B, max(N, K))
    tiles = triton.cdiv(N, block_n) * triton.cdiv(K, block_k)
    splits = _utils.row_splits(triton.cdiv(B, block_b), tiles, x.device)
    part_dw = torch.empty((splits, N, K), dtype=accumulation_dtype(x), device=x.device)
    part_db = torch.empty((splits, N), dtype=accumulation_dtype(x), device=x.device)
    wrap_triton(_linear_bwd_dw_kernel)[(splits, tiles)](
        dz, x, part_dw, part_db, B, N, K, dz.stride(0), dz.stride(1), x.stride(0), x.stride(1),
        FP64=is_fp64(x), TF32=_utils.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return part_dw, part_db


class _FoldedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return _linear_fwd(x, weight, bias)

    @staticmethod
    def backward(ctx, dz):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dweight = dbias = None
        if need_x:
            dx = _linear_bwd_dx(dz, weight, x)
        if need_w or need_b:
            part_dw, part_db = _linear_bwd_dw(dz, x)
            dweight = part_dw.sum(dim=0).to(weight.dtype)
            dbias = part_db.sum(dim=0).to(bias.dtype)
        return dx, dweight, dbias


def folded_linear(x, weight, bias):
    """x @ weight.T + bias: the Triton GEMMs where they use tensor cores (`_utils.triton_gemm`),
    else cuBLAS through torch."""
    _utils.require_launchable(x, "folded_linear")
    if _utils.triton_gemm(x):
        return _FoldedLinear.apply(x, weight, bias)
    return folded_linear_ref(x, weight, bias)
