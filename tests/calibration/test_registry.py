"""The one Calibrator protocol and its registry: every registered method fits, transforms, saves
and loads through `flowcore.load` the same way (one contract test over the registry), a file's
kind is its method's name, and unknown names, bad settings and files of other kinds are refused
clearly."""
import json

import numpy as np
import pytest
from safetensors import safe_open

import flowcore
import flowcore.calibration as calibration
from flowcore.calibration.file import (
    CalibratorFileError,
    EncoderProvenance,
    read_calibrator_file,
    write_calibrator_file,
)

SETTINGS = {"flow": {"config": "l2_d2_w32", "epochs": 1}, "whitening": {"power": 0.3, "keep": 5}, "abtt": {"k": 2},
            "auto": {"seed": 3, "threshold": 0.05}}
"""Small, non-default settings per method (the rest are fitted with their defaults)."""


def _anisotropic(rows=400, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) @ (rng.normal(size=(dim, dim)) * np.linspace(0.2, 4, dim)) + 5.0).astype(
        np.float32)


def _fit(name, X, encoder=None):
    calibrator = calibration.create(name, **SETTINGS.get(name, {}))
    options = {"show_progress_bar": False} if name == "flow" else {}
    return calibrator.fit(X, encoder=encoder, **options)


def test_the_registry_lists_every_method_once_by_the_name_its_class_carries():
    assert calibration.NAMES == ("none", "whitening", "flow", "center", "abtt", "zca", "auto")
    classes = [calibration.calibrator_class(name) for name in calibration.NAMES]
    assert [cls.name for cls in classes] == list(calibration.NAMES)
    assert len(set(classes)) == len(classes) and all(issubclass(cls, calibration.Calibrator) for cls in classes)
    assert flowcore.load is calibration.load and flowcore.Calibrator is calibration.Calibrator
    assert flowcore.FlowCalibrator is calibration.calibrator_class("flow")
    assert flowcore.Whitening is calibration.calibrator_class("whitening")
    assert flowcore.load is calibration.load
    with pytest.warns(DeprecationWarning, match="flowcore.PCAWhitening is now flowcore.Whitening"):
        assert flowcore.PCAWhitening is flowcore.Whitening
    with pytest.warns(DeprecationWarning, match="flowcore.load_calibrator is now flowcore.load"):
        assert flowcore.load_calibrator is flowcore.load


@pytest.mark.parametrize("name", calibration.NAMES)
def test_every_calibrator_fits_transforms_saves_and_loads_the_same_way(name, tmp_path):
    X = _anisotropic()
    provenance = EncoderProvenance("default", "mean")
    calibrator = _fit(name, X, encoder=provenance)
    calibrator.metadata = {"note": "kept"}
    Z = calibrator.transform(X)
    assert Z.dtype == np.float32 and Z.shape == (len(X), calibrator.output_dim) and np.isfinite(Z).all()
    assert calibrator.dim == X.shape[1] and calibrator.provenance == provenance and calibrator.source is None
    path = tmp_path / f"{name}.flow"
    calibrator.save(path)
    with safe_open(str(path), framework="pt") as reader:
        assert json.loads(reader.metadata()["info"])["kind"] == name  # the file's kind is the name
    loaded = flowcore.load(path)
    assert type(loaded) is type(calibrator) and loaded.name == name and loaded.source == path
    assert (loaded.dim, loaded.output_dim) == (calibrator.dim, calibrator.output_dim)
    assert loaded.provenance == provenance and loaded.metadata == {"note": "kept"}
    assert loaded.settings() == calibrator.settings()
    np.testing.assert_array_equal(loaded.transform(X), Z)
    assert type(calibrator).load(path).name == name  # the class's own load reads its kind too
    with pytest.raises(ValueError, match=r"row\(s\) 3"):
        loaded.transform(np.where(np.arange(len(X))[:, None] == 3, np.nan, X))


