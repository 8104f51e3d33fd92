"""STS evaluation: metrics and aggregations, the embedding cache, the protocol with stand-in
encoders and calibrators, table and JSON, the CLI, and MTEB parity with the real default encoder."""
import hashlib
import json
import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from flowcore.cli import main
from flowcore.sts.evaluate import (CalibrationSettings, EmbeddingCache, correlations, cosine_similarity, evaluate,
                          markdown_table, score_pairs, spearman_of, write_json)
from flowcore.sts.data import STSPairs


class HashEncoder:
    """A deterministic stand-in encoder: a fixed random vector per distinct sentence, plus a large
    shared offset (an anisotropic cone, like raw BERT vectors); counts what it encodes."""

    def __init__(self, pooling="mean", dim=16, offset=20.0):
        self.model_id, self.pooling, self.dim = "hash-encoder", pooling, dim
        self.offset = offset
        self.encoded: list[str] = []

    def encode(self, sentences, batch_size=64, show_progress_bar=None):
        self.encoded += list(sentences)
        rows = []
        for sentence in sentences:
            seed = int.from_bytes(hashlib.sha256(sentence.encode()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).normal(size=self.dim) + self.offset)
        return np.asarray(rows, dtype=np.float32)


def _pairs(dataset, similarity, scores, subsets):
    n = len(scores)
    return STSPairs(dataset, "test", [f"a{i}" for i in range(n)], [f"b{i}" for i in range(n)],
                    np.asarray(scores, dtype=float), list(subsets)), np.asarray(similarity, dtype=float)


def test_cosine_and_correlations_match_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(30, 5)), rng.normal(size=(30, 5))
    expected = [x @ y / np.linalg.norm(x) / np.linalg.norm(y) for x, y in zip(a, b)]
    np.testing.assert_allclose(cosine_similarity(a, b), expected, rtol=1e-12)
    gold = rng.uniform(0, 5, size=30)
    result = correlations(np.asarray(expected), gold)
    assert result["spearman"] == pytest.approx(100 * spearmanr(expected, gold)[0])
    assert result["pearson"] == pytest.approx(100 * pearsonr(expected, gold)[0])
    assert math.isnan(correlations(np.ones(30), gold)["spearman"])


def test_aggregations_all_wmean_mean():
    rng = np.random.default_rng(1)
    gold = rng.uniform(0, 5, size=40)
    similarity = np.concatenate([gold[:30] + rng.normal(scale=0.5, size=30), -gold[30:]])
    pairs, similarity = _pairs("STS13", similarity, gold, ["big"] * 30 + ["small"] * 10)
    result = score_pairs(similarity, pairs)
    big = 100 * spearmanr(similarity[:30], gold[:30])[0]
    small = 100 * spearmanr(similarity[30:], gold[30:])[0]
    assert small == pytest.approx(-100)
    assert result["spearman"] == pytest.approx(100 * spearmanr(similarity, gold)[0])
    assert result["spearman_wmean"] == pytest.approx((30 * big + 10 * small) / 40)
    assert result["spearman_mean"] == pytest.approx((big + small) / 2)
    assert result["subsets"]["small"]["n_pairs"] == 10 and result["aggregation"] == "all"
    assert spearman_of(result, "wmean") == result["spearman_wmean"]
    single = score_pairs(*reversed(_pairs("STS-B", similarity, gold, ["x"] * 40)))
    assert single["aggregation"] == "single" and "spearman_wmean" not in single
    assert spearman_of(single, "wmean") == single["spearman"]


def test_embedding_cache_encodes_each_sentence_once_per_model_and_pooling(tmp_path):
    encoder = HashEncoder()
    cache = EmbeddingCache(tmp_path)
    first = cache.embed(encoder, ["x", "y", "x"], progress=False)
    assert encoder.encoded == ["x", "y"]
    np.testing.assert_array_equal(first[0], first[2])
    fresh = EmbeddingCache(tmp_path)  # a new run, same folder: read from disk
    again = fresh.embed(encoder, ["y", "z", "x"], progress=False)
    assert encoder.encoded == ["x", "y", "z"]
    np.testing.assert_array_equal(again[[0, 2]], first[[1, 0]])
    other_pooling = HashEncoder(pooling="static-avg")
    EmbeddingCache(tmp_path).embed(other_pooling, ["x"], progress=False)
    assert other_pooling.encoded == ["x"]
    assert len(list(tmp_path.rglob("*.npy"))) == 3 and not list(tmp_path.rglob("*.tmp"))
    memory_only = HashEncoder()
    EmbeddingCache(None).embed(memory_only, ["x"], progress=False)
    assert memory_only.encoded == ["x"]


