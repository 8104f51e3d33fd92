"""The execution policy: how many CPU threads each kind of work gets, and the only calls that change
torch's thread count. torch's CPU results depend on the thread count, so every count is fixed by the work
and the CPUs this process may use (a count a user passes wins), never by the machine's load."""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["SMALL_BATCH_ROWS", "available_cpus", "calibration_threads", "check_threads", "encoder_threads",
           "inference_workers", "job_threads", "parallel_jobs", "pinned_threads", "side_by_side", "training_threads",
           "use_threads_in_this_process"]

Item = TypeVar("Item")

SMALL_BATCH_ROWS = 256
"""CPU training with batches of fewer rows runs on one torch thread (`training_threads`)."""


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota (`cpu.max`)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2 quota ("max", or no such file)
        with open("/sys/fs/cgroup/cpu.max") as limit:
            quota, period = limit.read().split()[:2]
        cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    return cpus


def _torch_threads(reserved: int = 0) -> int:
    """torch's thread count, capped at the CPUs available less `reserved`."""
    import torch

    return min(torch.get_num_threads(), available_cpus() - reserved)


def check_threads(threads: int | None, what: str = "threads") -> int | None:
    """`threads` if it is None or a positive integer, else a ValueError naming `what`."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"{what} must be a positive integer or None, got {threads!r}")
    return threads


def training_threads(batch_size: int) -> int:
    """torch threads for CPU training: one for batches under `SMALL_BATCH_ROWS` rows, where a second
    thread gains little and every op waits for the slowest thread.

    Example:
        >>> training_threads(32)
        1
    """
    return 1 if batch_size < SMALL_BATCH_ROWS else _torch_threads()


def encoder_threads(requested: int | None, quantized: bool) -> tuple[int, int]:
    """(torch threads per batch, batches side by side) for CPU encoding; int8 keeps its threads in one
    ONNX Runtime session. `requested`: the encoder's own count, None for torch's capped at the CPUs."""
    threads = requested or _torch_threads()
    return (threads, 1) if quantized or threads == 1 else (1, threads)


def inference_workers(blocks: int) -> int:
    """Row blocks of CPU flow inference run side by side, each on one torch thread."""
    return max(1, min(_torch_threads(), blocks))


def job_threads(text: bool, actor: bool = False) -> int:
    """A batch job's default torch thread count (recorded, so a resumed job is byte-identical): 1 per
    Ray actor; for text every CPU available (the encoder does nearly all the work); for stored vectors
    one fewer (the reader and writer keep a core).

    Example:
        >>> job_threads(text=True) == available_cpus()
        True
    """
    if actor:
        return 1
    return available_cpus() if text else max(1, _torch_threads(reserved=1))


def calibration_threads(threads: int | None, text: bool) -> int | None:
    """torch threads of the thread calibrating a batch job's chunks: `threads` for stored vectors; for text 1, as
    its encoder spreads the batches over the job's `threads` (more torch threads would stall on any busy core)."""
    return 1 if text and threads is not None else threads


def parallel_jobs(requested: int | None = None) -> int:
    """How many jobs (processes, workers) run side by side: `requested`, else the CPUs available."""
    return check_threads(requested, "jobs") or available_cpus()


@contextlib.contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` for the block and restored after it; None leaves it."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def use_threads_in_this_process(threads: int = 1) -> None:
    """torch's thread count for the rest of a worker process that exists for this work alone: a
    forked child (its OpenMP pool would hang with more than one) or a Ray actor."""
    import torch

    torch.set_num_threads(threads)


def side_by_side(workers: int, run: Callable[[Item], None], items: Iterable[Item]) -> None:
    """`run(item)` for every item on `workers` threads (in this thread, in order, when 1); the first
    failure in item order is raised and the items not started yet are dropped.

    Example:
        >>> with pinned_threads(1):
        ...     side_by_side(2, encode_batch, batches)   # two batches at a time, one torch thread each
    """
    if workers <= 1:
        for item in items:
            run(item)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, items))  # results in item order: the first failure cancels the items not started
