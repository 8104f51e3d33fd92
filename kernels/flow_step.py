"""One affine Glow step with its ActNorm folded into the 1x1 weight, fused:
y = x @ weight.T + bias, y1 = y[:, :split], h = conditioner(y1),
z = [y1, (y2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + SCALE_OFFSET)], logdet = sum(log sigmoid(...)) per row.

This file owns the Triton fused step, its `folded_affine_step_ref` twin (plain autograd) and the
`folded_affine_step(x, weight, bias, split, conditioner)` dispatcher, which returns (z, coupling
logdet); the step's own ActNorm + 1x1 log-det (a constant) is the caller's. x: (B, d), any
strides; z is contiguous, in x's dtype.

- Triton path, forward (inference and training alike): the first GEMM writes y1 straight into
  z, and the second GEMM computes y2 tile by tile and applies the coupling in its epilogue, so
  y2 never touches memory and no concatenation pass is needed. Row log-dets are summed from one
  partial per column block (fixed order, deterministic) and returned in float32 (float64 for
  float64). Where a Triton GEMM would not use tensor cores (float32 under torch's "highest"
  precision, float64: `_utils.triton_gemm`), cuBLAS computes y into z and one elementwise
  kernel applies the coupling in place.
- Triton path, training (`_TritonAffineStep`, for an `nn.Module` conditioner): the forward above
  keeps z and h; the backward is one elementwise kernel that writes dy2 = dz2 * scale into dy's
  second half and the interleaved dh from z2 (no y2 is kept), the conditioner's own backward,
  one add writing dy1 = dz1 + the conditioner's input gradient into dy's first half, and the
  two weight GEMMs on cuBLAS: no concatenation, slice gradient or accumulation pass. Composed
  differentiable ops (`folded_linear`, `affine_coupling`) run instead under torch.compile,
  for tensor subclasses, inside `torch.func` transforms and under autocast, for conditioners that
  are not modules, and to differentiate the backward itself (`create_graph=True`).
- PyTorch path: `flowcore.kernels.torch_step` (in place, with a hand-written training backward).
"""
from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl
from torch import nn
from torch.library import wrap_triton

from flowcore._torch_compat import composed_autograd_only, composed_backward, plain_tensors
from flowcore.backend import resolve
from flowcore.kernels import _utils
from flowcore.kernels._utils import linear_tile, load_shift_logit, log_sigmoid, row_block
from flowcore.kernels.coupling import (
    SCALE_OFFSET,
    _affine_bwd_from_output,
    _affine_fwd_into,
    affine_coupling,
    affine_coupling_ref,
)
from flowcore.kernels.folded_linear import folded_linear, folded_linear_ref
from flowcore.kernels.torch_step import torch_affine_step


def folded_affine_step_ref(x, weight, bias, split: int, conditioner: Callable):
    y = folded_linear_ref(x, weight, bias)
    y1, y2 = y.split([split, y.shape[1] - split], dim=1)
    z2, logdet = affine_coupling_ref(y2, conditioner(y1))
    return torch.cat([y1, z2], dim=1), logdet


