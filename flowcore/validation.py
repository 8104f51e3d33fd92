"""Input checks shared by training, the calibrator and the CLI: clear errors that name the row."""
from __future__ import annotations

import re
import warnings

import numpy as np
import torch

from flowcore import defaults

__all__ = ["NonFiniteOutputError", "as_tensor", "check_matrix", "check_output", "lone_surrogate"]


class NonFiniteOutputError(ValueError):
    """A calibrator mapped finite rows to NaN/Inf (values too large for its arithmetic). `rows`: their
    0-based numbers; `output`: the whole result, so that a batch job can reject just those rows."""

    def __init__(self, message: str, rows: np.ndarray, output: np.ndarray):
        super().__init__(message)
        self.rows, self.output = rows, output


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in `text` (a JSON "\\ud800" escape, or bytes decoded with
    "surrogateescape"), which no UTF-8 writer or tokenizer accepts; None when there is none."""
    match = _SURROGATE.search(text)
    return match.start() if match else None


def as_tensor(X, name: str = "X") -> torch.Tensor:
    """`X` (tensor, numpy array or memory map) as a tensor sharing its memory, except an array in the other
    byte order (a big-endian .npy) or with negative strides (`X[::-1]`), which is copied. Raises ValueError
    when X is not real numbers (complex numbers are refused, never cast to their real part)."""
    if isinstance(X, torch.Tensor):
        if X.is_complex():
            raise ValueError(f"{name} holds complex numbers ({X.dtype}); calibrators take real vectors")
        return X
    array = np.asarray(X)
    if np.iscomplexobj(array):
        raise ValueError(f"{name} holds complex numbers ({array.dtype}); calibrators take real vectors")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array, got dtype {array.dtype}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():  # read-only (memory-mapped) input is only ever read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def check_matrix(X, *, dim: int | None = None, min_rows: int = 1, name: str = "X",
                 row_offset: int = 0) -> torch.Tensor:
    """`X` as a 2-D tensor (no copy where possible), or a ValueError naming the problem: not 2-D, wrong
    width, too few rows, or the rows holding NaN/Inf (numbered from `row_offset`, for a chunk at a time)."""
    tensor = as_tensor(X, name)
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows x features), got shape {tuple(tensor.shape)}")
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    if dim is not None and tensor.shape[1] != dim:
        raise ValueError(f"{name} has {tensor.shape[1]} features per row but the flow expects {dim}")
    if tensor.shape[0] < min_rows:
        raise ValueError(f"{name} has {tensor.shape[0]} row(s); at least {min_rows} are needed")
    finite_rows = torch.isfinite(tensor).all(dim=1)
    if not bool(finite_rows.all()):
        bad = torch.nonzero(~finite_rows).flatten() + row_offset
        raise ValueError(f"{name} has NaN or Inf values in row(s) {_row_list(bad)} (0-based)")
    return tensor


def check_output(output: np.ndarray, name: str = "X") -> np.ndarray:
    """`output`, a calibrator's result for finite rows of `name`, unless a row holds NaN/Inf: then
    `NonFiniteOutputError` naming those rows and carrying `output`."""
    bad = [start + np.flatnonzero(~np.isfinite(output[start:start + defaults.CHECK_BLOCK_ROWS]).all(axis=1))
           for start in range(0, len(output), defaults.CHECK_BLOCK_ROWS)]
    bad = np.concatenate(bad) if bad else np.empty(0, dtype=np.intp)
    if len(bad):
        raise NonFiniteOutputError(f"{name} row(s) {_row_list(bad)} (0-based) are finite, but calibrated they hold "
                                   "NaN or Inf: values too large for the calibration's arithmetic", bad, output)
    return output


def _row_list(rows) -> str:
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return ", ".join(str(int(i)) for i in rows[:5]) + more
