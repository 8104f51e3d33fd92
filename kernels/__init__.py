"""The flow ops, each beside its pure-PyTorch `_ref` twin; imported as `flowcore.kernels`.

The bottom layer of flowcore: it imports torch, Triton (optional) and nothing else of flowcore.
Row log-dets and squared norms are float32 whatever the activations' dtype (float64 for float64).
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
