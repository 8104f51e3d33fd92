"""The folded linear map z = x @ weight.T + bias (a step's ActNorm folded into its 1x1 weight): the
`_ref` twin and the dispatcher."""
from __future__ import annotations

import torch

from ._utils import require_matrix, require_vector
from .dispatch import resolve, triton_ops


def folded_linear_ref(x, weight, bias):
    return torch.addmm(bias, x, weight.T)


def folded_linear(x, weight, bias):
    """x @ weight.T + bias."""
    if resolve(x) == "triton":
        require_matrix("folded_linear input", x)
        require_matrix("folded_linear weight", weight, x.shape[1])
        require_vector("folded_linear bias", bias, weight.shape[0])
        return triton_ops().folded_linear.folded_linear(x, weight, bias)
    return folded_linear_ref(x, weight, bias)
