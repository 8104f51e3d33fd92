"""The Triton kernels, one file per op, imported by name (`dispatch.triton_ops`) when a Triton op first runs."""
from .._utils import TRITON_OPS
from . import actnorm, coupling, step

TRITON_OPS.update(actnorm=actnorm.actnorm, couple=coupling.couple, step=step.folded_step)
