"""Helpers shared by every backend: argument checks, the accumulation dtype, the error a backend
that cannot run raises, and the table in which `kernels/triton/` registers its ops when imported
(so that nothing here imports the Triton files, and they import nothing that imports them)."""
from __future__ import annotations

from typing import Callable

import torch

TRITON_OPS: dict[str, Callable] = {}
"""The Triton entry points by name, filled by `register_triton_op` as `kernels/triton/` is imported."""


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here."""


def register_triton_op(name: str) -> Callable:
    """Record the decorated function in `TRITON_OPS` under `name`."""
    def record(function: Callable) -> Callable:
        TRITON_OPS[name] = function
        return function
    return record


def require_matrix(name: str, tensor: torch.Tensor, width: int | None = None) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, features), got shape {tuple(tensor.shape)}")
    if width is not None and tensor.shape[1] != width:
        raise ValueError(f"{name} must have {width} columns, got shape {tuple(tensor.shape)}")


def require_vector(name: str, tensor: torch.Tensor, length: int) -> None:
    if tensor.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(tensor.shape)}")


def is_fp64(tensor: torch.Tensor) -> bool:
    """Float64 inputs compute in float64; every other dtype accumulates in float32."""
    return tensor.dtype == torch.float64


def accumulation_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype of partial sums, row log-dets and squared norms over `tensor`: float64 for float64,
    else float32 (a 16-bit log-det would be coarsely quantised)."""
    return torch.float64 if is_fp64(tensor) else torch.float32
