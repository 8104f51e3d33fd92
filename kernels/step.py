"""The default Glow step, data -> latent: ActNorm -> LU-parametrised 1x1 -> affine coupling.

    a = (x + loc) * exp(logs);   y = a @ W.T,  W = P L U, U's diagonal sign * exp(log_s);
    h = conditioner(y[:, :split]);   z = [y1, (y2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + SCALE_OFFSET)];
    logdet = sum(logs) + sum(log_s) + sum(log sigmoid(h[:, 1::2] + SCALE_OFFSET)) per row.

`affine_step` runs it on one of the `PATHS`, chosen once per flow forward by `step_path`; every path
is tested against the composed twin `affine_step_ref`.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ._utils import require_matrix, require_vector
from .compat import composed_autograd_only, composed_backward, has_forward_hooks, plain_tensors, relu_backward
from .coupling import SCALE_OFFSET, affine_coupling_backward, affine_coupling_forward, affine_coupling_ref
from .dispatch import resolve, triton_ops
from .folded_linear import folded_linear_ref
from .triangular import factored_backward, factored_forward, factored_linear_ref, lu_product

PATHS = {
    "reference": "autograd of `affine_step_ref`: inside torch.func transforms, under autocast or "
                 "torch.compile, for tensor subclasses, and for conditioners other than a plain MLP",
    "factored": "`_AffineStep`, the LU factors applied to the batch one by one: CPU training on batches "
                "of fewer than FACTORED_ROWS_PER_FEATURE x d rows",
    "folded": "`_AffineStep`, ActNorm folded into W (one GEMM + bias): CPU inference and larger CPU "
              "training batches",
    "triton": "the fused Triton step (`triton/step.py`): the GEMM with the coupling in its epilogue",
}
"""Every implementation of the step, by name: what runs and where `step_path` sends it."""

FACTORED_ROWS_PER_FEATURE = 0.5
"""Training batches of fewer than this many rows per feature apply the LU factors to the batch instead
of assembling W (below the flop counts' crossover)."""


def step_path(x: torch.Tensor, dim: int, conditioners, training: bool) -> str:
    """The name of the `PATHS` entry that runs a step (or a whole flow's steps) on `x`.

    Args:
        x: the flow's input batch.
        dim: the flow's width (so every step of one forward takes the same path).
        conditioners: every conditioner the path will run.
        training: the parameters will get gradients from this forward (training mode, grad enabled).
    """
    if composed_autograd_only(x) or not plain_tensors((x,)):
        return "reference"
    if resolve(x) == "triton":
        modules = all(isinstance(conditioner, nn.Module) for conditioner in conditioners)
        return "triton" if modules or not torch.is_grad_enabled() else "reference"
    if any(mlp_layers(conditioner) is None for conditioner in conditioners):
        return "reference"
    return "factored" if training and x.shape[0] < FACTORED_ROWS_PER_FEATURE * dim else "folded"


def mlp_layers(conditioner) -> list[torch.Tensor] | None:
    """[W1, b1, W2, b2, ...] when `conditioner` is a plain, hook-free nn.Sequential of Linear (-> ReLU ->
    Linear)*, else None. Called at every step: Linear and ReLU have no children, so each layer's
    own hooks are read directly instead of walking `modules()`."""
    if (type(conditioner) is not nn.Sequential or len(conditioner) % 2 == 0
            or has_forward_hooks(conditioner, recurse=False)):
        return None
    layers = []
    for index, module in enumerate(conditioner):
        if module._forward_hooks or module._forward_pre_hooks:
            return None
        if index % 2:
            if type(module) is not nn.ReLU:
                return None
        elif type(module) is not nn.Linear or module.bias is None:
            return None
        else:
            layers += [module.weight, module.bias]
    return layers


def fold(loc, logs, lu, log_s, sign, perm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, bias, logdet) with ActNorm folded into the LU weight, y = x @ weight.T + bias:
    weight = W diag(exp(logs)), bias = weight @ loc, logdet = sum(logs) + sum(log_s). Differentiable."""
    weight = lu_product(lu, lu, sign * torch.exp(log_s))[perm] * torch.exp(logs)
    return weight, weight @ loc, logs.sum() + log_s.sum()


def affine_step_ref(x, loc, logs, lu, log_s, sign, perm, split: int, conditioner: Callable):
    """(z, logdet) of the step composed under autograd: the twin every path is tested against."""
    y = factored_linear_ref(x, loc, logs, lu, sign * torch.exp(log_s), perm)
    z, logdet = _coupled(y, split, conditioner)
    return z, logdet + (logs.sum() + log_s.sum()).to(logdet.dtype)


def _coupled(y, split: int, conditioner: Callable):
    """(z, coupling logdet) of the affine coupling of y's halves, composed under autograd."""
    y1, y2 = y.split([split, y.shape[1] - split], dim=1)
    z2, logdet = affine_coupling_ref(y2, conditioner(y1))
    return torch.cat([y1, z2], dim=1), logdet


def affine_step(x, loc, logs, lu, log_s, sign, perm, split: int, conditioner: Callable, *, path: str,
                folded: tuple | None = None):
    """(z, logdet per row) of the whole step on `path` (a `PATHS` name, from `step_path`).

    Args:
        x: (B, d) batch.
        loc, logs: ActNorm's shift and log-scale, (d,).
        lu: (d, d) packed strict triangles of L (below) and U (above), as in `LULinear`.
        log_s, sign: (d,) U's diagonal is sign * exp(log_s).
        perm: (d,) int64 row order of W = P L U, W[i] = (L U)[perm[i]].
        split: the coupling's first-half width.
        conditioner: maps y1 (B, split) to h (B, 2 (d - split)).
        path: the implementation, one of `PATHS`.
        folded: `fold`'s result when the caller keeps it (inference); computed here otherwise.

    Example:
        >>> z, logdet = affine_step(x, loc, logs, lu, log_s, sign, perm, d // 2, net, path=step_path(x, d, [net], True))
    """
    d = lu.shape[0]
    require_matrix("affine_step input", x, d)
    for name, vector in (("loc", loc), ("logs", logs), ("log_s", log_s), ("sign", sign), ("perm", perm)):
        require_vector(f"affine_step {name}", vector, d)
    if not 0 < split < d:
        raise ValueError(f"affine_step split must be in 1..{d - 1}, got {split}")
    if path == "reference":
        return affine_step_ref(x, loc, logs, lu, log_s, sign, perm, split, conditioner)
    if path == "factored":
        z, logdet = _run_on_cpu(_Factored, split, x, (loc, logs, lu, log_s, sign, perm), conditioner)
        return z, logdet + (logs.sum() + log_s.sum()).to(logdet.dtype)
    if path not in PATHS:
        raise ValueError(f"unknown step path {path!r}; choose one of {', '.join(PATHS)}")
    weight, bias, constant = folded if folded is not None else fold(loc, logs, lu, log_s, sign, perm)
    z, logdet = folded_step(x, weight, bias, split, conditioner, path=path)
    return z, logdet + constant.to(logdet.dtype)


def folded_step(x, weight, bias, split: int, conditioner: Callable, *, path: str):
    """(z, coupling logdet) of the step from its linear part folded into one GEMM (`fold`),
    y = x @ weight.T + bias, on path "folded", "triton" or "reference"."""
    if path == "folded":
        return _run_on_cpu(_Folded, split, x, (weight, bias), conditioner)
    if path == "triton":
        return triton_ops().step.affine_step(x, weight, bias, split, conditioner)
    if path == "reference":
        return folded_step_ref(x, weight, bias, split, conditioner)
    raise ValueError(f"folded_step runs the paths 'folded', 'triton' and 'reference', not {path!r}")


def folded_step_ref(x, weight, bias, split: int, conditioner: Callable):
    """(z, coupling logdet) of the step from its folded weight, composed under autograd."""
    return _coupled(folded_linear_ref(x, weight, bias), split, conditioner)


class _Folded:
    """The CPU step's linear part with ActNorm folded into W: y = x @ weight.T + bias."""

    arity = 2

    @staticmethod
    def forward(x, weight, bias):
        return torch.addmm(bias, x, weight.T), ()

    @staticmethod
    def backward(dy, x, inputs, saved, needs):
        weight, _ = inputs
        return (dy @ weight if needs[0] else None, dy.T @ x if needs[1] else None,
                dy.sum(dim=0) if needs[2] else None)

    ref = staticmethod(folded_linear_ref)


class _Factored:
    """The CPU step's linear part applied factor by factor (`triangular.factored_forward`):
    y = ((x + loc) * exp(logs)) @ (P L U).T, U's diagonal sign * exp(log_s)."""

    arity = 6

    @staticmethod
    def forward(x, loc, logs, lu, log_s, sign, perm):
        diagonal = sign * torch.exp(log_s)
        y, saved = factored_forward(x, loc, logs, lu, diagonal, perm)
        return y, (diagonal, *saved)

    @staticmethod
    def backward(dy, x, inputs, saved, needs):
        lu, perm = inputs[2], inputs[5]
        diagonal, *saved = saved
        dx, d_loc, d_logs, d_lu, d_diagonal = factored_backward(dy, lu, perm, saved, needs[:5])  # needs[4]: log_s
        return dx, d_loc, d_logs, d_lu, d_diagonal * diagonal if needs[4] else None, None, None

    @staticmethod
    def ref(x, loc, logs, lu, log_s, sign, perm):
        return factored_linear_ref(x, loc, logs, lu, sign * torch.exp(log_s), perm)


def _run_on_cpu(linear, split: int, x, inputs: tuple, conditioner):
    """(z, coupling logdet) on the CPU step: `_AffineStep` when a gradient is wanted, else its forward."""
    layers = mlp_layers(conditioner)
    if layers is None:
        raise ValueError("the CPU step paths need a plain MLP conditioner (nn.Sequential of Linear and ReLU, "
                         "no hooks); use the 'reference' path for others (step_path chooses it)")
    if layers[-2].shape[0] != 2 * (x.shape[1] - split):
        raise ValueError(f"affine_step conditioner output must have {2 * (x.shape[1] - split)} columns, "
                         f"got {layers[-2].shape[0]}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *inputs, *layers)):
        return _AffineStep.apply(linear, split, x, *inputs, *layers)
    with torch.no_grad():
        y, _ = linear.forward(x, *inputs)
        z, logdet, _, _ = _coupling_forward(y, split, layers)
    return z, logdet


def _coupling_forward(y, split: int, layers):
    """The MLP on y's first half, then the affine coupling in place on its second half: y becomes
    z. Returns (z, coupling logdet, scale, the MLP's hidden activations)."""
    hidden, a = [], y[:, :split]
    for index in range(0, len(layers) - 2, 2):
        a = torch.addmm(layers[index + 1], a, layers[index].T).relu_()
        hidden.append(a)
    weight, bias = layers[-2], layers[-1]  # the last layer as two GEMMs: shift and logit come out contiguous
    shift = torch.addmm(bias[0::2], a, weight[0::2].T)
    logit = torch.addmm(bias[1::2], a, weight[1::2].T).add_(SCALE_OFFSET)
    _, logdet, scale = affine_coupling_forward(y[:, split:], shift, logit, inplace=True)
    return y, logdet, scale, hidden


def _coupling_backward(dz, dlogdet, z, scale, hidden, layers, split: int, needs):
    """(dy, the MLP layers' gradients) of `_coupling_forward`, by hand; `needs` flags the layers'."""
    dy = torch.empty_like(z)
    dshift, dlogit = affine_coupling_backward(dz[:, split:], dlogdet, z[:, split:], scale, dx2_out=dy[:, split:])
    grad = torch.stack([dshift, dlogit], dim=2).flatten(1)  # dh, interleaved as h
    inputs, depth = [z[:, :split], *hidden], len(layers) // 2
    layer_grads = [None] * len(layers)
    for index in reversed(range(depth)):
        if index + 1 < depth:
            grad = relu_backward(grad, inputs[index + 1])
        if needs[2 * index]:
            layer_grads[2 * index] = grad.T @ inputs[index]
        if needs[2 * index + 1]:
            layer_grads[2 * index + 1] = grad.sum(dim=0)
        if index:
            grad = grad @ layers[2 * index]
        else:  # dy1 = dz1 + the conditioner's input gradient, written into dy's first half
            torch.addmm(dz[:, :split], grad, layers[0], out=dy[:, :split])
    return dy, layer_grads


def _mlp(layers) -> Callable:
    """The MLP of `layers` as composed differentiable ops (for the twin under create_graph)."""
    def conditioner(a):
        for index in range(0, len(layers), 2):
            a = torch.nn.functional.linear(torch.relu(a) if index else a, layers[index], layers[index + 1])
        return a
    return conditioner


class _AffineStep(torch.autograd.Function):
    """The CPU step, either linear part, the MLP and the coupling in place, with a hand-written backward;
    under `create_graph=True` it differentiates the composed twin, so higher-order gradients are exact."""

    @staticmethod
    def forward(ctx, linear, split: int, x, *tensors):
        inputs, layers = tensors[:linear.arity], tensors[linear.arity:]
        y, saved = linear.forward(x, *inputs)
        z, logdet, scale, hidden = _coupling_forward(y, split, layers)
        ctx.linear, ctx.split, ctx.counts = linear, split, (len(inputs), len(layers), len(saved))
        ctx.save_for_backward(x, *inputs, *layers, *saved, z, scale, *hidden)
        return z, logdet

    @staticmethod
    def backward(ctx, dz, dlogdet):
        x, *rest = ctx.saved_tensors
        arity, depth, saved_count = ctx.counts
        inputs, layers = rest[:arity], rest[arity:arity + depth]
        saved, (z, scale, *hidden) = rest[arity + depth:arity + depth + saved_count], rest[arity + depth + saved_count:]
        needs, linear, split = ctx.needs_input_grad[2:], ctx.linear, ctx.split
        if torch.is_grad_enabled():  # create_graph=True: differentiate the composed twin
            twin = _coupled(linear.ref(x, *inputs), split, _mlp(layers))
            return (None, None, *composed_backward(twin, (x, *inputs, *layers), needs, (dz, dlogdet)))
        dy, layer_grads = _coupling_backward(dz, dlogdet, z, scale, hidden, layers, split, needs[1 + arity:])
        return (None, None, *linear.backward(dy, x, inputs, saved, needs[:1 + arity]), *layer_grads)
