"""`flowcore analyze` end to end on the default model with a small corpus and labelled pairs
(figures exist and are PNG files), and its one-line errors."""
import json

import numpy as np

from flowcore.cli import main
from flowcore.sts.data import load_split

PNG = b"\x89PNG\r\n\x1a\n"


def test_analyze_end_to_end_on_the_default_model(sts_data_dir, tmp_path, capsys):
    dev = load_split(sts_data_dir, "STS-B", "dev")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(dev.sentences()[:300]) + "\n")
    pairs = tmp_path / "dev.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{s}\n" for a, b, s in list(zip(dev.sentences1, dev.sentences2, dev.scores))[:80]))
    out = tmp_path / "report"
    code = main(["analyze", "--input", str(corpus), "--pairs", str(pairs), "--pooling", "static-avg",
                 "--calibration", "none,center,abtt,whitening", "--frequency", "corpus", "--random-pairs", "2000",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--quiet"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("# Analysis: default static-avg on corpus.txt (300 vectors)")
    assert "## Does calibration help?" in captured.out and "Isotropy is not quality" in captured.out
    document = json.loads((out / "analysis.json").read_text())
    assert set(document["isotropy"]) == {"none", "center", "abtt", "whitening"}
    # static-avg vectors of all-MiniLM-L6-v2 crowd in a cone; centring removes it
    assert document["isotropy"]["none"]["mean_cosine"] > 0.3 > abs(document["isotropy"]["center"]["mean_cosine"])
    assert document["pairs"][0]["n_pairs"] == 80 and document["advice"]["recommended"] in document["isotropy"]
    buckets = document["frequency"]["corpus"]["buckets"]
    assert buckets[0]["start"] == 0 and buckets[0]["tokens"] == 100 and buckets[0]["mean_norm"] > 0
    assert sorted(document["figures"].values()) == ["cosines.png", "frequency.png", "lexical-dev.png"]
    for name in document["figures"].values():
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_analyze_errors_are_one_clean_line(tmp_path, capsys):
    assert main(["analyze", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path)]) == 2
    missing = tmp_path / "missing.txt"
    assert capsys.readouterr().err == f"flowcore analyze: error: --input {missing}: no such file\n"
    vectors = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    vectors[3, 2] = np.nan
    np.save(tmp_path / "v.npy", vectors)
    assert main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--frequency", "corpus", "--out",
                 str(tmp_path)]) == 2
    assert "--frequency corpus counts tokens in sentences" in capsys.readouterr().err
    assert main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NaN or Inf values in row(s) 3" in err
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    assert main(["analyze", "--embeddings", str(tmp_path / "bad.npy"), "--out", str(tmp_path)]) == 2
    assert "not a readable .npy file" in capsys.readouterr().err


def test_analyze_stored_vectors_without_a_model(tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.random.default_rng(0).normal(size=(300, 6)).astype(np.float32) + 2.0)
    assert main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--calibration", "none,center",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "| center | " in capsys.readouterr().out
    assert (tmp_path / "out" / "cosines.png").read_bytes().startswith(PNG)


def test_analyze_tempered_whitening(tmp_path, capsys):
    rng = np.random.default_rng(0)
    vectors = (rng.normal(size=(400, 6)) * [8, 4, 2, 1, 1, 1] + 2.0).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    assert main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--calibration", "none,whitening",
                 "--whitening-power", "0.25", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    capsys.readouterr()
    document = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert document["calibrations"]["whitening"]["settings"] == {"whitening_dim": None, "whitening_power": 0.25}
    assert main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--whitening-power", "2", "--out",
                 str(tmp_path / "out")]) == 2
    assert "--whitening-power must be from 0 to 1" in capsys.readouterr().err


def test_analyze_one_wide_vectors_fits_what_fit_fits(tmp_path, capsys):
    """d = 1: whitening and ZCA work as `flowcore fit` does; abtt and the flow, which need more directions,
    say why in words."""
    np.save(tmp_path / "v.npy", np.random.default_rng(0).normal(size=(200, 1)).astype(np.float32) * 3 + 1)
    main(["analyze", "--embeddings", str(tmp_path / "v.npy"), "--out", str(tmp_path / "out"), "--quiet"])
    calibrations = json.loads((tmp_path / "out" / "analysis.json").read_text())["calibrations"]
    assert [name for name, entry in calibrations.items() if "error" in entry] == ["abtt", "flow"]
    assert calibrations["abtt"]["error"] == "all-but-the-top k=1 must be below the embedding width 1"
    assert "leaves 0 feature(s) for the last level" in calibrations["flow"]["error"]
    assert main(["fit", "--embeddings", str(tmp_path / "v.npy"), "--calibration", "whitening", "--out",
                 str(tmp_path / "w.flow")]) == 0
