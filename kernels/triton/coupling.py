"""The Triton affine coupling kernels (the math: `reference.couple_ref`), the entry point `couple`, and the
in-place forward and from-output backward the step uses. Row log-dets are summed in registers across the row
(deterministic); the backward recomputes the scale from h and writes d(input) and dh in one elementwise pass.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .._utils import accumulation_dtype, is_fp64, require_matrix
from ..reference import couple_ref, uncouple_ref
from . import _utils
from ._utils import affine_couple, load_shift_logit, row_block


@triton.jit
def _affine_fwd_kernel(
    inp_ptr, h_ptr, out_ptr, logdet_ptr,
    B, D2, stride_ib, stride_id, stride_hb, stride_hd, stride_ob,
    INVERSE: tl.constexpr, FP64: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per row block: walks the columns, writes z2 (or x2) and the row log-dets. out may be inp
    itself (each element is read before it is written, by the same program)."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    rows = row_block(tl.program_id(0), BLOCK_B)
    logdet = tl.zeros((BLOCK_B, BLOCK_D), dtype=compute)
    for d0 in range(0, D2, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < B) & (cols[None, :] < D2)
        inp = tl.load(inp_ptr + rows[:, None] * stride_ib + cols[None, :] * stride_id, mask=mask, other=0.0)
        shift, logit = load_shift_logit(h_ptr, rows, d0, B, D2, stride_hb, stride_hd, compute, BLOCK_B, BLOCK_D)
        out, log_scale = affine_couple(inp.to(compute), shift, logit, INVERSE)
        tl.store(out_ptr + rows[:, None] * stride_ob + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)
        logdet += tl.where(mask, log_scale, 0.0)
    tl.store(logdet_ptr + rows, tl.sum(logdet, axis=1).to(logdet_ptr.dtype.element_ty), mask=rows < B)


@triton.jit
def _affine_bwd_kernel(
    grad_ptr, grad_logdet_ptr, inp_ptr, h_ptr, dinp_ptr, dh_ptr,
    B, D2, stride_gb, stride_gd, stride_gl, stride_ib, stride_id, stride_hb, stride_hd, stride_dib,
    INVERSE: tl.constexpr, FROM_OUTPUT: tl.constexpr, FP64: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Elementwise: d(input) and the interleaved dh = [dshift, dlogit] from the output grad g and the log-det
    grad gl. With s = sigmoid(logit) and ds/dlogit = s(1 - s):
    forward  z = (x + shift) s : dx = dshift = g s,  dlogit = (1 - s)(g z + gl);
    inverse  x = z / s - shift : dz = g / s, dshift = -g, dlogit = (1 - s)(gl - g z / s).
    With FROM_OUTPUT (forward only) inp holds the output z (the fused training step keeps z, not y2)."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    rows = row_block(tl.program_id(0), BLOCK_B)
    col_start = tl.program_id(1) * BLOCK_D
    cols = col_start + tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < B) & (cols[None, :] < D2)
    g = tl.load(grad_ptr + rows[:, None] * stride_gb + cols[None, :] * stride_gd, mask=mask, other=0.0).to(compute)
    gl = tl.load(grad_logdet_ptr + rows * stride_gl, mask=rows < B, other=0.0).to(compute)[:, None]
    inp = tl.load(inp_ptr + rows[:, None] * stride_ib + cols[None, :] * stride_id, mask=mask, other=0.0).to(compute)
    shift, logit = load_shift_logit(h_ptr, rows, col_start, B, D2, stride_hb, stride_hd, compute, BLOCK_B, BLOCK_D)
    scale = 1.0 / (1.0 + tl.exp(-logit))
    if INVERSE:
        dinp = g / scale
        dshift = -g
        dlogit = (1.0 - scale) * (gl - g * inp / scale)
    else:
        dinp = g * scale
        dshift = dinp
        z = inp if FROM_OUTPUT else (inp + shift) * scale
        dlogit = (1.0 - scale) * (g * z + gl)
    tl.store(dinp_ptr + rows[:, None] * stride_dib + cols[None, :], dinp.to(dinp_ptr.dtype.element_ty), mask=mask)
    dh = tl.reshape(tl.join(dshift, dlogit), (BLOCK_B, 2 * BLOCK_D))
    cols2 = 2 * col_start + tl.arange(0, 2 * BLOCK_D)
    mask2 = (rows[:, None] < B) & (cols2[None, :] < 2 * D2)
    tl.store(dh_ptr + rows[:, None] * (2 * D2) + cols2[None, :], dh.to(dh_ptr.dtype.element_ty), mask=mask2)


def _launch_affine_fwd(inp, h, out, inverse: bool) -> torch.Tensor:
    B, D2 = inp.shape
    logdet = torch.empty((B,), dtype=accumulation_dtype(inp), device=inp.device)
    block_b, block_d = _utils.elementwise_tiles("coupling", D2)
    wrap_triton(_affine_fwd_kernel)[(triton.cdiv(B, block_b),)](
        inp, h, out, logdet, B, D2, inp.stride(0), inp.stride(1), h.stride(0), h.stride(1), out.stride(0),
        INVERSE=inverse, FP64=is_fp64(inp), BLOCK_B=block_b, BLOCK_D=block_d,
    )
    return logdet


@_utils.registered_op("flowcore::affine_coupling_fwd", mutates_args=())
def _affine_fwd(inp: torch.Tensor, h: torch.Tensor, inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    return out, _launch_affine_fwd(inp, h, out, inverse)


@_utils.registered_op("flowcore::affine_coupling_fwd_into", mutates_args=("out",))
def _affine_fwd_into(inp: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = the forward coupling of inp (out may be inp; unit column stride); returns the row log-dets."""
    return _launch_affine_fwd(inp, h, out, inverse=False)


