"""Counting Triton kernel launches, so a test can prove which kernels ran: `triton_launches()`
patches Triton's launch entry point (`fn[grid](...)`) for the `with` block; the library keeps
no counter of its own."""
from __future__ import annotations

import collections
import contextlib
from typing import Iterator


@contextlib.contextmanager
def triton_launches() -> Iterator[collections.Counter]:
    """A Counter of kernel function name -> launches made inside the block."""
    from triton.runtime.jit import KernelInterface

    counts: collections.Counter = collections.Counter()
    original = KernelInterface.__getitem__

    def counting(self, grid):
        launch = original(self, grid)

        def run(*args, **kwargs):
            counts[self.fn.__name__] += 1
            return launch(*args, **kwargs)
        return run

    KernelInterface.__getitem__ = counting
    try:
        yield counts
    finally:
        KernelInterface.__getitem__ = original