@pytest.mark.parametrize("name", calibration.NAMES)
def test_fit_without_an_encoder_keeps_no_provenance_and_refits_keep_it(name):
    X = _anisotropic(rows=200)
    calibrator = _fit(name, X)
    assert calibrator.provenance is None
    calibrator = _fit(name, X, encoder=EncoderProvenance("m", "cls"))
    with pytest.raises(ValueError, match="NaN or Inf"):
        calibrator.fit(np.full((10, X.shape[1]), np.nan), encoder=EncoderProvenance("other", "mean"))
    assert calibrator.provenance == EncoderProvenance("m", "cls")


def test_a_class_load_refuses_a_file_of_another_kind(tmp_path):
    X = _anisotropic(rows=200, dim=6)
    _fit("abtt", X).save(tmp_path / "abtt.flow")
    with pytest.raises(CalibratorFileError, match="abtt.flow: holds the abtt calibration, not flow; flowcore.load"):
        flowcore.FlowCalibrator.load(tmp_path / "abtt.flow")
    with pytest.raises(CalibratorFileError, match="holds the abtt calibration, not zca"):
        flowcore.ZCAWhitening.load(tmp_path / "abtt.flow")
    _fit("zca", X).save(tmp_path / "zca.flow")
    with pytest.raises(CalibratorFileError, match="holds the zca calibration, not whitening"):
        flowcore.Whitening.load(tmp_path / "zca.flow")  # a subclass in code, another method on disk


def test_a_flow_file_without_a_kind_is_a_flow(tmp_path):
    """Flow files written before kinds were recorded (format version 3) still load unchanged."""
    X = _anisotropic(rows=200, dim=6)
    _fit("flow", X).save(tmp_path / "new.flow")
    tensors, info = read_calibrator_file(tmp_path / "new.flow")
    del info["kind"]
    write_calibrator_file(tmp_path / "old.flow", tensors, info)
    old = flowcore.load(tmp_path / "old.flow")
    assert old.name == "flow"
    np.testing.assert_array_equal(old.transform(X), flowcore.load(tmp_path / "new.flow").transform(X))


@pytest.mark.parametrize("kind, now", [("pca-whitening", "whitening"), ("zca-whitening", "zca")])
def test_files_of_the_earlier_linear_kinds_are_refused_with_how_to_refit(kind, now, tmp_path):
    tensors, info = read_calibrator_file(_saved("whitening", tmp_path))
    write_calibrator_file(tmp_path / "old.flow", {name: tensors[name] for name in ("linear.mean", "linear.matrix")},
              {**info, "kind": kind, "settings": {}})
    with pytest.raises(CalibratorFileError, match=rf"old.flow: a '{kind}' calibrator from an earlier flowcore.*"
                                            rf"now '{now}': refit it \(`flowcore fit --calibration {now}`\)"):
        flowcore.load(tmp_path / "old.flow")


def _saved(name, folder):
    path = folder / f"{name}.flow"
    _fit(name, _anisotropic(rows=200, dim=6)).save(path)
    return path


def test_damaged_or_unknown_calibrator_files_are_refused_naming_the_file(tmp_path):
    tensors, info = read_calibrator_file(_saved("abtt", tmp_path))
    write_calibrator_file(tmp_path / "odd.flow", tensors, {**info, "kind": "cholesky"})
    with pytest.raises(CalibratorFileError, match="odd.flow: unknown calibrator kind 'cholesky'; this flowcore reads "
                                            "none, whitening, flow, center, abtt, zca, auto"):
        flowcore.load(tmp_path / "odd.flow")
    write_calibrator_file(tmp_path / "bad.flow", {"linear.mean": tensors["linear.mean"][:2],
                                      "linear.matrix": tensors["linear.matrix"]}, info)
    with pytest.raises(CalibratorFileError, match="bad.flow: abtt calibrator file whose header does not match its "
                                                  "tensors.*does not fit a matrix"):
        flowcore.load(tmp_path / "bad.flow")
    write_calibrator_file(tmp_path / "k.flow", tensors, {**info, "settings": {"k": -1}})
    with pytest.raises(CalibratorFileError, match="k.flow: abtt calibrator file whose header does not match its "
                                                  "tensors.*positive integer"):
        flowcore.load(tmp_path / "k.flow")
    tensors, info = read_calibrator_file(_saved("whitening", tmp_path))
    del tensors["linear.axes"]
    write_calibrator_file(tmp_path / "w.flow", tensors, info)
    with pytest.raises(CalibratorFileError, match="w.flow: whitening calibrator file whose header does not match its "
                                            "tensors: it holds no tensor linear.axes"):
        flowcore.load(tmp_path / "w.flow")
    with pytest.raises(CalibratorFileError, match="no such calibrator file"):
        flowcore.load(tmp_path / "missing.flow")


