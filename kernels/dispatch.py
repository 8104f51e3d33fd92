"""Which implementation runs the flow ops: fused Triton kernels or plain PyTorch.

Choice, in order of precedence: `use_backend(name)` / `set_backend(name)`, then the `FLOWCORE_BACKEND`
environment variable (read whenever a plan is made: once per flow call), then `auto`. `auto` runs Triton
on CUDA tensors when Triton is installed, PyTorch otherwise; `triton` on CPU tensors needs the interpreter
(`TRITON_INTERPRET=1`), else a `BackendUnavailableError` says why.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from typing import Iterator

import torch

from ._utils import TRITON_OPS, BackendUnavailableError

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "FLOWCORE_BACKEND"
HAS_TRITON = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (its kernels are imported only when a Triton op first runs)."""

_override: str | None = None


def _check_name(name: str) -> str:
    name = str(name).strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown flowcore backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def get_backend() -> str:
    """The requested backend name (`auto`, `triton` or `torch`), before resolution."""
    return _override or _check_name(os.environ.get(ENV_VAR, "auto") or "auto")


def set_backend(name: str | None) -> None:
    """Pin the backend for this process; `None` returns control to `FLOWCORE_BACKEND`."""
    global _override
    _override = None if name is None else _check_name(name)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the enclosed code on backend `name`, restoring the previous choice afterwards."""
    previous = _override
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def resolve(tensor: torch.Tensor) -> str:
    """The backend that will actually run the ops on `tensor`: `triton` or `torch`."""
    name = get_backend()
    if name == "torch":
        return "torch"
    if name == "auto":
        return "triton" if tensor.is_cuda and HAS_TRITON else "torch"
    if not HAS_TRITON:
        raise BackendUnavailableError(
            "the Triton backend was requested (FLOWCORE_BACKEND=triton or use_backend('triton')) but Triton is "
            "not installed; pip install triton (Linux), or use the 'auto' or 'torch' backend"
        )
    if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise BackendUnavailableError(
            f"FLOWCORE_BACKEND=triton on a {tensor.device.type} tensor needs a CUDA GPU, or the Triton "
            "interpreter (set TRITON_INTERPRET=1 before importing flowcore); use FLOWCORE_BACKEND=auto "
            "to fall back to PyTorch"
        )
    return "triton"


def triton_ops() -> dict:
    """The Triton ops by name (`_utils.TRITON_OPS`), importing `kernels/triton/` by name on the first call."""
    if not TRITON_OPS:
        importlib.import_module(f"{__package__}.triton")
    return TRITON_OPS
