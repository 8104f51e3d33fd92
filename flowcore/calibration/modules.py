"""The calibrators as frozen, forward-only torch modules (`Calibrator.as_module`): float32 (batch, dim) in,
(batch, output_dim) out, matrix products and elementwise ops only, so that they trace and export (ONNX) and
run inside other models (sentence-transformers)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["FlowMap", "LinearMap", "Passthrough"]


class Passthrough(nn.Module):
    """x -> x: the raw vectors (`none`, and `auto` when it keeps them).

    Args:
        dim: the width of the vectors.

    Example:
        >>> Passthrough(384)(x) is x
        True
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class LinearMap(nn.Module):
    """x -> (x − μ)·W in float32, the map of every linear calibrator.

    Args:
        mean: μ, (dim,).
        matrix: W, (dim, output_dim).

    Example:
        >>> LinearMap(whitening.mean, whitening.matrix)(torch.from_numpy(X))   # ≈ whitening.transform(X)
    """

    def __init__(self, mean, matrix):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(np.asarray(mean), dtype=torch.float32).contiguous())
        self.register_buffer("matrix", torch.as_tensor(np.asarray(matrix), dtype=torch.float32).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) @ self.matrix


class FlowMap(nn.Module):
    """A `FlowCalibrator`'s transform: its standardizer (if any), then the Glow's forward (`GlowForward`) on
    the coordinates that vary; constant coordinates pass through centred, by fixed gathers.

    Args:
        glow: the calibrator's fitted `Glow`.
        standardizer: its `Standardizer`, or None (the "raw" recipe input).

    Example:
        >>> FlowMap(calibrator.flow, calibrator.standardizer)(torch.from_numpy(X))   # ≈ calibrator.transform(X)
    """

    def __init__(self, glow, standardizer=None):
        from flowcore.flows.forward import GlowForward

        super().__init__()
        self.glow = GlowForward(glow)
        self.standardized = standardizer is not None
        self.bypass = False
        if standardizer is None:
            return
        self.register_buffer("mean", standardizer.mean.detach().float().cpu().clone())
        self.register_buffer("scale", standardizer.scale.detach().float().cpu().clone())
        varying = standardizer.varying.detach().cpu()
        self.bypass = not bool(varying.all())
        if self.bypass:  # flowed coordinates, then the constant ones, put back in their places
            flowed, constant = torch.nonzero(varying).flatten(), torch.nonzero(~varying).flatten()
            self.register_buffer("flowed", flowed)
            self.register_buffer("constant", constant)
            self.register_buffer("order", torch.argsort(torch.cat([flowed, constant])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.standardized:
            return self.glow(x)
        y = (x - self.mean) / self.scale
        if not self.bypass:
            return self.glow(y)
        flowed = self.glow(y.index_select(1, self.flowed))
        return torch.cat([flowed, y.index_select(1, self.constant)], dim=1).index_select(1, self.order)
