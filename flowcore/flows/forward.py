"""The Glow's data -> latent direction as a frozen module of plain ops, for export and serving: each step
is one matrix product with ActNorm folded into its invertible 1x1 (`kernels.fold`), the conditioner MLP
and the coupling, elementwise; the levels split and concatenate as `Glow` does. No inverse, no log-det."""
from __future__ import annotations

import torch
from torch import nn

from flowcore import kernels
from flowcore.flows.glow import Glow
from flowcore.flows.invertible_linear import LULinear
from flowcore.flows.step import FlowStep

__all__ = ["GlowForward", "StepForward"]


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def _folded_linear(step: FlowStep) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the step's ActNorm and invertible 1x1 as one map y = x @ weight.T + bias, in float64."""
    loc, logs = _cpu(step.actnorm.loc).double(), _cpu(step.actnorm.logs).double()
    mixing = step.mixing
    if isinstance(mixing, LULinear):
        weight, bias, _ = kernels.fold(loc, logs, _cpu(mixing.lu).double(), _cpu(mixing.log_s).double(),
                                       _cpu(mixing.sign).double(), _cpu(mixing.perm))
        return weight, bias
    weight = torch.eye(step.actnorm.dim, dtype=torch.float64).flip(0) * torch.exp(logs)  # the reversal
    return weight, weight @ loc


class StepForward(nn.Module):
    """One `FlowStep`'s forward, z = [y1, coupling(y1, y2)] with y = x @ weight.T + bias, in float32.

    Args:
        step: a `FlowStep` of a fitted Glow (copied to the CPU: later changes to it do not reach this module).

    Example:
        >>> z = StepForward(glow.levels[0][0])(x)     # glow.levels[0][0](x)[0], to float32 rounding
    """

    def __init__(self, step: FlowStep):
        super().__init__()
        weight, bias = _folded_linear(step)
        coupling = step.coupling
        self.split, self.affine = coupling.split, coupling.kind == "affine"
        self.register_buffer("weight", weight.float().contiguous())
        self.register_buffer("bias", bias.float().contiguous())
        first, _, second, _, last = coupling.net
        for name, layer in (("hidden1", first), ("hidden2", second)):
            self.register_buffer(f"{name}_weight", _cpu(layer.weight).float().clone())
            self.register_buffer(f"{name}_bias", _cpu(layer.bias).float().clone())
        out_weight, out_bias = _cpu(last.weight).float(), _cpu(last.bias).float()
        if self.affine:  # h's even rows shift, its odd rows are the scale's logit: two products, no strided slice
            self.register_buffer("shift_weight", out_weight[0::2].contiguous())
            self.register_buffer("shift_bias", out_bias[0::2].contiguous())
            self.register_buffer("logit_weight", out_weight[1::2].contiguous())
            self.register_buffer("logit_bias", (out_bias[1::2] + kernels.SCALE_OFFSET).contiguous())
        else:
            self.register_buffer("shift_weight", out_weight.clone())
            self.register_buffer("shift_bias", out_bias.clone())
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.weight, self.bias)
        y1, y2 = y[:, :self.split], y[:, self.split:]
        hidden = torch.relu(torch.nn.functional.linear(y1, self.hidden1_weight, self.hidden1_bias))
        hidden = torch.relu(torch.nn.functional.linear(hidden, self.hidden2_weight, self.hidden2_bias))
        shifted = y2 + torch.nn.functional.linear(hidden, self.shift_weight, self.shift_bias)
        if self.affine:
            shifted = shifted * torch.sigmoid(torch.nn.functional.linear(hidden, self.logit_weight, self.logit_bias))
        return torch.cat([y1, shifted], dim=1)


class GlowForward(nn.Module):
    """A fitted `Glow`'s data -> latent map x -> z (`glow(x)[0]`), float32 in and out, without the log-det.

    Args:
        glow: a fitted `Glow` (its weights are copied).

    Example:
        >>> z = GlowForward(calibrator.flow)(torch.from_numpy(X))     # = calibrator.flow(x)[0], float32
    """

    def __init__(self, glow: Glow):
        super().__init__()
        self.level_dims = list(glow.level_dims)
        self.levels = nn.ModuleList(nn.ModuleList(StepForward(step) for step in steps) for steps in glow.levels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, leaving = x, []
        for index, steps in enumerate(self.levels):
            for step in steps:
                h = step(h)
            if index + 1 < len(self.levels):  # half the features leave as latent, as `Glow` splits them
                keep = self.level_dims[index + 1]
                h, out = h[:, :keep], h[:, keep:]
                leaving.append(out)
        return torch.cat([h, *reversed(leaving)], dim=1)
