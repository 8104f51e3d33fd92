"""flowcore.integrations.onnx on tiny random BERTs: onnxruntime (CPU) on the exported graph, fed by the
exported tokenizer.json alone, against flowcore's own path (Encoder + the calibrator's transform), for every
calibration method, every pooling and awkward inputs; the calibrator-only graph; the folder's files."""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import onnxruntime  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import flowcore  # noqa: E402
from flowcore.integrations import onnx as flowcore_onnx  # noqa: E402

from helpers.tiny_models import SENTENCE_WORDS, save_tiny_bert  # noqa: E402

MIN_COSINE, MAX_ABS = 0.99999, 1e-4
METHODS = {
    "whitening": lambda: flowcore.Whitening(),
    "whitening-k": lambda: flowcore.Whitening(keep=6),
    "tempered": lambda: flowcore.Whitening(power=0.25),
    "abtt": lambda: flowcore.AllButTheTop(k=2),
    "zca": lambda: flowcore.ZCAWhitening(),
    "center": lambda: flowcore.MeanCentering(),
    "none": lambda: flowcore.calibration.create("none"),
    "auto": lambda: flowcore.calibration.create("auto"),
    "flow": lambda: flowcore.FlowCalibrator("l2_d2_w32", epochs=2),
}


def run_graph(folder, texts: list[str]) -> np.ndarray:
    """What a deployment does: tokenizer.json alone, then onnxruntime on model.onnx."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    encoded = tokenizer.encode_batch(texts)
    columns = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
    feed = {node.name: np.array([getattr(e, columns[node.name]) for e in encoded], dtype=np.int64)
            for node in session.get_inputs()}
    return session.run(None, feed)[0]


def assert_parity(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    assert got.dtype == np.float32 and got.shape == want.shape
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    worst, largest = float(cosines.min()), float(np.abs(got - want).max())
    assert worst >= MIN_COSINE and largest <= MAX_ABS, (worst, largest)
    return worst, largest




@pytest.fixture(scope="module")
def held_out() -> list[str]:
    rng = np.random.default_rng(1)
    return [" ".join(rng.choice(SENTENCE_WORDS, size=int(rng.integers(1, 14)))) for _ in range(40)]


@pytest.mark.parametrize("method", METHODS)
def test_every_method(bert, sentences, held_out, tmp_path, method):
    encoder = flowcore.Encoder(bert)  # first-last-avg
    calibrator = METHODS[method]().fit(encoder.encode(sentences), encoder=encoder)
    folder = tmp_path / "onnx"
    flowcore_onnx.export(folder, calibrator)
    assert_parity(run_graph(folder, held_out), calibrator.transform(encoder.encode(held_out)))
    calibrator_only = tmp_path / "calibrator"
    flowcore_onnx.export(calibrator_only, calibrator, calibrator_only=True, normalize=True)
    session = onnxruntime.InferenceSession(str(calibrator_only / "calibrator.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape[1]) for i in session.get_inputs()] == [("embeddings", 16)]
    assert session.get_outputs()[0].name == "calibrated"
    X = encoder.encode(held_out)
    want = calibrator.transform(X)
    assert_parity(session.run(None, {"embeddings": X})[0], want / np.linalg.norm(want, axis=1, keepdims=True))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last2-avg", "static-avg", "layers=0,2"])
def test_every_pooling(bert, sentences, held_out, tmp_path, pooling):
    """The flow after each pooling, but after `cls` none: a random BERT's first-token vectors barely vary (std
    0.002), so any calibration fitted on them magnifies the encoder's own float32 rounding a hundredfold."""
    encoder = flowcore.Encoder(bert, pooling=pooling)
    calibrator = (flowcore.calibration.create("none") if pooling == "cls"
                  else flowcore.FlowCalibrator("l2_d2_w32", epochs=1))
    calibrator.fit(encoder.encode(sentences), encoder=encoder)
    flowcore_onnx.export(tmp_path / "onnx", calibrator, normalize=True)
    want = calibrator.transform(encoder.encode(held_out))
    assert_parity(run_graph(tmp_path / "onnx", held_out), want / np.linalg.norm(want, axis=1, keepdims=True))


def test_static_avg_runs_no_transformer_layer(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, pooling="static-avg")
    flowcore_onnx.export(tmp_path / "onnx", model=bert, pooling="static-avg")
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx"))
    assert not [node for node in graph.graph.node if node.op_type in ("MatMul", "Softmax")]
    assert_parity(run_graph(tmp_path / "onnx", sentences[:20]), encoder.encode(sentences[:20]))


