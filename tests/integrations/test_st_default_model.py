"""The exported folder on the real default encoder (all-MiniLM-L6-v2, offline): a small flow and a
BERT-whitening fitted on STS-B sentences, SentenceTransformer.encode against flowcore's own path."""
import json

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402

import flowcore  # noqa: E402
from flowcore.integrations.sentence_transformers import export, load_model  # noqa: E402
from flowcore.sts import load_split  # noqa: E402


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def stsb(sts_data_dir):
    pairs = load_split(sts_data_dir, "STS-B", "train")
    fit = list(dict.fromkeys(pairs.sentences1[:250] + pairs.sentences2[:250]))
    held_out = list(dict.fromkeys(load_split(sts_data_dir, "STS-B", "test").sentences1[:64]))
    return fit, held_out


def test_default_model_flow_and_whitening(stsb, tmp_path):
    fit, held_out = stsb
    encoder = flowcore.Encoder(pooling="first-last-avg")
    calibrator = flowcore.FlowCalibrator("l2_d2_w32").fit(encoder.encode(fit), encoder=encoder, show_progress_bar=False)
    calibrator.save(tmp_path / "model.flow")
    out = export(tmp_path / "flow_st", tmp_path / "model.flow", normalize=True)
    got = SentenceTransformer(out, trust_remote_code=True).encode(held_out)
    want = calibrator.transform(encoder.encode(held_out))
    flow_cos = cosines(got, want)
    assert flow_cos.min() > 0.9999, flow_cos.min()

    mean_encoder = flowcore.Encoder(pooling="mean")
    whitening = flowcore.Whitening(keep=128).fit(mean_encoder.encode(fit), encoder=mean_encoder)
    out = export(tmp_path / "white_st", whitening, normalize=True)  # the default model and mean pooling it records
    assert all(e["type"].startswith("sentence_transformers.")
               for e in json.loads((tmp_path / "white_st" / "modules.json").read_text()))
    got = load_model(out).encode(held_out)  # no trust_remote_code needed (nor passed)
    white_cos = cosines(got, whitening.transform(mean_encoder.encode(held_out)))
    assert white_cos.min() > 0.9999, white_cos.min()
    print(f"min cosine: flow {flow_cos.min():.7f}, whitening-128 {white_cos.min():.7f}")
