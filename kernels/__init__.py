"""The flow's execution plan and its ops, each beside its pure-PyTorch twin; imported as `flowcore.kernels`, the
bottom layer of flowcore (it imports torch and, optionally, Triton). `plan` chooses, once per flow call, how every
step runs (`PATHS`); `reference` holds the twins. Row log-dets and squared norms are float32 (float64 for float64).
"""
from ._utils import accumulation_dtype
from .dispatch import HAS_TRITON
from .plan import PATHS, Plan, plan
from .reference import (
    SCALE_OFFSET,
    StepParameters,
    actnorm_inverse_ref,
    actnorm_ref,
    couple_ref,
    fold,
    folded_step_ref,
    inverse_step_ref,
    step_ref,
    uncouple_ref,
)
from .squared_norm import squared_norm_ref
from .triangular import lu_factors, lu_product, lu_product_ref, lu_solve

__all__ = [
    "HAS_TRITON", "PATHS", "SCALE_OFFSET", "Plan", "StepParameters", "accumulation_dtype", "actnorm_inverse_ref",
    "actnorm_ref", "couple_ref", "fold", "folded_step_ref", "inverse_step_ref", "lu_factors", "lu_product",
    "lu_product_ref", "lu_solve", "plan", "squared_norm_ref", "step_ref", "uncouple_ref",
]
