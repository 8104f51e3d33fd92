"""One Glow step: ActNorm -> invertible linear -> coupling, data -> latent.

ActNorm is folded into the assembled LU weight, W' = W diag(exp(logs)), b = W' loc, so ActNorm +
1x1 cost one GEMM + bias (`kernels.folded_linear`) and no pass over the batch of their own; in
training the fold is differentiated through (d x d work), which is cheaper than back-propagating
through an elementwise ActNorm on (batch x d). In eval mode, when no gradient is wanted, the
folded weight is cached and rebuilt whenever a parameter changes (tracked by the tensors' version
counters) or the module returns to training. Writes through `.data` bypass version counters: after
such surgery call `train()` (or `eval()`) to drop the cache.
"""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels
from flowcore.flows.actnorm import ActNorm
from flowcore.flows.coupling import Coupling
from flowcore.flows.invertible_linear import LULinear, ReversePermutation

PERMUTATIONS = ("lu", "reverse")


class FlowStep(nn.Module):
    def __init__(self, dim: int, width: int = 32, coupling: str = "affine", permutation: str = "lu"):
        super().__init__()
        if permutation not in PERMUTATIONS:
            raise ValueError(f"unknown permutation {permutation!r}; choose one of {', '.join(PERMUTATIONS)}")
        self.actnorm = ActNorm(dim)
        self.mixing = LULinear(dim) if permutation == "lu" else ReversePermutation(dim)
        self.coupling = Coupling(dim, width, coupling)
        self._folded: tuple | None = None

    def train(self, mode: bool = True):
        self._folded = None
        return super().train(mode)

    def _fast_path(self) -> bool:
        if self.training:
            return False
        return not (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()))

    def _fold(self):
        """(W', b, logdet) of ActNorm + LU linear."""
        weight = self.mixing.weight() * torch.exp(self.actnorm.logs)
        return weight, weight @ self.actnorm.loc, self.actnorm.logdet() + self.mixing.logdet()

    def _cached_fold(self):
        """`_fold()` without autograd, rebuilt only when one of its parameters changed."""
        params = (self.actnorm.loc, self.actnorm.logs, *self.mixing.parameters())
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._folded is None or self._folded[0] != key:
            # a normal tensor even when first built under inference_mode, so that a later
            # gradient-enabled call with frozen parameters may still use it
            with torch.inference_mode(False), torch.no_grad():
                self._folded = (key, *self._fold())
        return self._folded[1:]

    def _mix(self, x: torch.Tensor):
        loc, logs = self.actnorm.loc, self.actnorm.logs
        if isinstance(self.mixing, ReversePermutation):
            if not self._fast_path():
                self.actnorm.maybe_initialize(x)
            return kernels.actnorm(x, loc, logs).flip(1), self.actnorm.logdet()
        if self._fast_path():
            weight, bias, logdet = self._cached_fold()
        else:
            self.actnorm.maybe_initialize(x)
            weight, bias, logdet = self._fold()
        return kernels.folded_linear(x, weight, bias), logdet

    def forward(self, x: torch.Tensor):
        if isinstance(self.mixing, LULinear) and self.coupling.kind == "affine":
            # the fused step (`kernels.flow_step`): in inference one GEMM + coupling epilogue on
            # Triton; in training on PyTorch, a hand-written backward without concatenations
            if self._fast_path():
                weight, bias, logdet = self._cached_fold()
            else:
                self.actnorm.maybe_initialize(x)
                weight, bias, logdet = self._fold()
            z, coupling_logdet = kernels.folded_affine_step(x, weight, bias, self.coupling.split, self.coupling.net)
            return z, coupling_logdet + logdet
        y, logdet = self._mix(x)
        z, coupling_logdet = self.coupling(y)
        return z, coupling_logdet + logdet

    def inverse(self, z: torch.Tensor):
        y, logdet = self.coupling.inverse(z)
        y, mixing_logdet = self.mixing.inverse(y)
        x, actnorm_logdet = self.actnorm.inverse(y)
        return x, logdet + mixing_logdet + actnorm_logdet
