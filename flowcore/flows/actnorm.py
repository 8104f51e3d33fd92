"""ActNorm: per-feature affine y = (x + loc) * exp(logs), initialised so that the first training batch
leaves with zero mean and unit variance. `initialized` is a saved buffer: a loaded model is never re-initialised."""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels

__all__ = ["ActNorm"]


class ActNorm(nn.Module):
    """Per-feature affine map on `dim` features, initialised from the first training batch."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.loc = nn.Parameter(torch.zeros(dim))
        self.logs = nn.Parameter(torch.zeros(dim))
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Set loc = -mean and logs = -log(std) from the batch `x` (B, D)."""
        if x.shape[0] < 2:
            raise ValueError(f"ActNorm's data-dependent initialisation needs at least 2 rows in the first training "
                             f"batch, got {x.shape[0]}; use a larger batch size")
        mean = x.mean(dim=0)
        std = x.std(dim=0, unbiased=False)
        constant = std <= 16 * torch.finfo(x.dtype).eps * mean.abs()  # zero, or rounding noise around the mean
        if bool(constant.any()):
            features = torch.nonzero(constant).flatten().tolist()
            shown = ", ".join(map(str, features[:10])) + (" ..." if len(features) > 10 else "")
            raise ValueError(f"feature(s) {shown} have zero variance in the first training batch, so ActNorm cannot "
                             "scale them to unit variance; drop constant features or use a larger, shuffled batch")
        self.loc.copy_(-mean)
        self.logs.copy_(-torch.log(std))
        self.initialized.fill_(True)

    def maybe_initialize(self, x: torch.Tensor) -> None:
        """`initialize` from `x` on the first call in training mode; nothing otherwise."""
        if self.training and not bool(self.initialized):
            self.initialize(x.detach())

    def logdet(self) -> torch.Tensor:
        """log|det| of the map, the same for every row: sum(logs)."""
        return self.logs.sum()

    def forward(self, x: torch.Tensor):
        """(y, logdet per row), composed in PyTorch (a `Glow` runs its steps through `kernels.plan`)."""
        self.maybe_initialize(x)
        return kernels.actnorm_ref(x, self.loc, self.logs), self.logdet().expand(x.shape[0])

    def inverse(self, y: torch.Tensor):
        return kernels.actnorm_inverse_ref(y, self.loc, self.logs), (-self.logdet()).expand(y.shape[0])