def test_awkward_inputs(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, max_length=12)
    flow = flowcore.FlowCalibrator("l2_d2_w32", epochs=1).fit(encoder.encode(sentences), encoder=encoder,
                                                              show_progress_bar=False)
    flowcore_onnx.export(tmp_path / "onnx", flow, max_length=12)
    long = " ".join(SENTENCE_WORDS * 3)  # 57 words: cut at 12 tokens
    batches = {"one sentence": [sentences[0]], "a 1-token sentence": ["dog"], "an empty text": [""],
               "truncated at max length": [long, long + " extra", sentences[1]],
               "batch of 257": (sentences * 2)[:256] + [long]}
    for label, texts in batches.items():
        with pytest.warns(UserWarning, match="truncated") if long in texts else _no_warning():
            want = flow.transform(encoder.encode(texts))
        got = run_graph(tmp_path / "onnx", texts)
        assert len(got) == len(texts), label
        assert_parity(got, want)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_folder(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, pooling="mean")
    whitening = flowcore.Whitening(keep=8).fit(encoder.encode(sentences), encoder=encoder)
    whitening.save(tmp_path / "w.flow")
    out = flowcore_onnx.export(tmp_path / "onnx", tmp_path / "w.flow", normalize=True, max_length=20)
    folder = tmp_path / "onnx"
    assert out == str(folder)
    assert {"model.onnx", "tokenizer.json", "flowcore.json"} <= {path.name for path in folder.iterdir()}
    assert not [path.name for path in folder.iterdir() if path.name.endswith(".tmp")]
    manifest = json.loads((folder / "flowcore.json").read_text())
    assert manifest["opset"] == flowcore_onnx.OPSET and manifest["pooling"] == "mean"
    assert manifest["max_length"] == 20 and manifest["normalize"] is True and manifest["quantize"] is None
    assert manifest["encoder"]["model"] == bert and manifest["encoder"]["config_sha256"]
    assert manifest["calibrator"]["method"] == "whitening" and manifest["calibrator"]["output_dim"] == 8
    from flowcore._fs import file_sha256
    assert manifest["calibrator"]["sha256"] == file_sha256(tmp_path / "w.flow")
    assert manifest["calibrator"]["file"] == str(tmp_path / "w.flow")
    assert list(manifest["inputs"]) == ["input_ids", "attention_mask", "token_type_ids"]
    assert manifest["output"] == {"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 8]}
    graph = onnx.load(str(folder / "model.onnx"))
    assert [(entry.domain, entry.version) for entry in graph.opset_import if entry.domain == ""] == [("", 18)]
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    for node in session.get_inputs():
        assert node.type == "tensor(int64)" and [isinstance(size, str) for size in node.shape] == [True, True]
    assert session.get_outputs()[0].type == "tensor(float)" and session.get_outputs()[0].shape[1] == 8
    # the tokenizer loads both ways and tokenizes as the encoder does
    hf = AutoTokenizer.from_pretrained(folder)
    texts = ["a man plays the red guitar", "dog"]
    assert hf(texts)["input_ids"] == encoder._loaded.tokenizer(texts)["input_ids"]
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(" ".join(SENTENCE_WORDS * 2)).ids[-1] == \
        hf(" ".join(SENTENCE_WORDS * 2), truncation=True, max_length=20)["input_ids"][-1]
    assert len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(" ".join(SENTENCE_WORDS * 2)).ids) == 20


def test_int8(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert, pooling="mean")
    whitening = flowcore.Whitening().fit(encoder.encode(sentences), encoder=encoder)
    flowcore_onnx.export(tmp_path / "float", whitening)
    flowcore_onnx.export(tmp_path / "int8", whitening, quantize="int8")
    graph = onnx.load(str(tmp_path / "int8" / "model.onnx"))
    operators = {node.op_type for node in graph.graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= operators  # the encoder's matrix products
    assert any(node.op_type == "MatMul" and "calibration.matrix" in node.input for node in graph.graph.node)
    manifest = json.loads((tmp_path / "int8" / "flowcore.json").read_text())
    from flowcore.text.quantize import cpu_flags, weight_type
    assert manifest["quantize"] == "int8" and manifest["quantized_weights"] == weight_type(cpu_flags())
    got, float32 = run_graph(tmp_path / "int8", sentences[:50]), run_graph(tmp_path / "float", sentences[:50])
    assert not np.array_equal(got, float32)
    cosines = (got * float32).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(float32, axis=1))
    assert cosines.min() > 0.9  # close, not equal: docs/benchmarks.md states the STS cost