@triton.jit
def _folded_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, h_ptr, z_ptr, part_logdet_ptr,
    B, N, K, stride_xb, stride_xk, stride_wn, stride_wk, stride_bias, stride_hb, stride_hd, stride_zb,
    SCALE_OFFSET: tl.constexpr, COUPLING: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """z[rows, ns] = x[rows] @ W[ns].T + bias[ns]; with COUPLING, the affine coupling with
    h[rows, 2 ns], h[rows, 2 ns + 1] is applied before the store and this column block's
    log-det partial of each row is written to part_logdet[column block, rows]."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    col_blocks = tl.cdiv(N, BLOCK_N)
    col_block = tl.program_id(0) % col_blocks
    rows = row_block(tl.program_id(0) // col_blocks, BLOCK_B)
    ns = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = linear_tile(x_ptr, w_ptr, bias_ptr, rows, ns, B, N, K, stride_xb, stride_xk, stride_wn, stride_wk,
                      stride_bias, compute, TF32, BLOCK_B, BLOCK_N, BLOCK_K)
    mask = (rows[:, None] < B) & (ns[None, :] < N)
    if COUPLING:
        shift, logit = load_shift_logit(h_ptr, rows, col_block * BLOCK_N, B, N, stride_hb, stride_hd,
                                    SCALE_OFFSET, compute, BLOCK_B, BLOCK_N)
        acc = (acc + shift) / (1.0 + tl.exp(-logit))
        partial = tl.sum(tl.where(mask, log_sigmoid(logit), 0.0), axis=1)
        tl.store(part_logdet_ptr + col_block * B + rows, partial, mask=rows < B)
    tl.store(z_ptr + rows[:, None] * stride_zb + ns[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)


def _launch_gemm(x, weight, bias, h, z, part_logdet, coupling: bool) -> None:
    B, K = x.shape
    N = weight.shape[0]
    block_b, block_n, block_k, options = _utils.fused_step_tiles(x.dtype, B, max(N, K))
    grid = (triton.cdiv(B, block_b) * triton.cdiv(N, block_n),)
    wrap_triton(_folded_gemm_kernel)[grid](
        x, weight, bias, h, z, part_logdet,
        B, N, K, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), bias.stride(0),
        h.stride(0), h.stride(1), z.stride(0),
        SCALE_OFFSET=SCALE_OFFSET, COUPLING=coupling, FP64=_utils.is_fp64(x), TF32=_utils.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )


@_utils.registered_op("flowcore::folded_gemm_into", mutates_args=("z",))
def _folded_gemm_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: torch.Tensor) -> None:
    """z[:, :n] = x @ weight.T + bias, n = weight.shape[0] (z's other columns untouched)."""
    _utils.record_launch("folded_step_first_half")
    # No coupling here: bias stands in for the h and log-det pointers, which are never read.
    _launch_gemm(x, weight, bias, bias[None, :], z, bias, coupling=False)


@_utils.registered_op("flowcore::folded_gemm_coupling_into", mutates_args=("z",))
def _folded_gemm_coupling_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor,
                               z: torch.Tensor) -> torch.Tensor:
    """z[:, split:] = affine coupling of x @ weight.T + bias with h; returns the row log-dets."""
    B, N = x.shape[0], weight.shape[0]
    block_n = _utils.fused_step_tiles(x.dtype, B, max(N, x.shape[1]))[1]
    part_logdet = torch.empty((triton.cdiv(N, block_n), B), dtype=_utils.accumulation_dtype(x), device=x.device)
    _utils.record_launch("folded_step_coupling")
    _launch_gemm(x, weight, bias, h, z, part_logdet, coupling=True)
    return part_logdet.sum(dim=0)


def _first_half(x, weight, bias, split: int) -> torch.Tensor:
    """z with y1 = x @ W[:split].T + b[:split] in its first `split` columns; with cuBLAS (see
    `_utils.triton_gemm`), all of y = x @ W.T + b."""
    if _utils.triton_gemm(x):
        z = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
        _folded_gemm_into(x, weight[:split], bias[:split], z)
        return z
    return torch.addmm(bias, x, weight.T)


def _second_half(x, weight, bias, split: int, h, z) -> torch.Tensor:
    """z[:, split:] = the coupling of y2 with h (after `_first_half`); returns the row log-dets."""
    _utils.require_matrix("folded_affine_step conditioner output", h, 2 * (weight.shape[0] - split))
    if _utils.triton_gemm(x):
        return _folded_gemm_coupling_into(x, weight[split:], bias[split:], h, z[:, split:])
    return _affine_fwd_into(z[:, split:], h, z[:, split:])


