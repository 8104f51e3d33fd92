"""`analyze` + `write_report` with stand-ins: stored vectors alone give the isotropy report; an
encoder and labelled pairs add each calibration's Spearman, the lexical bias and the advice; the
JSON is valid (NaN as null), the summary carries the caveat, the figures are PNG files."""
import json

import numpy as np
import pytest

from flowcore.analysis import analyze, write_report
from flowcore.sts.data import STSPairs

from helpers.sts_stand_ins import HashEncoder

PNG = b"\x89PNG\r\n\x1a\n"


def _pairs(count=80, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30)]
    first = [" ".join(rng.choice(words, 6)) for _ in range(count)]
    second = [" ".join(s.split()[: int(rng.integers(1, 7))]) for s in first]
    return STSPairs("mine", "pairs", first, second, rng.uniform(0, 5, count), ["mine"] * count, source="mine.tsv")


def test_stored_vectors_alone_give_the_isotropy_report(tmp_path):
    vectors = np.random.default_rng(0).normal(size=(500, 8)) + 5.0
    result = analyze(vectors, calibrations=["none", "center", "whitening"], frequency_sources=())
    assert result["isotropy"]["none"]["mean_cosine"] > 0.9 > 0.1 > abs(result["isotropy"]["center"]["mean_cosine"])
    assert result["pairs"] == [] and result["frequency"] == {}
    assert result["advice"]["recommended"] == result["advice"]["auto"]["choice"] == "none"  # balanced neighbourhoods
    paths = write_report(result, tmp_path / "out")
    assert sorted(paths) == ["cosines", "json", "summary"]
    assert paths["cosines"].read_bytes().startswith(PNG) and paths["cosines"].stat().st_size > 5000
    document = json.loads(paths["json"].read_text())
    assert document["figures"] == {"cosines": "cosines.png"} and "center" in document["isotropy"]
    summary = paths["summary"].read_text()
    assert "| center | " in summary and "Isotropy is not quality" in summary
    assert "No labelled pairs; auto's rule, from the corpus alone: none, the raw vectors (hubness " in summary


def test_pairs_give_spearman_lexical_bias_and_advice(tmp_path):
    pairs = _pairs()
    result = analyze(encoder=HashEncoder(dim=64), sentences=pairs.sentences(), pairs=[pairs],
                     calibrations=["none", "center", "zca"], frequency_sources=(), random_pairs=500)
    entry = result["pairs"][0]
    assert entry["n_pairs"] == 80 and set(entry["spearman"]) == {"none", "center", "zca"}
    assert set(entry["lexical_bias"]) == {"gold", "none", "center", "zca"}
    assert result["advice"]["recommended"] in {"none", "center", "zca"}
    assert result["advice"]["warnings"][0] == (  # at most 160 distinct sentences for 64 dims: fewer than 5 x 64
        f"the fit corpus has only {len(set(pairs.sentences()))} distinct sentences for 64-dimensional vectors, "
        "fewer than 5 x 64 = 320: whitening and the flow fitted on it are unreliable; fit on a larger corpus, "
        "e.g. NLI sentences via --input FILE")
    assert result["advice"]["warnings"][1].startswith("the raw vectors' nearest neighbours are already balanced")
    paths = write_report(result, tmp_path)
    assert paths["lexical-mine"].read_bytes().startswith(PNG)
    assert "## mine (80 labelled pairs)" in paths["summary"].read_text()


def test_bad_requests_are_clear_errors():
    with pytest.raises(ValueError, match="unknown calibration cholesky"):
        analyze(np.ones((4, 2)), calibrations=["cholesky"])
    with pytest.raises(ValueError, match="an encoder is needed"):
        analyze(np.ones((4, 2)), pairs=[_pairs()])
    with pytest.raises(ValueError, match="'corpus' frequency source counts tokens in sentences"):
        analyze(np.ones((4, 2)), encoder=HashEncoder(), frequency_sources=("corpus",))
