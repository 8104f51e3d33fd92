"""One Glow step, data -> latent: ActNorm -> invertible linear -> coupling.

What runs depends on the step's variant, and `FlowStep.forward` shows it:
- LU mixing (the default), training on a batch of fewer than `FACTORED_ROWS_PER_FEATURE` x d rows
  on the PyTorch backend (the paper's batch 32): W is never assembled; ActNorm, U, L and P are
  applied to the batch factor by factor. With the affine coupling the whole step is one autograd
  node (`kernels.factored_affine_step`); with the additive one `kernels.factored_linear` is
  followed by `Coupling.forward`.
- LU mixing otherwise: ActNorm is folded into the assembled LU weight, W' = W diag(exp(logs)),
  b = W' loc, so ActNorm + 1x1 cost one GEMM + bias and no pass over the batch of their own. With
  the affine coupling (the default) the GEMM and the coupling run fused in
  `kernels.folded_affine_step`, in training and in inference; with the additive coupling the GEMM
  (`kernels.folded_linear`) is followed by `Coupling.forward`. In training the fold is
  differentiated through (d x d work, cheaper than back-propagating through an elementwise
  ActNorm on batch x d).
- Reverse mixing: the layers' own forwards, one after the other.
In inference (eval mode, no gradient wanted) the folded weight is cached and rebuilt whenever a
parameter changes (the tensors' version counters) or the module returns to training. Writes through
`.data` bypass version counters: after such surgery call `train()` (or `eval()`) to drop the cache.
"""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels
from flowcore._torch_compat import version_key
from flowcore.backend import resolve
from flowcore.flows.actnorm import ActNorm
from flowcore.flows.coupling import Coupling
from flowcore.flows.invertible_linear import LULinear, ReversePermutation

__all__ = ["FACTORED_ROWS_PER_FEATURE", "PERMUTATIONS", "FlowStep"]

PERMUTATIONS = ("lu", "reverse")

FACTORED_ROWS_PER_FEATURE = 0.5
"""Training batches of fewer than this many rows per feature apply the LU factors to the batch
(12 B d^2 flops a step) instead of assembling W (about 4 d^3 with the gradient, plus 6 B d^2 for the
folded GEMMs): chosen below the flop counts' crossover near 0.6 d, not tuned by measurement."""


