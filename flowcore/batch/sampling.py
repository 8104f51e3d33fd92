"""The one row sampler: a reproducible uniform random sample of at most `max_rows` rows, in their original order,
from a stream (`sample_stream`) or a known row count (`sample_row_numbers`). Both are the same reservoir sample
(Li's "Algorithm L"), so for the same `max_rows` and `seed` `sample_stream(range(n))` equals `sample_row_numbers(n)`.
"""
from __future__ import annotations

import math
import random
from typing import Iterable, Iterator, TypeVar

__all__ = ["sample_row_numbers", "sample_stream"]

T = TypeVar("T")


def _check(max_rows: int) -> None:
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows!r}")


def _open_uniform(rng: random.Random) -> float:
    """A uniform draw from the open interval (0, 1)."""
    while (value := rng.random()) == 0.0:
        pass
    return value


def _replacements(size: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    """The stream positions (after the first `size`) whose row enters a full reservoir of `size`
    rows, each with the slot it replaces, in increasing order (Algorithm L, endless)."""
    log_w = math.log(_open_uniform(rng)) / size  # log of the running weight W, always < 0
    position = size - 1
    while True:
        log_keep = math.log(-math.expm1(log_w))  # log(1 - W)
        if log_keep == 0.0:  # W underflowed: no later row would ever be taken
            return
        position += math.floor(math.log(_open_uniform(rng)) / log_keep) + 1
        yield position, rng.randrange(size)
        log_w += math.log(_open_uniform(rng)) / size


def sample_stream(items: Iterable[T], max_rows: int | None, seed: int = 0) -> list[T]:
    """At most `max_rows` of `items`, uniformly at random and in stream order, in one pass
    (memory: `max_rows` items); all of them when `max_rows` is None."""
    if max_rows is None:
        return list(items)
    _check(max_rows)
    reservoir: list[tuple[int, T]] = []
    replacements = _replacements(max_rows, random.Random(seed))
    next_position, slot = next(replacements, (-1, 0))  # the first position past the full reservoir taken
    for position, item in enumerate(items):
        if position < max_rows:
            reservoir.append((position, item))
        elif position == next_position:
            reservoir[slot] = (position, item)
            next_position, slot = next(replacements, (-1, 0))
    return [item for _, item in sorted(reservoir, key=lambda entry: entry[0])]


def sample_row_numbers(rows: int, max_rows: int | None, seed: int = 0) -> list[int]:
    """The sorted row numbers `sample_stream(range(rows), max_rows, seed)` picks, computed from the count alone."""
    if max_rows is None:
        return list(range(rows))
    _check(max_rows)
    reservoir = list(range(min(rows, max_rows)))
    for position, slot in _replacements(max_rows, random.Random(seed)):  # positions from `max_rows` on
        if position >= rows:
            break
        reservoir[slot] = position
    return sorted(reservoir)
