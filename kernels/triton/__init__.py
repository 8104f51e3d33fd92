"""The Triton kernels of the flow ops, one file per op; imported by name (`dispatch.triton_ops`) when
a Triton op first runs, each file registering its entry points in `_utils.TRITON_OPS`."""
from . import actnorm, coupling, step

__all__ = ["actnorm", "coupling", "step"]
