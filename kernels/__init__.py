"""The flow ops, each in one file beside its pure-PyTorch `_ref` twin (Liger-Kernel style).

Imported as `flowcore.kernels` (never as a top-level `kernels`). Files:

- `actnorm.py`: ActNorm forward/inverse (Triton kernels, launchers, Function, `_ref`, dispatchers);
- `coupling.py`: affine and additive coupling; owns `SCALE_OFFSET`;
- `factored_step.py`: the affine step of small-batch training in one autograd node, factor by
  factor (`factored_affine_step`, `factored_affine_step_ref`);
- `folded_linear.py`: the folded ActNorm + 1x1 GEMM z = x @ W.T + b and its backward GEMMs;
- `flow_step.py`: the fused Triton step (folded GEMM with the coupling in its epilogue),
  `folded_affine_step_ref` and the `folded_affine_step` dispatcher;
- `torch_step.py`: the same step on PyTorch ops, with a hand-written training backward;
- `triangular.py`: the LU ops of `LULinear`: the blocked L @ U product (`lu_product`, `lu_factors`)
  and the factor-by-factor ActNorm + LU linear of small-batch training (`factored_linear`);
- `squared_norm.py`: row sums of squares with a one-pass backward;
- `_utils.py`: helpers shared by the files above (launch counter, checks, tile tables,
  `@triton.jit` helpers).

Triton launchers are registered with `torch.library.triton_op` (so torch.compile traces them);
every Triton dispatcher asks `flowcore.backend.resolve` which implementation to run.
`triangular`, `factored_step` and `squared_norm` are PyTorch-only ops with hand-written backwards.

Row log-dets and squared norms are float32 whatever the activations' dtype (float64 for
float64): `accumulation_dtype(tensor)`.

`launch_counts` maps each op name to the number of Triton launches its host launcher made
(eager calls), so callers can prove the Triton backend really ran.
"""
from flowcore.kernels._utils import accumulation_dtype, launch_counts
from flowcore.kernels.actnorm import actnorm, actnorm_inverse, actnorm_inverse_ref, actnorm_ref
from flowcore.kernels.coupling import (
    SCALE_OFFSET,
    additive_coupling,
    additive_coupling_inverse,
    additive_coupling_inverse_ref,
    additive_coupling_ref,
    affine_coupling,
    affine_coupling_inverse,
    affine_coupling_inverse_ref,
    affine_coupling_ref,
)
from flowcore.kernels.factored_step import factored_affine_step, factored_affine_step_ref
from flowcore.kernels.flow_step import folded_affine_step, folded_affine_step_ref
from flowcore.kernels.folded_linear import folded_linear, folded_linear_ref
from flowcore.kernels.squared_norm import squared_norm, squared_norm_ref
from flowcore.kernels.triangular import factored_linear, factored_linear_ref, lu_factors, lu_product, lu_product_ref

__all__ = [
    "SCALE_OFFSET",
    "actnorm",
    "actnorm_inverse",
    "actnorm_inverse_ref",
    "actnorm_ref",
    "accumulation_dtype",
    "additive_coupling",
    "additive_coupling_inverse",
    "additive_coupling_inverse_ref",
    "additive_coupling_ref",
    "affine_coupling",
    "affine_coupling_inverse",
    "affine_coupling_inverse_ref",
    "affine_coupling_ref",
    "factored_affine_step",
    "factored_affine_step_ref",
    "factored_linear",
    "factored_linear_ref",
    "folded_affine_step",
    "folded_affine_step_ref",
    "folded_linear",
    "folded_linear_ref",
    "launch_counts",
    "lu_factors",
    "lu_product",
    "lu_product_ref",
    "squared_norm",
    "squared_norm_ref",
]
