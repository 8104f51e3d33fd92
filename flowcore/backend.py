"""Which implementation runs the flow ops: fused Triton kernels or plain PyTorch.

Choice, in order of precedence: `use_backend(name)` / `set_backend(name)`, then the
`FLOWCORE_BACKEND` environment variable (read each time an op runs), then `auto`.

- `auto`   : Triton on CUDA tensors when Triton is importable, PyTorch otherwise.
- `triton` : always Triton. On CPU tensors that needs the Triton interpreter
             (`TRITON_INTERPRET=1` set before the kernels are imported); otherwise a
             `BackendUnavailableError` says why.
- `torch`  : PyTorch ops: the `_ref` twins, and for the LU + affine step a fused autograd
             Function with a hand-written backward (`flowcore.kernels.torch_step`).

Probes of torch internals (`composed_autograd_only`, `composed_backward`, hook detection) live in
`flowcore._torch_compat`.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from typing import Iterator

import torch

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "FLOWCORE_BACKEND"

_override: str | None = None


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here."""


def _check_name(name: str) -> str:
    name = str(name).strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown flowcore backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def get_backend() -> str:
    """The requested backend name (`auto`, `triton` or `torch`), before resolution."""
    if _override is not None:
        return _override
    return _check_name(os.environ.get(ENV_VAR, "auto") or "auto")


def set_backend(name: str | None) -> None:
    """Pin the backend for this process; `None` returns control to `FLOWCORE_BACKEND`."""
    global _override
    _override = None if name is None else _check_name(name)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the enclosed code on backend `name`, restoring the previous choice afterwards."""
    global _override
    previous = _override
    _override = _check_name(name)
    try:
        yield
    finally:
        _override = previous


@functools.cache
def triton_available() -> bool:
    """Whether Triton is importable (looked up once per process)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve(tensor: torch.Tensor) -> str:
    """The backend that will actually run an op on `tensor`: `triton` or `torch`."""
    name = get_backend()
    if name == "torch":
        return "torch"
    on_gpu = tensor.is_cuda
    if name == "auto":
        return "triton" if on_gpu and triton_available() else "torch"
    if not triton_available():
        raise BackendUnavailableError(
            "FLOWCORE_BACKEND=triton but Triton is not installed; `pip install triton` or use "
            "FLOWCORE_BACKEND=auto"
        )
    if not on_gpu and not interpreter_enabled():
        raise BackendUnavailableError(
            f"FLOWCORE_BACKEND=triton on a {tensor.device.type} tensor needs a CUDA GPU, or the Triton "
            "interpreter (set TRITON_INTERPRET=1 before importing flowcore); use FLOWCORE_BACKEND=auto "
            "to fall back to PyTorch"
        )
    return "triton"

