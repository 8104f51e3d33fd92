"""The LU ops of `LULinear`, L = tril(lower, -1) + I and U = triu(upper, 1) + diag(diagonal), in PyTorch, each
beside its composed `_ref` twin. `lu_product` (W = L @ U, rebuilt at every training step) skips the zero blocks
of L and U; the factored linear map ((x + loc) * exp(logs)) @ (P L U).T never forms W (O(B d^2), not O(d^3)).
"""
from __future__ import annotations

import functools

import torch

from .compat import composed_autograd_only, composed_backward


def lu_factors(lower: torch.Tensor, upper: torch.Tensor, diagonal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, U) = (tril(lower, -1) + I, triu(upper, 1) + diag(diagonal))."""
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
    """L @ U on the non-zero blocks only; the composed twin under create_graph=True."""

    @staticmethod
    def forward(ctx, lower, upper, diagonal):
        L, U = lu_factors(lower, upper, diagonal)
        ctx.save_for_backward(L, U, lower, upper, diagonal)
        (L11, _), (L21, L22) = _blocks(L)
        (U11, U12), (_, U22) = _blocks(U)
        out = torch.empty_like(L)
        (C11, C12), (C21, C22) = _blocks(out)
        C11.copy_(L11 @ U11)
        C12.copy_(L11 @ U12)
        C21.copy_(L21 @ U11)
        C22.copy_(torch.addmm(L21 @ U12, L22, U22))
        return out

    @staticmethod
    def backward(ctx, grad):
        L, U, *inputs = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the dense product (exact higher orders)
            return composed_backward(lu_product_ref(*inputs), inputs, ctx.needs_input_grad, grad)
        (L11, _), (L21, L22) = _blocks(L)
        (U11, U12), (_, U22) = _blocks(U)
        (G11, G12), (G21, G22) = _blocks(grad)
        # d lower: the strictly lower part of grad @ U.T; d upper and diagonal: the upper part of L.T @ grad
        d_lower, d_upper = torch.zeros_like(L), torch.zeros_like(U)
        (A11, _), (A21, A22) = _blocks(d_lower)
        (B11, B12), (_, B22) = _blocks(d_upper)
        A11.copy_(torch.addmm(G11 @ U11.T, G12, U12.T).tril_(-1))
        A21.copy_(torch.addmm(G21 @ U11.T, G22, U12.T))
        A22.copy_((G22 @ U22.T).tril_(-1))
        B11.copy_(torch.addmm(L11.T @ G11, L21.T, G21))
        B12.copy_(torch.addmm(L11.T @ G12, L21.T, G22))
        B22.copy_(L22.T @ G22)
        d_diagonal = d_upper.diagonal().clone()
        return d_lower, d_upper.triu_(1), d_diagonal


def _blocks(matrix: torch.Tensor):
    """((top-left, top-right), (bottom-left, bottom-right)) views of a square matrix, split in half."""
    h = matrix.shape[0] // 2
    return ((matrix[:h, :h], matrix[:h, h:]), (matrix[h:, :h], matrix[h:, h:]))


def lu_solve(z: torch.Tensor, lu: torch.Tensor, diagonal: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x with z = x @ (P L U).T by two triangular solves (L and U packed in `lu` as in `factored_linear_ref`)."""
    lower, upper = lu_factors(lu, lu, diagonal)
    y = z[:, torch.argsort(perm)]
    # x (L U)^T = y  <=>  (x U^T) L^T = y: solve against L^T (upper, unit), then U^T (lower).
    y = torch.linalg.solve_triangular(lower.T, y, upper=True, left=False, unitriangular=True)
    return torch.linalg.solve_triangular(upper.T, y, upper=False, left=False)


def factored_linear_ref(x, loc, logs, lu, diagonal, perm):
    """((x + loc) * exp(logs)) @ (P L U).T under autograd: L and U packed in `lu`, W[i] = (L U)[perm[i]]."""
    return ((x + loc) * torch.exp(logs)) @ lu_product_ref(lu, lu, diagonal)[perm].T


BLOCK_WIDTH = 192
"""The factored linear map applies L and U as max(1, d // BLOCK_WIDTH) diagonal blocks: only those are
masked, the rest of each block row is read straight from `lu`, and zero blocks are never multiplied."""


