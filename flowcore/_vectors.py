"""Row-wise vector helpers shared by the encoder, batch jobs and integrations."""
from __future__ import annotations

import numpy as np

__all__ = ["unit_rows"]


def unit_rows(vectors: np.ndarray, dtype=np.float32) -> np.ndarray:
    """`vectors` scaled to unit Euclidean length, as `dtype` (norms computed in float64, so each
    row's norm is 1 within `dtype` rounding); an all-zero row stays zero and NaN rows stay NaN."""
    wide = np.asarray(vectors, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))[:, None]
    return (wide / np.where(norms > 0, norms, 1.0)).astype(dtype, copy=False)
