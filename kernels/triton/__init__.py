"""The Triton kernels of the flow ops, one file per op (kernels, launchers, autograd Function),
beside the PyTorch files of the same names one level up, which hold the math, the `_ref` twins
and the dispatchers that call into here. Imported only when a Triton op first runs
(`flowcore.kernels.dispatch.triton_ops`), so the package works without Triton installed.
"""
from . import actnorm, coupling, folded_linear, step

__all__ = ["actnorm", "coupling", "folded_linear", "step"]
