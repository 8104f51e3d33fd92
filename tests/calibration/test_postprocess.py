"""The linear baselines (mean-centring, all-but-the-top, PCA/ZCA whitening): their math on data
with a known covariance, one file format with a "kind" (save/load round trips, dispatch, refusals),
and their names in `flowcore sts`."""
import numpy as np
import pytest

from flowcore import FlowCalibrator, Whitening
from flowcore.calibration.flow_file import EncoderProvenance, FlowFileError, load_flow, save_flow
from flowcore.calibration.postprocess import (
    AllButTheTop,
    MeanCentering,
    PCAWhitening,
    ZCAWhitening,
    load_calibrator,
)
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


def test_pca_whitening_is_bert_whitening_and_zca_is_its_symmetric_rotation():
    X, _ = _anisotropic()
    pca = PCAWhitening(dim=6).fit(X)
    np.testing.assert_allclose(pca.transform(X), Whitening(dim=6).fit(X).transform(X), atol=1e-6)
    zca = ZCAWhitening().fit(X)
    Z = zca.transform(X)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(X.shape[1]), atol=1e-3)
    np.testing.assert_allclose(zca.matrix, zca.matrix.T, atol=1e-10)  # W = U Λ^-1/2 Uᵀ is symmetric
    # ZCA keeps each coordinate beside its input coordinate: the diagonal dominates the cross-correlation
    cross = np.corrcoef(X.T, Z.T)[: X.shape[1], X.shape[1]:]
    assert (np.abs(np.diag(cross)) > np.abs(cross - np.diag(np.diag(cross))).max(axis=1)).all()


@pytest.mark.parametrize("calibrator", [MeanCentering(), AllButTheTop(k=3), PCAWhitening(dim=5), ZCAWhitening()],
                         ids=lambda c: c.kind)
def test_save_load_round_trip_keeps_kind_settings_provenance_and_output(tmp_path, calibrator):
    X, _ = _anisotropic(rows=300)
    calibrator.fit(X, encoder=EncoderProvenance("default", "mean"))
    calibrator.metadata = {"note": "kept"}
    path = tmp_path / f"{calibrator.kind}.flow"
    calibrator.save(path)
    _, info = load_flow(path)
    assert info["kind"] == calibrator.kind and info["settings"] == calibrator.settings()
    loaded = load_calibrator(path)
    assert type(loaded) is type(calibrator) and loaded.settings() == calibrator.settings()
    assert loaded.provenance == EncoderProvenance("default", "mean") and loaded.metadata == {"note": "kept"}
    np.testing.assert_array_equal(loaded.transform(X), calibrator.transform(X))
    assert type(calibrator).load(path).output_dim == calibrator.output_dim


def test_loading_dispatches_on_kind_and_refuses_the_wrong_one(tmp_path):
    X, _ = _anisotropic(rows=200, dim=6)
    flow_path = tmp_path / "model.flow"
    FlowCalibrator("l2_d2_w32", epochs=1).fit(X, progress=False).save(flow_path)
    assert isinstance(load_calibrator(flow_path), FlowCalibrator)  # a flow file records no kind: a flow
    with pytest.raises(FlowFileError, match="holds the flow calibrator, not center"):
        MeanCentering.load(flow_path)
    abtt_path = tmp_path / "abtt.flow"
    AllButTheTop(k=1).fit(X).save(abtt_path)
    with pytest.raises(FlowFileError, match="holds the abtt calibrator, not zca-whitening"):
        ZCAWhitening.load(abtt_path)
    tensors, info = load_flow(abtt_path)
    save_flow(tmp_path / "odd.flow", tensors, {**info, "kind": "cholesky"})
    with pytest.raises(FlowFileError, match="unknown calibrator kind 'cholesky'"):
        load_calibrator(tmp_path / "odd.flow")
    save_flow(tmp_path / "bad.flow", {"linear.mean": tensors["linear.mean"][:2],
                                      "linear.matrix": tensors["linear.matrix"]}, info)
    with pytest.raises(FlowFileError, match="does not fit a matrix"):
        load_calibrator(tmp_path / "bad.flow")


def test_bad_input_names_the_problem():
    X, _ = _anisotropic(rows=50, dim=4)
    with pytest.raises(ValueError, match="not fitted"):
        MeanCentering().transform(X)
    calibrator = ZCAWhitening().fit(X)
    with pytest.raises(ValueError, match="3 features per row but this zca-whitening calibrator was fitted on 4"):
        calibrator.transform(X[:, :3])
    X[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"row\(s\) 7"):
        MeanCentering().fit(X)


def test_sts_builds_and_labels_the_new_calibrations():
    settings = CalibrationSettings(abtt_k=2)
    assert isinstance(build_calibrator("center", settings), MeanCentering)
    abtt = build_calibrator("abtt", settings)
    assert isinstance(abtt, AllButTheTop) and abtt.k == 2
    assert isinstance(build_calibrator("zca", settings), ZCAWhitening)
    assert settings_record("abtt", settings) == {"abtt_k": 2}
    record = {"model": "default", "pooling": "mean", "calibration": "abtt", "fit_corpus": "target", "abtt_k": 2}
    assert row_label(record) == "default mean + abtt-2 (target)"
