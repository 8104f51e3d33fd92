"""The multi-scale Glow of BERT-flow for sentence vectors (a 1x1 image with D channels). After each level but
the last, half the features leave as latent under a standard normal prior, in place: z has the layout of x."""
from __future__ import annotations

import math

import torch
from torch import nn

from flowcore import defaults, kernels
from flowcore.flows.configs import CONFIGS
from flowcore.flows.step import FlowStep
from flowcore.kernels import accumulation_dtype
from flowcore.kernels.compat import functorch_transforms_active, has_forward_hooks
from flowcore.runtime import inference_workers, pinned_threads, side_by_side

__all__ = ["CONFIGS", "LINEAR_START_SCALE", "Glow"]

LINEAR_START_SCALE = 0.999
"""Initial scale of each level's last coupling in `Glow.start_linear` (sigmoid cannot reach 1)."""


class Glow(nn.Module):
    r"""The multi-scale Glow of BERT-flow on `dim`-wide vectors: `z, logdet = glow(x)`, data -> latent.

    Args:
        dim: the width D of the vectors.
        levels: multi-scale levels; after each but the last, half the features leave as latent.
        depth: steps per level.
        width: hidden units of each coupling's conditioner (two hidden ReLU layers).
        coupling: "affine" (the default) or "additive".
        permutation: the invertible 1x1 of each step: "lu" (learned, the default) or "reverse" (fixed).

    Example:
        >>> glow = Glow(768, levels=2, depth=3, width=32)   # or Glow.from_config("l2_d3_w32", 768)
        >>> loss = glow.bits_per_dim(x)                     # the training objective
    """

    def __init__(self, dim: int, levels: int = defaults.LEVELS, depth: int = defaults.DEPTH,
                 width: int = defaults.WIDTH, coupling: str = defaults.COUPLING,
                 permutation: str = defaults.PERMUTATION):
        super().__init__()
        for name, value in (("dim", dim), ("levels", levels), ("depth", depth), ("width", width)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Glow {name} must be a positive integer, got {value!r}")
        self.level_dims = [dim // 2**level for level in range(levels)]
        if self.level_dims[-1] < 2:
            raise ValueError(f"a Glow with {levels} levels halves the features {levels - 1} time(s); dim={dim} "
                             f"leaves {self.level_dims[-1]} feature(s) for the last level, which needs at least 2")
        self.dim = dim
        self.config = dict(dim=dim, levels=levels, depth=depth, width=width, coupling=coupling, permutation=permutation)
        self.levels = nn.ModuleList(nn.ModuleList(FlowStep(size, width, coupling, permutation) for _ in range(depth))
                                    for size in self.level_dims)

    @classmethod
    def from_config(cls, name: str, dim: int | None = None, **overrides) -> "Glow":
        """An official configuration such as `l2_d3_w32` (levels, depth, width) for `dim` features."""
        if name not in CONFIGS:
            raise ValueError(f"unknown Glow config {name!r}; choose one of {', '.join(CONFIGS)}")
        if dim is None:
            raise TypeError(f"Glow.from_config needs the embedding width, e.g. Glow.from_config({name!r}, dim=768)")
        return cls(dim, **{**CONFIGS[name], **overrides})

    @torch.no_grad()
    def start_linear(self, weight: torch.Tensor, loc: torch.Tensor | None = None) -> "Glow":
        """Start training from the linear flow z = R @ weight @ (x + loc), R orthogonal: later ActNorms undo the
        couplings' initial scale and each level's last coupling starts near the identity, so with a whitening
        `weight` training starts at whitening (R keeps cosines).

        Args:
            weight: (dim, dim) invertible matrix, e.g. Λ^(-1/2) Uᵀ of the data's covariance.
            loc: (dim,) shift added before `weight`, e.g. minus the data's mean; None: no shift.

        Example:
            >>> glow = Glow(384).start_linear(torch.eye(384))   # starts as a permutation
        """
        if weight.shape != (self.dim, self.dim):
            raise ValueError(f"Glow({self.dim}).start_linear expects a ({self.dim}, {self.dim}) weight, "
                             f"got {tuple(weight.shape)}")
        for index, steps in enumerate(self.levels):
            for position, step in enumerate(steps):
                if position + 1 == len(steps) and step.coupling.kind == "affine":
                    step.coupling.start_scale(LINEAR_START_SCALE)
                scale = None
                if position > 0:  # undo the previous coupling's initial scale
                    previous = steps[position - 1].coupling
                    scale = torch.ones(self.level_dims[index], dtype=step.actnorm.logs.dtype)
                    scale[previous.split:] = 1.0 / previous.initial_scale()
                first = index == 0 and position == 0
                step.start_linear(weight if first else None, loc if first else None, scale)
        return self

    def _check(self, x: torch.Tensor, what: str) -> None:
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"Glow({self.dim}) {what} expects shape (batch, {self.dim}), got {tuple(x.shape)}")

    def _plan(self, x: torch.Tensor) -> kernels.Plan:
        """How this call runs (`kernels.plan`), chosen once: every step of the call takes it."""
        conditioners = [step.coupling.net for steps in self.levels for step in steps]
        return kernels.plan(x, self.dim, conditioners, self.training and torch.is_grad_enabled())

    def forward(self, x: torch.Tensor):
        self._check(x, "forward")
        plan = self._plan(x)
        if self._blocked_inference(x):
            return self._forward_in_blocks(x, plan)
        parts, logdet = self._latent_parts(x, plan)
        return torch.cat(parts, dim=1), logdet

    def _blocked_inference(self, x: torch.Tensor) -> bool:
        """CPU inference runs the flow a block of rows at a time, so activations stay in cache."""
        small = x.shape[0] * self.dim * x.element_size() <= defaults.CPU_BLOCK_BYTES
        if self.training or x.device.type != "cpu" or small or functorch_transforms_active():
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())))

    def _forward_in_blocks(self, x: torch.Tensor, plan: kernels.Plan):
        """(z, logdet) of CPU inference, block by block; with n torch threads, n blocks run side by
        side on one thread each, so the output is that of a one-thread run whatever n or the load."""
        z = torch.empty_like(x, memory_format=torch.contiguous_format)
        logdet = x.new_empty(x.shape[0], dtype=accumulation_dtype(x))
        step = max(1, defaults.CPU_BLOCK_BYTES // (self.dim * x.element_size()))
        starts = range(0, x.shape[0], step)
        inference = torch.is_inference_mode_enabled()

        def run(start: int) -> None:
            with torch.inference_mode(inference), torch.no_grad():  # grad modes are per thread
                rows = slice(start, start + step)
                parts, logdet[rows] = self._latent_parts(x[rows], plan)
                torch.cat(parts, dim=1, out=z[rows])

        workers = inference_workers(len(starts))
        if has_forward_hooks(self) or torch.is_autocast_enabled("cpu") or plan.backend != "torch":
            workers = 1
        with pinned_threads(1 if workers > 1 else None):
            side_by_side(workers, run, starts)
        return z, logdet

    def _latent_parts(self, x: torch.Tensor, plan: kernels.Plan):
        """z's column blocks (last level's output, then earlier latents, latest first) and the log-det."""
        h, logdet, leaving = x, x.new_zeros(x.shape[0], dtype=accumulation_dtype(x)), []
        for index, steps in enumerate(self.levels):
            for step in steps:
                h, step_logdet = plan.step(h, step.params(h))
                logdet = logdet + step_logdet
            if index + 1 < len(self.levels):
                keep = self.level_dims[index + 1]
                h, out = h.split([keep, h.shape[1] - keep], dim=1)
                leaving.append(out)
        return [h, *reversed(leaving)], logdet

    def inverse(self, z: torch.Tensor, return_logdet: bool = False):
        """x from z; with `return_logdet`, also log|det dx/dz| per row (the negative of forward's)."""
        self._check(z, "inverse")
        plan = self._plan(z)
        h, logdet = z[:, : self.level_dims[-1]], z.new_zeros(z.shape[0], dtype=accumulation_dtype(z))
        for index in reversed(range(len(self.levels))):
            if index + 1 < len(self.levels):
                h = torch.cat([h, z[:, self.level_dims[index + 1] : self.level_dims[index]]], dim=1)
            for step in reversed(self.levels[index]):
                h, step_logdet = plan.inverse(h, step.params())
                logdet = logdet + step_logdet
        return (h, logdet) if return_logdet else h

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log N(z; 0, I) + logdet per row, the log-likelihood of each row of `x`."""
        self._check(x, "log_prob")
        plan = self._plan(x)
        if has_forward_hooks(self, recurse=False):  # the hooks see a forward call (which plans its own)
            z, logdet = self(x)
            parts = [z]
        elif self._blocked_inference(x):
            z, logdet = self._forward_in_blocks(x, plan)
            parts = [z]
        else:
            parts, logdet = self._latent_parts(x, plan)
        norm = sum(plan.squared_norm(part) for part in parts)
        return -0.5 * norm - 0.5 * self.dim * math.log(2 * math.pi) + logdet

    def bits_per_dim(self, x: torch.Tensor) -> torch.Tensor:
        """The training loss of the official code: mean negative log-likelihood in bits per dimension."""
        return -self.log_prob(x).mean() / (self.dim * math.log(2.0))

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.config.items())
