"""flowcore.integrations.sentence_transformers on a tiny random BERT: the exported folder's
`SentenceTransformer(...).encode` equals flowcore's own path (Encoder + calibration) row by row."""
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402

import flowcore  # noqa: E402
from flowcore.calibration.file import CalibratorFileError  # noqa: E402
from flowcore.integrations import sentence_transformers as fst  # noqa: E402

from helpers.tiny_models import SENTENCE_WORDS, save_tiny_bert  # noqa: E402


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)




@pytest.fixture(scope="module")
def flow_file(bert, sentences, tmp_path_factory):
    encoder = flowcore.Encoder(bert, pooling="first-last-avg")
    calibrator = flowcore.FlowCalibrator("l2_d2_w32").fit(encoder.encode(sentences), encoder=encoder,
                                                          show_progress_bar=False)
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    calibrator.save(path)
    return path


@pytest.mark.parametrize("pooling", ["first-last-avg", "static-avg", "layers=1,2", "last2-avg", "mean", "cls"])
def test_pooling_matches_the_encoder(bert, sentences, tmp_path, pooling):
    out = fst.export(tmp_path / "st", model=bert, pooling=pooling, onnx=False)  # the ONNX backend: its own tests
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    stock = pooling in ("mean", "cls")
    assert fst.needs_trust_remote_code(out) is not stock
    assert modules[1]["type"].endswith(".Pooling" if stock else ".LayerPooling")
    got = fst.load_model(out).encode(sentences[:40])
    want = flowcore.Encoder(bert, pooling=pooling).encode(sentences[:40])
    assert cosines(got, want).min() > 0.9999
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_flow_folder_matches_flowcore(bert, sentences, flow_file, tmp_path):
    out = fst.export(tmp_path / "st", flow_file, normalize=True)
    types = [entry["type"] for entry in json.loads((tmp_path / "st" / "modules.json").read_text())]
    assert [t.rsplit(".", 1)[1] for t in types] == ["Transformer", "LayerPooling", "FlowModule", "Normalize"]
    assert (tmp_path / "st" / "2_FlowModule" / fst.FLOW_FILE).is_file()
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(out)  # v6: a class outside sentence_transformers.* needs the flag, local folders too
    model = SentenceTransformer(out, trust_remote_code=True)
    assert model.get_embedding_dimension() == 16
    got = model.encode(sentences[:60])
    calibrator = flowcore.FlowCalibrator.load(flow_file)
    want = unit(calibrator.transform(flowcore.Encoder(bert).encode(sentences[:60])))
    assert cosines(got, want).min() > 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # the loaded folder saves and loads again, unchanged
    model.save(str(tmp_path / "again"))
    np.testing.assert_allclose(fst.load_model(tmp_path / "again").encode(sentences[:60]), got, atol=1e-6)


def test_flow_with_explicit_layers(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, pooling="layers=0,3")
    calibrator = flowcore.FlowCalibrator("l2_d2_w32").fit(encoder.encode(sentences), encoder=encoder,
                                                          show_progress_bar=False)
    out = fst.export(tmp_path / "st", calibrator, layers=[0, -1])  # the same hidden states, another spelling
    got = fst.load_model(out).encode(sentences[:40])
    assert cosines(got, calibrator.transform(encoder.encode(sentences[:40]))).min() > 0.9999


def test_linear_calibrations_are_stock_dense_and_load_without_flowcore(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, pooling="mean")
    (tmp_path / "texts.txt").write_text("\n".join(sentences[:50]))
    script = ("import sys; sys.modules['flowcore'] = None\n"  # flowcore is not importable in this process
              "import numpy as np\n"
              "from sentence_transformers import SentenceTransformer\n"
              "texts = open(sys.argv[1]).read().splitlines()\n"
              "for folder in sys.argv[2:]:\n"
              "    np.save(folder + '.npy', SentenceTransformer(folder, device='cpu').encode(texts))\n")
    calibrators = {"whitening": flowcore.Whitening(), "whitening-6": flowcore.Whitening(keep=6),
                   "tempered": flowcore.Whitening(power=0.25, keep=8), "zca": flowcore.ZCAWhitening(),
                   "center": flowcore.MeanCentering(), "abtt": flowcore.AllButTheTop(k=2),
                   "none": flowcore.calibration.create("none")}
    folders = []
    for label, calibrator in calibrators.items():
        calibrator.fit(encoder.encode(sentences), encoder=encoder)  # records the encoder: export needs no model
        folders.append(fst.export(tmp_path / label, calibrator, pooling="mean", normalize=True, onnx=False))
        types = [entry["type"] for entry in json.loads((tmp_path / label / "modules.json").read_text())]
        assert all(t.startswith("sentence_transformers.") for t in types), types
        dense = [] if label == "none" else ["Dense"]
        assert [t.rsplit(".", 1)[1] for t in types] == ["Transformer", "Pooling", *dense, "Normalize"]
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "texts.txt"), *folders],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    for calibrator, folder in zip(calibrators.values(), folders):
        got = np.load(folder + ".npy")
        want = unit(calibrator.transform(encoder.encode(sentences[:50])))
        assert got.shape == (50, calibrator.output_dim)
        assert cosines(got, want).min() > 0.9999


def test_whitening_after_a_flowcore_pooling(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert)  # first-last-avg: a LayerPooling, so the folder needs the flag
    whitening = flowcore.Whitening().fit(encoder.encode(sentences))
    out = fst.export(tmp_path / "st", whitening, model=bert)
    assert fst.needs_trust_remote_code(out)
    got = fst.load_model(out).encode(sentences[:40])
    assert cosines(got, whitening.transform(encoder.encode(sentences[:40]))).min() > 0.9999


