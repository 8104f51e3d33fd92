"""The Triton kernels of the flow ops, one file per op; imported only when a Triton op first runs."""
from . import actnorm, coupling, folded_linear, step

__all__ = ["actnorm", "coupling", "folded_linear", "step"]
