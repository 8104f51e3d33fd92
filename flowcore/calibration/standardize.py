"""Fixed per-coordinate standardisation in front of the flow, fitted once on the whole corpus; a
coordinate that never varies (its likelihood is unbounded) passes through centred, bypassing the flow."""
from __future__ import annotations

import torch
from torch import nn

from flowcore.calibration.moments import row_blocks

__all__ = ["CONSTANT_TOLERANCE", "Standardizer"]

CONSTANT_TOLERANCE = 1e-4  # a coordinate whose std is below this fraction of the largest is constant


class Standardizer(nn.Module):
    """Per-coordinate (x - mean) / std for `dim` coordinates, fitted once with `fit(X)`; the
    coordinates with `varying` False are only centred and bypass the flow."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("scale", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("varying", torch.ones(dim, dtype=torch.bool))

    @property
    def dim(self) -> int:
        """Width of the vectors taken and returned."""
        return self.mean.shape[0]

    @property
    def flow_dim(self) -> int:
        """How many coordinates go through the flow."""
        return int(self.varying.sum())

    @torch.no_grad()
    def fit(self, X: torch.Tensor, rows: torch.Tensor | None = None) -> "Standardizer":
        """Mean and std per coordinate in float64, two passes over blocks of rows (bounded memory).

        Args:
            X: (n, dim) tensor.
            rows: 1-D int64 tensor of the row numbers of X to fit on; None: all rows.

        Example:
            >>> standardizer = Standardizer(384).fit(torch.from_numpy(np.load("big.npy", mmap_mode="r")))
        """
        count = X.shape[0] if rows is None else len(rows)
        self.to(X.device)
        zero = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
        mean = sum((block.double().sum(0) for block in row_blocks(X, rows)), zero) / count
        squares = sum((((block.double() - mean) ** 2).sum(0) for block in row_blocks(X, rows)), zero)
        std = torch.sqrt(squares / count)
        varying = std > CONSTANT_TOLERANCE * std.max()
        if not bool(varying.any()):
            raise ValueError("no coordinate of the data varies: there is nothing for a flow to fit")
        self.mean.copy_(mean)
        self.scale.copy_(torch.where(varying, std, torch.ones_like(std)))
        self.varying.copy_(varying)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std on the varying coordinates, the full width centred."""
        return (x - self.mean.to(x.dtype)) / self.scale.to(x.dtype)

    def flow_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the flow sees of rows x: `forward(x)` at the varying coordinates only (flow_dim wide)."""
        return self(x)[:, self.varying]

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """x from `forward`'s output."""
        return y * self.scale.to(y.dtype) + self.mean.to(y.dtype)
