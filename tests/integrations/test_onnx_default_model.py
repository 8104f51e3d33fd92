"""The ONNX export on the real default encoder (all-MiniLM-L6-v2, offline, first-last-avg): a small flow
fitted on STS-B train sentences, the graph run by onnxruntime on the exported tokenizer.json against the
vectors `flowcore calibrate` writes for the same sentences, awkward inputs included."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from test_onnx_export import assert_parity, run_graph  # noqa: E402

import flowcore  # noqa: E402
from flowcore.cli import main  # noqa: E402
from flowcore.sts import load_split  # noqa: E402


def test_default_model_flow(sts_data_dir, tmp_path, capsys):
    train = load_split(sts_data_dir, "STS-B", "train")
    fit = list(dict.fromkeys(train.sentences1[:400] + train.sentences2[:400]))
    test = load_split(sts_data_dir, "STS-B", "test")
    long = " ".join(test.sentences1[:60])  # about 700 tokens: cut at the model's 256
    texts = list(dict.fromkeys(test.sentences1[:90])) + ["Hi", "", long]
    encoder = flowcore.Encoder()
    flowcore.FlowCalibrator("l2_d2_w32").fit(encoder.encode(fit), encoder=encoder,
                                             show_progress_bar=False).save(tmp_path / "model.flow")
    assert main(["export", "--calibrator", str(tmp_path / "model.flow"), "--format", "onnx", "--out",
                 str(tmp_path / "onnx"), "--quiet"]) == 0
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert main(["calibrate", "--calibrator", str(tmp_path / "model.flow"), "--input", str(tmp_path / "texts.txt"),
                 "--out", str(tmp_path / "z.npy"), "--quiet"]) == 0
    capsys.readouterr()
    want = np.load(tmp_path / "z.npy")
    empty = texts.index("")  # `flowcore calibrate` rejects an empty line (a NaN row); the graph encodes it
    good = [row for row in range(len(texts)) if row != empty]
    assert np.isnan(want[empty]).all()
    worst, largest = assert_parity(run_graph(tmp_path / "onnx", [texts[row] for row in good]), want[good])
    assert_parity(run_graph(tmp_path / "onnx", [long]), want[[-1]])  # a batch of 1
    print(f"default encoder, flow: min cosine {worst:.7f}, max abs {largest:.2e}")
