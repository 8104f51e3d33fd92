"""`auto`: whitening for vectors with hub-dominated neighbourhoods, the raw vectors for balanced
ones; the choice is deterministic for a seed, the same streamed as in memory, counts repeated rows
once, and is saved (with its evidence) and loaded like every calibrator."""
import json

import numpy as np
import pytest
from safetensors import safe_open

import flowcore
from flowcore import defaults
from flowcore.calibration import create
from flowcore.calibration.auto import AutoCalibration
from flowcore.calibration.hubness import DistinctRowSample, robin_hood_index
from flowcore.calibration.moments import Moments


def anisotropic(rows=1500, dim=32, seed=0):
    """A narrow cone with a steep spectrum (variances ∝ 1/i²), as static-avg or raw BERT vectors:
    a few rows are everyone's nearest neighbours."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    return (rng.normal(size=(rows, dim)) / np.arange(1, dim + 1) @ rotation + 4.0).astype(np.float32)


def fine_tuned_like(rows=1500, dim=32, seed=0):
    """Close to isotropic around an offset, as a similarity-trained encoder's vectors: balanced neighbourhoods."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) * np.linspace(1.0, 0.6, dim) + 0.5).astype(np.float32)


def test_hub_dominated_vectors_are_whitened_and_balanced_ones_kept_raw():
    X = anisotropic()
    auto = AutoCalibration().fit(X)
    assert auto.choice == "whitening" and auto.signals["hubness"] >= defaults.AUTO_HUBNESS_THRESHOLD
    dim = auto.signals["dim"]
    assert auto.output_dim == dim < X.shape[1]
    variances = np.linalg.eigvalsh(np.cov(X.astype(np.float64), rowvar=False))[::-1]
    shares = np.cumsum(variances) / variances.sum()
    assert shares[dim - 1] >= defaults.AUTO_VARIANCE_SHARE > shares[dim - 2]  # the fewest directions holding 90 %
    np.testing.assert_allclose(auto.transform(X), flowcore.Whitening(keep=dim).fit(X).transform(X), atol=1e-5)
    assert auto.reason == (f"whitening, {dim} directions (hubness {auto.signals['hubness']:.3f} ≥ 0.265; measured "
                           "on only 1500 distinct rows, fewer than the 4000 the threshold is set for)")

    Y = fine_tuned_like()
    raw = AutoCalibration().fit(Y)
    assert raw.choice == "none" and raw.signals["hubness"] < defaults.AUTO_HUBNESS_THRESHOLD
    Z = raw.transform(Y)
    assert Z.dtype == np.float32 and raw.output_dim == Y.shape[1]
    np.testing.assert_array_equal(Z, Y)
    assert raw.reason.startswith(f"none, the raw vectors (hubness {raw.signals['hubness']:.3f} < 0.265")
    assert raw.signals["sampled_rows"] == 1500
    assert AutoCalibration(sample_rows=1000).fit(Y).reason.endswith("neighbourhoods already balanced)")


def test_the_choice_is_deterministic_for_a_seed():
    X = anisotropic(seed=1)
    first, second = AutoCalibration(seed=5).fit(X), AutoCalibration(seed=5).fit(X)
    assert first.signals == second.signals and first.choice == second.choice
    np.testing.assert_array_equal(first.matrix, second.matrix)
    small = dict(sample_rows=500)  # seeds sample different rows: the index moves a little, the choice stays
    a, b = AutoCalibration(seed=0, **small).fit(X), AutoCalibration(seed=1, **small).fit(X)
    assert a.signals["hubness"] != b.signals["hubness"] and a.choice == b.choice == "whitening"