def test_errors(bert, sentences, tmp_path):
    encoder = flowcore.Encoder(bert)
    flow = flowcore.FlowCalibrator("l2_d2_w32", epochs=1).fit(encoder.encode(sentences), encoder=encoder,
                                                              show_progress_bar=False)
    with pytest.raises(ValueError, match="fitted on 'first-last-avg' pooling, not 'mean'"):
        flowcore_onnx.export(tmp_path / "a", flow, pooling="mean")
    wide = save_tiny_bert(tmp_path / "wide", SENTENCE_WORDS, hidden_size=24, num_layers=3)
    raw = flowcore.Whitening().fit(encoder.encode(sentences).copy())  # a copy: its encoder is unknown
    with pytest.raises(ValueError, match="24-wide vectors but the whitening calibrator expects 16"):
        flowcore_onnx.export(tmp_path / "b", raw, model=wide)
    with pytest.raises(ValueError, match="records no encoder"):
        flowcore_onnx.export(tmp_path / "c", raw)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="exists and is not a folder"):
        flowcore_onnx.export(tmp_path / "file", flow)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        flowcore_onnx.export(tmp_path / "full", flow)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="symbolic link"):
        flowcore_onnx.export(tmp_path / "link", flow)
    with pytest.raises(ValueError, match="quantize must be None or one of int8"):
        flowcore_onnx.export(tmp_path / "d", flow, quantize="int4")
    with pytest.raises(ValueError, match="give a calibrator"):
        flowcore_onnx.export(tmp_path / "e", calibrator_only=True)
    with pytest.raises(ValueError, match="a calibrator-only graph has nothing to quantise"):
        flowcore_onnx.export(tmp_path / "f", flow, calibrator_only=True, quantize="int8")
    assert not any((tmp_path / name).exists() for name in "abcdef")


def test_cli(bert, sentences, tmp_path, capsys):
    from flowcore.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    flow = tmp_path / "model.flow"
    assert main(["fit", "--input", str(corpus), "--model", bert, "--out", str(flow), "--calibration", "flow",
                 "--config", "l2_d2_w32", "--epochs", "1", "--quiet"]) == 0
    out = tmp_path / "onnx"
    assert main(["export", "--calibrator", str(flow), "--format", "onnx", "--out", str(out), "--quiet"]) == 0
    assert f"wrote {out}/model.onnx" in capsys.readouterr().out
    texts = sentences[:30]
    assert main(["calibrate", "--calibrator", str(flow), "--input", str(corpus), "--out", str(tmp_path / "z.npy"),
                 "--quiet"]) == 0
    assert_parity(run_graph(out, texts), np.load(tmp_path / "z.npy")[:30])
    only = tmp_path / "only"
    assert main(["export", "--calibrator", str(flow), "--format", "onnx", "--calibrator-only", "--out", str(only),
                 "--quiet"]) == 0
    assert sorted(path.name for path in only.iterdir()) == ["calibrator.onnx", "flowcore.json"]


@pytest.mark.parametrize("argv, message", [
    (["--format", "st", "--quantize", "int8"], "--calibrator-only and --quantize apply to --format onnx"),
    (["--calibrator-only"], "--calibrator-only and --quantize apply to --format onnx"),
    (["--format", "onnx", "--pooling", "mean"], "fitted on 'first-last-avg' pooling, not 'mean'"),
    (["--format", "onnx", "--calibrator-only", "--pooling", "mean"], "--model and --pooling do not apply"),
])
def test_cli_errors(bert, sentences, tmp_path, capsys, argv, message):
    from flowcore.cli import main

    encoder = flowcore.Encoder(bert)
    flowcore.Whitening().fit(encoder.encode(sentences), encoder=encoder).save(tmp_path / "w.flow")
    assert main(["export", "--calibrator", str(tmp_path / "w.flow"), *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowcore export: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_file_as_the_output(tmp_path, capsys):
    from flowcore.cli import main

    (tmp_path / "taken").write_text("x")
    assert main(["export", "--calibrator", "m.flow", "--format", "onnx", "--out", str(tmp_path / "taken")]) == 2
    assert "is an existing file; give a folder" in capsys.readouterr().err


def test_a_missing_extra_is_named(monkeypatch, tmp_path, capsys):
    import sys

    from flowcore.cli import main

    monkeypatch.setitem(sys.modules, "onnxscript", None)
    assert main(["export", "--calibrator", "m.flow", "--format", "onnx", "--out", str(tmp_path / "out")]) == 2
    assert "needs onnxscript, which is not installed: pip install 'flowcore[onnx]'" in capsys.readouterr().err