class _TritonAffineStep(torch.autograd.Function):
    """The Triton training step with a hand-written backward (see the module docstring).

    The conditioner's graph is built in the forward from z's first half and kept on ctx. That
    view is taken through `z.data`, whose version counter is its own: the writes into z's second
    half that follow (in place, under a dispatch mode seen as mutations of z) leave the saved
    first half valid, as it is."""

    @staticmethod
    def forward(ctx, x, weight, bias, split: int, conditioner: nn.Module, *params):
        z = _first_half(x, weight, bias, split)
        with torch.enable_grad():
            y1 = z.data[:, :split].requires_grad_()
            h = conditioner(y1)
        logdet = _second_half(x, weight, bias, split, h.detach(), z)
        ctx.split, ctx.conditioner, ctx.graph = split, conditioner, (y1, h)
        ctx.save_for_backward(x, weight, bias, z, *params)
        return z, logdet

    @staticmethod
    def backward(ctx, dz, dlogdet):
        x, weight, bias, z, *params = ctx.saved_tensors
        split, (y1, h) = ctx.split, ctx.graph
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_params = ctx.needs_input_grad[5:]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the composed twin
            outputs = folded_affine_step_ref(x, weight, bias, split, ctx.conditioner)
            grads = composed_backward(outputs, (x, weight, bias, *params), (need_x, need_w, need_b, *need_params),
                                      (dz, dlogdet))
            return (*grads[:3], None, None, *grads[3:])
        dz = torch.zeros_like(z) if dz is None else dz
        dlogdet = z.new_zeros(z.shape[0], dtype=_utils.accumulation_dtype(z)) if dlogdet is None else dlogdet
        dy = torch.empty_like(z)
        dh = _affine_bwd_from_output(dz[:, split:], dlogdet, z[:, split:], h.detach(), dy[:, split:])
        wanted = [y1, *(p for p, needed in zip(params, need_params) if needed)]
        grads = iter(torch.autograd.grad(h, wanted, dh, allow_unused=True))
        dy1 = next(grads)
        if dy1 is None:
            dy[:, :split].copy_(dz[:, :split])
        else:
            torch.add(dz[:, :split], dy1, out=dy[:, :split])
        param_grads = [next(grads) if needed else None for needed in need_params]
        dx = dy @ weight if need_x else None
        dweight = dy.T @ x if need_w else None
        dbias = dy.sum(dim=0) if need_b else None
        return dx, dweight, dbias, None, None, *param_grads


def folded_affine_step(x, weight, bias, split: int, conditioner: Callable):
    """(z, coupling logdet) of one folded affine step; see the module docstring."""
    _utils.require_matrix("folded_affine_step input", x)
    _utils.require_matrix("folded_affine_step weight", weight, x.shape[1])
    _utils.require_vector("folded_affine_step bias", bias, weight.shape[0])
    if not 0 < split < weight.shape[0]:
        raise ValueError(f"folded_affine_step split must be in 1..{weight.shape[0] - 1}, got {split}")
    if resolve(x) != "triton":
        return torch_affine_step(x, weight, bias, split, conditioner, folded_affine_step_ref)
    _utils.require_launchable(x, "folded_affine_step")
    params = list(conditioner.parameters()) if isinstance(conditioner, nn.Module) else []
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias, *params))
    if wants_grad:
        if isinstance(conditioner, nn.Module) and plain_tensors((x, weight, bias)) and not composed_autograd_only(x):
            return _TritonAffineStep.apply(x, weight, bias, split, conditioner, *params)
        return _composed_step(x, weight, bias, split, conditioner)
    z = _first_half(x, weight, bias, split)
    h = conditioner(z[:, :split])
    if h.requires_grad:  # a conditioner that closes over trainable tensors: keep h's gradient path
        return _composed_step(x, weight, bias, split, conditioner)
    return z, _second_half(x, weight, bias, split, h, z)


def _composed_step(x, weight, bias, split: int, conditioner: Callable):
    """The step as composed differentiable Triton ops (autograd joins them)."""
    y = folded_linear(x, weight, bias)
    y1 = y[:, :split]
    z2, logdet = affine_coupling(y[:, split:], conditioner(y1))
    return torch.cat([y1, z2], dim=1), logdet
