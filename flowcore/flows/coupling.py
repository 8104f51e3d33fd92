"""Coupling layers: the first half of the features conditions a transform of the second half.

x1 = x[:, :d // 2] passes through and h = NN(x1), a two-hidden-layer ReLU MLP whose last layer starts at zero:
- affine:   z2 = (x2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + SCALE_OFFSET), log-det = sum(log scale);
- additive: z2 = x2 + h, log-det 0.
Odd dimensions work: x2 takes the extra feature.
"""
from __future__ import annotations

import torch
from torch import nn

from flowcore import defaults, kernels
from flowcore.flows.configs import COUPLINGS

__all__ = ["COUPLINGS", "Coupling"]


class Coupling(nn.Module):
    """A coupling layer of `kind` "affine" or "additive" on `dim` features; `split` = dim // 2
    features condition the rest through `net`, an MLP of `width` hidden units."""

    def __init__(self, dim: int, width: int = defaults.WIDTH, kind: str = defaults.COUPLING):
        super().__init__()
        if kind not in COUPLINGS:
            raise ValueError(f"unknown coupling {kind!r}; choose one of {', '.join(COUPLINGS)}")
        if dim < 2:
            raise ValueError(f"a coupling layer needs at least 2 features, got {dim}")
        self.kind = kind
        self.split = dim // 2
        d2 = dim - self.split
        out = 2 * d2 if kind == "affine" else d2
        self.net = nn.Sequential(
            nn.Linear(self.split, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, out),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def initial_scale(self) -> float:
        """The scale of x2 while the conditioner's last layer is zero (1 for the additive coupling)."""
        if self.kind != "affine":
            return 1.0
        return float(torch.sigmoid(self.net[-1].bias[1::2] + kernels.SCALE_OFFSET).mean())

    @torch.no_grad()
    def start_scale(self, scale: float) -> None:
        """Start the affine coupling at z2 = x2 * `scale` (0 < scale < 1) by setting the logits' bias."""
        if self.kind != "affine":
            raise ValueError("start_scale applies to the affine coupling only")
        if not 0.0 < scale < 1.0:
            raise ValueError(f"an affine coupling's scale lies in (0, 1), got {scale}")
        self.net[-1].bias[1::2] = torch.logit(torch.tensor(scale, dtype=torch.float64)).item() - kernels.SCALE_OFFSET

    def forward(self, x: torch.Tensor):
        """(z, logdet per row), composed in PyTorch (a `Glow` runs its steps through `kernels.plan`)."""
        x1, x2 = x.split([self.split, x.shape[1] - self.split], dim=1)
        z2, logdet = kernels.couple_ref(x2, self.net(x1), self.kind)
        return torch.cat([x1, z2], dim=1), logdet

    def inverse(self, z: torch.Tensor):
        z1, z2 = z.split([self.split, z.shape[1] - self.split], dim=1)
        x2, logdet = kernels.uncouple_ref(z2, self.net(z1), self.kind)
        return torch.cat([z1, x2], dim=1), -logdet
