"""Maximum-likelihood training of a flow (bits per dimension, Adam), reproducible from a seed."""
from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from flowcore.validation import check_matrix

__all__ = ["TrainingDivergedError", "fit"]


class TrainingDivergedError(FloatingPointError, ValueError):
    """The loss or the gradients stopped being finite; the weights are left as before that step."""


def fit(flow, X, epochs: int = 1, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
        device=None, progress: bool = True, init_rows: int = 1024) -> list[float]:
    """Train `flow` by maximum likelihood (bits per dimension, Adam) on the rows of `X`.

    Works in the flow's dtype (float64 included). Before the first step, every ActNorm is
    initialised from the data (as Glow's `n_batch_init`): the first `max(batch_size, init_rows)`
    shuffled rows, so that a small training batch does not give noisy statistics. Batches are
    shuffled with a generator seeded by `seed`, so the same seed gives the same result. A
    non-finite loss or gradient stops training with `TrainingDivergedError` before any weight is
    touched. The flow is left in eval mode.

    Args:
        flow: a `Glow` (anything with `bits_per_dim(x)`, `dim` and parameters).
        X: (n, dim) numpy array or tensor, n >= 2, finite.
        epochs: passes over X.
        batch_size: rows per step (the paper's 32).
        lr: Adam's learning rate (the paper's 1e-3).
        seed: seeds the batch order.
        device: move the flow there first (the data follows the flow).
        progress: show a tqdm bar.
        init_rows: rows used for ActNorm's data-dependent initialisation.

    Returns:
        The mean loss (bits per dimension) of each epoch.

    Example:
        >>> glow = flowcore.Glow(384, levels=2, depth=3, width=32)
        >>> losses = flowcore.fit(glow, X, epochs=1, batch_size=32, lr=1e-3, seed=0)
    """
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ValueError(f"epochs and batch_size must be >= 1 and lr > 0 (got {epochs}, {batch_size}, {lr})")
    parameter = next(flow.parameters())
    if device is not None:
        flow.to(device)
        parameter = next(flow.parameters())
    data = check_matrix(X, dim=getattr(flow, "dim", None), min_rows=2)
    data = data.to(device=parameter.device, dtype=parameter.dtype)
    rows = data.shape[0]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(flow.parameters(), lr=lr, foreach=True)
    steps_per_epoch = math.ceil(rows / batch_size)
    flow.train()
    epoch_losses = []
    bar = tqdm(total=epochs * steps_per_epoch, desc="fit flow", unit="step", disable=not progress)
    try:
        for epoch in range(epochs):
            order = torch.randperm(rows, generator=generator).to(data.device)
            total = 0.0
            if epoch == 0:
                with torch.no_grad():
                    flow(data[order[: max(batch_size, init_rows)]])
            for step in range(steps_per_epoch):
                batch = data[order[step * batch_size : (step + 1) * batch_size]]
                loss = flow.bits_per_dim(batch)
                where = f"epoch {epoch + 1}, step {step + 1}/{steps_per_epoch}"
                if not torch.isfinite(loss):
                    raise TrainingDivergedError(
                        f"the training loss became {loss.item()} at {where}; the weights are kept from the "
                        f"previous step. Try a lower learning rate (now {lr}), standardising the inputs, "
                        f"or float64"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                gradients = [p.grad for p in flow.parameters() if p.grad is not None]
                if not bool(torch.isfinite(torch.stack([g.abs().max() for g in gradients])).all()):
                    raise TrainingDivergedError(
                        f"the gradients became non-finite at {where}; the weights are kept from the "
                        f"previous step. Try a lower learning rate (now {lr}) or standardising the inputs"
                    )
                optimizer.step()
                total += loss.item() * batch.shape[0]
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            epoch_losses.append(total / rows)
    finally:
        bar.close()
        flow.eval()
    return epoch_losses
