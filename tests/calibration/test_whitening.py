"""Whitening: zero mean, identity covariance, the paper's W = U·Λ^(-1/2), reduction to k dims, and
tempered whitening W = U·Λ^(-γ) (γ = ½ full whitening, γ = 0 centring's cosines), in memory and streamed."""
import numpy as np
import pytest

from flowcore import MeanCentering, Whitening
from flowcore.calibration.moments import Moments


def _anisotropic(rows=500, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)) * np.linspace(0.1, 5.0, dim)
    return (rng.normal(size=(rows, dim)) @ mixing + 3.0).astype(np.float32)


def test_whitened_fit_data_has_zero_mean_and_identity_covariance():
    X = _anisotropic()
    Z = Whitening().fit(X).transform(X)
    assert Z.dtype == np.float32 and Z.shape == X.shape
    np.testing.assert_allclose(Z.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(X.shape[1]), atol=1e-3)


def test_matches_the_bert_whitening_formula_up_to_column_signs():
    X = _anisotropic().astype(np.float64)
    mu = X.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(np.cov((X - mu).T))
    reference = (X - mu) @ (u @ np.diag(1 / np.sqrt(s)))[:, :5]
    ours = Whitening(keep=5).fit(X).transform(X)
    signs = np.sign((reference * ours).sum(axis=0))
    np.testing.assert_allclose(ours * signs, reference, rtol=1e-3, atol=1e-3)


def test_dimension_reduction_keeps_the_largest_variance_directions():
    X = _anisotropic()
    whitening = Whitening(keep=4).fit(X)
    Z = whitening.transform(X[:50])
    assert Z.shape == (50, 4)
    assert np.all(np.diff(whitening.eigenvalues) <= 0)
    full = np.linalg.eigvalsh(np.cov(X.astype(np.float64), rowvar=False))[::-1]
    np.testing.assert_allclose(whitening.eigenvalues, full[:4], rtol=1e-6)


def test_directions_without_variance_are_dropped():
    """Like mean-pooled MiniLM, whose LayerNorm leaves coordinates constant to 1e-32."""
    X = np.full((40, 10), 0.5, dtype=np.float64)
    X[:, :3] = np.random.default_rng(1).normal(size=(40, 3))
    X[:, 5] += np.random.default_rng(2).normal(size=40) * 1e-30
    whitening = Whitening().fit(X)
    Z = whitening.transform(X)
    assert whitening.output_dim == 3 and Z.shape == (40, 3) and np.isfinite(Z).all()
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(3), atol=1e-3)
    assert Whitening(keep=2).fit(X).output_dim == 2
    with pytest.raises(ValueError, match="every row of the corpus is the same"):
        Whitening().fit(np.ones((5, 4)))