class MeanShift:
    """A stand-in calibrator: subtracts the fitted mean (removes the shared offset)."""

    fitted_rows: list[int] = []

    def fit(self, X):
        self.mean = X.mean(axis=0)
        MeanShift.fitted_rows.append(len(X))
        return self

    def transform(self, X):
        return X - self.mean


def test_evaluate_protocol_with_stand_ins(sts_data_dir, tmp_path):
    encoder = HashEncoder()
    MeanShift.fitted_rows = []
    records = evaluate(encoder, datasets=["STS16", "STS-B"], calibrations=["none", "whitening", "flow"],
                       data_dir=sts_data_dir, cache=EmbeddingCache(tmp_path), factories={"flow": MeanShift},
                       settings=CalibrationSettings(whitening_dim=8), progress=False)
    assert [(r["dataset"], r["calibration"]) for r in records] == [
        (d, c) for d in ("STS16", "STS-B") for c in ("none", "whitening", "flow")]
    assert MeanShift.fitted_rows == [2 * 1186, 2 * 8628]  # target: every sentence of every split
    by_key = {(r["dataset"], r["calibration"]): r for r in records}
    assert by_key["STS-B", "none"]["n_pairs"] == 1379 and "fit_corpus" not in by_key["STS-B", "none"]
    assert by_key["STS-B", "whitening"]["whitening_dim"] == 8
    assert by_key["STS16", "flow"]["fit_corpus"] == "target" and by_key["STS16", "flow"]["fit_sentences"] == 2372
    assert set(by_key["STS16", "none"]["subsets"]) == {"answer-answer", "headlines", "plagiarism", "postediting",
                                                       "question-question"}
    for record in records:  # random vectors carry no meaning: every correlation is near zero
        assert abs(record["spearman"]) < 10 and record["model"] == "hash-encoder"
    encoded = len(encoder.encoded)
    evaluate(encoder, datasets=["STS-B"], calibrations=["whitening"], data_dir=sts_data_dir,
             cache=EmbeddingCache(tmp_path), progress=False)
    assert len(encoder.encoded) == encoded  # a second run re-encodes nothing


