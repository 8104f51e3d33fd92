"""Affine and additive coupling on the second half of the features.

Given x2 (B, d2) and the conditioner output h:
- affine (h is (B, 2*d2)): shift = h[:, 0::2], scale = sigmoid(h[:, 1::2] + 2),
  z2 = (x2 + shift) * scale, logdet = sum(log(scale)) per row; inverse x2 = z2 / scale - shift.
- additive (h is (B, d2)): z2 = x2 + h, logdet 0.
`*_ref` are the pure-PyTorch twins; the others dispatch on `flowcore.backend.resolve`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flowcore.backend import resolve


def affine_coupling_ref(x2, h):
    shift, raw = h[:, 0::2], h[:, 1::2] + 2.0
    scale = torch.sigmoid(raw)
    z2 = (x2 + shift) * scale
    return z2, F.logsigmoid(raw).sum(dim=1)


def affine_coupling_inverse_ref(z2, h):
    """Returns x2 and the log-det of the *forward* map (the inverse's is its negative)."""
    shift, raw = h[:, 0::2], h[:, 1::2] + 2.0
    x2 = z2 / torch.sigmoid(raw) - shift
    return x2, F.logsigmoid(raw).sum(dim=1)


def additive_coupling_ref(x2, h):
    return x2 + h


def additive_coupling_inverse_ref(z2, h):
    return z2 - h


def affine_coupling(x2, h):
    if resolve(x2) == "triton":
        raise NotImplementedError("triton affine coupling: filled in by the Triton kernels issue")
    return affine_coupling_ref(x2, h)


def affine_coupling_inverse(z2, h):
    if resolve(z2) == "triton":
        raise NotImplementedError("triton affine coupling inverse: filled in by the Triton kernels issue")
    return affine_coupling_inverse_ref(z2, h)


def additive_coupling(x2, h):
    return additive_coupling_ref(x2, h)


def additive_coupling_inverse(z2, h):
    return additive_coupling_inverse_ref(z2, h)
