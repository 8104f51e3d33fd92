"""Affine and additive coupling on the second half of the features, data -> latent: the math in
PyTorch (written once here), the `_ref` twins, and the dispatchers. Owns `SCALE_OFFSET`.

- affine: scale = sigmoid(h[:, 1::2] + SCALE_OFFSET), z2 = (x2 + h[:, 0::2]) * scale,
  logdet = sum(log(scale)) per row;
- additive: z2 = x2 + h, logdet 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._utils import accumulation_dtype, require_matrix
from .dispatch import resolve, triton_ops

SCALE_OFFSET = 2.0
"""The offset of the affine coupling's scale logit, as in the Glow code; every implementation reads it here."""


def shift_and_logit(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h[:, 0::2], h[:, 1::2] + SCALE_OFFSET): one unbind, whose backward is a single stack
    instead of two zero-filled full-size slice gradients."""
    shift, logit = h.unflatten(1, (-1, 2)).unbind(-1)
    return shift, logit + SCALE_OFFSET


def coupling_logdet(logit: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """sum(log sigmoid(logit)) per row, in float32 (float64 for float64): the log of a given `scale`
    (one cheap pass) unless 16-bit or underflowed, else log-sigmoid (no data-dependent branch)."""
    if scale is not None and scale.dtype not in (torch.float16, torch.bfloat16):
        logdet = torch.log(scale).sum(dim=1)
        if bool(torch.isfinite(logdet).all()):
            return logdet
    return F.logsigmoid(logit.to(accumulation_dtype(logit))).sum(dim=1)


def affine_coupling_forward(x2, shift, logit, inplace: bool = False):
    """(z2, logdet, scale) of the affine coupling from shift and logit. With `inplace`, z2
    overwrites x2 (no autograd: the fused step's own forward)."""
    scale = torch.sigmoid(logit)
    if inplace:
        return x2.add_(shift).mul_(scale), coupling_logdet(logit, scale), scale
    return (x2 + shift) * scale, coupling_logdet(logit), scale


def affine_coupling_backward(dz2, dlogdet, z2, scale, dx2_out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx2, dlogit) of the affine coupling from its output z2 and scale: dx2 = d(shift) = dz2 * scale,
    written into `dx2_out` when given; dlogit = (1 - scale) * (dz2 * z2 + dlogdet)."""
    dx2 = torch.mul(dz2, scale, out=dx2_out)
    dlogit = torch.addcmul(dlogdet.to(z2.dtype)[:, None], dz2, z2)
    return dx2, dlogit.addcmul_(dlogit, scale, value=-1.0)


def affine_coupling_ref(x2, h):
    z2, logdet, _ = affine_coupling_forward(x2, *shift_and_logit(h))
    return z2, logdet


def affine_coupling_inverse_ref(z2, h):
    """Returns x2 and the log-det of the *forward* map (the inverse's is its negative)."""
    shift, logit = shift_and_logit(h)
    return z2 / torch.sigmoid(logit) - shift, coupling_logdet(logit)


def additive_coupling_ref(x2, h):
    return x2 + h


def additive_coupling_inverse_ref(z2, h):
    return z2 - h


def _check(op: str, inp, h, h_width_factor: int) -> None:
    require_matrix(f"{op} input", inp)
    require_matrix(f"{op} conditioner output h", h, h_width_factor * inp.shape[1])
    if h.shape[0] != inp.shape[0]:
        raise ValueError(f"{op}: input has {inp.shape[0]} rows but h has {h.shape[0]}")


def affine_coupling(x2, h):
    if resolve(x2) == "triton":
        _check("affine_coupling", x2, h, 2)
        return triton_ops().coupling.affine_coupling(x2, h, inverse=False)
    return affine_coupling_ref(x2, h)


def affine_coupling_inverse(z2, h):
    if resolve(z2) == "triton":
        _check("affine_coupling_inverse", z2, h, 2)
        return triton_ops().coupling.affine_coupling(z2, h, inverse=True)
    return affine_coupling_inverse_ref(z2, h)


def additive_coupling(x2, h):
    if resolve(x2) == "triton":
        _check("additive_coupling", x2, h, 1)
        return triton_ops().coupling.additive_coupling(x2, h, subtract=False)
    return additive_coupling_ref(x2, h)


def additive_coupling_inverse(z2, h):
    if resolve(z2) == "triton":
        _check("additive_coupling_inverse", z2, h, 1)
        return triton_ops().coupling.additive_coupling(z2, h, subtract=True)
    return additive_coupling_inverse_ref(z2, h)