def test_calibration_fitted_on_a_sentence_file_is_fitted_once(sts_data_dir, tmp_path):
    corpus = tmp_path / "nli.txt"
    corpus.write_text("A man sleeps.\nA dog runs.\nTwo birds sing.\n", encoding="utf-8")
    MeanShift.fitted_rows = []
    records = evaluate(HashEncoder(), datasets=["STS13", "STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                       fit_corpus=str(corpus), factories={"flow": MeanShift}, progress=False)
    assert MeanShift.fitted_rows == [3]
    assert {r["fit_corpus"] for r in records} == {str(corpus)}


def test_whitening_lifts_an_anisotropic_representation():
    """Two high-variance nuisance directions plus a shared offset dominate raw cosine; the six
    unit-variance directions that carry the meaning are drowned until whitening equalises them."""
    rng = np.random.default_rng(3)
    n, dim = 400, 8
    gold = rng.uniform(0, 5, size=n)
    meaning = rng.normal(size=(n, dim))
    partner = meaning * (gold[:, None] / 5) + rng.normal(size=(n, dim)) * (1 - gold[:, None] / 5)
    left, right = meaning + 5, partner + 5
    left[:, :2], right[:, :2] = rng.normal(size=(n, 2)) * 10 + 5, rng.normal(size=(n, 2)) * 10 + 5
    pairs = STSPairs("STS-B", "test", [""] * n, [""] * n, gold, ["x"] * n)
    from flowcore import Whitening

    raw = score_pairs(cosine_similarity(left, right), pairs)["spearman"]
    whitening = Whitening().fit(np.concatenate([left, right]))
    calibrated = score_pairs(cosine_similarity(whitening.transform(left), whitening.transform(right)), pairs)
    assert raw < 20 and calibrated["spearman"] > raw + 40


def test_failed_calibration_is_reported_and_kept(sts_data_dir):
    class Exploding(MeanShift):
        def transform(self, X):
            return np.full_like(X, np.nan)

    records = evaluate(HashEncoder(), datasets=["STS16"], calibrations=["none", "flow"], data_dir=sts_data_dir,
                       factories={"flow": Exploding}, progress=False)
    assert records[0]["spearman"] is not None
    assert records[1]["spearman"] is None and "NaN" in records[1]["error"]
    assert "| n/a |" in markdown_table(records)


def test_markdown_table_and_json(tmp_path):
    records = [
        {"dataset": "STS12", "calibration": "none", "pooling": "mean", "model": "m", "spearman": 70.0,
         "spearman_wmean": 60.0, "spearman_mean": 50.0, "aggregation": "all"},
        {"dataset": "STS-B", "calibration": "none", "pooling": "mean", "model": "m", "spearman": 80.0,
         "aggregation": "single"},
        {"dataset": "STS12", "calibration": "flow", "pooling": "mean", "model": "m", "spearman": math.nan,
         "fit_corpus": "target", "aggregation": "all"},
    ]
    table = markdown_table(records, "wmean").splitlines()
    assert table[0] == "| encoder + calibration | STS12 | STS-B | Avg. |"
    assert table[2] == "| m mean | 60.00 | 80.00 | 70.00 |"
    assert table[3] == "| m mean + flow (target) | n/a | n/a | n/a |"
    assert markdown_table(records).splitlines()[2] == "| m mean | 70.00 | 80.00 | 75.00 |"
    out = tmp_path / "r.json"
    write_json(records, out, seconds=1.5)
    document = json.loads(out.read_text())
    assert document["seconds"] == 1.5 and document["results"][2]["spearman"] is None
    assert document["results"][0]["spearman_wmean"] == 60.0


def test_cli_errors_are_one_clean_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLOWCORE_DATA", raising=False)
    assert main(["sts", "--no-cache"]) == 2
    assert "pass --data-dir DIR or set FLOWCORE_DATA" in capsys.readouterr().err
    assert main(["sts", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "STS data folder not found" in capsys.readouterr().err
    assert main(["sts", "--data-dir", str(tmp_path), "--fit-corpus", "nli.txt"]) == 2
    assert "neither 'target', 'train' nor an existing file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sts", "--datasets", "STS17"])
    assert "unknown dataset STS17" in capsys.readouterr().err


def test_cli_static_avg_whitening_end_to_end(sts_data_dir, tmp_path, capsys):
    """The real default encoder on STS-B with the cheap static-avg pooling: whitening lifts it."""
    out = tmp_path / "sts.json"
    code = main(["sts", "--data-dir", str(sts_data_dir), "--datasets", "STS-B", "--pooling", "static-avg",
                 "--calibration", "none,whitening", "--cache-dir", str(tmp_path / "cache"), "--json", str(out),
                 "--quiet"])
    assert code == 0
    table = capsys.readouterr().out
    assert "| default static-avg + whitening (target) |" in table
    none, whitening = json.loads(out.read_text())["results"]
    assert none["n_pairs"] == 1379 and whitening["fit_sentences"] == 2 * 8628
    assert whitening["spearman"] > none["spearman"] + 10


@pytest.fixture(scope="module")
def encode_cache(tmp_path_factory):
    """One embedding cache for the real-encoder tests of this module (each sentence encoded once)."""
    return EmbeddingCache(tmp_path_factory.mktemp("embeddings"))


@pytest.mark.parametrize("dataset, mteb", [("STS-B", 82.03), ("STS16", 78.99)])
def test_mteb_parity_of_the_raw_default_encoder(sts_data_dir, encode_cache, dataset, mteb):
    """Exact parity with MTEB's published all-MiniLM-L6-v2 figures (mean pooling, `all` aggregation)."""
    from flowcore.text.encoder import Encoder

    record, = evaluate(Encoder("default", pooling="mean"), datasets=[dataset], calibrations=["none"],
                       data_dir=sts_data_dir, cache=encode_cache, progress=False)
    assert record["spearman"] == pytest.approx(mteb, abs=0.05)


def test_flow_lifts_an_anisotropic_pooling_as_much_as_whitening(sts_data_dir, encode_cache):
    """static-avg (averaged word embeddings) of the default model is anisotropic: raw 61.2 on STS16."""
    from flowcore.text.encoder import Encoder

    none, whitening, flow = evaluate(Encoder("default", pooling="static-avg"), datasets=["STS16"],
                                     calibrations=["none", "whitening", "flow"], data_dir=sts_data_dir,
                                     cache=encode_cache, progress=False)
    assert flow["spearman"] > none["spearman"] + 8
    assert flow["spearman"] > whitening["spearman"] - 1
    assert np.isfinite(flow["flow_losses"]).all()


def test_flow_defaults_survive_constant_coordinates_of_mean_pooling(sts_data_dir, encode_cache):
    """Mean-pooled MiniLM has two coordinates constant to 1e-32: fed raw, the engine's defaults
    diverge; `flowcore sts` standardizes and drops them, and the flow then trains normally."""
    from flowcore.text.encoder import Encoder

    encoder = Encoder("default", pooling="mean")
    flow, = evaluate(encoder, datasets=["STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                     cache=encode_cache, progress=False)
    assert "error" not in flow and flow["spearman"] > 70 and flow["flow_losses"][0] < 5
    raw, = evaluate(encoder, datasets=["STS16"], calibrations=["flow"], data_dir=sts_data_dir,
                    cache=encode_cache, settings=CalibrationSettings(flow_input="raw"), progress=False)
    assert "non-finite" in raw.get("error", "") or raw["flow_losses"][0] > 1000  # diverged, or blew up
