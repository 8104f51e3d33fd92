"""Maximum-likelihood training of a flow: reproducible, bounded in memory, resumable."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from flowcore import defaults
from flowcore._fs import atomic_write
from flowcore._progress import ProgressReport
from flowcore.runtime import check_threads, pinned_threads, training_threads
from flowcore.validation import as_tensor, check_matrix

__all__ = ["CHECKPOINT_FORMAT", "CheckpointMismatchError", "TrainingDivergedError", "fit", "row_index",
           "training_matrix"]

CHECKPOINT_FORMAT = "flowcore-training-checkpoint"
CHECKPOINT_VERSION = 1
GATHER_BLOCK_ROWS = 8192
"""Chosen rows (`rows=`) checked at a time: they are gathered, so a smaller block than a slice's."""


class TrainingDivergedError(FloatingPointError, ValueError):
    """The loss or the gradients stopped being finite; the weights are left as before that step."""


class CheckpointMismatchError(ValueError):
    """A checkpoint file belongs to another training run (other data, options or flow)."""


def fit(flow, X, epochs: int = 1, batch_size: int = 32, lr: float = 1e-3, seed: int = 0, device=None,
        show_progress_bar: bool | None = None, init_rows: int = 1024,
        on_epoch: Callable[[float, float], bool | None] | None = None, *, checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int = 1000, rows=None, prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
        threads: int | None = None, evaluate_every: int | None = None) -> list[float]:
    """Train `flow` by maximum likelihood (bits per dimension, Adam) on the rows of `X`.

    The same `seed` gives the same result; resumed from `checkpoint` with the same arguments, `fit` ends with
    the weights of an uninterrupted run, bit for bit (same machine and thread count). `X` is read a batch at a
    time (bounded memory). A non-finite loss or gradient raises `TrainingDivergedError` before any weight
    changes. The flow is left in eval mode.

    Args:
        flow: a `Glow` (anything with `bits_per_dim(x)`, `dim` and parameters).
        X: (n, dim) numpy array, memory map or tensor, n >= 2, finite.
        epochs: passes over X.
        batch_size: rows per step (the paper's 32).
        lr: Adam's learning rate (the paper's 1e-3).
        seed: seeds the batch order.
        device: move the flow there first (the data follows the flow).
        show_progress_bar: progress on stderr (a bar on a terminal, else a plain line every 30 s); False: none.
        init_rows: ActNorm is initialised from the first max(batch_size, init_rows) shuffled rows.
        on_epoch: called as `on_epoch(epochs_done, loss)` after each epoch; a true result stops training.
            Its `checkpoint_state`/`restore_checkpoint_state`, if any, are checkpointed too.
        evaluate_every: also call `on_epoch` every this many steps, `epochs_done` fractional (e.g. 1.25)
            and the epoch's mean loss so far; None: after epochs only.
        checkpoint: a file to checkpoint to (atomically) and resume from; None: no checkpoints.
        checkpoint_every: optimizer steps between checkpoints.
        rows: the row numbers of X to train on, in this order (the shuffle permutes them); None: all.
        prepare: maps each batch (row by row) before it reaches the flow, so no transformed copy of X is made.
        threads: torch CPU threads while training; None: `flowcore.runtime.training_threads`.

    Returns:
        The mean loss (bits per dimension) of each epoch (the last one's over the steps trained,
        when `on_epoch` stopped training within it).

    Example:
        >>> losses = flowcore.fit(flowcore.Glow(384), np.load("big.npy", mmap_mode="r"), checkpoint="fit.ckpt")
    """
    if epochs < 1 or batch_size < 1 or not lr > 0 or checkpoint_every < 1 or (
            evaluate_every is not None and evaluate_every < 1):
        raise ValueError(f"epochs, batch_size, checkpoint_every and evaluate_every must be >= 1 and lr > 0 (got "
                         f"{epochs}, {batch_size}, {checkpoint_every}, {evaluate_every}, {lr})")
    if device is not None:
        flow.to(device)
    parameter = next(flow.parameters())
    threads = check_threads(threads)
    if threads is None and parameter.device.type == "cpu":
        threads = training_threads(batch_size)
    with pinned_threads(threads):
        return _fit(flow, X, epochs, batch_size, lr, seed, show_progress_bar, init_rows, on_epoch, checkpoint,
                    checkpoint_every, rows, prepare, parameter, evaluate_every if on_epoch is not None else None)


