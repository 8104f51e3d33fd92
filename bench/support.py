"""Helpers the benchmark files share (importable because pyproject.toml puts bench/ on pytest's path).

- `busy_core()` runs one busy-loop process on one core for the `with` block: the "one busy core"
  load of the benchmarks.
"""
import contextlib
import multiprocessing
import os
import time


def _spin(core: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    while True:
        pass


@contextlib.contextmanager
def busy_core(core: int | None = None):
    """One busy-loop process on one core (the last CPU this process may use unless `core` is
    given) for the block: the "one busy core" load of the benchmarks."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    process = multiprocessing.get_context("spawn").Process(target=_spin, args=(cores[-1] if core is None else core,),
                                                           daemon=True)
    process.start()
    time.sleep(0.5)  # let it reach its core
    try:
        yield
    finally:
        process.terminate()
        process.join()
