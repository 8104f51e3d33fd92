"""The LU product W = L @ U of `LULinear`, with L = tril(lower, -1) + I and
U = triu(upper, 1) + diag(diagonal): `lu_factors` (L and U, built here only), `lu_product_ref`
(the dense composition) and `lu_product` (the dispatcher), a pure-PyTorch op.

`lu_product` runs `_TriangularProduct`, a blocked product with a hand-written backward that
skips the zero blocks of L and U (W is rebuilt at every training step): with a 2 x 2 block split
the product and each of its two gradients are 5 half-size GEMMs instead of 8. Inside
`torch.func` transforms and under autocast it runs the composed `lu_product_ref`; under
`create_graph=True` the backward differentiates `lu_product_ref`, so higher-order gradients
are exact.
"""
from __future__ import annotations

import torch

from flowcore._torch_compat import composed_autograd_only, composed_backward


def lu_factors(lower: torch.Tensor, upper: torch.Tensor, diagonal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, U): unit lower-triangular L from the strict lower part of `lower`, upper-triangular U
    from the strict upper part of `upper` with `diagonal` on its diagonal."""
    eye = torch.eye(lower.shape[0], dtype=lower.dtype, device=lower.device)
    return torch.tril(lower, -1) + eye, torch.triu(upper, 1) + torch.diag(diagonal)


def lu_product_ref(lower: torch.Tensor, upper: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """(tril(lower, -1) + I) @ (triu(upper, 1) + diag(diagonal)), composed under autograd."""
    L, U = lu_factors(lower, upper, diagonal)
    return L @ U


def lu_product(lower: torch.Tensor, upper: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    if composed_autograd_only(lower):
        return lu_product_ref(lower, upper, diagonal)
    return _TriangularProduct.apply(lower, upper, diagonal)


class _TriangularProduct(torch.autograd.Function):
    """L @ U on the non-zero blocks only (see the module docstring)."""

    @staticmethod
    def forward(ctx, lower, upper, diagonal):
        L, U = lu_factors(lower, upper, diagonal)
        ctx.save_for_backward(L, U, lower, upper, diagonal)
        h = L.shape[0] // 2
        (L11, _), (L21, L22) = _blocks(L, h)
        (U11, U12), (_, U22) = _blocks(U, h)
        out = torch.empty_like(L)
        (C11, C12), (C21, C22) = _blocks(out, h)
        C11.copy_(L11 @ U11)
        C12.copy_(L11 @ U12)
        C21.copy_(L21 @ U11)
        C22.copy_(torch.addmm(L21 @ U12, L22, U22))
        return out

    @staticmethod
    def backward(ctx, grad):
        L, U, *inputs = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the dense product, so higher-order gradients are exact
            return _dense_backward(ctx, grad, *inputs)
        h = L.shape[0] // 2
        (L11, _), (L21, L22) = _blocks(L, h)
        (U11, U12), (_, U22) = _blocks(U, h)
        (G11, G12), (G21, G22) = _blocks(grad, h)
        # d lower: the strictly lower part of grad @ U.T; d upper and diagonal: the upper part of L.T @ grad
        d_lower, d_upper = torch.zeros_like(L), torch.zeros_like(U)
        (A11, _), (A21, A22) = _blocks(d_lower, h)
        (B11, B12), (_, B22) = _blocks(d_upper, h)
        A11.copy_(torch.addmm(G11 @ U11.T, G12, U12.T).tril_(-1))
        A21.copy_(torch.addmm(G21 @ U11.T, G22, U12.T))
        A22.copy_((G22 @ U22.T).tril_(-1))
        B11.copy_(torch.addmm(L11.T @ G11, L21.T, G21))
        B12.copy_(torch.addmm(L11.T @ G12, L21.T, G22))
        B22.copy_(L22.T @ G22)
        d_diagonal = d_upper.diagonal().clone()
        return d_lower, d_upper.triu_(1), d_diagonal


def _dense_backward(ctx, grad, lower, upper, diagonal):
    return composed_backward(lu_product_ref(lower, upper, diagonal), (lower, upper, diagonal),
                             ctx.needs_input_grad, grad)


def _blocks(matrix: torch.Tensor, h: int):
    """((top-left, top-right), (bottom-left, bottom-right)) views, split after row/column h."""
    return ((matrix[:h, :h], matrix[:h, h:]), (matrix[h:, :h], matrix[h:, h:]))
