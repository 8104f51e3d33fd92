"""The one choice of how a flow runs: `plan(x, dim, conditioners, training)` reads the backend once and
returns the `Plan` every step of one flow call takes: its forward, its inverse and the prior's
squared norm. A plan is one of the `PATHS`; every path is tested against the twins of `reference`.
"""
from __future__ import annotations

import torch
from torch import nn

from . import reference
from ._utils import require_matrix, require_vector
from .compat import composed_autograd_only, plain_tensors
from .cpu import Factored, Folded, cpu_step, mlp_layers
from .dispatch import resolve, triton_ops
from .squared_norm import squared_norm, squared_norm_ref

PATHS = {
    "reference": "autograd of the twins (`reference.step_ref`): inside torch.func transforms, under autocast or "
                 "torch.compile, for tensor subclasses, and for conditioners other than a plain MLP",
    "factored": "CPU training on batches of fewer than FACTORED_ROWS_PER_FEATURE x d rows: the default step in "
                "one Function (`cpu.py`) with the LU factors applied to the batch one by one",
    "folded": "CPU inference and larger CPU training batches: ActNorm folded into the LU weight (one GEMM + "
              "bias), the default step in one Function (`cpu.py`)",
    "triton": "the Triton backend: an LU step is the folded GEMMs with the coupling in the second's epilogue "
              "(`triton/step.py`); a reversal step and every inverse run the Triton ActNorm and coupling kernels",
}
"""Every way a flow runs. On the CPU paths the variants compose the twins, an LU step from its folded weight."""

FACTORED_ROWS_PER_FEATURE = 0.5
"""Training batches of fewer rows per feature apply the LU factors, not W (below the flop counts' crossover)."""


def plan(x: torch.Tensor, dim: int, conditioners, training: bool) -> Plan:
    """The `Plan` that runs a whole flow on `x`, the backend read once.

    Args:
        x: the flow's input batch.
        dim: the flow's width (so every step of one call takes the same path).
        conditioners: every conditioner the plan will run.
        training: the parameters will get gradients from this call (training mode, grad enabled).

    Example:
        >>> run = plan(x, d, [net], training=True)      # "factored" for a batch of fewer than d / 2 rows
        >>> z, logdet = run.step(x, StepParameters(loc, logs, lu, log_s, sign, perm, d // 2, net))
    """
    if composed_autograd_only(x) or not plain_tensors((x,)):
        return Plan("reference")
    if resolve(x) == "triton":
        modules = all(isinstance(conditioner, nn.Module) for conditioner in conditioners)
        return Plan("triton" if modules or not torch.is_grad_enabled() else "reference")
    if any(mlp_layers(conditioner) is None for conditioner in conditioners):
        return Plan("reference")
    return Plan("factored" if training and x.shape[0] < FACTORED_ROWS_PER_FEATURE * dim else "folded")


class Plan:
    """How every step of one flow call runs: `step` (data -> latent), `inverse` and `squared_norm`,
    and the elementwise ops they use, on the backend of `path` (Triton for "triton", else PyTorch).

    Args:
        path: one of `PATHS` (`plan` chooses it).

    Example:
        >>> z, logdet = Plan("folded").step(x, StepParameters(loc, logs, lu, log_s, sign, perm, d // 2, net))
    """

    def __init__(self, path: str):
        if path not in PATHS:
            raise ValueError(f"unknown step path {path!r}; choose one of {', '.join(PATHS)}")
        self.path = path
        self.backend = "triton" if path == "triton" else "torch"
        self._triton = triton_ops() if path == "triton" else None

    def __repr__(self) -> str:
        return f"Plan({self.path!r})"

    def step(self, x: torch.Tensor, p: reference.StepParameters):
        """(z, logdet per row) of the step with parameters `p`."""
        _check(x, p)
        if self.path == "reference":
            return reference.step_ref(x, p)
        if p.lu is None:
            return reference.reversed_step(x, p, self.actnorm, self.couple)
        if self.path == "factored" and p.coupling == "affine":
            z, logdet = cpu_step(Factored, p.split, x, (p.loc, p.logs, p.lu, p.log_s, p.sign, p.perm), p.conditioner)
            return z, logdet + (p.logs.sum() + p.log_s.sum()).to(logdet.dtype)
        weight, bias, constant = p.folded()
        z, logdet = self.folded_step(x, weight, bias, p.split, p.conditioner, p.coupling)
        return z, logdet + constant.to(logdet.dtype)

    def folded_step(self, x, weight, bias, split: int, conditioner, coupling: str = "affine"):
        """(z, coupling logdet) of a step folded into y = x @ weight.T + bias: the Triton step, CPU Function or twin."""
        if self._triton is not None:
            return self._triton["step"](x, weight, bias, split, conditioner, coupling)
        if self.path == "folded" and coupling == "affine":
            return cpu_step(Folded, split, x, (weight, bias), conditioner)
        return reference.folded_step_ref(x, weight, bias, split, conditioner, coupling)

    def inverse(self, z: torch.Tensor, p: reference.StepParameters):
        """(x, log-det of the inverse map per row) of the step with parameters `p`."""
        _check(z, p)
        return reference.inverse_step_ref(z, p, self.uncouple, self.actnorm_inverse)

    def squared_norm(self, z: torch.Tensor) -> torch.Tensor:
        """Each row's sum of squares, in float32 (float64 for float64)."""
        return squared_norm_ref(z) if self.path == "reference" else squared_norm(z)

    def actnorm(self, x, loc, logs):
        """(x + loc) * exp(logs) on this plan's backend."""
        if self._triton is None:
            return reference.actnorm_ref(x, loc, logs)
        return self._triton["actnorm"](x, loc, logs, False)

    def actnorm_inverse(self, y, loc, logs):
        """y * exp(-logs) - loc on this plan's backend."""
        if self._triton is None:
            return reference.actnorm_inverse_ref(y, loc, logs)
        return self._triton["actnorm"](y, loc, logs, True)

    def couple(self, x2, h, coupling: str = "affine"):
        """(z2, log-det per row) of the coupling (`reference.couple_ref`) on this plan's backend."""
        if self._triton is None:
            return reference.couple_ref(x2, h, coupling)
        return self._triton["couple"](x2, h, coupling, False)

    def uncouple(self, z2, h, coupling: str = "affine"):
        """(x2, log-det of the forward map per row) of the coupling's inverse on this plan's backend."""
        if self._triton is None:
            return reference.uncouple_ref(z2, h, coupling)
        return self._triton["couple"](z2, h, coupling, True)


def _check(x: torch.Tensor, p: reference.StepParameters) -> None:
    d = p.logs.shape[0] if p.lu is None else p.lu.shape[0]
    require_matrix("step input", x, d)
    tensors = (("loc", p.loc), ("logs", p.logs), ("log_s", p.log_s), ("sign", p.sign), ("perm", p.perm))
    for name, vector in tensors if p.lu is not None else tensors[:2]:
        require_vector(f"step {name}", vector, d)
    if p.lu is not None:
        require_matrix("step lu", p.lu, d)
    if not 0 < p.split < d:
        raise ValueError(f"step split must be in 1..{d - 1}, got {p.split}")
    if p.coupling not in ("affine", "additive"):
        raise ValueError(f"unknown coupling {p.coupling!r}; choose affine or additive")
