"""Invertible linear ("1x1") map z = x @ W.T with the step's ActNorm fused in, and its LU inverse.

- `actnorm_linear(x, loc, logs, weight)`: z = ((x + loc) * exp(logs)) @ weight.T (training path;
  gradients reach x, loc, logs and weight, and from weight autograd reaches L, U, log_s).
- `folded_linear(x, weight, bias)`: z = x @ weight.T + bias (eval path, ActNorm folded in).
- `lu_inverse(z, perm, lower, upper)`: x with z = x @ W.T, W = P @ lower @ upper, where
  `W[i] = (lower @ upper)[perm[i]]`, `lower` unit lower-triangular, `upper` upper-triangular
  with the diagonal; two triangular solves, never an explicit inverse.
The log-det, sum(log_s), needs no kernel.
"""
from __future__ import annotations

import torch

from flowcore.backend import resolve


def actnorm_linear_ref(x, loc, logs, weight):
    return ((x + loc) * torch.exp(logs)) @ weight.T


def folded_linear_ref(x, weight, bias):
    return torch.addmm(bias, x, weight.T)


def lu_inverse_ref(z, perm, lower, upper):
    inverse_perm = torch.argsort(perm)
    y = z[:, inverse_perm]
    # x (L U)^T = y  <=>  (x U^T) L^T = y: solve against L^T (upper, unit), then U^T (lower).
    y = torch.linalg.solve_triangular(lower.T, y, upper=True, left=False, unitriangular=True)
    return torch.linalg.solve_triangular(upper.T, y, upper=False, left=False)


def actnorm_linear(x, loc, logs, weight):
    if resolve(x) == "triton":
        raise NotImplementedError("triton actnorm_linear: filled in by the Triton kernels issue")
    return actnorm_linear_ref(x, loc, logs, weight)


def folded_linear(x, weight, bias):
    if resolve(x) == "triton":
        raise NotImplementedError("triton folded_linear: filled in by the Triton kernels issue")
    return folded_linear_ref(x, weight, bias)


def lu_inverse(z, perm, lower, upper):
    return lu_inverse_ref(z, perm, lower, upper)
