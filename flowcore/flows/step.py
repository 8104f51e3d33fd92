"""One Glow step, data -> latent: ActNorm -> invertible linear -> coupling; a `Glow` runs it through its
`kernels.plan`, given `params(x)`. With the LU 1x1, ActNorm folds into its weight; in inference the fold is
cached until a parameter's version changes (writes through `.data` bypass versions: call `train()` or
`eval()` after them)."""
from __future__ import annotations

import torch
from torch import nn

from flowcore import defaults, kernels
from flowcore.flows.actnorm import ActNorm
from flowcore.flows.configs import PERMUTATIONS
from flowcore.flows.coupling import Coupling
from flowcore.flows.invertible_linear import LULinear, ReversePermutation
from flowcore.kernels.compat import version_key

__all__ = ["PERMUTATIONS", "FlowStep"]


class FlowStep(nn.Module):
    """ActNorm -> invertible linear ("lu" or "reverse") -> coupling ("affine" or "additive") on `dim` features:
    `z, logdet = step(x)`, data -> latent; `x, logdet = step.inverse(z)`, composed in PyTorch (`kernels.step_ref`)."""

    def __init__(self, dim: int, width: int = defaults.WIDTH, coupling: str = defaults.COUPLING,
                 permutation: str = defaults.PERMUTATION):
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
        """Make ActNorm + 1x1 the map y = weight @ ((x + loc) * scale) (defaults: the current 1x1, no
        shift, scale 1) and mark ActNorm initialised. A `weight` needs the LU mixing."""
        self.actnorm.loc.copy_(loc if loc is not None else torch.zeros_like(self.actnorm.loc))
        self.actnorm.logs.copy_(torch.log(scale) if scale is not None else torch.zeros_like(self.actnorm.logs))
        self.actnorm.initialized.fill_(True)  # copy_ bumps the parameters' versions: a cached fold is rebuilt
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
        mixing.lu.copy_(torch.tril(lower, -1) + torch.triu(upper, 1))  # L's and U's strict triangles
        mixing.log_s.copy_(torch.log(diagonal.abs()))

    def params(self, x: torch.Tensor | None = None) -> kernels.StepParameters:
        """The step's tensors as a plan takes them (`kernels.StepParameters`); given the step's input `x`,
        ActNorm is first initialised from it (on the first call in training mode)."""
        if x is not None:
            self.actnorm.maybe_initialize(x)
        actnorm, mixing, coupling = self.actnorm, self.mixing, self.coupling
        if not isinstance(mixing, LULinear):
            return kernels.StepParameters(actnorm.loc, actnorm.logs, None, None, None, None, coupling.split,
                                          coupling.net, coupling.kind)
        return kernels.StepParameters(actnorm.loc, actnorm.logs, mixing.lu, mixing.log_s, mixing.sign, mixing.perm,
                                      coupling.split, coupling.net, coupling.kind, self._fold)

    def forward(self, x: torch.Tensor):
        """(z, logdet per row)."""
        return kernels.step_ref(x, self.params(x))

    def inverse(self, z: torch.Tensor):
        """(x, log-det of the inverse map per row)."""
        return kernels.inverse_step_ref(z, self.params())

    def _fold(self):
        """`kernels.fold` of ActNorm and the LU linear: cached in inference, differentiable otherwise."""
        mixing = self.mixing
        parameters = (self.actnorm.loc, self.actnorm.logs, mixing.lu, mixing.log_s, mixing.sign, mixing.perm)
        if self.training or (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())):
            return kernels.fold(*parameters)
        key = version_key(parameters)
        if self._fold_cache is None or self._fold_cache[0] != key:
            # a normal tensor even if built in inference mode: a grad-enabled call with frozen parameters may use it
            with torch.inference_mode(False), torch.no_grad():
                self._fold_cache = (key, *kernels.fold(*parameters))
        return self._fold_cache[1:]
