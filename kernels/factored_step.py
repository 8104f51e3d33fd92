"""One affine Glow step of small-batch training in one autograd node, factor by factor:
a = (x + loc) * exp(logs), y = a @ (P L U).T with U's diagonal sign * exp(log_s)
(`flowcore.kernels.triangular.factored_linear`), h = conditioner(y1),
z = [y1, (y2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + SCALE_OFFSET)] and
logdet = sum(log scale) + sum(logs) + sum(log_s) per row: the step's whole log-det.

`factored_affine_step(x, loc, logs, lu, log_s, sign, perm, split, conditioner)` returns (z, logdet);
`factored_affine_step_ref` is its composed twin.

Why one node: at the paper's batch of 32 rows every op is small, so a step costs about as much
per op call as per flop. Composed, the step is the factored product, the conditioner, the
coupling, a concatenation and the log-det terms, each with its own autograd nodes, slices and
stacks. `_FactoredAffineStep` runs the factored product (`triangular.factored_forward`), the MLP
with its output interleaved as the coupling reads it, and the coupling in place on the product;
its backward writes dy2 = dz2 * scale straight into dy, stacks d(shift) and d(logit) into dh
once, back-propagates the MLP by hand (dy1 = dz1 + its input gradient, written into dy) and
hands dy to `triangular.factored_backward`. The folded step's PyTorch path
(`flowcore.kernels.torch_step`) splits the MLP's last layer instead, which pays at large batches
(contiguous shift and logit) and costs ops at small ones. Conditioners other than the coupling's
plain MLP, `torch.func` transforms and autocast run the composed twin; under `create_graph=True`
the backward differentiates it, so higher-order gradients are exact.
"""
from __future__ import annotations

from typing import Callable

import torch

from flowcore._torch_compat import composed_autograd_only, composed_backward, relu_backward
from flowcore.kernels.coupling import SCALE_OFFSET, affine_coupling_ref, row_log_sigmoid_sum
from flowcore.kernels.torch_step import mlp_layers
from flowcore.kernels.triangular import factored_backward, factored_forward, factored_linear_ref


def factored_affine_step_ref(x, loc, logs, lu, log_s, sign, perm, split: int, conditioner: Callable):
    """The step composed under autograd (see the module docstring)."""
    y = factored_linear_ref(x, loc, logs, lu, sign * torch.exp(log_s), perm)
    y1, y2 = y.split([split, y.shape[1] - split], dim=1)
    z2, logdet = affine_coupling_ref(y2, conditioner(y1))
    return torch.cat([y1, z2], dim=1), logdet + (logs.sum() + log_s.sum()).to(logdet.dtype)


def factored_affine_step(x, loc, logs, lu, log_s, sign, perm, split: int, conditioner: Callable):
    """(z, logdet) of ActNorm -> LU linear -> affine coupling, applied factor by factor.

    Args:
        x: (B, d) batch.
        loc, logs: ActNorm's shift and log-scale, (d,).
        lu: (d, d) packed strict triangles of L (below) and U (above), as in `LULinear`.
        log_s, sign: (d,) U's diagonal is sign * exp(log_s).
        perm: (d,) int64 row order of W = P L U, W[i] = (L U)[perm[i]].
        split: the coupling's first-half width.
        conditioner: maps y1 (B, split) to h (B, 2 (d - split)).

    Example:
        >>> z, logdet = factored_affine_step(x, step.actnorm.loc, step.actnorm.logs, step.mixing.lu,
        ...                                  step.mixing.log_s, step.mixing.sign, step.mixing.perm,
        ...                                  step.coupling.split, step.coupling.net)
    """
    layers = mlp_layers(conditioner)
    if layers is None or composed_autograd_only(x):
        return factored_affine_step_ref(x, loc, logs, lu, log_s, sign, perm, split, conditioner)
    if layers[-2].shape[0] != 2 * (x.shape[1] - split):
        raise ValueError(f"factored_affine_step conditioner output must have {2 * (x.shape[1] - split)} columns, "
                         f"got {layers[-2].shape[0]}")
    return _FactoredAffineStep.apply(x, loc, logs, lu, log_s, sign, perm, split, *layers)


