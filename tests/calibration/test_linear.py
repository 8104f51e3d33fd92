"""The linear calibrators (identity, mean-centring, all-but-the-top, ZCA whitening): their math on
data with a known covariance, streamed fits, clear errors, and their names in `flowcore sts`
(whitening's own tests are in test_whitening.py; save/load round trips in test_registry.py)."""
import numpy as np
import pytest

from flowcore import AllButTheTop, MeanCentering, Whitening, ZCAWhitening
from flowcore.calibration.linear import Identity, principal_axes
from flowcore.calibration.moments import Moments
from flowcore.sts.baselines import CalibrationSettings, build_calibrator, settings_record
from flowcore.sts.report import row_label


def _anisotropic(rows=2000, dim=10, seed=0):
    """Rows with a large shared offset and variances 25, 16, 9, 4, 1, ... along a random rotation."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    scales = np.concatenate([[5.0, 4.0, 3.0, 2.0], np.full(dim - 4, 1.0)])
    return (rng.normal(size=(rows, dim)) * scales @ rotation.T + 7.0).astype(np.float32), rotation


def test_centering_removes_the_mean_and_nothing_else():
    X, _ = _anisotropic()
    Z = MeanCentering().fit(X).transform(X)
    np.testing.assert_allclose(Z.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(Z, X - X.astype(np.float64).mean(axis=0), atol=1e-5)


def test_all_but_the_top_removes_exactly_the_top_directions():
    X, rotation = _anisotropic()
    abtt = AllButTheTop(k=2).fit(X)
    Z = abtt.transform(X)
    assert Z.shape == X.shape
    top = rotation[:, :2]  # the planted directions of variance 25 and 16
    assert (np.var(Z @ top, axis=0) < 0.1).all()  # of variances 25 and 16, almost nothing is left (sampling error)
    assert (np.var(X @ rotation[:, 2:], axis=0) - np.var(Z @ rotation[:, 2:], axis=0) < 0.1).all()  # the rest stays
    variances = np.linalg.eigvalsh(np.cov(Z, rowvar=False))[::-1]
    assert 7 < variances[0] < 11 and variances[-2:].max() < 1e-6  # 9 (the third direction) is now the top


def test_all_but_the_top_defaults_to_d_over_100():
    assert AllButTheTop().removed(384) == 4 and AllButTheTop().removed(50) == 1 and AllButTheTop(7).removed(50) == 7
    with pytest.raises(ValueError, match="below the embedding width"):
        AllButTheTop(k=10).fit(_anisotropic()[0])
    with pytest.raises(ValueError, match="positive integer"):
        AllButTheTop(k=0)


def test_zca_is_the_symmetric_rotation_of_full_whitening():
    X, _ = _anisotropic()
    zca = ZCAWhitening().fit(X)
    Z = zca.transform(X)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(X.shape[1]), atol=1e-3)
    np.testing.assert_allclose(zca.matrix, zca.matrix.T, atol=1e-10)  # W = U Λ^-1/2 Uᵀ is symmetric
    # ZCA keeps each coordinate beside its input coordinate: the diagonal dominates the cross-correlation
    cross = np.corrcoef(X.T, Z.T)[: X.shape[1], X.shape[1]:]
    assert (np.abs(np.diag(cross)) > np.abs(cross - np.diag(np.diag(cross))).max(axis=1)).all()
    # a rotation of full whitening: the same lengths, so the same cosines
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), np.linalg.norm(Whitening().fit(X).transform(X), axis=1),
                               rtol=1e-5)


def test_principal_axes_are_sorted_orthonormal_and_drop_flat_directions():
    X, rotation = _anisotropic(rows=5000)
    X[:, -1] = 2.0  # a constant coordinate: no variance along it
    eigenvalues, axes = principal_axes(np.cov(X, rowvar=False))
    assert len(eigenvalues) == X.shape[1] - 1 and np.all(np.diff(eigenvalues) <= 0)
    np.testing.assert_allclose(axes.T @ axes, np.eye(len(eigenvalues)), atol=1e-12)
    with pytest.raises(ValueError, match="every row of the corpus is the same"):
        principal_axes(np.zeros((3, 3)))


@pytest.mark.parametrize("calibrator", [MeanCentering, lambda: AllButTheTop(k=2), ZCAWhitening],
                         ids=["center", "abtt", "zca"])
def test_streamed_fits_equal_the_in_memory_fit(calibrator):
    X, _ = _anisotropic(rows=3000)
    X = X.astype(np.float64) + 1e3
    in_memory = calibrator().fit(X)
    streamed = calibrator().fit_chunks(X[start:start + 700] for start in range(0, len(X), 700))
    merged = type(in_memory).from_moments(Moments.of(X[:1100]).merge(Moments.of(X[1100:])), **in_memory.settings())
    for fitted in (streamed, merged):
        assert fitted.rows == len(X) and fitted.settings() == in_memory.settings()
        np.testing.assert_allclose(fitted.mean, in_memory.mean, rtol=1e-12)
        np.testing.assert_allclose(fitted.matrix, in_memory.matrix, rtol=1e-8, atol=1e-10)


def test_the_identity_keeps_the_vectors_and_needs_no_fit():
    X, _ = _anisotropic(rows=20, dim=4)
    np.testing.assert_array_equal(Identity().transform(X), X)
    assert Identity().transform(X.astype(np.float64)).dtype == np.float32
    fitted = Identity().fit_chunks([X[:7], X[7:]])
    assert (fitted.dim, fitted.output_dim) == (4, 4)
    with pytest.raises(ValueError, match="3 features per row but this none calibrator was fitted on 4"):
        fitted.transform(X[:, :3])
    with pytest.raises(ValueError, match="no width until fitted"):
        Identity().dim
    broken = X.copy()
    broken[11, 0] = np.inf
    with pytest.raises(ValueError, match=r"row\(s\) 11"):
        Identity().fit_chunks([broken[:7], broken[7:]])


def test_bad_input_names_the_problem(monkeypatch):
    X, _ = _anisotropic(rows=50, dim=4)
    with pytest.raises(ValueError, match="not fitted"):
        MeanCentering().transform(X)
    calibrator = ZCAWhitening().fit(X)
    with pytest.raises(ValueError, match="3 features per row but this zca calibrator was fitted on 4"):
        calibrator.transform(X[:, :3])
    whole = calibrator.transform(X)
    monkeypatch.setattr("flowcore.defaults.TRANSFORM_CHUNK_ROWS", 8)  # mapped 8 rows at a time
    np.testing.assert_allclose(calibrator.transform(X), whole, rtol=1e-6)
    with pytest.raises(ValueError, match=r"row\(s\) 50 "):  # numbered across the chunks
        calibrator.transform(np.concatenate([X, np.full((1, 4), np.nan)]))
    X[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"row\(s\) 7"):
        MeanCentering().fit(X)
    with pytest.raises(ValueError, match="first bad row: 7"):
        AllButTheTop(k=1).fit_chunks([X[:5], X[5:]])
    with pytest.raises(ValueError, match="abtt needs at least 2 rows, got 1"):
        AllButTheTop(k=1).fit_chunks([X[:1]])


def test_sts_builds_and_labels_the_new_calibrations():
    settings = CalibrationSettings(abtt_k=2)
    assert isinstance(build_calibrator("center", settings).calibrator, MeanCentering)
    abtt = build_calibrator("abtt", settings).calibrator
    assert isinstance(abtt, AllButTheTop) and abtt.k == 2
    assert isinstance(build_calibrator("zca", settings).calibrator, ZCAWhitening)
    assert isinstance(build_calibrator("none", settings).calibrator, Identity)
    assert settings_record("abtt", settings) == {"abtt_k": 2}
    record = {"model": "default", "pooling": "mean", "calibration": "abtt", "fit_corpus": "target", "abtt_k": 2}
    assert row_label(record) == "default mean + abtt-2 (target)"
