"""Calibrator files: the typed encoder provenance, files of the previous format version (read as they are), and one
clear error for files of any other format version."""
import json

import numpy as np
import pytest
from safetensors import safe_open

import flowcore
from flowcore.calibration.file import FORMAT_VERSION, CalibratorFileError, EncoderProvenance

from helpers.calibrator_files import rewritten


@pytest.fixture(scope="module")
def fitted():
    data = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    return data, flowcore.FlowCalibrator(config="l2_d2_w32", batch_size=64).fit(data, show_progress_bar=False)



class _FakeEncoder:
    model_id = "/models/bert"
    pooling = "first-last-avg"


def test_fit_records_the_encoder_as_typed_provenance(fitted, tmp_path):
    data, _ = fitted
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32", batch_size=64).fit(data, show_progress_bar=False,
                                                                                encoder=_FakeEncoder())
    assert calibrator.provenance == EncoderProvenance("/models/bert", "first-last-avg")
    calibrator.save(tmp_path / "m.flow")
    with safe_open(str(tmp_path / "m.flow"), framework="pt") as reader:
        header = reader.metadata()
    assert header["format_version"] == str(FORMAT_VERSION) == "4"
    assert json.loads(header["info"])["encoder"] == {"model": "/models/bert", "pooling": "first-last-avg"}
    assert flowcore.FlowCalibrator.load(tmp_path / "m.flow").provenance == calibrator.provenance


def test_a_failed_refit_keeps_the_old_provenance(fitted):
    data, _ = fitted
    calibrator = flowcore.FlowCalibrator(config="l2_d2_w32", batch_size=64).fit(data, show_progress_bar=False,
                                                                                encoder=_FakeEncoder())
    with pytest.raises(ValueError, match="NaN or Inf"):
        calibrator.fit(np.full((10, 8), np.nan), show_progress_bar=False, encoder=EncoderProvenance("other", "cls"))
    assert calibrator.provenance == EncoderProvenance("/models/bert", "first-last-avg")


@pytest.mark.parametrize("version", ["1", "2", "9"])
def test_a_file_of_another_format_version_says_how_to_refit(fitted, tmp_path, version):
    """Versions 1 and 2 (earlier flowcore releases) and unknown ones: one error naming the file."""
    _, calibrator = fitted
    calibrator.save(tmp_path / "current.flow")
    rewritten(tmp_path / "current.flow", tmp_path / f"v{version}.flow", lambda info: None, version, rehash=False)
    message = (rf"v{version}.flow: calibrator file format version {version}; this flowcore reads versions 3, 4. "
               r"Refit it with this flowcore \(`flowcore fit`\)")
    for load in (flowcore.load, flowcore.FlowCalibrator.load):
        with pytest.raises(CalibratorFileError, match=message):
            load(tmp_path / f"v{version}.flow")


@pytest.mark.parametrize("kind", ["flow", "whitening"])
def test_a_version_3_file_still_loads_and_maps_alike(fitted, tmp_path, kind):
    """Files written before the checksum covered the header (version 3) load, with their contents checked."""
    data, flow = fitted
    calibrator = flow if kind == "flow" else flowcore.Whitening(keep=4).fit(data)
    calibrator.save(tmp_path / "current.flow")
    rewritten(tmp_path / "current.flow", tmp_path / "v3.flow", lambda info: None, "3")
    loaded = flowcore.load(tmp_path / "v3.flow")
    assert loaded.name == kind
    np.testing.assert_array_equal(loaded.transform(data[:5]), calibrator.transform(data[:5]))


def test_the_checksum_covers_the_header(fitted, tmp_path):
    """A version 4 header edited after the fit (here: the recorded encoder) is refused, naming the file."""
    _, calibrator = fitted
    calibrator.save(tmp_path / "m.flow")
    rewritten(tmp_path / "m.flow", tmp_path / "edited.flow",
              lambda info: info.update(encoder={"model": "other", "pooling": "cls"}), rehash=False)
    with pytest.raises(CalibratorFileError,
                       match=r"edited.flow: corrupted calibrator file \(its weights or header do not match"):
        flowcore.load(tmp_path / "edited.flow")


def test_a_valid_file_whose_header_length_starts_like_a_pickle_loads(fitted, tmp_path):
    """A safetensors header length whose low byte is 0x80 (a pickle's first byte) is not a pickle."""
    data, calibrator = fitted
    for pad in range(256):
        calibrator.metadata = {"pad": "x" * pad}
        calibrator.save(tmp_path / "m.flow")
        if (tmp_path / "m.flow").read_bytes()[0] == 0x80:
            break
    assert (tmp_path / "m.flow").read_bytes()[0] == 0x80
    loaded = flowcore.FlowCalibrator.load(tmp_path / "m.flow")
    np.testing.assert_array_equal(loaded.transform(data[:5]), calibrator.transform(data[:5]))


def test_a_damaged_header_is_refused_naming_the_file(fitted, tmp_path):
    _, calibrator = fitted
    calibrator.save(tmp_path / "m.flow")
    data = (tmp_path / "m.flow").read_bytes()
    (tmp_path / "m.flow").write_bytes(data[:40])
    with pytest.raises(CalibratorFileError, match=r"m.flow: not a readable calibrator file: its header claims"):
        flowcore.FlowCalibrator.load(tmp_path / "m.flow")