class FlowStep(nn.Module):
    """ActNorm -> invertible linear (`permutation`: "lu" or "reverse") -> coupling (`coupling`:
    "affine" or "additive") on `dim` features, the coupling's conditioner `width` units wide.

    `z, logdet = step(x)` maps data -> latent with logdet = log|det dz/dx| per row;
    `x, logdet = step.inverse(z)` maps back with the inverse's log-det.
    """

    def __init__(self, dim: int, width: int = 32, coupling: str = "affine", permutation: str = "lu"):
        super().__init__()
        if permutation not in PERMUTATIONS:
            raise ValueError(f"unknown permutation {permutation!r}; choose one of {', '.join(PERMUTATIONS)}")
        self.actnorm = ActNorm(dim)
        self.mixing = LULinear(dim) if permutation == "lu" else ReversePermutation(dim)
        self.coupling = Coupling(dim, width, coupling)
        self._fold_cache: tuple | None = None

    def train(self, mode: bool = True):
        self._fold_cache = None
        return super().train(mode)

    @torch.no_grad()
    def start_linear(self, weight: torch.Tensor | None = None, loc: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None) -> None:
        """Make ActNorm + 1x1 the affine map y = weight @ ((x + loc) * scale) before training
        (defaults: the current 1x1, no shift, scale 1); ActNorm then counts as initialised, so no
        data-dependent initialisation follows. A `weight` needs the LU mixing and is stored as its
        P L U factors (float64 LU)."""
        self.actnorm.loc.copy_(loc if loc is not None else torch.zeros_like(self.actnorm.loc))
        self.actnorm.logs.copy_(torch.log(scale) if scale is not None else torch.zeros_like(self.actnorm.logs))
        self.actnorm.initialized.fill_(True)
        self._fold_cache = None
        if weight is None:
            return
        if not isinstance(self.mixing, LULinear):
            raise ValueError("start_linear(weight=...) needs the LU mixing (permutation='lu')")
        permutation, lower, upper = torch.linalg.lu(weight.to(torch.float64))
        diagonal = torch.diagonal(upper)
        if not bool((diagonal != 0).all()):
            raise ValueError("start_linear needs an invertible weight")
        mixing = self.mixing
        mixing.perm.copy_(permutation.argmax(dim=1))
        mixing.sign.copy_(torch.sign(diagonal))
        mixing.set_factors(lower, upper)
        mixing.log_s.copy_(torch.log(diagonal.abs()))

    def forward(self, x: torch.Tensor):
        if isinstance(self.mixing, LULinear) and self._factored(x):
            self.actnorm.maybe_initialize(x)
            mixing = self.mixing
            if self.coupling.kind == "affine":
                return kernels.factored_affine_step(x, self.actnorm.loc, self.actnorm.logs, mixing.lu, mixing.log_s,
                                                    mixing.sign, mixing.perm, self.coupling.split, self.coupling.net)
            y = kernels.factored_linear(x, self.actnorm.loc, self.actnorm.logs, mixing.lu, mixing.diagonal(),
                                        mixing.perm)
            z, coupling_logdet = self.coupling(y)
            return z, coupling_logdet + (self.actnorm.logdet() + mixing.logdet())
        if isinstance(self.mixing, LULinear):
            weight, bias, logdet = self._folded(x)
            if self.coupling.kind == "affine":
                z, coupling_logdet = kernels.folded_affine_step(x, weight, bias, self.coupling.split,
                                                                self.coupling.net)
                return z, coupling_logdet + logdet
            y = kernels.folded_linear(x, weight, bias)
        else:
            y, logdet = self.actnorm(x)
            y, mixing_logdet = self.mixing(y)
            logdet = logdet + mixing_logdet
        z, coupling_logdet = self.coupling(y)
        return z, coupling_logdet + logdet

    def inverse(self, z: torch.Tensor):
        y, logdet = self.coupling.inverse(z)
        y, mixing_logdet = self.mixing.inverse(y)
        x, actnorm_logdet = self.actnorm.inverse(y)
        return x, logdet + mixing_logdet + actnorm_logdet

    def _factored(self, x: torch.Tensor) -> bool:
        """Apply the LU factors to the batch rather than fold W (see the module docstring)?"""
        return (self.training and torch.is_grad_enabled() and x.shape[0] < FACTORED_ROWS_PER_FEATURE * x.shape[1]
                and resolve(x) == "torch")

    def _folded(self, x: torch.Tensor):
        """(W', b, logdet) of ActNorm + LU linear for input `x`: the cached fold in inference;
        in training, after ActNorm's data-dependent initialisation from `x`, differentiable."""
        if not self.training and not (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())):
            return self._cached_fold()
        self.actnorm.maybe_initialize(x)
        return self._fold()

    def _fold(self):
        weight = self.mixing.weight() * torch.exp(self.actnorm.logs)
        return weight, weight @ self.actnorm.loc, self.actnorm.logdet() + self.mixing.logdet()

    def _cached_fold(self):
        """`_fold()` without autograd, rebuilt only when one of its parameters changed."""
        key = version_key((self.actnorm.loc, self.actnorm.logs, *self.mixing.parameters()))
        if self._fold_cache is None or self._fold_cache[0] != key:
            # a normal tensor even when first built under inference_mode, so that a later
            # gradient-enabled call with frozen parameters may still use it
            with torch.inference_mode(False), torch.no_grad():
                self._fold_cache = (key, *self._fold())
        return self._fold_cache[1:]
