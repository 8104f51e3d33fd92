"""Fixed per-coordinate standardisation in front of the flow, fitted once on the whole corpus.

Sentence vectors can hold coordinates that never vary (mean-pooled all-MiniLM-L6-v2 has two,
constant to 1e-32). Maximum likelihood on such a coordinate is unbounded and training diverges,
so those pass through centred and untouched, while every other coordinate is centred and scaled
to unit variance before the flow sees it. It is invertible and keeps positions: z has x's width.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["CONSTANT_TOLERANCE", "Standardizer"]

CONSTANT_TOLERANCE = 1e-4  # a coordinate whose std is below this fraction of the largest is constant
STAT_CHUNK_ROWS = 65536


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
    def all_varying(self) -> bool:
        """True when every coordinate goes through the flow (no gather/scatter needed)."""
        return self.flow_dim == self.dim

    @property
    def flow_dim(self) -> int:
        """How many coordinates go through the flow."""
        return int(self.varying.sum())

    @torch.no_grad()
    def fit(self, X: torch.Tensor) -> "Standardizer":
        """Mean and std per coordinate in float64, two passes over chunks (no float64 copy of X)."""
        rows = X.shape[0]
        self.to(X.device)
        total = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
        for start in range(0, rows, STAT_CHUNK_ROWS):
            total += X[start : start + STAT_CHUNK_ROWS].double().sum(0)
        mean = total / rows
        squares = torch.zeros_like(mean)
        for start in range(0, rows, STAT_CHUNK_ROWS):
            squares += ((X[start : start + STAT_CHUNK_ROWS].double() - mean) ** 2).sum(0)
        std = torch.sqrt(squares / rows)
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

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """x from `forward`'s output."""
        return y * self.scale.to(y.dtype) + self.mean.to(y.dtype)