def _launch_affine_bwd(grad, grad_logdet, inp, h, dinp, inverse: bool, from_output: bool) -> torch.Tensor:
    B, D2 = inp.shape
    dh = torch.empty((B, 2 * D2), dtype=h.dtype, device=h.device)
    block_b, block_d = _utils.elementwise_tiles("coupling", D2)
    wrap_triton(_affine_bwd_kernel)[(triton.cdiv(B, block_b), triton.cdiv(D2, block_d))](
        grad, grad_logdet, inp, h, dinp, dh, B, D2, *grad.stride(), grad_logdet.stride(0), *inp.stride(), *h.stride(),
        dinp.stride(0), INVERSE=inverse, FROM_OUTPUT=from_output, FP64=is_fp64(inp), BLOCK_B=block_b, BLOCK_D=block_d,
    )
    return dh


@_utils.registered_op("flowcore::affine_coupling_bwd", mutates_args=())
def _affine_bwd(grad: torch.Tensor, grad_logdet: torch.Tensor, inp: torch.Tensor, h: torch.Tensor,
                inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dinp = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    return dinp, _launch_affine_bwd(grad, grad_logdet, inp, h, dinp, inverse, from_output=False)


@_utils.registered_op("flowcore::affine_coupling_bwd_from_output", mutates_args=("dinp",))
def _affine_bwd_from_output(grad: torch.Tensor, grad_logdet: torch.Tensor, out: torch.Tensor, h: torch.Tensor,
                            dinp: torch.Tensor) -> torch.Tensor:
    """The forward coupling's backward from its output z2: d(input) into `dinp` (unit column stride); returns dh."""
    return _launch_affine_bwd(grad, grad_logdet, out, h, dinp, inverse=False, from_output=True)


class _AffineCoupling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, h, inverse):
        ctx.save_for_backward(inp, h)
        ctx.inverse = inverse
        return _affine_fwd(inp, h, inverse)

    @staticmethod
    def backward(ctx, grad, grad_logdet):
        return (*_affine_bwd(grad, grad_logdet, *ctx.saved_tensors, ctx.inverse), None)


def couple(inp, h, coupling: str, inverse: bool):
    """(out, log-det of the forward map per row) of the coupling of inp with h, or of its inverse; arguments
    checked. The additive coupling is one add (or subtract), one torch kernel already: its twin runs."""
    op = f"{coupling}_coupling{'_inverse' if inverse else ''}"
    require_matrix(f"{op} input", inp)
    require_matrix(f"{op} conditioner output h", h, (2 if coupling == "affine" else 1) * inp.shape[1])
    if h.shape[0] != inp.shape[0]:
        raise ValueError(f"{op}: input has {inp.shape[0]} rows but h has {h.shape[0]}")
    if coupling == "additive":
        return (uncouple_ref if inverse else couple_ref)(inp, h, coupling)
    _utils.require_launchable(inp, op)
    return _AffineCoupling.apply(inp, h, inverse)
