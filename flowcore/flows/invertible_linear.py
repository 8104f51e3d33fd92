"""Invertible linear maps ("1x1 convolutions" on a 1x1 image): z = x @ W.T.

- `LULinear`: W = P @ L @ (U + diag(sign * exp(log_s))), with P and sign fixed, L unit lower-
  triangular and U strictly upper-triangular learnable; initialised from the LU factors of a
  random rotation, so log|det W| = sum(log_s). Inverted with two triangular solves.
- `ReversePermutation`: the fixed reversal of the features (log-det 0).

`LULinear.weight()` lets a flow step fold its ActNorm into one GEMM; the reversal stays a flip.
It is rebuilt at every training step by `kernels.lu_product`, whose L @ U and gradients skip the
zero blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels

__all__ = ["LULinear", "ReversePermutation"]


class LULinear(nn.Module):
    """The learned invertible 1x1 on `dim` features, LU-parametrised (see the module docstring).

    In the default step its `weight()` is folded with ActNorm into one GEMM
    (`flowcore.flows.step`); `forward` is the reference composition the contract tests run.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        rotation, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
        permutation, lower, upper = torch.linalg.lu(rotation)
        diagonal = torch.diagonal(upper)
        dtype = torch.get_default_dtype()
        # W[i] = (L U)[perm[i]]  <=>  W = P L U with P[i, perm[i]] = 1.
        self.register_buffer("perm", permutation.argmax(dim=1))
        self.register_buffer("sign", torch.sign(diagonal).to(dtype))
        self.lower = nn.Parameter(torch.tril(lower, -1).to(dtype))
        self.upper = nn.Parameter(torch.triu(upper, 1).to(dtype))
        self.log_s = nn.Parameter(torch.log(diagonal.abs()).to(dtype))

    def _diagonal(self) -> torch.Tensor:
        return self.sign * torch.exp(self.log_s)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, U) with unit diagonal on L and sign * exp(log_s) on the diagonal of U."""
        return kernels.lu_factors(self.lower, self.upper, self._diagonal())

    def weight(self) -> torch.Tensor:
        """W = P L U, assembled (differentiably) from the factors."""
        return kernels.lu_product(self.lower, self.upper, self._diagonal())[self.perm]

    def logdet(self) -> torch.Tensor:
        """log|det W| = sum(log_s), the same for every row."""
        return self.log_s.sum()

    def forward(self, x: torch.Tensor):
        return x @ self.weight().T, self.logdet().expand(x.shape[0])

    def inverse(self, z: torch.Tensor):
        """x with z = x @ W.T: two triangular solves, never an explicit inverse."""
        lower, upper = self.factors()
        y = z[:, torch.argsort(self.perm)]
        # x (L U)^T = y  <=>  (x U^T) L^T = y: solve against L^T (upper, unit), then U^T (lower).
        y = torch.linalg.solve_triangular(lower.T, y, upper=True, left=False, unitriangular=True)
        x = torch.linalg.solve_triangular(upper.T, y, upper=False, left=False)
        return x, (-self.logdet()).expand(z.shape[0])


class ReversePermutation(nn.Module):
    """The fixed reversal of `dim` features (the official code's "reverse"), log-det 0."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor):
        return x.flip(1), x.new_zeros(x.shape[0])

    def inverse(self, z: torch.Tensor):
        return z.flip(1), z.new_zeros(z.shape[0])
