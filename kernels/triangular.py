"""The LU ops of `LULinear`, with L = tril(lower, -1) + I and U = triu(upper, 1) + diag(diagonal),
all pure PyTorch: `lu_factors` (L and U, built here only); `lu_product` (W = L @ U) and its
`lu_product_ref`; `factored_linear` (an ActNorm + LU linear applied factor by factor) and its
`factored_linear_ref`.

`lu_product` runs `_TriangularProduct`, a blocked product with a hand-written backward that
skips the zero blocks of L and U (W is rebuilt at every training step): with a 2 x 2 block split
the product and each of its two gradients are 5 half-size GEMMs instead of 8. Inside
`torch.func` transforms and under autocast it runs the composed `lu_product_ref`; under
`create_graph=True` the backward differentiates `lu_product_ref`, so higher-order gradients
are exact.

`factored_linear(x, loc, logs, lu, diagonal, perm)` = ((x + loc) * exp(logs)) @ (P L U).T, with
L and U packed in one matrix `lu` (`LULinear`), never forms W: it multiplies the batch by U.T,
then L.T, then permutes the columns, and its hand-written backward gives the factors' gradients
as rank-batch products, the strict triangles only. For a batch of B rows that is 12 B d^2 flops
against about 4 d^3 for assembling W and differentiating the product, so training with batches
much smaller than d (the paper's 32) applies the factors (`FlowStep`); large batches fold W once
and run one GEMM. At small batches its cost is memory traffic over d x d matrices, so it reads the
off-diagonal blocks of L and U straight from `lu` and masks only the diagonal blocks.
"""
from __future__ import annotations

import functools

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


def factored_linear_ref(x, loc, logs, lu, diagonal, perm):
    """((x + loc) * exp(logs)) @ (P L U).T with L, U from the packed `lu` (see `factored_linear`),
    composed under autograd."""
    return ((x + loc) * torch.exp(logs)) @ lu_product_ref(lu, lu, diagonal)[perm].T


def factored_linear(x, loc, logs, lu, diagonal, perm):
    """a = (x + loc) * exp(logs), then y = a @ (P L U).T applied factor by factor.

    Args:
        x: (B, d) batch.
        loc, logs: ActNorm's shift and log-scale, (d,).
        lu: (d, d) packed factors: L = tril(lu, -1) + I, U = triu(lu, 1) + diag(diagonal); lu's own
            diagonal is not used (its gradient is 0).
        diagonal: (d,) U's diagonal.
        perm: (d,) int64 row order of W, W[i] = (L U)[perm[i]].

    Example:
        >>> y = factored_linear(x, loc, logs, mixing.lu, mixing.diagonal(), mixing.perm)
    """
    if composed_autograd_only(x):
        return factored_linear_ref(x, loc, logs, lu, diagonal, perm)
    return _FactoredLinear.apply(x, loc, logs, lu, diagonal, perm)


