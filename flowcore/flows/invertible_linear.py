"""Invertible linear maps ("1x1 convolutions" on a 1x1 image): z = x @ W.T.

`LULinear`: W = P L (U + diag(sign * exp(log_s))), so log|det W| = sum(log_s); L's and U's strict
triangles share one (d, d) parameter `lu`. It starts as a random permutation (L = U = I), not as
Glow's random rotation, whose LU factors are badly conditioned at large d and make the loss jump."""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels

__all__ = ["LULinear", "ReversePermutation"]


class LULinear(nn.Module):
    """The learned invertible 1x1 on `dim` features, LU-parametrised (see the module docstring)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        dtype = torch.get_default_dtype()
        # W[i] = (L U)[perm[i]]  <=>  W = P L U with P[i, perm[i]] = 1.
        self.register_buffer("perm", torch.randperm(dim))
        self.register_buffer("sign", torch.ones(dim, dtype=dtype))
        self.lu = nn.Parameter(torch.zeros(dim, dim, dtype=dtype))
        self.log_s = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def diagonal(self) -> torch.Tensor:
        """U's diagonal, sign * exp(log_s)."""
        return self.sign * torch.exp(self.log_s)

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, U) with unit diagonal on L and sign * exp(log_s) on the diagonal of U."""
        return kernels.lu_factors(self.lu, self.lu, self.diagonal())

    def weight(self) -> torch.Tensor:
        """W = P L U, assembled (differentiably) from the factors."""
        return kernels.lu_product(self.lu, self.lu, self.diagonal())[self.perm]

    def logdet(self) -> torch.Tensor:
        """log|det W| = sum(log_s), the same for every row."""
        return self.log_s.sum()

    def forward(self, x: torch.Tensor):
        return x @ self.weight().T, self.logdet().expand(x.shape[0])

    def inverse(self, z: torch.Tensor):
        """x with z = x @ W.T: two triangular solves, never an explicit inverse."""
        return kernels.lu_solve(z, self.lu, self.diagonal(), self.perm), (-self.logdet()).expand(z.shape[0])


class ReversePermutation(nn.Module):
    """The fixed reversal of `dim` features (the official code's "reverse"), log-det 0."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor):
        return x.flip(1), x.new_zeros(x.shape[0])

    inverse = forward  # the reversal is its own inverse
