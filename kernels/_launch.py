"""Shared host-side helpers for the Triton launchers: the launch counter, device checks,
compute-dtype flags and grid sizing.

The Triton decorators pick the interpreter or the GPU compiler when a kernel module is
imported, so `INTERPRETED` is read once, here, at that same moment.
"""
from __future__ import annotations

import torch
import triton

from flowcore.backend import BackendUnavailableError

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

launch_counts: dict[str, int] = {}
"""Op name -> number of Triton kernel launches made by the host launchers (eager calls)."""


def record_launch(op: str) -> None:
    launch_counts[op] = launch_counts.get(op, 0) + 1


def require_launchable(tensor: torch.Tensor, op: str) -> None:
    """Fail clearly when the kernels cannot run on `tensor`'s device."""
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise BackendUnavailableError(
            f"{op}: the Triton kernels were built for the GPU (TRITON_INTERPRET was not set when "
            f"flowcore.kernels was imported) and cannot run on a {tensor.device.type} tensor"
        )


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


def allow_tf32(tensor: torch.Tensor) -> bool:
    """Follow torch's own float32 matmul policy (`torch.set_float32_matmul_precision`)."""
    return tensor.dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"


def parallel_programs(device: torch.device) -> int:
    """How many programs keep the device busy (a few per SM; a handful in the interpreter)."""
    if device.type == "cuda":
        return 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def row_splits(row_blocks: int, other_programs: int, device: torch.device) -> int:
    """Number of row ranges a batch reduction is split into (one fp32 partial each)."""
    wanted = triton.cdiv(parallel_programs(device), max(other_programs, 1))
    return max(1, min(row_blocks, wanted))
