"""Input checks shared by training, the calibrator and the CLI: clear errors that name the row."""
from __future__ import annotations

import re
import warnings

import numpy as np
import torch

__all__ = ["as_tensor", "check_matrix", "lone_surrogate"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in `text` (a JSON "\\ud800" escape, or bytes decoded
    with "surrogateescape"), which is not Unicode text and which no UTF-8 writer or tokenizer
    accepts; None when there is none."""
    match = _SURROGATE.search(text)
    return match.start() if match else None


def as_tensor(X, name: str = "X") -> torch.Tensor:
    """`X` (tensor, numpy array or memory map) as a tensor sharing its memory: a memory map stays
    one. Raises ValueError when X is not numeric."""
    if isinstance(X, torch.Tensor):
        return X
    array = np.asarray(X)
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array, got dtype {array.dtype}")
    with warnings.catch_warnings():  # read-only (memory-mapped) input is only ever read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def check_matrix(X, *, dim: int | None = None, min_rows: int = 1, name: str = "X",
                 row_offset: int = 0) -> torch.Tensor:
    """Return `X` as a 2-D tensor (no copy where possible) after checking shape and finiteness.

    Raises ValueError naming the problem: not 2-D, wrong width, too few rows, or the rows
    holding NaN/Inf (numbered from `row_offset`, for callers that check a chunk at a time).
    """
    tensor = as_tensor(X, name)
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows x features), got shape {tuple(tensor.shape)}")
    if not (tensor.is_floating_point()):
        tensor = tensor.to(torch.get_default_dtype())
    if dim is not None and tensor.shape[1] != dim:
        raise ValueError(f"{name} has {tensor.shape[1]} features per row but the flow expects {dim}")
    if tensor.shape[0] < min_rows:
        raise ValueError(f"{name} has {tensor.shape[0]} row(s); at least {min_rows} are needed")
    finite_rows = torch.isfinite(tensor).all(dim=1)
    if not bool(finite_rows.all()):
        bad = torch.nonzero(~finite_rows).flatten() + row_offset
        shown = ", ".join(str(int(i)) for i in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(f"{name} has NaN or Inf values in row(s) {shown}{more} (0-based)")
    return tensor