def test_unknown_names_and_bad_settings_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown calibration 'pca'; choose from none, whitening, flow, center, "
                                         "abtt, zca, auto"):
        calibration.create("pca")
    with pytest.raises(ValueError, match="calibration 'whitening' takes the settings keep, power, tolerance; not k"):
        calibration.create("whitening", k=3)
    with pytest.raises(ValueError, match=r"calibration 'center' takes the settings \(none\); not dim"):
        calibration.create("center", dim=3)
    assert calibration.setting_names("abtt") == ("k",)
    assert {"config", "recipe", "epochs", "seed"} <= set(calibration.setting_names("flow"))
    with pytest.raises(ValueError, match="unknown flow config 'huge'"):
        calibration.create("flow", config="huge")
    created = calibration.create("whitening", power=0.3, keep=128)
    assert created.settings() == {"keep": 128, "power": 0.3, "tolerance": 1e-8}
    with pytest.warns(DeprecationWarning, match=r"Whitening\(dim=k\) is now Whitening\(keep=k\)"):
        assert calibration.create("whitening", dim=64).settings()["keep"] == 64  # its earlier name


@pytest.mark.parametrize("name", [name for name in calibration.NAMES if name != "none"])
def test_an_unfitted_calibrator_says_so(name, tmp_path):
    calibrator = calibration.create(name)
    X = _anisotropic(rows=10)
    for use in (lambda: calibrator.transform(X), lambda: calibrator.dim, lambda: calibrator.save(tmp_path / "x")):
        with pytest.raises((ValueError, RuntimeError), match="not fitted"):
            use()


@pytest.mark.parametrize("name", calibration.NAMES)
def test_every_calibrator_takes_and_refuses_the_same_inputs(name):
    """What the flow accepts, every method accepts (a reversed view, a tensor that requires grad, no rows), and
    complex numbers are refused by every one, never cast to their real part."""
    import torch

    X = _anisotropic(rows=200)
    calibrator = _fit(name, X)
    expected = calibrator.transform(X[::-1].copy())
    np.testing.assert_array_equal(calibrator.transform(X[::-1]), expected)
    np.testing.assert_array_equal(calibrator.transform(torch.from_numpy(X).requires_grad_()),
                                  calibrator.transform(X))
    assert calibrator.transform(X[:0]).shape == (0, calibrator.output_dim)
    for complex_rows in (X.astype(np.complex64), torch.from_numpy(X.astype(np.complex64))):
        with pytest.raises(ValueError, match=r"X holds complex numbers \(.*complex64\); calibrators take real "
                                             "vectors"):
            calibrator.transform(complex_rows)


@pytest.mark.parametrize("rows, dim", [("two rows", None), ("rank 1", None), ("full", 1)])
def test_whitening_to_one_direction_saves_and_loads(tmp_path, rows, dim):
    rng = np.random.default_rng(0)
    X = {"two rows": rng.normal(size=(2, 8)), "rank 1": rng.normal(size=(50, 1)) * rng.normal(size=(1, 8)),
         "full": rng.normal(size=(50, 8))}[rows]
    whitening = flowcore.Whitening(keep=dim).fit(X)
    assert whitening.output_dim == 1
    whitening.save(tmp_path / "w.flow")
    np.testing.assert_array_equal(flowcore.load(tmp_path / "w.flow").transform(X), whitening.transform(X))