def _fit(flow, X, epochs, batch_size, lr, seed, show_progress_bar, init_rows, on_epoch, checkpoint, checkpoint_every,
         rows, prepare, parameter, evaluate_every) -> list[float]:
    flow_dim = getattr(flow, "dim", None)
    data = training_matrix(X, dim=flow_dim if prepare is None else None, rows=rows)
    index = None if rows is None else row_index(rows, data.shape[0])
    count = data.shape[0] if index is None else len(index)

    def batch_of(positions: torch.Tensor) -> torch.Tensor:
        batch = data[positions if index is None else index[positions]]
        if prepare is not None:
            batch = prepare(batch)
        return batch.to(device=parameter.device, dtype=parameter.dtype)

    generator = torch.Generator().manual_seed(seed)
    parameters = list(flow.parameters())  # walked once, not at every step
    optimizer = torch.optim.Adam(parameters, lr=lr, fused=True)  # one pass per tensor
    steps_per_epoch = math.ceil(count / batch_size)
    identity = {"epochs": epochs, "batch_size": batch_size, "lr": lr, "seed": seed, "init_rows": init_rows,
                "rows": count, "dim": int(flow_dim or data.shape[1]),
                "dtype": str(parameter.dtype).removeprefix("torch."),
                "parameters": {name: list(p.shape) for name, p in flow.named_parameters()},
                "torch_threads": torch.get_num_threads()}
    if evaluate_every is not None:  # another schedule of evaluations is another run
        identity["evaluate_every"] = evaluate_every
    state = _TrainingState()
    if checkpoint is not None and Path(checkpoint).exists():
        state = _load_checkpoint(Path(checkpoint), identity, flow, optimizer, generator, on_epoch)

    def save(generator_state: torch.Tensor) -> None:
        if checkpoint is not None:
            _save_checkpoint(Path(checkpoint), identity, flow, optimizer, generator_state, state, on_epoch)

    bar = ProgressReport("fit flow", epochs * steps_per_epoch, state.epoch * steps_per_epoch + state.step,
                         show_progress_bar, unit="steps")
    try:
        for epoch in range(state.epoch, epochs if not state.finished else 0):
            flow.train()  # an on_epoch that scored held-out rows may have left it in eval mode
            epoch_start = generator.get_state()
            order = torch.randperm(count, generator=generator)
            if epoch == 0 and state.step == 0:
                with torch.no_grad():
                    flow(batch_of(order[: max(batch_size, init_rows)]))
            for step in range(state.step, steps_per_epoch):
                batch = batch_of(order[step * batch_size : (step + 1) * batch_size])
                loss = flow.bits_per_dim(batch)
                where = f"epoch {epoch + 1}, step {step + 1}/{steps_per_epoch}"
                if not torch.isfinite(loss):
                    raise TrainingDivergedError(f"the training loss became {loss.item()} at {where}; the weights are "
                                                f"kept from the previous step. Try a lower learning rate (now {lr}), "
                                                "standardising the inputs, or float64")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if not _all_finite([p.grad for p in parameters if p.grad is not None]):
                    raise TrainingDivergedError(f"the gradients became non-finite at {where}; the weights are kept "
                                                f"from the previous step. Try a lower learning rate (now {lr}) or "
                                                "standardising the inputs")
                optimizer.step()
                value = loss.item()
                state.total += value * batch.shape[0]
                state.step = step + 1
                bar.advance(1, f"loss {value:.4f}")
                if evaluate_every is not None and state.step % evaluate_every == 0 and state.step < steps_per_epoch:
                    trained = min(state.step * batch_size, count)
                    if on_epoch(epoch + state.step / steps_per_epoch, state.total / trained):
                        state.losses.append(state.total / trained)
                        state.finished = True
                        break
                    flow.train()  # the evaluation may have left it in eval mode
                if (epoch * steps_per_epoch + state.step) % checkpoint_every == 0 and state.step < steps_per_epoch:
                    save(epoch_start)
            if state.finished:  # stopped within the epoch
                save(epoch_start)
                break
            state.losses.append(state.total / count)
            state.epoch, state.step, state.total = epoch + 1, 0, 0.0
            stop = on_epoch is not None and bool(on_epoch(epoch + 1, state.losses[-1]))
            state.finished = stop or epoch + 1 == epochs
            save(generator.get_state())
            if stop:
                break
    finally:
        bar.close()
        flow.eval()
    return list(state.losses)


def training_matrix(X, dim: int | None = None, min_rows: int = 2, rows=None) -> torch.Tensor:
    """X as a tensor without a copy, checked a block of rows at a time (never loaded whole).

    Args:
        X: (n, d) numpy array, memory map or tensor.
        dim: the width required, or None.
        min_rows: the fewest rows accepted (of `rows`, when given).
        rows: row numbers of X (`row_index`): only these are checked and counted; None: all rows.

    Example:
        >>> data = training_matrix(np.load("big.npy", mmap_mode="r"), dim=384)
    """
    data = as_tensor(X)
    check_matrix(data[:0] if data.dim() == 2 else data, dim=dim, min_rows=0)
    if rows is None:
        if data.shape[0] < min_rows:
            raise ValueError(f"X has {data.shape[0]} row(s); at least {min_rows} are needed")
        for start in range(0, data.shape[0], defaults.CHECK_BLOCK_ROWS):
            check_matrix(data[start : start + defaults.CHECK_BLOCK_ROWS], row_offset=start)
    else:
        index = row_index(rows, data.shape[0])
        if len(index) < min_rows:
            raise ValueError(f"rows selects {len(index)} row(s) of X; at least {min_rows} are needed")
        for start in range(0, len(index), GATHER_BLOCK_ROWS):
            chosen = index[start : start + GATHER_BLOCK_ROWS]
            finite = torch.isfinite(data[chosen]).all(dim=1)
            if not bool(finite.all()):
                bad = ", ".join(str(int(row)) for row in chosen[~finite][:5])
                raise ValueError(f"X has NaN or Inf values in row(s) {bad} (0-based)")
    return data if data.is_floating_point() else data.to(torch.get_default_dtype())