def _bounds(d: int, blocks: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The block edges 0 = b_0 < ... < b_blocks = d of near-equal diagonal blocks, and each block's (lo, hi)."""
    bounds = [index * d // blocks for index in range(blocks + 1)]
    return bounds, list(zip(bounds, bounds[1:]))


def _column_blocks(matrix: torch.Tensor, bounds: list[int]) -> tuple[torch.Tensor, ...]:
    """matrix's column blocks between `bounds`, as views (one call, not one slice per block)."""
    return (matrix,) if len(bounds) == 2 else matrix.tensor_split(bounds[1:-1], dim=1)


def _left_of(blocks: tuple[torch.Tensor, ...], matrix: torch.Tensor, index: int, lo: int) -> torch.Tensor:
    """matrix[:, :lo], the columns left of block `index` (the first block's view when that is all)."""
    return blocks[0] if index == 1 else matrix[:, :lo]


def _right_of(blocks: tuple[torch.Tensor, ...], matrix: torch.Tensor, index: int, hi: int) -> torch.Tensor:
    """matrix[:, hi:], the columns right of block `index` (the last block's view when that is all)."""
    return blocks[-1] if index == len(blocks) - 2 else matrix[:, hi:]


def factored_forward(x, loc, logs, lu, diagonal, perm):
    """(y, saved for `factored_backward`) of the factored map: t = a @ U.T, v = t @ L.T, a block row at a time."""
    scale = torch.exp(logs)
    a = torch.add(x, loc).mul_(scale)
    d = lu.shape[0]
    bounds, spans = _bounds(d, max(1, d // BLOCK_WIDTH))
    diagonal_blocks = ([(lu, diagonal)] if len(spans) == 1
                       else [(lu[lo:hi, lo:hi], diagonal[lo:hi]) for lo, hi in spans])
    lowers = [_unit_lower(block) for block, _ in diagonal_blocks]
    uppers = [_upper(block, block_diagonal) for block, block_diagonal in diagonal_blocks]
    t, v = torch.empty_like(a), torch.empty_like(a)
    a_blocks, t_blocks, v_blocks = (_column_blocks(m, bounds) for m in (a, t, v))
    for index, (lo, hi) in enumerate(spans):  # t[:, i] = sum over j >= i of a[:, j] U[i, j]
        rows = torch.mm(a_blocks[index], uppers[index].T, out=t_blocks[index])
        if hi < d:
            rows.addmm_(_right_of(a_blocks, a, index, hi), lu[lo:hi, hi:].T)
    for index, (lo, hi) in enumerate(spans):  # v[:, i] = sum over j <= i of t[:, j] L[i, j]
        rows = torch.mm(t_blocks[index], lowers[index].T, out=v_blocks[index])
        if lo:
            rows.addmm_(_left_of(t_blocks, t, index, lo), lu[lo:hi, :lo].T)
    return v.index_select(1, perm), (scale, a, t, *lowers, *uppers)


def factored_backward(dy, lu, perm, saved, needs):
    """(dx, d loc, d logs, d lu, d diagonal) of the factored map, None where `needs` says not wanted."""
    scale, a, t, *factors = saved
    blocks = len(factors) // 2
    lowers, uppers = factors[:blocks], factors[blocks:]
    d = lu.shape[0]
    bounds, spans = _bounds(d, blocks)
    dv = dy.index_select(1, torch.argsort(perm))  # y = v[:, perm]
    dt = torch.empty_like(dv)
    dv_blocks, dt_blocks = _column_blocks(dv, bounds), _column_blocks(dt, bounds)
    for index, (lo, hi) in enumerate(spans):  # dt = dv @ L, a block column at a time
        columns = torch.mm(dv_blocks[index], lowers[index], out=dt_blocks[index])
        if hi < d:
            columns.addmm_(_right_of(dv_blocks, dv, index, hi), lu[hi:, lo:hi])
    d_lu = d_diagonal = None
    if needs[3] or needs[4]:
        d_lu = torch.empty_like(lu)
        a_blocks, t_blocks, diagonals = _column_blocks(a, bounds), _column_blocks(t, bounds), []
        for index, (lo, hi) in enumerate(spans):
            if lo:
                torch.mm(dv_blocks[index].T, _left_of(t_blocks, t, index, lo), out=d_lu[lo:hi, :lo])  # d L
            if hi < d:
                torch.mm(dt_blocks[index].T, _right_of(a_blocks, a, index, hi), out=d_lu[lo:hi, hi:])  # d U
            upper = dt_blocks[index].T @ a_blocks[index]  # d U's block with its diagonal
            _strict_triangles(dv_blocks[index].T @ t_blocks[index], upper,
                              out=d_lu if blocks == 1 else d_lu[lo:hi, lo:hi])
            diagonals.append(upper.diagonal())
        d_diagonal = diagonals[0] if blocks == 1 else torch.cat(diagonals)
    dx = d_loc = d_logs = None
    if needs[0] or needs[1] or needs[2]:
        da = torch.empty_like(dt)
        da_blocks = _column_blocks(da, bounds)
        for index, (lo, hi) in enumerate(spans):  # da = dt @ U, a block column at a time
            columns = torch.mm(dt_blocks[index], uppers[index], out=da_blocks[index])
            if lo:
                columns.addmm_(_left_of(dt_blocks, dt, index, lo), lu[:lo, lo:hi])
        d_logs = (da * a).sum(dim=0) if needs[2] else None
        dx = da.mul_(scale)
        d_loc = dx.sum(dim=0) if needs[1] else None
    return dx, d_loc, d_logs, d_lu if needs[3] else None, d_diagonal if needs[4] else None


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
    """The (strictly lower, strictly upper) 0/1 masks and the identity, cached (faster than `tril` or `triu`)."""
    ones = torch.ones(d, d, dtype=dtype, device=device)
    return torch.tril(ones, -1), torch.triu(ones, 1), torch.eye(d, dtype=dtype, device=device)
