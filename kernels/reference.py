"""The PyTorch twins of the flow's ops, written once: the math every backend implements, composed under
autograd, and the pieces the CPU and Triton steps share. Every path of a `Plan` is tested against these.

One step, data -> latent (`StepParameters` holds its tensors):

    a = (x + loc) * exp(logs);   y = a @ W.T with W = P L U, U's diagonal sign * exp(log_s)  (or y = a reversed);
    h = conditioner(y[:, :split]);
    affine:   z2 = (y2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + SCALE_OFFSET), log-det sum(log sigmoid(...));
    additive: z2 = y2 + h, log-det 0;
    logdet = sum(logs) + sum(log_s) + the coupling's, per row.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from ._utils import accumulation_dtype
from .triangular import factored_linear_ref, lu_product, lu_solve

SCALE_OFFSET = 2.0
"""The offset of the affine coupling's scale logit, as in the Glow code; every implementation reads it here."""


class StepParameters(NamedTuple):
    """One Glow step's tensors and settings, as a `Plan` runs them.

    Args:
        loc, logs: ActNorm's shift and log-scale, (d,).
        lu: (d, d) packed strict triangles of L (below) and U (above); None for the reversal.
        log_s, sign: (d,) U's diagonal is sign * exp(log_s); None for the reversal.
        perm: (d,) int64 row order of W = P L U, W[i] = (L U)[perm[i]]; None for the reversal.
        split: the coupling's first-half width.
        conditioner: maps y1 (B, split) to h, (B, 2 (d - split)) for "affine", (B, d - split) for "additive".
        coupling: "affine" or "additive".
        fold: returns `fold`'s (weight, bias, logdet) of these tensors (a caller's cache); None: computed.

    Example:
        >>> p = StepParameters(loc, logs, lu, log_s, sign, perm, d // 2, net)
        >>> z, logdet = step_ref(x, p)
    """

    loc: torch.Tensor
    logs: torch.Tensor
    lu: torch.Tensor | None
    log_s: torch.Tensor | None
    sign: torch.Tensor | None
    perm: torch.Tensor | None
    split: int
    conditioner: Callable
    coupling: str = "affine"
    fold: Callable[[], tuple] | None = None

    def folded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weight, bias, logdet) of ActNorm folded into the LU weight: the caller's, else `fold`'s."""
        return self.fold() if self.fold is not None else fold(self.loc, self.logs, self.lu, self.log_s, self.sign,
                                                             self.perm)


# --- the coupling
def shift_and_logit(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h[:, 0::2], h[:, 1::2] + SCALE_OFFSET) by one unbind: its backward is one stack, not two zero-filled slices."""
    shift, logit = h.unflatten(1, (-1, 2)).unbind(-1)
    return shift, logit + SCALE_OFFSET


