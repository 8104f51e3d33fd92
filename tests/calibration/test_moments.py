"""Mergeable float64 moments: exact pairwise merging, chunk order and size do not matter, O(d²) state."""
import numpy as np
import pytest

from flowcore.calibration.moments import Moments, MomentsAccumulator


def _rows(rows=3000, dim=9, seed=0, offset=1e4):
    """Vectors far from the origin, where E[x²] − E[x]² would cancel catastrophically."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, dim)) @ rng.normal(size=(dim, dim)) + offset


def _relative(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_chunked_moments_equal_the_in_memory_statistics():
    X = _rows()
    moments = Moments.of_chunks(X[start:start + 128] for start in range(0, len(X), 128))
    assert moments.count == len(X)
    assert _relative(moments.mean, X.mean(axis=0)) < 1e-14
    assert _relative(moments.covariance(), np.cov(X, rowvar=False)) < 1e-10
    assert _relative(moments.covariance(ddof=0), np.cov(X, rowvar=False, ddof=0)) < 1e-10


def test_merging_is_order_free_and_shard_sizes_do_not_matter():
    X = _rows(rows=1001)
    cuts = [0, 1, 7, 400, 401, 1001]
    shards = [Moments.of(X[a:b]) for a, b in zip(cuts, cuts[1:])]
    forward = Moments.empty(X.shape[1])
    for shard in shards:
        forward = forward.merge(shard)
    backward = Moments.empty(X.shape[1])
    for shard in reversed(shards):
        backward = shard.merge(backward)
    reference = Moments.of(X)
    for merged in (forward, backward):
        assert merged.count == reference.count
        assert _relative(merged.comoment, reference.comoment) < 1e-10


def test_accumulator_keeps_few_partial_sums_and_merges_shards():
    X = _rows(rows=4096, dim=4)
    accumulator = MomentsAccumulator()
    for start in range(0, 2048, 16):
        accumulator.add(X[start:start + 16])
        assert len(accumulator._stack) <= 8  # a binary counter over 128 chunks: at most log2 + 1 entries
    accumulator.add_moments(Moments.of(X[2048:]))  # a shard summarised elsewhere
    assert accumulator.rows == 4096
    assert _relative(accumulator.total().covariance(), np.cov(X, rowvar=False)) < 1e-10


def test_bad_input_is_named():
    X = _rows(rows=50, dim=3)
    X[37, 1] = np.inf
    accumulator = MomentsAccumulator()
    accumulator.add(X[:30])
    with pytest.raises(ValueError, match="first bad row: 37"):
        accumulator.add(X[30:])
    with pytest.raises(ValueError, match="3- and 4-dimensional"):
        Moments.of(X[:5]).merge(Moments.of(_rows(rows=5, dim=4)))
    with pytest.raises(ValueError, match="more than 1 row"):
        Moments.of(X[:1]).covariance()
    with pytest.raises(ValueError, match="width is unknown"):
        MomentsAccumulator().total()
    with pytest.raises(ValueError, match="2-D"):
        Moments.of(X[0])
