"""Calibrator files from strangers: random bytes, truncated or damaged files, a pickle or torch.save
file, a header claiming huge tensors, NaN weights, a valid flow of another width. Each is refused
with a one-line `CalibratorFileError` naming the file, the header ones before safetensors reads any
tensor, and nothing in flowcore can run code from a file (no pickle, no remote code)."""
import ast
import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from faults_support import DIM, REPO, fitted_flow
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

import flowcore.calibration.file as calibrator_file
from flowcore import FlowCalibrator
from flowcore.calibration.file import CalibratorFileError
from flowcore.cli import main

from helpers.calibrator_files import rewritten


def refused(path) -> str:
    with pytest.raises(CalibratorFileError) as error:
        FlowCalibrator.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


@given(data=st.binary(max_size=400))
def test_random_bytes_are_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("random") / "model.flow"
    path.write_bytes(data)
    refused(path)


@given(cut=st.integers(0, 10**9), flip=st.integers(0, 10**9), bit=st.integers(0, 7),
       how=st.sampled_from(["cut", "flip"]))
def test_a_truncated_or_bit_flipped_flow_file_loads_unchanged_or_is_refused(tmp_path_factory, flow_path, cut, flip,
                                                                            bit, how):
    data = flow_path.read_bytes()
    if how == "cut":
        data = data[: cut % len(data)]
    else:
        position = flip % len(data)
        data = data[:position] + bytes([data[position] ^ (1 << bit)]) + data[position + 1:]
    path = tmp_path_factory.mktemp("damaged") / "model.flow"
    path.write_bytes(data)
    try:
        loaded = FlowCalibrator.load(path)
    except CalibratorFileError as error:
        assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
        return
    assert how == "flip"  # only a flip in the free-form JSON (not the weights: checksummed) can still load
    x = np.random.default_rng(0).normal(size=(4, DIM)).astype(np.float32)
    np.testing.assert_array_equal(loaded.transform(x), FlowCalibrator.load(flow_path).transform(x))


