"""The default step (LU 1x1, affine coupling) on the CPU: one autograd Function with a hand-written backward
(the paper's batch-32 fit is bound by op calls, not flops). Its linear part is ActNorm folded into W (one GEMM
+ bias) or the LU factors applied to the batch one by one; the MLP and the coupling run in place. Under
`create_graph=True` it differentiates the composed twin.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from . import reference
from .compat import composed_backward, has_forward_hooks, relu_backward
from .triangular import factored_backward, factored_forward, factored_linear_ref


def mlp_layers(conditioner) -> list[torch.Tensor] | None:
    """[W1, b1, W2, b2, ...] when `conditioner` is a plain, hook-free nn.Sequential of Linear (-> ReLU -> Linear)*,
    else None. Called at every step: Linear and ReLU have no children, so their hooks are read directly."""
    if (type(conditioner) is not nn.Sequential or len(conditioner) % 2 == 0
            or has_forward_hooks(conditioner, recurse=False)):
        return None
    layers = []
    for index, module in enumerate(conditioner):
        linear = index % 2 == 0
        if (module._forward_hooks or module._forward_pre_hooks or type(module) is not (nn.Linear if linear else nn.ReLU)
                or linear and module.bias is None):
            return None
        if linear:
            layers += [module.weight, module.bias]
    return layers


class Folded:
    """The linear part with ActNorm folded into W: y = x @ weight.T + bias."""

    arity = 2

    @staticmethod
    def forward(x, weight, bias):
        return reference.folded_linear_ref(x, weight, bias), ()

    @staticmethod
    def backward(dy, x, inputs, saved, needs):
        return reference.folded_linear_backward(dy, x, inputs[0], needs)

    ref = staticmethod(reference.folded_linear_ref)


class Factored:
    """The linear part factor by factor (`triangular.factored_forward`): y = ((x + loc) * exp(logs)) @ (P L U).T."""

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


def cpu_step(linear, split: int, x, inputs: tuple, conditioner):
    """(z, coupling logdet) of the step with `linear` (`Folded` or `Factored`) of `inputs`."""
    layers = mlp_layers(conditioner)
    if layers is None:
        raise ValueError("the CPU step paths need a plain MLP conditioner (nn.Sequential of Linear and ReLU, "
                         "no hooks); use the 'reference' path for others (`plan` chooses it)")
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
    """(z, coupling logdet, scale, the MLP's hidden activations); the coupling runs in place: y becomes z."""
    hidden, a = [], y[:, :split]
    for index in range(0, len(layers) - 2, 2):
        a = torch.addmm(layers[index + 1], a, layers[index].T).relu_()
        hidden.append(a)
    weight, bias = layers[-2], layers[-1]  # the last layer as two GEMMs: shift and logit come out contiguous
    shift = torch.addmm(bias[0::2], a, weight[0::2].T)
    logit = torch.addmm(bias[1::2], a, weight[1::2].T).add_(reference.SCALE_OFFSET)
    _, logdet, scale = reference.affine_coupling_forward(y[:, split:], shift, logit, inplace=True)
    return y, logdet, scale, hidden


def _coupling_backward(dz, dlogdet, z, scale, hidden, layers, split: int, needs):
    """(dy, the MLP layers' gradients) of `_coupling_forward`, by hand; `needs` flags the layers'."""
    dy = torch.empty_like(z)
    dshift, dlogit = reference.affine_coupling_backward(dz[:, split:], dlogdet, z[:, split:], scale,
                                                        dx2_out=dy[:, split:])
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
    """The MLP of `layers` as composed differentiable ops."""
    def conditioner(a):
        for index in range(0, len(layers), 2):
            a = torch.nn.functional.linear(torch.relu(a) if index else a, layers[index], layers[index + 1])
        return a
    return conditioner


class _AffineStep(torch.autograd.Function):
    """The CPU step (either linear part, the MLP, the coupling in place) with a hand-written backward."""

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
            twin = reference.coupled_ref(linear.ref(x, *inputs), split, _mlp(layers))
            return (None, None, *composed_backward(twin, (x, *inputs, *layers), needs, (dz, dlogdet)))
        dy, layer_grads = _coupling_backward(dz, dlogdet, z, scale, hidden, layers, split, needs[1 + arity:])
        return (None, None, *linear.backward(dy, x, inputs, saved, needs[:1 + arity]), *layer_grads)
