"""One affine Glow step with its ActNorm folded into the 1x1 weight, fused:
y = x @ weight.T + bias, y1 = y[:, :split], h = conditioner(y1),
z = [y1, (y2 + h[:, 0::2]) * sigmoid(h[:, 1::2] + 2)], logdet = sum(log sigmoid(...)) per row.

`folded_affine_step(x, weight, bias, split, conditioner)` returns (z, coupling logdet); the
step's own ActNorm + 1x1 log-det (a constant) is the caller's. x: (B, d), any strides; z is
contiguous, in x's dtype. `folded_affine_step_ref` is the pure-PyTorch twin (plain autograd).

- Triton path, no gradient wanted (calibrating large embedding sets): the first GEMM writes y1
  straight into z, and the second GEMM computes y2 tile by tile and applies the coupling in its
  epilogue, so y2 never touches memory and no concatenation pass is needed. Row log-dets are
  summed from one partial per column block (fixed order, deterministic). When a gradient is
  wanted it composes the differentiable ops (`folded_linear`, `affine_coupling`).
- PyTorch path: y is computed once into z and the coupling is applied to its second half in
  place. When the conditioner is the coupling's MLP (`nn.Sequential` of `Linear` layers with
  `ReLU` between), its last layer runs as two GEMMs so that shift and raw come out
  contiguous, and in training `_TorchAffineStep` runs the whole step with a
  hand-written backward that writes d(shift) straight into dy (they are equal) and dy1 into
  dy's other half: autograd of the composed ops would add a concatenation, a split gradient
  and a stack per step, each a full pass over the batch. Other conditioners run the composed
  twin under autograd, and so does everything inside `torch.func` transforms or autocast.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module_globals
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from flowcore.backend import composed_autograd_only, composed_backward, resolve
from flowcore.kernels import _launch
from flowcore.kernels.coupling import _load_shift_raw, affine_coupling, affine_coupling_ref
from flowcore.kernels.invertible_linear import _interpreter_blocks, folded_linear, folded_linear_ref


def folded_affine_step_ref(x, weight, bias, split: int, conditioner: Callable):
    y = folded_linear_ref(x, weight, bias)
    y1, y2 = y.split([split, y.shape[1] - split], dim=1)
    z2, logdet = affine_coupling_ref(y2, conditioner(y1))
    return torch.cat([y1, z2], dim=1), logdet


def _torch_step(x, weight, bias, split: int, shift_and_raw: Callable):
    """(z, logdet, scale) without autograd: y is computed into z and the coupling applied in
    place on z's second half. `shift_and_raw(y1)` returns (h[:, 0::2], h[:, 1::2] + 2); the
    scale is exp(log sigmoid(raw)), computed in place on the log sigmoid's buffer."""
    z = torch.addmm(bias, x, weight.T)
    shift, raw = shift_and_raw(z[:, :split])
    log_scale = F.logsigmoid(raw)
    logdet = log_scale.sum(dim=1)
    scale = log_scale.exp_()
    z[:, split:].add_(shift).mul_(scale)
    return z, logdet, scale


def _split_output(conditioner: Callable, second: int) -> Callable:
    """Any conditioner as `shift_and_raw` for `_torch_step`."""
    def shift_and_raw(y1):
        h = conditioner(y1)
        _launch.require_matrix("folded_affine_step conditioner output", h, 2 * second)
        return h[:, 0::2], h[:, 1::2] + 2.0
    return shift_and_raw


def _mlp_layers(conditioner) -> list[torch.Tensor] | None:
    """[W1, b1, W2, b2, ...] when `conditioner` is a plain nn.Sequential of Linear (-> ReLU ->
    Linear)* with no hooks anywhere (the fused step reads the weights instead of calling the
    modules), else None."""
    if type(conditioner) is not nn.Sequential or len(conditioner) % 2 == 0 or _any_hooks(conditioner):
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