def test_a_streamed_fit_equals_the_in_memory_fit():
    X = anisotropic(rows=2000, seed=2)
    X[1000:1300] = X[:300]  # repeated sentences
    memory = AutoCalibration(sample_rows=800).fit(X)
    bounds = [0, 7, 333, 1200, 1999, 2000]
    streamed = AutoCalibration(sample_rows=800).fit_chunks(X[a:b] for a, b in zip(bounds, bounds[1:]))
    assert streamed.choice == memory.choice and streamed.signals == memory.signals
    np.testing.assert_allclose(streamed.mean, memory.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(streamed.matrix, memory.matrix, rtol=1e-8, atol=1e-10)
    assert streamed.rows == memory.rows == 2000
    with pytest.raises(ValueError, match="moments alone do not hold: fit it with fit"):
        AutoCalibration().fit_moments(Moments.of(X))
    broken = X.copy()
    broken[1500, 3] = np.inf
    with pytest.raises(ValueError, match=r"NaN or Inf values in row\(s\) 1500"):
        AutoCalibration().fit_chunks([broken[:1000], broken[1000:]])


def test_the_sample_holds_distinct_rows_whatever_their_order_and_chunks():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 6))
    stream = np.concatenate([rows, rows[:100], rows[50:60]])  # 110 repeats
    whole = DistinctRowSample(1000, seed=2)
    whole.add(stream)
    assert len(whole.rows) == 300 and len(np.unique(whole.rows, axis=0)) == 300
    shuffled = DistinctRowSample(120, seed=2)
    for block in np.array_split(stream[rng.permutation(len(stream))], 7):
        shuffled.add(block)
    ordered = DistinctRowSample(120, seed=2)
    ordered.add(stream)
    np.testing.assert_array_equal(shuffled.rows, ordered.rows)
    assert len(np.unique(shuffled.rows, axis=0)) == 120
    other = DistinctRowSample(120, seed=3)
    other.add(stream)
    assert not np.array_equal(other.rows, ordered.rows)
    with pytest.raises(ValueError, match="expected rows of 6 values, got 5"):
        ordered.add(rows[:, :5])


def test_the_robin_hood_index_counts_how_unevenly_neighbour_places_are_shared():
    ring = np.stack([np.cos(np.arange(12) * np.pi / 6), np.sin(np.arange(12) * np.pi / 6)], axis=1)
    assert robin_hood_index(ring, np.zeros(2), neighbours=2) == 0.0  # each point: its two ring neighbours
    # a hub: a point every other point has among its 2 nearest, while k=2 places each are expected
    star = np.concatenate([ring[[0]], ring[[0]] + 0.01 * ring[1:7] @ np.eye(2)], axis=0)
    hits_of_hub = robin_hood_index(star, np.zeros(2), neighbours=2)
    assert 0 < hits_of_hub < 1
    assert robin_hood_index(ring[:1], np.zeros(2)) == 0.0  # no other row to neighbour


@pytest.mark.parametrize("make", [anisotropic, fine_tuned_like])
def test_the_file_records_the_choice_and_its_evidence(make, tmp_path):
    X = make(rows=600, dim=16)
    auto = create("auto", seed=2, threshold=0.2).fit(X, encoder=flowcore.calibration.file.EncoderProvenance(
        "default", "static-avg"))
    auto.save(tmp_path / "auto.flow")
    with safe_open(str(tmp_path / "auto.flow"), framework="pt") as reader:
        info = json.loads(reader.metadata()["info"])
    assert info["kind"] == "auto" and info["fit"]["choice"] == auto.choice
    assert info["fit"]["signals"]["hubness"] == auto.signals["hubness"] and info["settings"]["threshold"] == 0.2
    loaded = flowcore.load(tmp_path / "auto.flow")
    assert isinstance(loaded, AutoCalibration) and loaded.choice == auto.choice and loaded.signals == auto.signals
    assert loaded.reason == auto.reason and loaded.settings() == auto.settings()
    np.testing.assert_array_equal(loaded.transform(X), auto.transform(X))


def test_bad_settings_are_refused():
    for settings, message in (({"threshold": 0}, "threshold must be a number in"),
                              ({"variance_share": 1.5}, "variance_share must be a number in"),
                              ({"sample_rows": 0}, "sample_rows must be a positive integer"),
                              ({"neighbours": 2.5}, "neighbours must be a positive integer"),
                              ({"seed": "a"}, "seed must be an integer")):
        with pytest.raises(ValueError, match=message):
            AutoCalibration(**settings)
    with pytest.raises(ValueError, match="auto needs at least 2 rows, got 1"):
        AutoCalibration().fit(anisotropic(rows=1))
