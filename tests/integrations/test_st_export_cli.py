"""`flowcore export`: a calibrator file or a whitening corpus in, a sentence-transformers folder out."""
import json

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402

import flowcore  # noqa: E402
from flowcore.cli import main  # noqa: E402
from flowcore.integrations.sentence_transformers import load_model  # noqa: E402

from helpers.tiny_models import SENTENCE_WORDS, save_tiny_bert  # noqa: E402


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    bert = save_tiny_bert(root / "bert", SENTENCE_WORDS, hidden_size=16, num_layers=3)
    rng = np.random.default_rng(2)
    sentences = [" ".join(rng.choice(SENTENCE_WORDS, size=int(rng.integers(2, 10)))) for _ in range(300)]
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    flow = root / "model.flow"
    assert main(["fit", "--input", str(corpus), "--model", bert, "--pooling", "static-avg", "--out", str(flow),
                 "--calibration", "flow", "--config", "l2_d2_w32"]) == 0
    return bert, sentences, corpus, flow


def test_export_flow_end_to_end(setup, tmp_path, capsys):
    bert, sentences, _, flow = setup
    out = tmp_path / "st"
    # encoder and pooling: the flow's
    assert main(["export", "--calibrator", str(flow), "--out", str(out), "--normalize"]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    got = SentenceTransformer(str(out), trust_remote_code=True).encode(sentences[:50])
    vectors = flowcore.Encoder(bert, pooling="static-avg").encode(sentences[:50])
    want = flowcore.FlowCalibrator.load(flow).transform(vectors)
    assert cosines(got, want).min() > 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_export_whitening_end_to_end(setup, tmp_path, capsys):
    bert, sentences, corpus, _ = setup
    out = tmp_path / "st"
    assert main(["export", "--whitening", str(corpus), "--whitening-dim", "8", "--model", bert, "--pooling", "mean",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "whitening to 8 dims fitted on 300 sentences" in printed and "trust_remote_code" not in printed
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types)
    got = SentenceTransformer(str(out)).encode(sentences[:50])
    encoder = flowcore.Encoder(bert, pooling="mean")
    want = flowcore.Whitening(keep=8).fit(encoder.encode(sentences)).transform(encoder.encode(sentences[:50]))
    assert got.shape == (50, 8) and cosines(got, want).min() > 0.9999


@pytest.mark.parametrize("method", [["abtt", "--abtt-k", "2"],
                                    ["whitening", "--whitening-power", "0.25", "--whitening-dim", "8"]],
                         ids=lambda method: method[0])
def test_export_a_fitted_linear_file_as_a_stock_dense(setup, tmp_path, capsys, method):
    bert, sentences, corpus, _ = setup
    fitted = tmp_path / "linear.flow"
    assert main(["fit", "--input", str(corpus), "--model", bert, "--pooling", "mean", "--calibration", *method, "--out",
                 str(fitted)]) == 0
    out = tmp_path / "st"
    assert main(["export", "--calibrator", str(fitted), "--out", str(out)]) == 0  # encoder and pooling: the file's
    printed = capsys.readouterr().out
    assert f"({method[0]} {fitted})" in printed and "trust_remote_code" not in printed
    types = [entry["type"].rsplit(".", 1)[1] for entry in json.loads((out / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Dense"]
    got = SentenceTransformer(str(out)).encode(sentences[:30])
    want = flowcore.load(fitted).transform(flowcore.Encoder(bert, pooling="mean").encode(sentences[:30]))
    assert got.shape == want.shape and cosines(got, want).min() > 0.9999


def test_export_tempered_whitening(setup, tmp_path, capsys):
    bert, sentences, corpus, _ = setup
    out = tmp_path / "st"
    assert main(["export", "--whitening", str(corpus), "--whitening-power", "0.25", "--model", bert, "--pooling",
                 "mean", "--out", str(out)]) == 0
    capsys.readouterr()
    encoder = flowcore.Encoder(bert, pooling="mean")
    want = flowcore.Whitening(power=0.25).fit(encoder.encode(sentences)).transform(encoder.encode(sentences[:20]))
    assert cosines(SentenceTransformer(str(out)).encode(sentences[:20]), want).min() > 0.9999


def test_export_whitening_default_pooling(setup, tmp_path, capsys):
    bert, sentences, corpus, _ = setup
    out = tmp_path / "st"
    assert main(["export", "--whitening", str(corpus), "--model", bert, "--out", str(out)]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    assert [e["type"].rsplit(".", 1)[1] for e in json.loads((out / "modules.json").read_text())][1] == "LayerPooling"
    encoder = flowcore.Encoder(bert)  # first-last-avg
    want = flowcore.Whitening().fit(encoder.encode(sentences)).transform(encoder.encode(sentences[:20]))
    got = load_model(out).encode(sentences[:20])
    assert got.shape == want.shape and cosines(got, want).min() > 0.9999


@pytest.mark.parametrize("argv, message", [
    (["--calibrator", "{root}/missing.flow"], "missing.flow: no such calibrator file"),
    (["--calibrator", "{flow}", "--pooling", "mean"], "fitted on 'static-avg' pooling, not 'mean'"),
    (["--calibrator", "{flow}", "--model", "{root}/nowhere"], "model folder {root}/nowhere does not exist"),
    (["--calibrator", "{flow}", "--whitening-dim", "4"], "apply to --whitening, not to --calibrator"),
    (["--calibrator", "{flow}", "--whitening-power", "0.3"], "apply to --whitening, not to --calibrator"),
    (["--whitening", "{corpus}", "--whitening-power", "3", "--model", "{bert}"], "whitening power must be a number"),
    (["--whitening", "{root}/empty.txt", "--model", "{bert}"], "needs at least 2 usable sentences"),
])
def test_export_errors(setup, tmp_path, capsys, argv, message):
    bert, _, corpus, flow = setup
    root = corpus.parent
    (root / "empty.txt").write_text("")
    fill = dict(root=root, flow=flow, bert=bert, corpus=corpus)
    argv = [part.format(**fill) for part in argv]
    assert main(["export", *argv, "--out", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowcore export: error: ") and err.count("\n") == 1, err
    assert message.format(**fill) in err
    assert not (tmp_path / "st").exists()


def test_export_refuses_a_non_empty_folder(setup, tmp_path, capsys):
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "keep.txt").write_text("mine")
    assert main(["export", "--calibrator", str(setup[3]), "--out", str(tmp_path / "st")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_export_whitening_reports_rejected_rows(setup, tmp_path, capsys):
    bert, sentences, _, _ = setup
    corpus = tmp_path / "rejects.jsonl"
    lines = [json.dumps({"text": text}) for text in sentences[:100]]
    lines[3:3] = ["", "{not json"]
    corpus.write_text("\n".join(lines) + "\n")
    assert main(["export", "--whitening", str(corpus), "--model", bert, "--pooling", "mean",
                 "--out", str(tmp_path / "st")]) == 0
    captured = capsys.readouterr()
    assert f"{corpus}: skipped 2 unusable row(s) (1 empty line, 1 broken JSON); first at row 3" in captured.err
    assert "fitted on 100 sentences" in captured.out and "warning" not in captured.err  # 100 >= 5 x 16


def test_export_whitening_warns_on_a_small_corpus(setup, tmp_path, capsys):
    bert, sentences, _, _ = setup
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("\n".join(sentences[:30]) + "\n")
    assert main(["export", "--whitening", str(corpus), "--whitening-dim", "4", "--model", bert, "--pooling", "mean",
                 "--out", str(tmp_path / "st")]) == 0
    err = capsys.readouterr().err
    distinct = len(set(sentences[:30]))
    assert f"flowcore export: warning: the fit corpus has only {distinct} distinct sentences for 16-dimensional" in err
    assert "--whitening CORPUS" in err and "skipped" not in err
