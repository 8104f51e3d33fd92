"""Each row's sum of squares (the Gaussian prior's term), in float32 for 16-bit z, float64 for float64.
`squared_norm` makes no (batch x d) temporary and its backward is one pass; a plan's reference path takes the twin.
"""
from __future__ import annotations

import torch

from ._utils import accumulation_dtype


def squared_norm_ref(z: torch.Tensor) -> torch.Tensor:
    z = z.to(accumulation_dtype(z))
    return torch.linalg.vecdot(z, z)


def squared_norm(z: torch.Tensor) -> torch.Tensor:
    """Row sums of squares with a one-pass backward."""
    return _SquaredNorm.apply(z)


class _SquaredNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return squared_norm_ref(z)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return (z * (2.0 * grad)[:, None]).to(z.dtype)