def _any_hooks(module: nn.Module) -> bool:
    """Forward (pre-)hooks on `module`, its children, or registered globally for all modules."""
    if getattr(_module_globals, "_global_forward_hooks", None) or getattr(_module_globals, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


class _MLP:
    """The coupling's MLP as `shift_and_raw`: its last layer runs as two GEMMs over its even
    (shift) and odd (raw, with the + 2 in the bias) weight rows, so that shift and raw come out
    as contiguous matrices; the inputs of each layer are kept in `inputs` for the backward."""

    def __init__(self, layers, second: int):
        self.weights, self.biases = layers[0::2], layers[1::2]
        if self.weights[-1].shape[0] != 2 * second:
            raise ValueError(f"folded_affine_step conditioner output must have {2 * second} columns, "
                             f"got {self.weights[-1].shape[0]}")
        self.inputs: list[torch.Tensor] = []

    def __call__(self, y1):
        a = y1
        for weight, bias in zip(self.weights[:-1], self.biases[:-1]):
            self.inputs.append(a)
            a = torch.addmm(bias, a, weight.T).relu_()
        self.inputs.append(a)
        weight, bias = self.weights[-1], self.biases[-1]
        return torch.addmm(bias[0::2], a, weight[0::2].T), torch.addmm(bias[1::2] + 2.0, a, weight[1::2].T)


class _TorchAffineStep(torch.autograd.Function):
    """The step on PyTorch ops with a hand-written backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, split: int, *layers):
        mlp = _MLP(layers, weight.shape[0] - split)
        z, logdet, scale = _torch_step(x, weight, bias, split, mlp)
        ctx.split = split
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
        dy = z.new_empty((rows, d))
        dz2 = dz[:, split:]
        dshift = torch.mul(dz2, scale, out=dy[:, split:])  # dy2 and d(shift) are equal
        # d/draw of (y2 + shift) * scale and of log scale: (1 - scale) * (dz2 * z2 + dlogdet)
        draw = torch.addcmul(dlogdet[:, None], dz2, z[:, split:])
        draw.addcmul_(draw, scale, value=-1.0)
        # the gradient of each layer's output as (part, rows of the layer's weight) pairs: the last
        # layer's is dh = interleaved (dshift, draw), kept apart so that dshift is never copied
        parts = [(dshift, slice(0, None, 2)), (draw, slice(1, None, 2))]
        dshift_sum = dshift.sum(dim=0)  # the shift bias's gradient and half of the step bias's
        layer_grads = [None] * (2 * depth)
        for index in reversed(range(depth)):
            layer_weight, layer_input = mlp_weights[index], inputs[index]
            if ctx.needs_input_grad[4 + 2 * index]:
                layer_grads[2 * index] = dweight = torch.empty_like(layer_weight)
                for part, weight_rows in parts:
                    dweight[weight_rows] = part.T @ layer_input
            if ctx.needs_input_grad[5 + 2 * index]:
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
                parts = [(torch.ops.aten.threshold_backward(grad, layer_input, 0), slice(None))]
        dx = dy @ weight if ctx.needs_input_grad[0] else None
        dweight = dy.T @ x if ctx.needs_input_grad[1] else None
        dbias = torch.cat([dy[:, :split].sum(dim=0), dshift_sum]) if ctx.needs_input_grad[2] else None
        return dx, dweight, dbias, None, *layer_grads


def _composed_backward(ctx, grads, x, weight, bias, split: int, layers):
    """The step's input gradients through autograd of `folded_affine_step_ref` (with a graph)."""
    def conditioner(a):
        for index in range(0, len(layers), 2):
            a = F.linear(torch.relu(a) if index else a, layers[index], layers[index + 1])
        return a

    outputs = folded_affine_step_ref(x, weight, bias, split, conditioner)
    result = composed_backward(outputs, (x, weight, bias, *layers),
                               ctx.needs_input_grad[:3] + ctx.needs_input_grad[4:], grads)
    return (*result[:3], None, *result[3:])


@triton.jit
def _folded_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, h_ptr, z_ptr, part_logdet_ptr,
    B, N, K, stride_xb, stride_xk, stride_wn, stride_wk, stride_bias, stride_hb, stride_hd, stride_zb,
    COUPLING: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """z[rows, ns] = x[rows] @ W[ns].T + bias[ns]; with COUPLING, the affine coupling with
    h[rows, 2 ns], h[rows, 2 ns + 1] is applied before the store and this column block's
    log-det partial of each row is written to part_logdet[column block, rows]."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = x_ptr.dtype.element_ty
    col_blocks = tl.cdiv(N, BLOCK_N)
    col_block = tl.program_id(0) % col_blocks
    rows = (tl.program_id(0) // col_blocks) * BLOCK_B + tl.arange(0, BLOCK_B)
    ns = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=compute)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < B) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + ns[None, :] * stride_wn + ks[:, None] * stride_wk,
                    mask=(ns[None, :] < N) & (ks[:, None] < K), other=0.0)
        acc = tl.dot(x.to(operand), w.to(operand), acc, input_precision="tf32" if TF32 else "ieee",
                     out_dtype=compute)
    acc += tl.load(bias_ptr + ns * stride_bias, mask=ns < N, other=0.0).to(compute)[None, :]
    mask = (rows[:, None] < B) & (ns[None, :] < N)
    if COUPLING:
        shift, raw = _load_shift_raw(h_ptr, rows, col_block * BLOCK_N, B, N, stride_hb, stride_hd,
                                     compute, BLOCK_B, BLOCK_N)
        acc = (acc + shift) / (1.0 + tl.exp(-raw))
        log_sigmoid = tl.minimum(raw, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(raw)))
        partial = tl.sum(tl.where(mask, log_sigmoid, 0.0), axis=1)
        tl.store(part_logdet_ptr + col_block * B + rows, partial, mask=rows < B)
    tl.store(z_ptr + rows[:, None] * stride_zb + ns[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)


def _blocks(dtype: torch.dtype, B: int, D: int) -> tuple[int, int, int, dict]:
    if _launch.INTERPRETED:
        return _interpreter_blocks(B, D)
    if dtype == torch.float64:
        return 64, 64, 32, {"num_warps": 4, "num_stages": 2}
    return 128, 64, 32 if dtype == torch.float32 else 64, {"num_warps": 8, "num_stages": 3}


def _launch_gemm(x, weight, bias, h, z, part_logdet, coupling: bool) -> None:
    B, K = x.shape
    N = weight.shape[0]
    block_b, block_n, block_k, options = _blocks(x.dtype, B, max(N, K))
    grid = (triton.cdiv(B, block_b) * triton.cdiv(N, block_n),)
    wrap_triton(_folded_gemm_kernel)[grid](
        x, weight, bias, h, z, part_logdet,
        B, N, K, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), bias.stride(0),
        h.stride(0), h.stride(1), z.stride(0),
        COUPLING=coupling, FP64=_launch.is_fp64(x), TF32=_launch.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )


@triton_op("flowcore::folded_gemm_into", mutates_args=("z",))
def _first_half(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: torch.Tensor) -> None:
    """z[:, :n] = x @ weight.T + bias, n = weight.shape[0] (z's other columns untouched)."""
    _launch.record_launch("folded_step_first_half")
    # No coupling here: bias stands in for the h and log-det pointers, which are never read.
    _launch_gemm(x, weight, bias, bias[None, :], z, bias, coupling=False)


@triton_op("flowcore::folded_gemm_coupling_into", mutates_args=("z",))
def _second_half(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor,
                 z: torch.Tensor) -> torch.Tensor:
    """z[:, split:] = affine coupling of x @ weight.T + bias with h; returns the row log-dets."""
    B, N = x.shape[0], weight.shape[0]
    block_n = _blocks(x.dtype, B, max(N, x.shape[1]))[1]
    partial_dtype = torch.float64 if _launch.is_fp64(x) else torch.float32
    part_logdet = torch.empty((triton.cdiv(N, block_n), B), dtype=partial_dtype, device=x.device)
    _launch.record_launch("folded_step_coupling")
    _launch_gemm(x, weight, bias, h, z, part_logdet, coupling=True)
    return part_logdet.sum(dim=0).to(x.dtype)


def folded_affine_step(x, weight, bias, split: int, conditioner: Callable):
    """(z, coupling logdet) of one folded affine step; see the module docstring."""
    _launch.require_matrix("folded_affine_step input", x)
    _launch.require_matrix("folded_affine_step weight", weight, x.shape[1])
    _launch.require_vector("folded_affine_step bias", bias, weight.shape[0])
    if not 0 < split < weight.shape[0]:
        raise ValueError(f"folded_affine_step split must be in 1..{weight.shape[0] - 1}, got {split}")
    if resolve(x) != "triton":
        return _torch_affine_step(x, weight, bias, split, conditioner)
    _launch.require_launchable(x, "folded_affine_step")
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias))
    if wants_grad:
        y = folded_linear(x, weight, bias)
        y1 = y[:, :split]
        z2, logdet = affine_coupling(y[:, split:], conditioner(y1))
        return torch.cat([y1, z2], dim=1), logdet
    z = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _first_half(x, weight[:split], bias[:split], z)
    h = conditioner(z[:, :split])
    _launch.require_matrix("folded_affine_step conditioner output", h, 2 * (weight.shape[0] - split))
    if h.requires_grad:  # a trainable conditioner under grad mode: keep h's gradient path
        z2, logdet = affine_coupling(folded_linear(x, weight[split:], bias[split:]), h)
        return torch.cat([z[:, :split], z2], dim=1), logdet
    logdet = _second_half(x, weight[split:], bias[split:], h, z[:, split:])
    return z, logdet


def _torch_affine_step(x, weight, bias, split: int, conditioner: Callable):
    if composed_autograd_only(x):
        return folded_affine_step_ref(x, weight, bias, split, conditioner)
    layers = _mlp_layers(conditioner)
    if layers is None:
        if torch.is_grad_enabled():
            return folded_affine_step_ref(x, weight, bias, split, conditioner)
        return _torch_step(x, weight, bias, split, _split_output(conditioner, weight.shape[0] - split))[:2]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias, *layers)):
        return _TorchAffineStep.apply(x, weight, bias, split, *layers)
    with torch.no_grad():
        return _torch_step(x, weight, bias, split, _MLP(layers, weight.shape[0] - split))[:2]
