"""The calibrations compared: whitening lifts an anisotropic representation; the factory builds
each calibration from its settings and records the settings that matter."""
import numpy as np
import pytest

from flowcore.calibration.auto import AutoCalibration
from flowcore.calibration.linear import Identity
from flowcore.calibration.whitening import Whitening
from flowcore.sts.baselines import (
    CALIBRATIONS,
    Baseline,
    CalibrationSettings,
    build_calibrator,
    prefitted,
    settings_record,
)
from flowcore.sts.data import STSPairs
from flowcore.sts.metrics import cosine_similarity, score_pairs


def test_whitening_lifts_an_anisotropic_representation():
    """Two high-variance nuisance directions plus a shared offset dominate raw cosine; the six
    unit-variance directions that carry the meaning are drowned until whitening equalises them."""
    rng = np.random.default_rng(3)
    n, dim = 400, 8
    gold = rng.uniform(0, 5, size=n)
    meaning = rng.normal(size=(n, dim))
    partner = meaning * (gold[:, None] / 5) + rng.normal(size=(n, dim)) * (1 - gold[:, None] / 5)
    left, right = meaning + 5, partner + 5
    left[:, :2], right[:, :2] = rng.normal(size=(n, 2)) * 10 + 5, rng.normal(size=(n, 2)) * 10 + 5
    pairs = STSPairs("STS-B", "test", [""] * n, [""] * n, gold, ["x"] * n)
    from flowcore import Whitening

    raw = score_pairs(cosine_similarity(left, right), pairs)["spearman"]
    whitening = Whitening().fit(np.concatenate([left, right]))
    calibrated = score_pairs(cosine_similarity(whitening.transform(left), whitening.transform(right)), pairs)
    assert raw < 20 and calibrated["spearman"] > raw + 40


def test_build_calibrator_and_settings_record():
    settings = CalibrationSettings(whitening_dim=4, whitening_power=0.3, flow_input="prewhiten", flow_epochs=2, seed=7)
    assert CALIBRATIONS == ("none", "whitening", "flow", "center", "abtt", "zca", "auto")
    none = build_calibrator("none", settings)
    assert isinstance(none, Baseline) and isinstance(none.calibrator, Identity)
    assert none.transform([[1, 2]]).dtype == np.float32
    whitening = build_calibrator("whitening", settings).calibrator
    assert isinstance(whitening, Whitening) and (whitening.keep, whitening.power) == (4, 0.3)
    flow = build_calibrator("flow", settings, show_progress_bar=False)
    assert flow.prewhiten and flow.show_progress_bar is False
    assert flow.calibrator.epochs == 2 and flow.calibrator.standardize  # the recipe's input, on whitened vectors
    with pytest.raises(ValueError, match="unknown calibration 'pca'"):
        build_calibrator("pca", settings)
    with pytest.raises(ValueError, match="unknown flow input 'whiten'; choose from standardize, prewhiten, raw"):
        build_calibrator("flow", CalibrationSettings(flow_input="whiten"))
    assert settings_record("none", settings) == {}
    assert settings_record("whitening", settings) == {"whitening_dim": 4, "whitening_power": 0.3}
    assert settings_record("flow", settings) == {"flow_config": "l2_d3_w32", "flow_recipe": "whitened",
                                                 "flow_epochs": 2, "flow_lr": 1e-3, "flow_batch_size": 32,
                                                 "flow_input": "prewhiten", "seed": 7, "flow_holdout": 0.1,
                                                 "flow_evaluations_per_epoch": 4, "flow_patience": 2}
    auto = build_calibrator("auto", settings).calibrator
    assert isinstance(auto, AutoCalibration) and auto.seed == 7 and settings_record("auto", settings) == {"seed": 7}
    assert settings_record("whitening", CalibrationSettings()) == {"whitening_dim": None, "whitening_power": 0.5}


def test_prewhiten_fits_the_flow_on_whitened_vectors():
    X = np.random.default_rng(0).normal(size=(300, 6)) @ np.random.default_rng(1).normal(size=(6, 6)) + 4
    settings = CalibrationSettings(flow_config="l2_d2_w32", flow_input="prewhiten", flow_epochs=1)
    baseline = build_calibrator("flow", settings, show_progress_bar=False).fit(X)
    whitened = Whitening().fit(X).transform(X)
    np.testing.assert_allclose(baseline.whitening.transform(X), whitened)
    np.testing.assert_array_equal(baseline.transform(X), baseline.calibrator.transform(whitened))
    assert baseline.report()["losses"] == baseline.calibrator.losses


@pytest.mark.parametrize("name, record", [
    ("whitening", {"whitening_dim": 3, "whitening_power": 0.25}), ("abtt", {"abtt_k": 2}), ("zca", {}),
    ("flow", {"flow_config": "l2_d2_w32", "flow_recipe": "whitened", "flow_epochs": 1})])
def test_any_calibrator_file_is_prefitted_with_its_settings(tmp_path, name, record):
    X = np.random.default_rng(0).normal(size=(300, 6)) @ np.random.default_rng(1).normal(size=(6, 6))
    from flowcore.calibration import create

    settings = {"whitening": {"keep": 3, "power": 0.25}, "abtt": {"k": 2}, "zca": {},
                "flow": {"config": "l2_d2_w32", "epochs": 1}}[name]
    calibrator = create(name, **settings)
    calibrator.fit(X, **({"show_progress_bar": False} if name == "flow" else {}))
    calibrator.save(tmp_path / "c.flow")
    given = prefitted(tmp_path / "c.flow")
    assert given.calibrator.name == name and given.source == str(tmp_path / "c.flow")
    assert given.record["flow_file"] == str(tmp_path / "c.flow")
    assert {key: given.record[key] for key in record} == record
    np.testing.assert_array_equal(given.calibrator.transform(X), calibrator.transform(X))
