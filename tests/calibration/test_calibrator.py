"""FlowCalibrator: fit/transform/inverse, chunking, streaming, files that cannot be misread."""
import json

import numpy as np
import pytest

import flowcore
from flowcore.calibration.file import CalibratorFileError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(600, 10)) @ rng.normal(size=(10, 10)) + 2).astype(np.float32)


@pytest.fixture(scope="module")
def calibrator(data):
    # two full epochs (no held-out selection), so that the losses of both are recorded
    return flowcore.FlowCalibrator(config="l2_d2_w32", recipe="standardized", epochs=2, batch_size=64, lr=1e-3,
                                   seed=3).fit(data, show_progress_bar=False)


def test_transform_inverse_and_types(calibrator, data):
    Z = calibrator.transform(data)
    assert Z.dtype == np.float32 and Z.shape == data.shape
    np.testing.assert_allclose(calibrator.inverse_transform(Z), data, atol=1e-4, rtol=1e-4)
    assert calibrator.dim == 10 and len(calibrator.losses) == 2


def test_chunked_and_streaming_transform_match(calibrator, data):
    whole = calibrator.transform(data)
    # a GEMM's rounding may depend on how many rows it sees, so chunked output is close, not equal
    np.testing.assert_allclose(calibrator.transform(data, chunk_rows=7), whole, rtol=1e-5, atol=1e-5)
    streamed = list(calibrator.transform_iter(data[i : i + 100] for i in range(0, 600, 100)))
    assert len(streamed) == 6
    np.testing.assert_allclose(np.concatenate(streamed), whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(streamed[2], calibrator.transform(data[200:300]))


def test_same_seed_same_model(data, calibrator):
    again = flowcore.FlowCalibrator(config="l2_d2_w32", recipe="standardized", epochs=2, batch_size=64, lr=1e-3,
                                    seed=3).fit(data, show_progress_bar=False)
    np.testing.assert_array_equal(again.transform(data), calibrator.transform(data))
    default = flowcore.FlowCalibrator(config="l2_d2_w32", epochs=2, batch_size=64, seed=3)
    np.testing.assert_array_equal(default.fit(data, show_progress_bar=False).transform(data),
                                  default.fit(data, show_progress_bar=False).transform(data))


def test_save_load_round_trip(calibrator, data, tmp_path):
    from flowcore.calibration.file import EncoderProvenance

    calibrator.metadata = {"corpus": "nli", "sentences": 500}
    calibrator.provenance = EncoderProvenance("default", "mean")
    path = tmp_path / "model.flow"
    calibrator.save(path)
    loaded = flowcore.FlowCalibrator.load(path)
    np.testing.assert_array_equal(loaded.transform(data), calibrator.transform(data))
    assert loaded.metadata == {"corpus": "nli", "sentences": 500}
    assert loaded.provenance == EncoderProvenance("default", "mean")
    assert loaded.config == "l2_d2_w32" and loaded.losses == calibrator.losses
    assert all(bool(m.initialized) for m in loaded.flow.modules() if hasattr(m, "initialized"))
    assert b"pickle" not in path.read_bytes()[:200]


@pytest.mark.parametrize("coupling,permutation,recipe", [("additive", "lu", "whitened"), ("affine", "reverse", "paper"),
                                                       ("additive", "reverse", "standardized")])
def test_the_bert_flow_code_options_fit_save_and_load(data, tmp_path, coupling, permutation, recipe):
    """The paper's code's coupling and permutation options: the Glow is built with them, recorded in
    the file, and loaded back to the same model."""
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32", recipe=recipe, epochs=1, batch_size=64, seed=1,
                                         coupling=coupling, permutation=permutation).fit(data, show_progress_bar=False)
    step = calibrator.flow.levels[0][0]
    assert step.coupling.kind == coupling and type(step.mixing).__name__ == {
        "lu": "LULinear", "reverse": "ReversePermutation"}[permutation]
    Z = calibrator.transform(data)
    np.testing.assert_allclose(calibrator.inverse_transform(Z), data, atol=1e-3, rtol=1e-3)
    calibrator.save(tmp_path / "variant.flow")
    loaded = flowcore.load(tmp_path / "variant.flow")
    assert (loaded.coupling, loaded.permutation) == (coupling, permutation)
    np.testing.assert_array_equal(loaded.transform(data), Z)


def test_unknown_or_incompatible_flow_options_are_refused():
    with pytest.raises(ValueError, match="unknown flow coupling 'spline'; choose one of affine, additive"):
        flowcore.FlowCalibrator(coupling="spline")
    with pytest.raises(ValueError, match="unknown flow permutation 'shuffle'; choose one of lu, reverse"):
        flowcore.FlowCalibrator(permutation="shuffle")
    with pytest.raises(ValueError, match="'whitened' recipe starts the flow at whitening through its LU 1x1"):
        flowcore.FlowCalibrator(permutation="reverse")


