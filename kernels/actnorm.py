"""ActNorm: y = (x + loc) * exp(logs), per feature, and its inverse: the `_ref` twins and the
dispatchers. The log-det, sum(logs) per row, needs no kernel.
"""
from __future__ import annotations

import torch

from ._utils import require_matrix, require_vector
from .dispatch import resolve, triton_ops


def actnorm_ref(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return (x + loc) * torch.exp(logs)


def actnorm_inverse_ref(y: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return y * torch.exp(-logs) - loc


def _check(op: str, x, loc, logs) -> None:
    require_matrix(f"{op} input", x)
    require_vector(f"{op} loc", loc, x.shape[1])
    require_vector(f"{op} logs", logs, x.shape[1])


def actnorm(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    if resolve(x) == "triton":
        _check("actnorm", x, loc, logs)
        return triton_ops().actnorm.actnorm(x, loc, logs, inverse=False)
    return actnorm_ref(x, loc, logs)


def actnorm_inverse(y: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    if resolve(y) == "triton":
        _check("actnorm_inverse", y, loc, logs)
        return triton_ops().actnorm.actnorm(y, loc, logs, inverse=True)
    return actnorm_inverse_ref(y, loc, logs)