@pytest.mark.parametrize("calibrator", [flowcore.Whitening(keep=3), flowcore.Whitening(power=0.2),
                                        flowcore.AllButTheTop(k=1), flowcore.MeanCentering(), flowcore.ZCAWhitening()],
                         ids=lambda calibrator: calibrator.name)
def test_linear_dense_weights(calibrator):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5)) + 3.0
    calibrator.fit(X)
    dense = fst.linear_dense(calibrator)
    assert (dense.in_features, dense.out_features, type(dense.activation_function).__name__) == (
        5, calibrator.output_dim, "Identity")
    import torch
    z = dense({"sentence_embedding": torch.tensor(X, dtype=torch.float32)})["sentence_embedding"]
    np.testing.assert_allclose(z.detach().numpy(), calibrator.transform(X), atol=1e-4)
    with pytest.raises(ValueError, match="not fitted"):
        fst.linear_dense(type(calibrator)())
    with pytest.raises(TypeError, match="a flow calibrator is not linear"):
        fst.linear_dense(flowcore.FlowCalibrator())


def test_errors(bert, sentences, flow_file, tmp_path):
    with pytest.raises(CalibratorFileError, match="no such calibrator file"):
        fst.export(tmp_path / "a", tmp_path / "missing.flow")
    with pytest.raises(ValueError, match="fitted on 'first-last-avg' pooling, not 'mean'"):
        fst.export(tmp_path / "b", flow_file, pooling="mean")
    other = save_tiny_bert(tmp_path / "other", SENTENCE_WORDS, hidden_size=16, num_layers=3, seed=1)
    with pytest.raises(ValueError, match="fitted on embeddings from encoder"):
        fst.export(tmp_path / "c", flow_file, model=other)
    foreign = flowcore.Encoder(bert).encode(sentences).copy()  # a copy: vectors whose encoder is unknown
    raw = flowcore.FlowCalibrator("l2_d2_w32").fit(foreign, show_progress_bar=False)
    with pytest.raises(ValueError, match="records no encoder"):
        fst.export(tmp_path / "d", raw)
    wide = save_tiny_bert(tmp_path / "wide", SENTENCE_WORDS, hidden_size=24, num_layers=3)
    with pytest.raises(ValueError, match="24-wide vectors but the flow calibrator expects 16"):
        fst.export(tmp_path / "e", raw, model=wide)
    whitening = flowcore.Whitening().fit(foreign)
    with pytest.raises(ValueError, match="the whitening calibrator records no encoder"):
        fst.export(tmp_path / "g", whitening)
    with pytest.raises(ValueError, match="24-wide vectors but the whitening calibrator expects 16"):
        fst.export(tmp_path / "h", whitening, model=wide)
    with pytest.raises(TypeError, match="FlowModule takes a fitted calibrator or a calibrator file path, not dict"):
        fst.FlowModule({})
    with pytest.raises(ValueError, match="unknown pooling"):
        fst.export(tmp_path / "f", model=bert, pooling="max")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        fst.export(tmp_path / "full", flow_file)


def test_damaged_folders_are_refused(flow_file, tmp_path):
    out = fst.export(tmp_path / "st", flow_file)
    modules_json = tmp_path / "st" / "modules.json"
    modules = json.loads(modules_json.read_text())
    modules[2]["type"] = "somewhere.else.Module"
    modules_json.write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="neither sentence-transformers' nor flowcore's: somewhere.else.Module"):
        fst.load_model(out)
    modules[2]["type"] = "flowcore.integrations.sentence_transformers.FlowModule"
    modules_json.write_text(json.dumps(modules))
    (tmp_path / "st" / "2_FlowModule" / fst.FLOW_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="no flow.safetensors"):
        fst.load_model(out)
    with pytest.raises(FileNotFoundError, match="no modules.json"):
        fst.load_model(tmp_path)


def test_load_model_refuses_remote_code(flow_file, tmp_path):
    out = fst.export(tmp_path / "st", flow_file)
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    transformer = tmp_path / "st" / modules[0]["path"]
    config_path = transformer / "config.json"
    pristine = config_path.read_text()
    config = json.loads(pristine)
    config["auto_map"] = {"AutoModel": "evil.EvilModel"}
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json has an 'auto_map' key \(auto_map\)"):
        fst.load_model(out)
    config_path.write_text(pristine)
    tokenizer_path = transformer / "tokenizer_config.json"
    tokenizer = json.loads(tokenizer_path.read_text())
    tokenizer["nested"] = [{"auto_map": {"AutoTokenizer": ["evil.Tokenizer", None]}}]
    tokenizer_path.write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match=r"tokenizer_config.json has an 'auto_map' key \(nested\[0\]\.auto_map\)"):
        fst.load_model(out)


def test_load_model_refuses_a_foreign_dense_activation(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert)
    out = fst.export(tmp_path / "st", flowcore.Whitening().fit(encoder.encode(sentences)), model=bert)
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    config_path = tmp_path / "st" / modules[2]["path"] / "config.json"
    config = json.loads(config_path.read_text())
    assert config["activation_function"] == "torch.nn.modules.linear.Identity"  # what export writes
    fst.load_model(out)
    config["activation_function"] = "os.system"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json has 'activation_function' 'os.system', not torch's "):
        fst.load_model(out)


def test_export_refuses_a_model_with_auto_map(tmp_path):
    bert = save_tiny_bert(tmp_path / "remote", SENTENCE_WORDS, hidden_size=16, num_layers=3)
    config_path = tmp_path / "remote" / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'auto_map'.*flowcore never runs remote code"):
        fst.export(tmp_path / "st", model=bert, pooling="mean")
    assert not (tmp_path / "st").exists()
