"""The PyTorch backend's folded affine step (`flowcore.kernels.flow_step` for the math):
`torch_affine_step(x, weight, bias, split, conditioner, reference)`, the hand-written `_TorchAffineStep`
autograd Function and its no-autograd forward `_torch_step`.

y is computed once into z and the coupling is applied to its second half in place. When the
conditioner is the coupling's MLP (`nn.Sequential` of `Linear` layers with `ReLU` between, no
hooks), its last layer runs as two GEMMs so that shift and logit come out contiguous, and in
training `_TorchAffineStep` runs the whole step with a hand-written backward that writes
d(shift) straight into dy (they are equal) and dy1 into dy's other half: autograd of the
composed ops would add a concatenation, a split gradient and a stack per step, each a full pass
over the batch. Other conditioners run the composed twin `folded_affine_step_ref` under
autograd, and so does everything inside `torch.func` transforms or autocast; under
`create_graph=True` the backward differentiates the composed twin.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from flowcore._torch_compat import composed_autograd_only, composed_backward, has_forward_hooks, relu_backward
from flowcore.kernels import _utils
from flowcore.kernels.coupling import SCALE_OFFSET, row_log_sigmoid_sum


def torch_affine_step(x, weight, bias, split: int, conditioner: Callable, reference: Callable):
    """(z, coupling logdet) of the folded affine step on PyTorch ops (arguments already checked);
    `reference` is the op's composed twin (`flow_step.folded_affine_step_ref`), run where the
    hand-written backward must give way to autograd."""
    if composed_autograd_only(x):
        return reference(x, weight, bias, split, conditioner)
    layers = mlp_layers(conditioner)
    if layers is None:
        if torch.is_grad_enabled():
            return reference(x, weight, bias, split, conditioner)
        return _torch_step(x, weight, bias, split, _split_output(conditioner, weight.shape[0] - split))[:2]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias, *layers)):
        return _TorchAffineStep.apply(x, weight, bias, split, reference, *layers)
    with torch.no_grad():
        return _torch_step(x, weight, bias, split, _MLP(layers, weight.shape[0] - split))[:2]


def _torch_step(x, weight, bias, split: int, shift_and_logit: Callable):
    """(z, logdet, scale) without autograd: y is computed into z and the coupling applied in
    place on z's second half. `shift_and_logit(y1)` returns (h[:, 0::2], h[:, 1::2] + SCALE_OFFSET).
    The scale is sigmoid(logit) and the log-det the row sums of its log: two passes where log sigmoid
    then exp took two slower ones (log sigmoid is the slowest op of the step after the GEMMs); a scale
    that underflows to 0 (logit below about -88 in float32) falls back to log sigmoid, and so do
    16-bit activations, whose log-det is float32 from the logit."""
    z = torch.addmm(bias, x, weight.T)
    shift, logit = shift_and_logit(z[:, :split])
    scale = torch.sigmoid(logit)
    if scale.dtype in (torch.float16, torch.bfloat16):  # a 16-bit scale's log is too coarse
        logdet = row_log_sigmoid_sum(logit)
    else:
        logdet = torch.log(scale).sum(dim=1)
        if not bool(torch.isfinite(logdet).all()):
            logdet = row_log_sigmoid_sum(logit)
    z[:, split:].add_(shift).mul_(scale)
    return z, logdet, scale


def _split_output(conditioner: Callable, d2: int) -> Callable:
    """Any conditioner as `shift_and_logit` for `_torch_step`."""
    def shift_and_logit(y1):
        h = conditioner(y1)
        _utils.require_matrix("folded_affine_step conditioner output", h, 2 * d2)
        return h[:, 0::2], h[:, 1::2] + SCALE_OFFSET
    return shift_and_logit


def mlp_layers(conditioner) -> list[torch.Tensor] | None:
    """[W1, b1, W2, b2, ...] when `conditioner` is a plain nn.Sequential of Linear (-> ReLU ->
    Linear)* with no hooks anywhere (the fused step reads the weights instead of calling the
    modules), else None."""
    if type(conditioner) is not nn.Sequential or len(conditioner) % 2 == 0 or has_forward_hooks(conditioner):
        return None
    layers = []
    for index, module in enumerate(conditioner):
        if index % 2:
            if type(module) is not nn.ReLU:
                return None
        elif type(module) is not nn.Linear or module.bias is None:
            return None
        else:
            layers += [module.weight, module.bias]
    return layers


class _MLP:
    """The coupling's MLP as `shift_and_logit`: its last layer runs as two GEMMs over its even
    (shift) and odd (logit, with `SCALE_OFFSET` in the bias) weight rows, so that shift and logit
    come out as contiguous matrices; the inputs of each layer are kept in `inputs` for the
    backward."""

    def __init__(self, layers, d2: int):
        self.weights, self.biases = layers[0::2], layers[1::2]
        if self.weights[-1].shape[0] != 2 * d2:
            raise ValueError(f"folded_affine_step conditioner output must have {2 * d2} columns, "
                             f"got {self.weights[-1].shape[0]}")
        self.inputs: list[torch.Tensor] = []

    def __call__(self, y1):
        a = y1
        for weight, bias in zip(self.weights[:-1], self.biases[:-1]):
            self.inputs.append(a)
            a = torch.addmm(bias, a, weight.T).relu_()
        self.inputs.append(a)
        weight, bias = self.weights[-1], self.biases[-1]
        return torch.addmm(bias[0::2], a, weight[0::2].T), torch.addmm(bias[1::2] + SCALE_OFFSET, a, weight[1::2].T)


class _TorchAffineStep(torch.autograd.Function):
    """The step on PyTorch ops with a hand-written backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, split: int, reference: Callable, *layers):
        mlp = _MLP(layers, weight.shape[0] - split)
        z, logdet, scale = _torch_step(x, weight, bias, split, mlp)
        ctx.split, ctx.reference = split, reference
        ctx.save_for_backward(x, weight, bias, z, scale, *mlp.inputs[1:], *layers)
        return z, logdet

    @staticmethod
    def backward(ctx, dz, dlogdet):
        x, weight, bias, z, scale, *rest = ctx.saved_tensors
        (rows, d), split = z.shape, ctx.split
        depth = (len(rest) + 1) // 3
        hidden, layers = rest[: depth - 1], rest[depth - 1:]
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the composed twin, so higher-order gradients are exact
            return _composed_backward(ctx, (dz, dlogdet), x, weight, bias, split, layers)
        inputs, mlp_weights = [z[:, :split], *hidden], layers[0::2]
        dlogdet = dlogdet.to(z.dtype)  # the log-det is float32 for 16-bit activations
        dy = z.new_empty((rows, d))
        dz2 = dz[:, split:]
        dshift = torch.mul(dz2, scale, out=dy[:, split:])  # dy2 and d(shift) are equal
        # d/dlogit of (y2 + shift) * scale and of log scale: (1 - scale) * (dz2 * z2 + dlogdet)
        dlogit = torch.addcmul(dlogdet[:, None], dz2, z[:, split:])
        dlogit.addcmul_(dlogit, scale, value=-1.0)
        # the gradient of each layer's output as (part, rows of the layer's weight) pairs: the last
        # layer's is dh = interleaved (dshift, dlogit), kept apart so that dshift is never copied
        parts = [(dshift, slice(0, None, 2)), (dlogit, slice(1, None, 2))]
        dshift_sum = dshift.sum(dim=0)  # the shift bias's gradient and half of the step bias's
        layer_grads = [None] * (2 * depth)
        for index in reversed(range(depth)):
            layer_weight, layer_input = mlp_weights[index], inputs[index]
            if ctx.needs_input_grad[5 + 2 * index]:
                layer_grads[2 * index] = dweight = torch.empty_like(layer_weight)
                for part, weight_rows in parts:
                    dweight[weight_rows] = part.T @ layer_input
            if ctx.needs_input_grad[6 + 2 * index]:
                layer_grads[2 * index + 1] = dbias = layer_weight.new_empty(layer_weight.shape[0])
                for part, weight_rows in parts:
                    dbias[weight_rows] = dshift_sum if part is dshift else part.sum(dim=0)
            (part, weight_rows), *more = parts
            if index:
                grad = part @ layer_weight[weight_rows]
            else:  # dy1 = dz1 + the conditioner's input gradient, written into dy's first half
                grad = torch.addmm(dz[:, :split], part, layer_weight[weight_rows], out=dy[:, :split])
            for part, weight_rows in more:
                grad.addmm_(part, layer_weight[weight_rows])
            if index:
                parts = [(relu_backward(grad, layer_input), slice(None))]
        dx = dy @ weight if ctx.needs_input_grad[0] else None
        dweight = dy.T @ x if ctx.needs_input_grad[1] else None
        dbias = torch.cat([dy[:, :split].sum(dim=0), dshift_sum]) if ctx.needs_input_grad[2] else None
        return dx, dweight, dbias, None, None, *layer_grads


def _composed_backward(ctx, grads, x, weight, bias, split: int, layers):
    """The step's input gradients through autograd of `folded_affine_step_ref` (with a graph)."""
    def conditioner(a):
        for index in range(0, len(layers), 2):
            a = F.linear(torch.relu(a) if index else a, layers[index], layers[index + 1])
        return a

    outputs = ctx.reference(x, weight, bias, split, conditioner)
    result = composed_backward(outputs, (x, weight, bias, *layers),
                               ctx.needs_input_grad[:3] + ctx.needs_input_grad[5:], grads)
    return (*result[:3], None, None, *result[3:])
