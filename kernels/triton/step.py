"""The step with an LU 1x1 on the Triton kernels, ActNorm folded into the 1x1 weight (`reference.fold`):
y = x @ weight.T + bias, then the coupling of y's halves, in the second GEMM's epilogue (y2 never touches memory);
where a Triton GEMM would not use tensor cores, cuBLAS computes y and the coupling runs in place after it. The
backward works from z: one elementwise kernel (none if additive), the conditioner's, the weight GEMMs on cuBLAS.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn
from torch.library import wrap_triton

from .._utils import accumulation_dtype, is_fp64, require_matrix
from ..compat import composed_backward
from ..reference import folded_linear_backward, folded_step_ref, zero_logdet
from . import _utils
from ._utils import INTERPRETED, affine_couple, load_shift_logit, row_block
from .coupling import _affine_bwd_from_output, _affine_fwd_into

EPILOGUES = {None: 0, "affine": 1, "additive": 2}
"""The GEMM kernel's COUPLING constant for each coupling applied in its epilogue (None: y alone)."""

INTERPRETER_DOT_UPCAST = tl.constexpr(INTERPRETED)
"""The interpreter's bfloat16 `tl.dot` returns garbage, so there 16-bit dot operands are widened to
float32 (`dot_operand`): the same products and accumulation as a 16-bit MMA."""


@triton.jit
def dot_operand(t, dtype: tl.constexpr):
    """`t` rounded to `dtype`, a GEMM's operand type (widened again in the interpreter)."""
    t = t.to(dtype)
    if INTERPRETER_DOT_UPCAST:
        if dtype.is_fp16() or dtype.is_bf16():
            t = t.to(tl.float32)
    return t


@triton.jit
def _folded_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, h_ptr, z_ptr, part_logdet_ptr,
    B, N, K, stride_xb, stride_xk, stride_wn, stride_wk, stride_bias, stride_hb, stride_hd, stride_zb,
    COUPLING: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """z[rows, ns] = x[rows] @ W[ns].T + bias[ns], then (`EPILOGUES`) for COUPLING 1 the affine coupling
    with h[rows, 2 ns], h[rows, 2 ns + 1], this column block's log-det partial of each row written to
    part_logdet[column block, rows]; for COUPLING 2 the additive coupling, + h[rows, ns]."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = x_ptr.dtype.element_ty
    col_blocks = tl.cdiv(N, BLOCK_N)
    col_block = tl.program_id(0) % col_blocks
    rows = row_block(tl.program_id(0) // col_blocks, BLOCK_B)
    ns = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=compute)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < B) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + ns[None, :] * stride_wn + ks[:, None] * stride_wk,
                    mask=(ns[None, :] < N) & (ks[:, None] < K), other=0.0)
        acc = tl.dot(dot_operand(x, operand), dot_operand(w, operand), acc,
                     input_precision="tf32" if TF32 else "ieee", out_dtype=compute)
    acc = acc + tl.load(bias_ptr + ns * stride_bias, mask=ns < N, other=0.0).to(compute)[None, :]
    mask = (rows[:, None] < B) & (ns[None, :] < N)
    if COUPLING == 1:
        shift, logit = load_shift_logit(h_ptr, rows, col_block * BLOCK_N, B, N, stride_hb, stride_hd, compute,
                                        BLOCK_B, BLOCK_N)
        acc, log_scale = affine_couple(acc, shift, logit, False)
        partial = tl.sum(tl.where(mask, log_scale, 0.0), axis=1)
        tl.store(part_logdet_ptr + col_block * B + rows, partial, mask=rows < B)
    if COUPLING == 2:
        acc += tl.load(h_ptr + rows[:, None] * stride_hb + ns[None, :] * stride_hd, mask=mask, other=0.0).to(compute)
    tl.store(z_ptr + rows[:, None] * stride_zb + ns[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)


def _launch_gemm(x, weight, bias, h, z, coupling: str | None) -> torch.Tensor:
    B, K = x.shape
    N = weight.shape[0]
    block_b, block_n, block_k, options = _utils.fused_step_tiles(x.dtype, B, max(N, K))
    col_blocks = triton.cdiv(N, block_n)
    part_logdet = x.new_empty((col_blocks, B), dtype=accumulation_dtype(x)) if coupling == "affine" else bias
    wrap_triton(_folded_gemm_kernel)[(triton.cdiv(B, block_b) * col_blocks,)](
        x, weight, bias, h, z, part_logdet, B, N, K, *x.stride(), *weight.stride(), bias.stride(0), *h.stride(),
        z.stride(0), COUPLING=EPILOGUES[coupling], FP64=is_fp64(x), TF32=_utils.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return part_logdet


@_utils.registered_op("flowcore::folded_gemm_into", mutates_args=("z",))
def _folded_gemm_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: torch.Tensor) -> None:
    """z[:, :n] = x @ weight.T + bias, n = weight.shape[0]; bias stands in for h and the log-dets (never read)."""
    _launch_gemm(x, weight, bias, bias[None, :], z, coupling=None)


@_utils.registered_op("flowcore::folded_gemm_coupling_into", mutates_args=("z",))
def _folded_gemm_coupling_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor,
                               z: torch.Tensor) -> torch.Tensor:
    """z[:, split:] = affine coupling of x @ weight.T + bias with h; returns the row log-dets."""
    return _launch_gemm(x, weight, bias, h, z, coupling="affine").sum(dim=0)


@_utils.registered_op("flowcore::folded_gemm_additive_into", mutates_args=("z",))
def _folded_gemm_additive_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor,
                               z: torch.Tensor) -> None:
    """z[:, split:] = x @ weight.T + bias + h: the additive coupling in the GEMM's epilogue."""
    _launch_gemm(x, weight, bias, h, z, coupling="additive")


