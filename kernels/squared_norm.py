"""Each row's sum of squares (the Gaussian prior's term), in float32 for 16-bit z, float64 for float64.

`_SquaredNorm`'s forward makes no (batch x d) temporary and its backward one pass, 2 z * grad.
"""
from __future__ import annotations

import torch

from ._utils import accumulation_dtype
from .compat import composed_autograd_only


def squared_norm_ref(z: torch.Tensor) -> torch.Tensor:
    z = z.to(accumulation_dtype(z))
    return torch.linalg.vecdot(z, z)


def squared_norm(z: torch.Tensor) -> torch.Tensor:
    if composed_autograd_only(z):
        return squared_norm_ref(z)
    return _SquaredNorm.apply(z)


class _SquaredNorm(torch.autograd.Function):
    """Row sums of squares with a one-pass backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return squared_norm_ref(z)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return (z * (2.0 * grad)[:, None]).to(z.dtype)
