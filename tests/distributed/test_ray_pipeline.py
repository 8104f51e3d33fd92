"""`flowcore.ray.Calibrate` in a user's own Ray Data pipeline, and whitening moments as a Ray reduction."""
import numpy as np
import pytest

from flowcore import Encoder, FlowCalibrator, Whitening
from flowcore.ray import Calibrate, moments

from helpers.tiny_models import save_tiny_bert

WORDS = "the a cat dog sat on mat ran fast slow big small red blue house tree".split()


def test_calibrate_adds_vectors_and_keeps_bad_rows(ray_session, tmp_path):
    encoder = Encoder(model=save_tiny_bert(tmp_path / "bert", WORDS, hidden_size=16, num_layers=2), pooling="mean",
                      threads=1)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 10))) for _ in range(120)]
    calibrator = FlowCalibrator(seed=0, epochs=1).fit(encoder.encode(texts), show_progress_bar=False, encoder=encoder)
    calibrator.save(tmp_path / "text.flow")
    items = [{"id": i, "text": text} for i, text in enumerate(texts[:40])]
    items[5]["text"], items[9]["text"] = "  ", None
    dataset = ray_session.data.from_items(items).map_batches(
        Calibrate, fn_constructor_kwargs={"flow": str(tmp_path / "text.flow"), "normalize": True},
        compute=ray_session.data.ActorPoolStrategy(size=1), batch_size=16, batch_format="numpy")
    rows = sorted(dataset.take_all(), key=lambda row: row["id"])
    assert [row["id"] for row in rows] == list(range(40))  # nothing dropped
    assert [row["reject"] for row in rows if row["reject"]] == ["empty text", "missing text field"]
    got = np.stack([row["embedding"] for row in rows])
    good = [i for i in range(40) if i not in (5, 9)]
    assert np.isnan(got[[5, 9]]).all() and np.isfinite(got[good]).all()
    expected = calibrator.transform(encoder.encode([texts[i] for i in good]))
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert ((got[good] * expected).sum(axis=1)).min() > 0.99999

    with pytest.raises(ValueError, match="the flow calibrator was fitted on embeddings from encoder"):
        Calibrate(tmp_path / "text.flow", model=save_tiny_bert(tmp_path / "other", WORDS, 16, 2, seed=1))


def test_moments_of_a_distributed_dataset_give_the_in_memory_whitening(ray_session):
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(5000, 6)) @ rng.normal(size=(6, 6)) + 50).astype(np.float32)
    dataset = ray_session.data.from_numpy(X).repartition(7)
    merged = moments(dataset, column="data")
    assert merged.count == 5000
    reference = np.cov(X.astype(np.float64), rowvar=False)
    assert np.abs(merged.covariance() - reference).max() / np.abs(reference).max() < 1e-10
    whitening = Whitening.from_moments(merged)
    np.testing.assert_allclose(whitening.eigenvalues, Whitening().fit(X).eigenvalues, rtol=1e-10)
