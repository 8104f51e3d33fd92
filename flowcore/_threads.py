"""torch's CPU thread count: how many CPUs this process may use, pinning a count for a block, and
running work items side by side in threads (`side_by_side`).

Float results of torch's CPU ops depend on the thread count (reductions split differently), so
a reproducible result needs a fixed count; nothing here follows the machine's load.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["available_cpus", "check_threads", "pinned_threads", "side_by_side"]

Item = TypeVar("Item")


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota (`cpu.max`)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as limit:
            quota, period = limit.read().split()[:2]
        cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):  # no cgroup v2 quota ("max", or no such file)
        pass
    return max(1, cpus)


def check_threads(threads: int | None, what: str = "threads") -> int | None:
    """`threads` if it is None or a positive integer, else a ValueError naming `what`."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"{what} must be a positive integer or None, got {threads!r}")
    return threads


@contextlib.contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` for the block and restored after it; None
    leaves it alone."""
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


def side_by_side(workers: int, run: Callable[[Item], None], items: Iterable[Item]) -> None:
    """`run(item)` for every item, on `workers` threads that each take the next item (in this
    thread, in order, when `workers` is 1). The first failure in item order is raised, and the
    items not started yet are dropped.

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
        running = [pool.submit(run, item) for item in items]
        try:
            for task in running:
                task.result()
        except BaseException:
            for task in running:
                task.cancel()
            raise