class _FactoredAffineStep(torch.autograd.Function):
    """The step with a hand-written backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, loc, logs, lu, log_s, sign, perm, split: int, *layers):
        diagonal = sign * torch.exp(log_s)
        z, saved = factored_forward(x, loc, logs, lu, diagonal, perm)
        activations = [z[:, :split]]
        for index in range(0, len(layers) - 2, 2):
            activations.append(torch.addmm(layers[index + 1], activations[-1], layers[index].T).relu_())
        h = torch.addmm(layers[-1], activations[-1], layers[-2].T)
        shift, logit = h.unflatten(1, (-1, 2)).unbind(-1)
        logit.add_(SCALE_OFFSET)
        scale = torch.sigmoid(logit)
        logdet = row_log_sigmoid_sum(logit).add_(logs.sum() + log_s.sum())
        z[:, split:].add_(shift).mul_(scale)
        ctx.split, ctx.saved_count = split, len(saved)
        ctx.save_for_backward(x, loc, logs, lu, log_s, sign, perm, diagonal, z, scale, *saved, *activations[1:],
                              *layers)
        return z, logdet

    @staticmethod
    def backward(ctx, dz, dlogdet):
        x, loc, logs, lu, log_s, sign, perm, diagonal, z, scale, *rest = ctx.saved_tensors
        saved, rest = rest[: ctx.saved_count], rest[ctx.saved_count:]
        depth = (len(rest) + 1) // 3
        hidden, layers = rest[: depth - 1], rest[depth - 1:]
        split, needs = ctx.split, ctx.needs_input_grad
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the composed twin, so higher-order gradients are exact
            def conditioner(a):
                for index in range(0, len(layers), 2):
                    a = torch.nn.functional.linear(torch.relu(a) if index else a, layers[index], layers[index + 1])
                return a

            outputs = factored_affine_step_ref(x, loc, logs, lu, log_s, sign, perm, split, conditioner)
            result = composed_backward(outputs, (x, loc, logs, lu, log_s, *layers), needs[:5] + needs[8:],
                                       (dz, dlogdet))
            return (*result[:5], None, None, None, *result[5:])
        dy = torch.empty_like(z)
        dz2, z2 = dz[:, split:], z[:, split:]
        dshift = torch.mul(dz2, scale, out=dy[:, split:])  # dy2 and d(shift) are equal
        # d/dlogit of (y2 + shift) * scale and of log scale: (1 - scale) * (dz2 * z2 + dlogdet)
        dlogit = torch.addcmul(dlogdet.to(z.dtype)[:, None], dz2, z2)
        dlogit.addcmul_(dlogit, scale, value=-1.0)
        grad = torch.stack([dshift, dlogit], dim=2).flatten(1)  # dh, interleaved as h
        inputs = [z[:, :split], *hidden]
        layer_grads = [None] * len(layers)
        for index in reversed(range(depth)):
            if index + 1 < depth:
                grad = relu_backward(grad, inputs[index + 1])
            if needs[8 + 2 * index]:
                layer_grads[2 * index] = grad.T @ inputs[index]
            if needs[9 + 2 * index]:
                layer_grads[2 * index + 1] = grad.sum(dim=0)
            if index:
                grad = grad @ layers[2 * index]
            else:  # dy1 = dz1 + the conditioner's input gradient, written into dy's first half
                torch.addmm(dz[:, :split], grad, layers[0], out=dy[:, :split])
        dx, d_loc, d_logs, d_lu, d_diagonal = factored_backward(dy, lu, perm, saved, needs[:5])
        total = dlogdet.sum()  # every row's log-det holds sum(logs) + sum(log_s)
        if d_logs is not None:
            d_logs = d_logs.add_(total.to(d_logs.dtype))
        d_log_s = d_diagonal.mul(diagonal).add_(total.to(diagonal.dtype)) if needs[4] else None
        return dx, d_loc, d_logs, d_lu, d_log_s, None, None, None, *layer_grads