def row_index(rows, count: int) -> torch.Tensor:
    """`rows` as a 1-D int64 tensor, after checking that each is in range.

    Args:
        rows: row numbers, in the order they are to be used.
        count: rows of the matrix they index.

    Example:
        >>> row_index(np.flatnonzero(good), len(X))
    """
    index = torch.as_tensor(np.asarray(rows) if not isinstance(rows, torch.Tensor) else rows)
    if index.dim() != 1 or (index.numel() and (index.is_floating_point() or index.dtype == torch.bool)):
        raise ValueError(f"rows must be a 1-D array of row numbers, got shape {tuple(index.shape)} "
                         f"of {str(index.dtype).removeprefix('torch.')}")
    index = index.to(device="cpu", dtype=torch.long)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= count):
        outside = int(index.min()) if int(index.min()) < 0 else int(index.max())
        raise ValueError(f"rows holds row number {outside}, outside X's {count} row(s)")
    return index


class _TrainingState:
    """Where training stands: the next epoch and step, the epoch's loss sum, the mean losses so far."""

    def __init__(self, epoch: int = 0, step: int = 0, total: float = 0.0, losses: list[float] | None = None,
                 finished: bool = False):
        self.epoch, self.step, self.total, self.losses = epoch, step, total, list(losses or [])
        self.finished = finished


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite: the sums first (one small op per tensor), element-wise only
    when a sum is not (it may just have overflowed)."""
    if bool(torch.isfinite(torch.stack([t.sum() for t in tensors]).sum())):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _save_checkpoint(path: Path, identity: dict, flow, optimizer, generator_state: torch.Tensor,
                     state: _TrainingState, on_epoch) -> None:
    """Flow, Adam, the generator's state at the epoch's start and `on_epoch`'s state, as safetensors."""
    from safetensors.torch import save

    tensors = {f"flow.{name}": value for name, value in flow.state_dict().items()}
    for name, parameter in flow.named_parameters():
        tensors.update({f"adam.{name}.{key}": value for key, value in optimizer.state.get(parameter, {}).items()})
    tensors["generator.epoch_start"] = generator_state
    callback = None
    if hasattr(on_epoch, "checkpoint_state"):
        callback_tensors, callback = on_epoch.checkpoint_state()
        tensors.update({f"callback.{name}": value for name, value in callback_tensors.items()})
    header = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "job": identity,
              "epoch": state.epoch, "step": state.step, "total": state.total, "losses": state.losses,
              "finished": state.finished, "callback": callback}
    payload = save({name: value.detach().cpu().contiguous() for name, value in tensors.items()},
                   metadata={"flowcore": json.dumps(header)})
    atomic_write(path, lambda stream: stream.write(payload))


def _load_checkpoint(path: Path, identity: dict, flow, optimizer, generator, on_epoch) -> _TrainingState:
    """Restore what `_save_checkpoint` wrote; refuse a checkpoint of another run."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as reader:
            header = json.loads((reader.metadata() or {})["flowcore"])
            tensors = {name: reader.get_tensor(name) for name in reader.keys()}
        if header.get("format") != CHECKPOINT_FORMAT or header.get("version") != CHECKPOINT_VERSION:
            raise ValueError("not a flowcore training checkpoint")
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        raise CheckpointMismatchError(f"{path}: unreadable training checkpoint ({error}); "
                                      "delete it to start over") from None
    if header["job"] != identity:
        changed = [f"{key} was {header['job'].get(key)!r}, now {value!r}" for key, value in identity.items()
                   if header["job"].get(key) != value]
        raise CheckpointMismatchError(f"{path} is a checkpoint of another training run ({'; '.join(changed)}); "
                                      "rerun the original command to finish it, or delete it to start over")
    flow.load_state_dict({name[5:]: value for name, value in tensors.items() if name.startswith("flow.")})
    for name, parameter in flow.named_parameters():
        values = {key.rpartition(".")[2]: value for key, value in tensors.items()
                  if key.startswith(f"adam.{name}.") and key.count(".") == name.count(".") + 2}
        if values:
            optimizer.state[parameter] = {key: value.to(parameter.device) if key != "step" else value
                                          for key, value in values.items()}
    generator.set_state(tensors["generator.epoch_start"])  # the current epoch's shuffle is drawn again
    if hasattr(on_epoch, "restore_checkpoint_state") and header.get("callback") is not None:
        on_epoch.restore_checkpoint_state({name[9:]: value for name, value in tensors.items()
                                           if name.startswith("callback.")}, header["callback"])
    return _TrainingState(header["epoch"], header["step"], header["total"], header["losses"], header["finished"])
