"""The one row sampler: at most `max_rows` rows, uniform, in their original order, the same
sample for the same seed, and the same rows from a stream as from a known row count."""
from collections import Counter

import pytest

from flowcore.batch.sampling import sample_row_numbers, sample_stream


@pytest.mark.parametrize("rows", [0, 1, 4, 5, 6, 50, 1000])
@pytest.mark.parametrize("max_rows", [1, 5, 64])
def test_a_stream_and_a_known_count_give_the_same_rows(rows, max_rows):
    for seed in range(4):
        picked = sample_row_numbers(rows, max_rows, seed)
        assert sample_stream(range(rows), max_rows, seed) == picked
        assert picked == sorted(set(picked)) and len(picked) == min(rows, max_rows)
        assert all(0 <= row < rows for row in picked)


def test_samples_are_reproducible_in_order_and_differ_between_seeds():
    items = [f"s{i}" for i in range(100)]
    sample = sample_stream(iter(items), 10, seed=7)
    assert sample == sample_stream(iter(items), 10, seed=7)
    assert sample == sorted(sample, key=items.index)
    assert len({tuple(sample_stream(items, 10, seed=seed)) for seed in range(20)}) == 20


def test_every_row_is_equally_likely():
    counts = Counter(row for seed in range(2000) for row in sample_row_numbers(40, 8, seed))
    assert len(counts) == 40
    assert all(0.16 < count / 2000 < 0.24 for count in counts.values())  # each kept with p = 8/40
    firsts = Counter(sample_row_numbers(10**6, 1, seed)[0] // 100_000 for seed in range(2000))
    assert all(150 < count < 250 for count in firsts.values()) and len(firsts) == 10


def test_no_limit_keeps_everything_and_bad_limits_are_refused():
    assert sample_stream(iter("abc"), None) == ["a", "b", "c"]
    assert sample_row_numbers(3, None) == sample_row_numbers(3, 10) == [0, 1, 2]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_rows must be at least 1"):
            sample_stream([1, 2], bad)
        with pytest.raises(ValueError, match="max_rows must be at least 1"):
            sample_row_numbers(2, bad)


def test_a_huge_known_count_is_sampled_without_visiting_every_row():
    picked = sample_row_numbers(10**15, 3, seed=0)
    assert len(picked) == 3 and picked == sorted(picked) and max(picked) < 10**15
