"""Helpers shared by every backend: argument checks, the accumulation dtype, the backend error, the Triton ops."""
from __future__ import annotations

from typing import Callable

import torch

TRITON_OPS: dict[str, Callable] = {}
"""The Triton entry points by name, filled by `kernels/triton/__init__.py`."""


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here."""


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
