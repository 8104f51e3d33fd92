"""The CUDA path of `FlowCalibrator.transform` / `inverse_transform`: host copies, uploads, compute and
downloads of neighbouring chunks overlap, through two pinned buffers of each kind."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from flowcore.validation import as_tensor, check_matrix


def map_on_cuda(X, fn: Callable[[torch.Tensor], torch.Tensor], *, dim: int, device: torch.device,
                dtype: torch.dtype, chunk_rows: int, name: str = "X") -> np.ndarray:
    """`fn` applied to X's (rows, dim) rows `chunk_rows` at a time on `device`, cast there to `dtype`;
    float32 numpy (rows, dim). `name` is how errors name X."""
    source = as_tensor(X, name)
    if source.dim() != 2 or source.shape[1] != dim:
        raise ValueError(f"{name} must have shape (rows, {dim}), got {tuple(source.shape)}")
    rows = source.shape[0]
    out = np.empty((rows, dim), dtype=np.float32)
    if rows == 0:
        return out
    chunk_rows = min(chunk_rows, rows)
    pinned = dict(dtype=torch.float32, pin_memory=True)
    stage_in = [torch.empty((chunk_rows, dim), **pinned) for _ in range(2)]
    stage_out = [torch.empty((chunk_rows, dim), **pinned) for _ in range(2)]
    stage_finite = [torch.empty(chunk_rows, dtype=torch.bool, pin_memory=True) for _ in range(2)]
    uploaded = [torch.cuda.Event() for _ in range(2)]
    downloaded = [torch.cuda.Event() for _ in range(2)]
    upload, download = torch.cuda.Stream(device), torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def finish(start: int, n: int, b: int) -> None:
        downloaded[b].synchronize()
        if not bool(stage_finite[b][:n].all()):  # stage_in[b] still holds the chunk: name its bad rows
            check_matrix(stage_in[b][:n], name=name, row_offset=start)
        torch.from_numpy(out[start : start + n]).copy_(stage_out[b][:n])

    pending = None
    with ThreadPoolExecutor(2) as pool:
        for i, start in enumerate(range(0, rows, chunk_rows)):
            b, n = i % 2, min(chunk_rows, rows - start)
            uploaded[b].synchronize()  # the upload of chunk i - 2 has left stage_in[b]
            fill = pool.submit(stage_in[b][:n].copy_, source[start : start + n])
            drain = pool.submit(finish, *pending) if pending else None
            fill.result()
            with torch.cuda.stream(upload):
                chunk = stage_in[b][:n].to(device, non_blocking=True)
                uploaded[b].record(upload)
            compute.wait_stream(upload)
            chunk.record_stream(compute)
            finite = torch.isfinite(chunk).all(dim=1)
            result = fn(chunk.to(dtype)).float()
            with torch.cuda.stream(download):  # stage_out[b] was chunk i - 2's, copied out in iteration i - 1
                download.wait_stream(compute)
                stage_out[b][:n].copy_(result, non_blocking=True)
                stage_finite[b][:n].copy_(finite, non_blocking=True)
                downloaded[b].record(download)
            result.record_stream(download)
            finite.record_stream(download)
            if drain is not None:
                drain.result()
            pending = (start, n, b)
        finish(*pending)
    return out