class _Trap:
    """Unpickling this would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_is_refused_as_a_pickle_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    (tmp_path / "model.flow").write_bytes(pickle.dumps({"flow": _Trap(marker)}, protocol=4))
    message = refused(tmp_path / "model.flow")
    assert "this is a Python pickle, not a calibrator file; flowcore never unpickles" in message
    assert not marker.exists()


def test_a_torch_save_file_is_refused_as_a_zip_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    torch.save({"weights": torch.zeros(3), "trap": _Trap(marker)}, tmp_path / "model.flow")
    assert "this is a zip archive (torch.save writes these)" in refused(tmp_path / "model.flow")
    assert not marker.exists()


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


@pytest.mark.parametrize("content, problem", [
    (safetensors_bytes({"flow.w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}},
                       bytes(16)), "tensor 'flow.w' claims bytes 0..4,000,000,000,000 but the file holds 16 bytes"),
    (safetensors_bytes({"flow.w": {"dtype": "F32", "shape": [10**6], "data_offsets": [0, 16]}}, bytes(16)),
     "tensor 'flow.w' of shape [1000000] needs 4,000,000 bytes but is given 16"),
    (safetensors_bytes({"flow.w": {"dtype": "PY_OBJECT", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)),
     "tensor 'flow.w' has an unknown dtype 'PY_OBJECT'"),
    (struct.pack("<Q", 2**60) + b"{}", "its header claims 1,152,921,504,606,846,976 bytes"),
    (struct.pack("<Q", 4) + b"\xff\xfe{}", "its header is not usable JSON: 'utf-8' codec can't decode"),
    (b"\x01\x02", "only 2 bytes"),
])
def test_a_header_that_lies_is_refused_before_safetensors_reads_it(tmp_path, monkeypatch, content, problem):
    def never(*args, **kwargs):
        raise AssertionError("safetensors was asked to read a file the header check should have refused")

    monkeypatch.setattr(calibrator_file, "safe_open", never)
    (tmp_path / "model.flow").write_bytes(content)
    assert problem in refused(tmp_path / "model.flow")


def test_nan_weights_are_refused(tmp_path, flow_path):
    calibrator = FlowCalibrator.load(flow_path)
    with torch.no_grad():
        next(calibrator.flow.parameters()).fill_(float("nan"))
    calibrator.save(tmp_path / "nan.flow")
    assert "the weights hold NaN/Inf" in refused(tmp_path / "nan.flow")


def test_a_valid_safetensors_file_that_is_not_a_flow_is_refused(tmp_path):
    save_file({"weight": torch.zeros(2, 2)}, str(tmp_path / "model.flow"))
    assert "not a flowcore calibrator file" in refused(tmp_path / "model.flow")


def test_a_valid_flow_of_another_width_is_refused_before_any_work(tmp_path, capsys):
    wide = fitted_flow(tmp_path, dim=2 * DIM)
    np.save(tmp_path / "in.npy", np.zeros((5, DIM), dtype=np.float32))
    assert main(["calibrate", "--calibrator", str(wide), "--embeddings", str(tmp_path / "in.npy"),
                 "--out", str(tmp_path / "out.npy")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"flowcore calibrate: error: {tmp_path / 'in.npy'} holds {DIM}-wide vectors but the calibrator expects "
        f"{2 * DIM}"]
    assert not (tmp_path / "out.npy").exists()


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def test_no_code_path_in_flowcore_can_run_code_from_a_file():
    """No unpickling module, no torch.load, no np.load(allow_pickle=True), no eval/exec, and
    `trust_remote_code=True` nowhere as a literal (export's load_model sets it only after its checks)."""
    found = []
    for path in sorted([*(REPO / "flowcore").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] + ([node.module] if isinstance(node, ast.ImportFrom)
                                                                 else [])
                found += [f"{where} imports {name}" for name in names if name and name.split(".")[0] in UNSAFE_MODULES]
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called in ("torch.load", "eval", "exec", "pickle.load", "pickle.loads"):
                    found.append(f"{where} calls {called}")
                for keyword in node.keywords:
                    if keyword.arg in ("allow_pickle", "trust_remote_code") and \
                            isinstance(keyword.value, ast.Constant) and keyword.value.value is True:
                        found.append(f"{where} passes {keyword.arg}=True")
    assert found == []



def fitted_linear(tmp_path: Path, kind: str, **settings) -> Path:
    from flowcore.calibration import create

    x = np.random.default_rng(3).normal(size=(200, DIM)) * np.arange(1, DIM + 1)
    path = tmp_path / f"{kind}.flow"
    create(kind, **settings).fit(x).save(path)
    return path


def relabel(kind: str):
    settings = {"center": {}, "abtt": {"k": None}, "zca": {"tolerance": 1e-8}, "none": {},
                "whitening": {"dim": None, "power": 0.5, "tolerance": 1e-8}}[kind]
    return lambda info: info.update(kind=kind, settings=settings)


@pytest.mark.parametrize("source, target", [("whitening", "center"), ("whitening", "abtt"), ("whitening", "zca"),
                                            ("zca", "whitening"), ("center", "abtt"), ("abtt", "center"),
                                            ("center", "none"), ("whitening", "flow")])
def test_a_relabelled_header_is_refused_naming_the_file(tmp_path, source, target):
    """The kind and settings are inside the checksum (format 4); a version-3 file, whose checksum covers the
    tensors only, is refused because its tensors are not what its header's method computes."""
    original = fitted_linear(tmp_path, source)
    edited = rewritten(original, tmp_path / "edited.flow", relabel(target) if target != "flow" else
                       lambda info: info.update(kind="flow"), rehash=False)
    assert "corrupted calibrator file (its weights or header do not match their recorded checksum)" in refused(edited)
    legacy = rewritten(original, tmp_path / "legacy.flow", relabel(target) if target != "flow" else
                       lambda info: info.update(kind="flow"), version="3")
    message = refused(legacy)
    assert "header does not match its tensors" in message or "does not match its recorded configuration" in message
    assert "'" + "dim" + "'" not in message.split(": ", 1)[1][:40]  # a reason in words, never a bare key


def test_a_legacy_file_of_each_kind_loads_as_it_was(tmp_path):
    x = np.random.default_rng(4).normal(size=(50, DIM))
    for kind in ("whitening", "zca", "center", "abtt", "auto", "none"):
        original = fitted_linear(tmp_path, kind)
        legacy = rewritten(original, tmp_path / f"legacy-{kind}.flow", lambda info: None, version="3")
        from flowcore import load

        np.testing.assert_array_equal(load(legacy).transform(x), load(original).transform(x))


def test_a_flow_header_declaring_ten_million_steps_is_refused_before_anything_is_built(tmp_path, flow_path):
    edited = rewritten(flow_path, tmp_path / "deep.flow", lambda info: info["glow"].update(depth=10**7))
    assert "declares 2 levels of 10000000 steps, but it holds the tensors of 4 steps" in refused(edited)
    huge = rewritten(flow_path, tmp_path / "wide.flow", lambda info: info["glow"].update(levels=10**7, depth=10**7))
    assert "holds the tensors of 4 steps" in refused(huge)


@pytest.mark.parametrize("header, problem", [
    ('{"__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"__metadata__": {"x": "y"}, "n": ' + "7" * 5000 + "}", "invalid number: an integer of more than 4,300 digits"),
    ('{"__metadata__": {"x": "y", "x": "z"}}', "duplicate key 'x'"),
])
def test_a_hostile_json_header_is_refused_in_one_line(tmp_path, header, problem):
    encoded = header.encode()
    (tmp_path / "model.flow").write_bytes(struct.pack("<Q", len(encoded)) + encoded)
    assert problem in refused(tmp_path / "model.flow")
    assert main(["calibrate", "--calibrator", str(tmp_path / "model.flow"), "--embeddings", "x.npy", "--out",
                 str(tmp_path / "o.npy")]) == 2


def test_hostile_info_json_is_refused_in_one_line(tmp_path, flow_path):
    from safetensors import safe_open

    with safe_open(str(flow_path), framework="pt") as reader:
        metadata, tensors = dict(reader.metadata()), {name: reader.get_tensor(name) for name in reader.keys()}
    for info, problem in (("[" * 100_000, "nested too deeply"), ('{"kind": ' + "9" * 5000 + "}", "4,300 digits")):
        save_file(tensors, str(tmp_path / "m.flow"), metadata={**metadata, "info": info})
        assert problem in refused(tmp_path / "m.flow")


def test_a_matrix_with_no_output_columns_is_refused_on_load(tmp_path):
    """A file whose (checksummed) matrix maps to 0 columns would fail mid-job: it is refused on load."""
    from safetensors import safe_open

    original = fitted_linear(tmp_path, "center")
    with safe_open(str(original), framework="pt") as reader:
        metadata, tensors = dict(reader.metadata()), {name: reader.get_tensor(name) for name in reader.keys()}
    tensors["linear.matrix"] = torch.zeros(DIM, 0, dtype=torch.float64)
    metadata["sha256"] = calibrator_file._digest(tensors, json.loads(metadata["info"]))
    save_file(tensors, str(tmp_path / "empty.flow"), metadata=metadata)
    assert "maps no vector to anything" in refused(tmp_path / "empty.flow")


def test_a_calibrator_path_that_is_a_link_loop_says_so(tmp_path):
    (tmp_path / "a.flow").symlink_to(tmp_path / "b.flow")
    (tmp_path / "b.flow").symlink_to(tmp_path / "a.flow")
    with pytest.raises(CalibratorFileError) as error:
        FlowCalibrator.load(tmp_path / "a.flow")
    assert str(error.value) == f"{tmp_path / 'a.flow'} is a symbolic link loop, not a file"
