"""The sentence-transformers folder's onnx/model.onnx: `SentenceTransformer(folder, backend="onnx")` (and
`load_model(folder, backend="onnx")`) loads it, applies the calibration after the pooling and agrees with the
torch backend, for stock and flowcore poolings, linear calibrations and the flow. sentence-transformers' ONNX
backend imports optimum, which cannot be installed beside transformers 5: `helpers.optimum_stand_in` does
what its ORTModelForFeatureExtraction does."""
import json

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

import flowcore  # noqa: E402
from flowcore.integrations import sentence_transformers as fst  # noqa: E402

from helpers import optimum_stand_in  # noqa: E402


def _agree(got, want):
    assert got.shape == want.shape
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("pooling, method", [("mean", "whitening"), ("first-last-avg", "flow"),
                                             ("static-avg", "abtt"), ("cls", "none")])
def test_onnx_backend_agrees_with_torch(bert, sentences, tmp_path, monkeypatch, pooling, method):
    encoder = flowcore.Encoder(bert, pooling=pooling)
    settings = {"flow": {"config": "l2_d2_w32", "epochs": 1}}.get(method, {})
    calibrator = flowcore.calibration.create(method, **settings).fit(encoder.encode(sentences), encoder=encoder)
    out = fst.export(tmp_path / "st", calibrator, normalize=True)
    graph = onnx.load(str(tmp_path / "st" / fst.ONNX_GRAPH))
    assert [node.name for node in graph.graph.output] == ["last_hidden_state"]
    assert {node.name for node in graph.graph.input} == {"input_ids", "attention_mask", "token_type_ids"}
    optimum_stand_in.install(monkeypatch)
    stock = pooling in ("mean", "cls") and method != "flow"
    load = SentenceTransformer if stock else fst.load_model
    torch_model, onnx_model = load(out), load(out, backend="onnx")
    assert type(onnx_model[0].model).__name__ == "ORTModelForFeatureExtraction"
    texts = sentences[:40]
    got = onnx_model.encode(texts)
    _agree(got, torch_model.encode(texts))
    want = calibrator.transform(encoder.encode(texts))
    _agree(got, want / np.linalg.norm(want, axis=1, keepdims=True))


def test_no_graph_without_the_extra_or_when_declined(bert, tmp_path, monkeypatch):
    fst.export(tmp_path / "declined", model=bert, pooling="mean", onnx=False)
    assert not (tmp_path / "declined" / "onnx").exists()
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else
                        find_spec(name, *a))
    fst.export(tmp_path / "without", model=bert, pooling="mean")
    assert not (tmp_path / "without" / "onnx").exists()
    assert json.loads((tmp_path / "without" / "modules.json").read_text())[0]["path"] == ""