class _FactoredLinear(torch.autograd.Function):
    """The factor-by-factor product (`factored_forward`, `factored_backward`)."""

    @staticmethod
    def forward(ctx, x, loc, logs, lu, diagonal, perm):
        y, saved = factored_forward(x, loc, logs, lu, diagonal, perm)
        ctx.save_for_backward(x, loc, logs, lu, diagonal, perm, *saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, loc, logs, lu, diagonal, perm, *saved = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the composed twin, so higher-order gradients are exact
            return (*composed_backward(factored_linear_ref(x, loc, logs, lu, diagonal, perm),
                                       (x, loc, logs, lu, diagonal), needs[:5], dy), None)
        return (*factored_backward(dy, lu, perm, saved, needs[:5]), None)


BLOCKED_FROM_DIM = 384
"""`factored_linear` applies L and U on their 2 x 2 block split from this width; narrower, as whole
masked triangles: more flops, fewer and larger ops, which is what costs at small widths (batch 32,
fp32, one thread: at d = 192 whole 373 us against blocked 682 us, forward and backward; 1161
against 1084 at d = 384, 6133 against 4081 at d = 768)."""


def factored_forward(x, loc, logs, lu, diagonal, perm):
    """(y, saved) of `factored_linear` without autograd. From `BLOCKED_FROM_DIM` features on a 2 x 2
    block split of L and U: the off-diagonal blocks are read straight from `lu`, only the diagonal
    blocks are masked, and the zero blocks are never multiplied; below it on the whole masked
    triangles. `saved` is what `factored_backward` needs."""
    scale = torch.exp(logs)
    a = torch.add(x, loc).mul_(scale)
    d = lu.shape[0]
    if d < BLOCKED_FROM_DIM:
        strictly_lower, strictly_upper, identity = _masks(d, lu.dtype, lu.device)
        L = torch.addcmul(identity, lu, strictly_lower)
        U = torch.diag(diagonal).addcmul_(lu, strictly_upper)
        t = a @ U.T
        return (t @ L.T).index_select(1, perm), (scale, a, t, L, U)
    h = d // 2
    (F11, U12), (L21, F22) = _blocks(lu, h)
    L11, L22 = _unit_lower(F11), _unit_lower(F22)
    U11, U22 = _upper(F11, diagonal[:h]), _upper(F22, diagonal[h:])
    a1, a2 = a[:, :h], a[:, h:]
    t = torch.empty_like(a)
    t1, t2 = t[:, :h], t[:, h:]
    torch.mm(a1, U11.T, out=t1).addmm_(a2, U12.T)
    torch.mm(a2, U22.T, out=t2)
    v = torch.empty_like(a)
    torch.mm(t1, L11.T, out=v[:, :h])
    torch.mm(t1, L21.T, out=v[:, h:]).addmm_(t2, L22.T)
    return v.index_select(1, perm), (scale, a, t, L11, L22, U11, U22)


def factored_backward(dy, lu, perm, saved, needs):
    """(dx, d loc, d logs, d lu, d diagonal) of `factored_linear` from dy and `factored_forward`'s
    `saved`, without autograd; `needs` flags which of them are wanted (None for the others). The
    factors' gradients are rank-batch products, strict triangles only (block by block from
    `BLOCKED_FROM_DIM` features)."""
    dv = dy.index_select(1, torch.argsort(perm))  # y = v[:, perm]
    if lu.shape[0] < BLOCKED_FROM_DIM:
        dt, da, d_lu, d_diagonal = _whole_backward(dv, lu, saved, needs)
    else:
        dt, da, d_lu, d_diagonal = _blocked_backward(dv, lu, saved, needs)
    scale, a = saved[:2]
    dx = d_loc = d_logs = None
    if da is not None:
        d_logs = (da * a).sum(dim=0) if needs[2] else None
        dx = da.mul_(scale)
        d_loc = dx.sum(dim=0) if needs[1] else None
    return dx, d_loc, d_logs, d_lu if needs[3] else None, d_diagonal if needs[4] else None


def _whole_backward(dv, lu, saved, needs):
    """(dt, da, d lu, d diagonal) on the whole masked triangles (da and the factors' gradients
    None when not wanted)."""
    _, a, t, L, U = saved
    dt = dv @ L
    d_lu = d_diagonal = da = None
    if needs[3] or needs[4]:
        strictly_lower, strictly_upper, _ = _masks(lu.shape[0], lu.dtype, lu.device)
        upper = dt.T @ a  # d U with its diagonal
        d_lu = torch.mul(dv.T @ t, strictly_lower).addcmul_(upper, strictly_upper)
        d_diagonal = upper.diagonal()
    if needs[0] or needs[1] or needs[2]:
        da = dt @ U
    return dt, da, d_lu, d_diagonal


def _blocked_backward(dv, lu, saved, needs):
    """`_whole_backward` on the 2 x 2 block split."""
    _, a, t, L11, L22, U11, U22 = saved
    h = lu.shape[0] // 2
    (_, U12), (L21, _) = _blocks(lu, h)
    dv1, dv2, t1, t2, a1, a2 = dv[:, :h], dv[:, h:], t[:, :h], t[:, h:], a[:, :h], a[:, h:]
    dt = torch.empty_like(dv)
    dt1, dt2 = dt[:, :h], dt[:, h:]
    torch.mm(dv1, L11, out=dt1).addmm_(dv2, L21)
    torch.mm(dv2, L22, out=dt2)
    d_lu = d_diagonal = da = None
    if needs[3] or needs[4]:
        d_lu = torch.empty_like(lu)
        (G11, G12), (G21, G22) = _blocks(d_lu, h)
        torch.mm(dv2.T, t1, out=G21)  # d L21
        torch.mm(dt1.T, a2, out=G12)  # d U12
        upper11, upper22 = dt1.T @ a1, dt2.T @ a2  # d U11, d U22 with their diagonals
        _strict_triangles(dv1.T @ t1, upper11, out=G11)
        _strict_triangles(dv2.T @ t2, upper22, out=G22)
        d_diagonal = torch.cat([upper11.diagonal(), upper22.diagonal()])
    if needs[0] or needs[1] or needs[2]:
        da = torch.empty_like(dt)
        torch.mm(dt1, U11, out=da[:, :h])
        torch.mm(dt1, U12, out=da[:, h:]).addmm_(dt2, U22)
    return dt, da, d_lu, d_diagonal


def _unit_lower(block: torch.Tensor) -> torch.Tensor:
    """tril(block, -1) + I."""
    strictly_lower, _, identity = _masks(block.shape[0], block.dtype, block.device)
    return torch.addcmul(identity, block, strictly_lower)


def _upper(block: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """triu(block, 1) + diag(diagonal)."""
    return torch.diag(diagonal).addcmul_(block, _masks(block.shape[0], block.dtype, block.device)[1])


def _strict_triangles(lower: torch.Tensor, upper: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`lower`'s strict lower triangle plus `upper`'s strict upper triangle, into `out`."""
    strictly_lower, strictly_upper, _ = _masks(lower.shape[0], lower.dtype, lower.device)
    torch.mul(lower, strictly_lower, out=out)
    return out.addcmul_(upper, strictly_upper)


@functools.lru_cache(maxsize=32)
def _masks(d: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (strictly lower, strictly upper) 0/1 masks and the identity of a (d, d) matrix, built
    once per size and dtype: a multiplication by a mask is one vectorised pass, several times
    faster than `tril`, `triu` or `torch.where` on a bool mask."""
    ones = torch.ones(d, d, dtype=dtype, device=device)
    return torch.tril(ones, -1), torch.triu(ones, 1), torch.eye(d, dtype=dtype, device=device)
