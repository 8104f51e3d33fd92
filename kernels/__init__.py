"""Fused Triton kernels for the flow ops, each beside its pure-PyTorch `_ref` twin.

Imported as `flowcore.kernels` (never as a top-level `kernels`). One file per op (actnorm,
invertible_linear, coupling, and flow_step for the fused step: Triton inference, and a
PyTorch training path with a hand-written backward), each holding its `@triton.jit` kernels,
host launchers registered with `torch.library.triton_op` (so torch.compile traces them), the
`torch.autograd.Function` and the pure-PyTorch `_ref` twin. Every dispatcher asks
`flowcore.backend.resolve` which to run.

`launch_counts` maps each op name to the number of Triton launches its host launcher made
(eager calls), so callers can prove the Triton backend really ran.
"""
from flowcore.kernels._launch import launch_counts
from flowcore.kernels.actnorm import actnorm, actnorm_inverse, actnorm_inverse_ref, actnorm_ref
from flowcore.kernels.coupling import (
    additive_coupling,
    additive_coupling_inverse,
    additive_coupling_inverse_ref,
    additive_coupling_ref,
    affine_coupling,
    affine_coupling_inverse,
    affine_coupling_inverse_ref,
    affine_coupling_ref,
)
from flowcore.kernels.flow_step import folded_affine_step, folded_affine_step_ref
from flowcore.kernels.invertible_linear import (
    actnorm_linear,
    actnorm_linear_ref,
    folded_linear,
    folded_linear_ref,
    lu_inverse,
    lu_inverse_ref,
)
