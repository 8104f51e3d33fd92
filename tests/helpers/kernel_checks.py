"""Shared checks for the Triton kernel tests: run a Triton op (an op of `Plan("triton")`) and compare
its outputs and every gradient with its `_ref` twin (same dtype) and with a float64 reference."""
from __future__ import annotations

import torch

from helpers.launches import triton_launches

# Max |error| allowed, relative to the largest |value| of the float64 reference.
TOLERANCE = {torch.float64: 1e-11, torch.float32: 5e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def coupling_mlp(split: int, out: int, dtype, depth: int = 3, width: int = 16, generator=None) -> torch.nn.Sequential:
    """A coupling conditioner (Linear -> ReLU -> ... -> Linear, `depth` layers) with weights and
    biases drawn from N(0, 0.4^2) in float64 (by `generator`, else torch's global one) and then
    cast to `dtype`, so every dtype gets the same values."""
    sizes = [split] + [width] * (depth - 1) + [out]
    modules = []
    for index in range(depth):
        modules.append(torch.nn.Linear(sizes[index], sizes[index + 1]))
        if index + 1 < depth:
            modules.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*modules).double()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.4, generator=generator)
    return net.to(dtype)


def as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


TF32_TOLERANCE = 2e-3
"""float32 GEMMs under TF32 (10-bit mantissas, K = 768-1024): errors of 3-10e-4 of max|ref|."""


def assert_close_scaled(actual, same_dtype, float64, what: str, relative: float | None = None) -> None:
    """`actual` is within the dtype's tolerance (or `relative`) of max|float64| of both the
    same-dtype and the float64 reference."""
    tolerance = (relative or TOLERANCE[actual.dtype]) * max(float64.abs().max().item(), 1e-30)
    for name, expected in (("_ref", same_dtype), ("float64 reference", float64)):
        error = (actual.double() - expected.double()).abs().max().item()
        assert error <= tolerance, f"{what}: max |triton - {name}| = {error:.3e} > {tolerance:.3e}"


def assert_as_accurate_as_ref(actual, same_dtype, float64, what: str, factor: float = 2.0) -> None:
    """In 16-bit, where every summation order rounds differently: `actual` is at most `factor`
    times as far from float64 as the `_ref` twin in the same dtype is (or within the dtype's
    tolerance)."""
    scale = max(float64.abs().max().item(), 1e-30)
    ref_error = (same_dtype.double() - float64.double()).abs().max().item()
    error = (actual.double() - float64.double()).abs().max().item()
    allowed = max(factor * ref_error, TOLERANCE[actual.dtype] * scale)
    assert error <= allowed, f"{what}: max |triton - float64| = {error:.3e} > {allowed:.3e} (_ref: {ref_error:.3e})"


def check_op(op, ref, inputs: tuple, what: str, grad_seed: int = 1, backward_kernels: bool = True,
             relative: float | None = None) -> None:
    """Outputs and gradients w.r.t. every floating input of `op` (a Triton op) equal those of `ref`
    in the same dtype and of `ref` in float64. `backward_kernels`: the backward
    launches Triton kernels too (the additive coupling's gradient is the identity). `relative`:
    a tolerance other than the dtype's (TF32)."""
    leaves = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs)
    leaves64 = tuple(t.detach().double().requires_grad_(t.is_floating_point()) for t in inputs)
    leaves_ref = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs)
    with triton_launches() as launched:
        outputs = as_tuple(op(*leaves))
    assert launched, f"{what}: no Triton kernel was launched"
    expected = as_tuple(ref(*leaves_ref))
    expected64 = as_tuple(ref(*leaves64))
    generator = torch.Generator().manual_seed(grad_seed)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=torch.float64) for o in expected64]
    for index, (out, exp, exp64) in enumerate(zip(outputs, expected, expected64)):
        assert out.dtype == exp.dtype and out.shape == exp.shape, f"{what}: output {index} dtype/shape"
        assert_close_scaled(out, exp, exp64, f"{what} output {index}", relative)

    def grads(outs, leaves_):
        wrt = [t for t in leaves_ if t.requires_grad]
        return torch.autograd.grad(outs, wrt, [c.to(device=o.device, dtype=o.dtype) for c, o in zip(cotangents, outs)])

    with triton_launches() as launched:
        actual_grads = grads(outputs, leaves)
    if backward_kernels:
        assert launched, f"{what}: the backward launched no Triton kernel"
    reference_grads = zip(actual_grads, grads(expected, leaves_ref), grads(expected64, leaves64))
    for index, (g, g_ref, g64) in enumerate(reference_grads):
        assert g.dtype == g_ref.dtype and g.shape == g_ref.shape, f"{what}: gradient {index} dtype/shape"
        assert_close_scaled(g, g_ref, g64, f"{what} gradient {index}", relative)