def test_bad_input_is_reported_clearly():
    X = _anisotropic(rows=20, dim=6)
    with pytest.raises(ValueError, match="not fitted"):
        Whitening().transform(X)
    with pytest.raises(ValueError, match="whitening needs at least 2 rows, got 1"):
        Whitening().fit(X[:1])
    with pytest.raises(ValueError, match="whitening cannot keep 7 directions of 6-wide vectors"):
        Whitening(keep=7).fit(X)
    broken = X.copy()
    broken[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN or Inf values in row\(s\) 3"):
        Whitening().fit(broken)
    with pytest.raises(ValueError, match="5 features per row but this whitening calibrator was fitted on 6"):
        Whitening().fit(X).transform(X[:, :5])
    with pytest.raises(ValueError, match="2-D"):
        Whitening().fit(X[0])
    with pytest.raises(ValueError, match="2-D"):
        Whitening().fit(X).transform(X[0])


@pytest.mark.parametrize("settings, message", [
    ({"keep": 0}, "keep must be a positive integer"), ({"keep": 2.5}, "keep must be a positive integer"),
    ({"power": -0.1}, "power must be a number from 0"), ({"power": 1.5}, "power must be a number from 0"),
    ({"power": float("nan")}, "power must be a number from 0"), ({"power": "half"}, "power must be a number"),
    ({"tolerance": 1.0}, "tolerance must be a number in"),
])
def test_bad_settings_are_refused_clearly(settings, message):
    with pytest.raises(ValueError, match=message):
        Whitening(**settings)


def _cosines(Z: np.ndarray) -> np.ndarray:
    unit = Z.astype(np.float64) / np.linalg.norm(Z.astype(np.float64), axis=1, keepdims=True)
    return unit @ unit.T


def test_power_one_half_is_full_whitening():
    X = _anisotropic().astype(np.float64)
    mu = X.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(X - mu, rowvar=False))
    reference = eigenvectors / np.sqrt(eigenvalues)  # BERT-whitening's W, columns in ascending order
    ours = Whitening(power=0.5).fit(X)
    assert Whitening().power == 0.5 and ours.settings()["power"] == 0.5
    signs = np.sign((ours.matrix * reference[:, ::-1]).sum(axis=0))
    np.testing.assert_allclose(ours.matrix * signs, reference[:, ::-1], rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(_cosines(ours.transform(X)), _cosines(Whitening().fit(X).transform(X)), atol=1e-6)
    np.testing.assert_allclose(np.cov(ours.transform(X), rowvar=False), np.eye(X.shape[1]), atol=1e-4)


def test_power_zero_only_centres_and_rotates():
    X = _anisotropic().astype(np.float64)
    rotated = Whitening(power=0).fit(X)
    centred = MeanCentering().fit(X)
    np.testing.assert_allclose(rotated.matrix.T @ rotated.matrix, np.eye(X.shape[1]), atol=1e-12)  # a rotation
    np.testing.assert_allclose(np.linalg.norm(rotated.transform(X), axis=1),
                               np.linalg.norm(centred.transform(X), axis=1), rtol=1e-6)
    np.testing.assert_allclose(_cosines(rotated.transform(X)), _cosines(centred.transform(X)), atol=1e-6)


def test_tempered_whitening_leaves_the_spectrum_at_the_power_one_minus_two_gamma():
    """Var along the i-th axis after W = U Λ^-γ is λ_i^(1-2γ): γ between 0 and ½ shrinks the
    dominant directions less than full whitening."""
    X = _anisotropic(rows=4000).astype(np.float64)
    tempered = Whitening(power=0.3, keep=7).fit(X)
    Z = tempered.transform(X).astype(np.float64)
    assert Z.shape == (len(X), 7)
    np.testing.assert_allclose(np.var(Z, axis=0, ddof=1), tempered.eigenvalues ** 0.4, rtol=1e-4)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.diag(tempered.eigenvalues ** 0.4), atol=1e-3)


@pytest.mark.parametrize("power", [0.5, 0.3, 0.0])
def test_streaming_fit_equals_the_in_memory_fit(power):
    """fit_chunks / from_moments: the same μ, Λ and W (up to column signs) from O(d²) statistics."""
    X = _anisotropic(rows=2000, dim=12).astype(np.float64) + 1e3
    in_memory = Whitening(keep=8, power=power).fit(X)
    streamed = Whitening(keep=8, power=power).fit_chunks(X[start:start + 300] for start in range(0, len(X), 300))
    merged = Whitening.from_moments(Moments.of(X[:700]).merge(Moments.of(X[700:])), keep=8, power=power)
    for fitted in (streamed, merged):
        assert (fitted.rows, fitted.rank, fitted.output_dim) == (2000, 12, 8)
        np.testing.assert_allclose(fitted.mean, in_memory.mean, rtol=1e-12)
        np.testing.assert_allclose(fitted.eigenvalues, in_memory.eigenvalues, rtol=1e-10)
        signs = np.sign((fitted.matrix * in_memory.matrix).sum(axis=0))
        np.testing.assert_allclose(fitted.matrix * signs, in_memory.matrix, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(_cosines(fitted.transform(X[:50])), _cosines(in_memory.transform(X[:50])),
                                   atol=1e-6)


def test_streaming_fit_reports_rank_and_refuses_bad_chunks():
    X = np.random.default_rng(3).normal(size=(100, 6))
    X[:, 4] = 2.0  # a constant coordinate: below the eigenvalue floor
    fitted = Whitening().fit_chunks([X[:50], X[50:]])
    assert fitted.rank == 5 and fitted.output_dim == 5
    bad = X.copy()
    bad[73, 0] = np.nan
    with pytest.raises(ValueError, match="first bad row: 73"):
        Whitening().fit_chunks([bad[:50], bad[50:]])
    with pytest.raises(ValueError, match="at least 2 rows"):
        Whitening().fit_chunks([X[:1]])
    with pytest.raises(ValueError, match="whitening cannot keep 7 directions of 6-wide vectors"):
        Whitening(keep=7).fit_chunks([X])
