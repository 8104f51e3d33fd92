"""ActNorm: y = (x + loc) * exp(logs), per feature, and its inverse.

`actnorm` / `actnorm_inverse` dispatch on `flowcore.backend.resolve`; `actnorm_ref` and
`actnorm_inverse_ref` are the pure-PyTorch twins (test oracle and CPU path).
Shapes: x (B, D); loc, logs (D,). The log-det, sum(logs) per row, needs no kernel.
"""
from __future__ import annotations

import torch

from flowcore.backend import resolve


def actnorm_ref(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return (x + loc) * torch.exp(logs)


def actnorm_inverse_ref(y: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return y * torch.exp(-logs) - loc


def actnorm(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    if resolve(x) == "triton":
        raise NotImplementedError("triton actnorm: filled in by the Triton kernels issue")
    return actnorm_ref(x, loc, logs)


def actnorm_inverse(y: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    if resolve(y) == "triton":
        raise NotImplementedError("triton actnorm inverse: filled in by the Triton kernels issue")
    return actnorm_inverse_ref(y, loc, logs)
