"""Invertible linear maps ("1x1 convolutions" on a 1x1 image): z = x @ W.T.

- `LULinear`: W = P @ L @ (U + diag(sign * exp(log_s))), with P and sign fixed, L unit lower-
  triangular and U strictly upper-triangular learnable; initialised from the LU factors of a
  random rotation, so log|det W| = sum(log_s). Inverted with two triangular solves.
- `ReversePermutation`: the fixed reversal of the features (log-det 0).

`LULinear.weight()` lets a flow step fold its ActNorm into one GEMM; the reversal stays a flip.
"""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels


class LULinear(nn.Module):
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

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, U) with unit diagonal on L and sign * exp(log_s) on the diagonal of U."""
        eye = torch.eye(self.dim, dtype=self.lower.dtype, device=self.lower.device)
        lower = torch.tril(self.lower, -1) + eye
        upper = torch.triu(self.upper, 1) + torch.diag(self.sign * torch.exp(self.log_s))
        return lower, upper

    def weight(self) -> torch.Tensor:
        lower, upper = self.factors()
        return (lower @ upper)[self.perm]

    def logdet(self) -> torch.Tensor:
        return self.log_s.sum()

    def forward(self, x: torch.Tensor):
        return x @ self.weight().T, self.logdet().expand(x.shape[0])

    def inverse(self, z: torch.Tensor):
        lower, upper = self.factors()
        return kernels.lu_inverse(z, self.perm, lower, upper), (-self.logdet()).expand(z.shape[0])


class ReversePermutation(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor):
        return x.flip(1), x.new_zeros(x.shape[0])

    def inverse(self, z: torch.Tensor):
        return z.flip(1), z.new_zeros(z.shape[0])