def _first_half(x, weight, bias, split: int) -> torch.Tensor:
    """z with y1 = x @ W[:split].T + b[:split] in its first `split` columns; on cuBLAS, all of y = x @ W.T + b."""
    if _utils.triton_gemm(x):
        z = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
        _folded_gemm_into(x, weight[:split], bias[:split], z)
        return z
    return torch.addmm(bias, x, weight.T)


def _second_half(x, weight, bias, split: int, h, z, coupling: str) -> torch.Tensor:
    """z[:, split:] = the coupling of y2 with h (after `_first_half`); returns the row log-dets."""
    require_matrix("step conditioner output", h, (1 if coupling == "additive" else 2) * (weight.shape[0] - split))
    if coupling == "additive":
        if _utils.triton_gemm(x):
            _folded_gemm_additive_into(x, weight[split:], bias[split:], h, z[:, split:])
        else:
            z[:, split:].add_(h)
        return zero_logdet(x)
    if _utils.triton_gemm(x):
        return _folded_gemm_coupling_into(x, weight[split:], bias[split:], h, z[:, split:])
    return _affine_fwd_into(z[:, split:], h, z[:, split:])


class _TritonStep(torch.autograd.Function):
    """The Triton training step with a hand-written backward. The conditioner's graph is built from `z.data`'s
    first half, whose version counter is its own: the in-place writes into z's second half leave it valid."""

    @staticmethod
    def forward(ctx, x, weight, bias, split: int, coupling: str, conditioner: nn.Module, *params):
        z = _first_half(x, weight, bias, split)
        with torch.enable_grad():
            y1 = z.data[:, :split].requires_grad_()
            h = conditioner(y1)
        logdet = _second_half(x, weight, bias, split, h.detach(), z, coupling)
        ctx.split, ctx.coupling, ctx.conditioner, ctx.graph = split, coupling, conditioner, (y1, h)
        ctx.save_for_backward(x, weight, bias, z, *params)
        return z, logdet

    @staticmethod
    def backward(ctx, dz, dlogdet):
        x, weight, bias, z, *params = ctx.saved_tensors
        split, (y1, h) = ctx.split, ctx.graph
        needs = ctx.needs_input_grad[:3]  # x, weight, bias
        need_params = ctx.needs_input_grad[6:]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the composed twin
            outputs = folded_step_ref(x, weight, bias, split, ctx.conditioner, ctx.coupling)
            grads = composed_backward(outputs, (x, weight, bias, *params), (*needs, *need_params), (dz, dlogdet))
            return (*grads[:3], None, None, None, *grads[3:])
        dy = torch.empty_like(z)
        if ctx.coupling == "additive":  # z2 = y2 + h: dy2 = dh = dz2
            dh = dy[:, split:].copy_(dz[:, split:])
        else:
            dh = _affine_bwd_from_output(dz[:, split:], dlogdet, z[:, split:], h.detach(), dy[:, split:])
        wanted = [y1, *(p for p, needed in zip(params, need_params) if needed)]
        grads = iter(torch.autograd.grad(h, wanted, dh, allow_unused=True))
        dy1 = next(grads)
        if dy1 is None:
            dy[:, :split].copy_(dz[:, :split])
        else:
            torch.add(dz[:, :split], dy1, out=dy[:, :split])
        param_grads = [next(grads) if needed else None for needed in need_params]
        return (*folded_linear_backward(dy, x, weight, needs), None, None, None, *param_grads)


def folded_step(x, weight, bias, split: int, conditioner, coupling: str = "affine"):
    """(z, coupling logdet) of the folded step on the Triton kernels (the other arguments checked by the plan)."""
    _utils.require_launchable(x, "step")
    params = list(conditioner.parameters()) if isinstance(conditioner, nn.Module) else []
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias, *params)):
        return _TritonStep.apply(x, weight, bias, split, coupling, conditioner, *params)
    z = _first_half(x, weight, bias, split)
    return z, _second_half(x, weight, bias, split, conditioner(z[:, :split]), z, coupling)