def coupling_logdet(logit: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """sum(log sigmoid(logit)) per row: the log of a given `scale` (one pass) unless 16-bit or underflowed."""
    if scale is not None and scale.dtype not in (torch.float16, torch.bfloat16):
        logdet = torch.log(scale).sum(dim=1)
        if bool(torch.isfinite(logdet).all()):
            return logdet
    return F.logsigmoid(logit.to(accumulation_dtype(logit))).sum(dim=1)


def affine_coupling_forward(x2, shift, logit, inplace: bool = False):
    """(z2, logdet, scale) of the affine coupling; with `inplace` z2 overwrites x2 (the CPU step, no autograd)."""
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


def zero_logdet(x2: torch.Tensor) -> torch.Tensor:
    return x2.new_zeros(x2.shape[0], dtype=accumulation_dtype(x2))


def couple_ref(x2: torch.Tensor, h: torch.Tensor, coupling: str = "affine"):
    """(z2, log-det per row) of the coupling of x2 with the conditioner's output h."""
    if coupling == "additive":
        return x2 + h, zero_logdet(x2)
    z2, logdet, _ = affine_coupling_forward(x2, *shift_and_logit(h))
    return z2, logdet


def uncouple_ref(z2: torch.Tensor, h: torch.Tensor, coupling: str = "affine"):
    """(x2, log-det of the *forward* map per row) of the coupling's inverse (its own log-det is the negative)."""
    if coupling == "additive":
        return z2 - h, zero_logdet(z2)
    shift, logit = shift_and_logit(h)
    return z2 / torch.sigmoid(logit) - shift, coupling_logdet(logit)


def coupled_ref(y: torch.Tensor, split: int, conditioner: Callable, coupling: str = "affine", couple=couple_ref):
    """(z, coupling log-det) of y's halves, the first conditioning the second, through `couple` (a plan's op)."""
    y1, y2 = y.split([split, y.shape[1] - split], dim=1)
    z2, logdet = couple(y2, conditioner(y1), coupling)
    return torch.cat([y1, z2], dim=1), logdet


# --- ActNorm and the 1x1
def actnorm_ref(x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return (x + loc) * torch.exp(logs)


def actnorm_inverse_ref(y: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return y * torch.exp(-logs) - loc


def fold(loc, logs, lu, log_s, sign, perm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, bias, logdet) with ActNorm folded into the LU weight, y = x @ weight.T + bias:
    weight = W diag(exp(logs)), bias = weight @ loc, logdet = sum(logs) + sum(log_s). Differentiable."""
    weight = lu_product(lu, lu, sign * torch.exp(log_s))[perm] * torch.exp(logs)
    return weight, weight @ loc, logs.sum() + log_s.sum()


def folded_linear_ref(x, weight, bias):
    """x @ weight.T + bias: ActNorm and the 1x1 folded into one GEMM (`fold`)."""
    return torch.addmm(bias, x, weight.T)


def folded_linear_backward(dy, x, weight, needs) -> tuple:
    """(dx, dweight, dbias) of `folded_linear_ref`, None where `needs` says not wanted (the CPU and Triton steps')."""
    return (dy @ weight if needs[0] else None, dy.T @ x if needs[1] else None, dy.sum(dim=0) if needs[2] else None)


# --- whole steps
def folded_step_ref(x, weight, bias, split: int, conditioner: Callable, coupling: str = "affine"):
    """(z, coupling log-det) of the step from its folded weight, composed under autograd."""
    return coupled_ref(folded_linear_ref(x, weight, bias), split, conditioner, coupling)


def reversed_step(x, p: StepParameters, actnorm=actnorm_ref, couple=couple_ref):
    """(z, logdet) of a step with the reversal for its 1x1, from the elementwise ops `actnorm` and `couple`."""
    z, logdet = coupled_ref(actnorm(x, p.loc, p.logs).flip(1), p.split, p.conditioner, p.coupling, couple)
    return z, logdet + p.logs.sum().to(logdet.dtype)


def step_ref(x, p: StepParameters):
    """(z, logdet per row) of the step composed under autograd: the twin every path is tested against."""
    if p.lu is None:
        return reversed_step(x, p)
    y = factored_linear_ref(x, p.loc, p.logs, p.lu, p.sign * torch.exp(p.log_s), p.perm)
    z, logdet = coupled_ref(y, p.split, p.conditioner, p.coupling)
    return z, logdet + (p.logs.sum() + p.log_s.sum()).to(logdet.dtype)


def inverse_step_ref(z, p: StepParameters, uncouple=uncouple_ref, actnorm_inverse=actnorm_inverse_ref):
    """(x, log-det of the inverse map per row) of the step: the coupling undone, then the 1x1 (two triangular
    solves, or the reversal), then ActNorm, from the elementwise ops `uncouple` and `actnorm_inverse`."""
    z1, z2 = z.split([p.split, z.shape[1] - p.split], dim=1)
    y2, coupling_logdet = uncouple(z2, p.conditioner(z1), p.coupling)
    y = torch.cat([z1, y2], dim=1)
    logdet = -coupling_logdet
    if p.lu is None:
        y = y.flip(1)
    else:
        y = lu_solve(y, p.lu, p.sign * torch.exp(p.log_s), p.perm)
        logdet = logdet + (-p.log_s.sum())
    return actnorm_inverse(y, p.loc, p.logs), logdet + (-p.logs.sum())