def test_bad_inputs_are_refused(calibrator, data):
    with pytest.raises(ValueError, match="has 9 features per row but the flow expects 10"):
        calibrator.transform(data[:, :9])
    bad = data.copy()
    bad[123, 0] = np.inf
    with pytest.raises(ValueError, match=r"row\(s\) 123"):
        calibrator.transform(bad, chunk_rows=50)
    with pytest.raises(ValueError, match="must be 2-D"):
        calibrator.transform(data[0])
    with pytest.raises(ValueError, match="at least 2 are needed"):
        flowcore.FlowCalibrator().fit(data[:1])
    with pytest.raises(ValueError, match="unknown flow config"):
        flowcore.FlowCalibrator(config="big")
    with pytest.raises(RuntimeError, match="not fitted yet"):
        flowcore.FlowCalibrator().transform(data)
    with pytest.raises(ValueError, match="must be a numeric array"):
        calibrator.transform([["a"] * 10])


def test_damaged_files_are_named(calibrator, tmp_path):
    path = tmp_path / "model.flow"
    calibrator.save(path)
    blob = path.read_bytes()

    truncated = tmp_path / "truncated.flow"
    truncated.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CalibratorFileError, match="truncated.flow: not a readable calibrator file"):
        flowcore.FlowCalibrator.load(truncated)

    corrupted = tmp_path / "corrupted.flow"
    flipped = bytearray(blob)
    flipped[-10] ^= 0xFF
    corrupted.write_bytes(bytes(flipped))
    with pytest.raises(CalibratorFileError, match="corrupted.flow: corrupted calibrator file"):
        flowcore.FlowCalibrator.load(corrupted)

    with pytest.raises(CalibratorFileError, match="missing.flow: no such calibrator file"):
        flowcore.FlowCalibrator.load(tmp_path / "missing.flow")

    from flowcore.calibration.file import read_calibrator_file, write_calibrator_file
    tensors, info = read_calibrator_file(path)
    info["glow"]["dim"] = 12
    mismatched = tmp_path / "mismatched.flow"
    write_calibrator_file(mismatched, tensors, info)
    with pytest.raises(CalibratorFileError,
                       match="mismatched.flow: flow file does not match its recorded configuration") as raised:
        flowcore.FlowCalibrator.load(mismatched)
    message = str(raised.value)
    assert "\n" not in message and "tensor flow.levels.0.0" in message and "refit" in message  # one line, the first
    info["glow"]["dim"] = tensors["flow.levels.0.0.actnorm.loc"].shape[0]  # a tensor too many, then one too few
    extra = {**tensors, "flow.levels.0.0.mixing.lower": tensors["flow.levels.0.0.mixing.lu"].clone()}
    for changed, expected in ((extra, "tensor flow.levels.0.0.mixing.lower is not part of the recorded configuration"),
                              ({k: v for k, v in tensors.items() if not k.endswith("0.0.actnorm.logs")},
                               "needs a tensor flow.levels.0.0.actnorm.logs, which the file lacks")):
        write_calibrator_file(mismatched, changed, info)
        with pytest.raises(CalibratorFileError, match=expected):
            flowcore.FlowCalibrator.load(mismatched)

    from safetensors.torch import save_file
    foreign = tmp_path / "foreign.flow"
    save_file({"w": tensors["flow.levels.0.0.actnorm.loc"]}, str(foreign), metadata={"info": json.dumps(info)})
    with pytest.raises(CalibratorFileError, match="foreign.flow: not a flowcore calibrator file"):
        flowcore.FlowCalibrator.load(foreign)


@pytest.mark.parametrize("standardize", [True, False])
def test_raw_and_standardized_inputs_round_trip(data, standardize, tmp_path):
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32", batch_size=64, standardize=standardize).fit(
        data, show_progress_bar=False)
    Z = calibrator.transform(data)
    np.testing.assert_allclose(calibrator.inverse_transform(Z), data, atol=2e-4, rtol=1e-4)
    calibrator.save(tmp_path / "m.flow")
    loaded = flowcore.FlowCalibrator.load(tmp_path / "m.flow")
    assert loaded.standardize is standardize
    np.testing.assert_array_equal(loaded.transform(data), Z)


def test_constant_coordinates_bypass_the_flow_instead_of_diverging():
    """Mean-pooled all-MiniLM-L6-v2 has coordinates constant to 1e-32; on such data the flow must
    train without NaN and leave them alone, while the others are calibrated."""
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(2000, 12)) @ rng.normal(size=(12, 12)) + 0.3).astype(np.float32)
    X[:, 4] = -0.0625 + rng.normal(size=2000).astype(np.float32) * 1e-32
    X[:, 9] = 0.5
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32", batch_size=32).fit(X, show_progress_bar=False)
    assert calibrator.flow.dim == 10 and calibrator.dim == 12
    assert all(np.isfinite(calibrator.losses))
    Z = calibrator.transform(X)
    assert np.isfinite(Z).all()
    np.testing.assert_allclose(Z[:, [4, 9]], 0.0, atol=1e-6)
    varying = [i for i in range(12) if i not in (4, 9)]
    assert np.abs(Z[:, varying].std(0) - 1).max() < 0.3
    np.testing.assert_allclose(calibrator.inverse_transform(Z), X, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="no coordinate of the data varies"):
        flowcore.FlowCalibrator().fit(np.ones((10, 4), dtype=np.float32))


def test_saved_file_is_readable_by_others(calibrator, tmp_path):
    import os
    import stat

    path = tmp_path / "shared.flow"
    calibrator.save(path)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
