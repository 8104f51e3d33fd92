"""The flow ops, each beside its pure-PyTorch `_ref` twin; imported as `flowcore.kernels`.

The bottom layer of flowcore: it imports torch, Triton (optional) and itself, nothing else of
flowcore. Files:

- `dispatch.py`: which backend runs an op (`use_backend`, `FLOWCORE_BACKEND`, `resolve`);
- `compat.py`: every probe of torch internals the ops rely on;
- `actnorm.py`, `coupling.py`, `folded_linear.py`: the ops' math, `_ref` twins and dispatchers;
  `coupling.py` owns `SCALE_OFFSET` and the coupling's PyTorch forward and gradient;
- `triangular.py`: the LU ops (`lu_product`, the factored linear map);
- `squared_norm.py`: row sums of squares with a one-pass backward;
- `step.py`: the default Glow step in one call, its path table (`PATHS`, `step_path`), its
  reference `affine_step_ref` and the one CPU autograd Function;
- `triton/`: the Triton kernels, launchers and Functions of the ops and of the fused step,
  imported only when a Triton op first runs.

Row log-dets and squared norms are float32 whatever the activations' dtype (float64 for
float64): `accumulation_dtype(tensor)`.
"""
from ._utils import accumulation_dtype
from .actnorm import actnorm, actnorm_inverse, actnorm_inverse_ref, actnorm_ref
from .coupling import (
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
from .dispatch import HAS_TRITON
from .folded_linear import folded_linear, folded_linear_ref
from .squared_norm import squared_norm, squared_norm_ref
from .step import PATHS, affine_step, affine_step_ref, fold, step_path
from .triangular import lu_factors, lu_product, lu_product_ref

__all__ = [
    "HAS_TRITON",
    "PATHS",
    "SCALE_OFFSET",
    "accumulation_dtype",
    "actnorm",
    "actnorm_inverse",
    "actnorm_inverse_ref",
    "actnorm_ref",
    "additive_coupling",
    "additive_coupling_inverse",
    "additive_coupling_inverse_ref",
    "additive_coupling_ref",
    "affine_coupling",
    "affine_coupling_inverse",
    "affine_coupling_inverse_ref",
    "affine_coupling_ref",
    "affine_step",
    "affine_step_ref",
    "fold",
    "folded_linear",
    "folded_linear_ref",
    "lu_factors",
    "lu_product",
    "lu_product_ref",
    "squared_norm",
    "squared_norm_ref",
    "step_path",
]
