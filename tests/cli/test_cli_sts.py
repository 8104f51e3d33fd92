"""`flowcore sts`: clean one-line errors, progress on stderr (none with --quiet), and an end-to-end
run with the real default encoder."""
import json
import logging

import pytest

from flowcore.cli import main

from helpers.sts_stand_ins import HashEncoder


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


def test_cli_progress_goes_to_stderr_as_bare_lines(sts_data_dir, tmp_path, capsys, monkeypatch):
    """A stand-in encoder: stderr carries the progress lines exactly (on a terminal, or with
    --progress), stdout the table; --quiet, or a stderr that is not a terminal, prints no progress;
    the `flowcore.sts` logger is left as it was found."""
    monkeypatch.setattr("flowcore.text.encoder.Encoder",
                        lambda model, pooling, max_length, device: HashEncoder(pooling=pooling))
    command = ["sts", "--data-dir", str(sts_data_dir), "--datasets", "STS-B", "--pooling", "mean",
               "--calibration", "none,whitening", "--no-cache"]
    logger = logging.getLogger("flowcore.sts")
    before = logger.level, logger.propagate, list(logger.handlers)
    assert main(command + ["--progress"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[:4] == ["STS-B: 1379 test pairs", "encoding 1256 sentences with hash-encoder (mean pooling)",
                         "encoding 1296 sentences with hash-encoder (mean pooling)",
                         "encoding 12935 sentences with hash-encoder (mean pooling)"]
    assert lines[4].startswith("STS-B: none: Spearman ")
    assert lines[5] == "STS-B: fitting whitening on 17256 target sentences"
    assert lines[6].startswith("STS-B: whitening: Spearman ") and len(lines) == 7
    assert captured.out.splitlines()[1] == "| encoder + calibration | STS-B | Avg. |"
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert main(command + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(command) == 0  # stderr is not a terminal here
    assert capsys.readouterr().err == ""


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


@pytest.fixture
def stand_in(monkeypatch):
    """`flowcore sts` with the stand-in encoder (fast, never the real model)."""
    monkeypatch.setattr("flowcore.text.encoder.Encoder",
                        lambda model, pooling, max_length, device: HashEncoder(pooling=pooling))


def _pairs_file(path, n=120, bad=""):
    rows = ["s1\ts2\tlabel"] + [f"sentence {i}\tanother one {i % 11}\t{i % 6}" for i in range(n)]
    path.write_text("\n".join(rows[:3] + ([bad] if bad else []) + rows[3:]) + "\n", encoding="utf-8")
    return path


def test_sts_shows_the_papers_pooling_and_the_embedding_layers_by_default(tmp_path, capsys, stand_in):
    """The main job's table: BERT-flow's first-last-avg, where a trained encoder needs no calibration, and the
    anisotropic embedding-layer vectors (static-avg), where calibration helps as in the paper."""
    _pairs_file(tmp_path / "mine.tsv")
    assert main(["sts", "--pairs", str(tmp_path / "mine.tsv"), "--calibration", "none", "--no-cache", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| hash-encoder first-last-avg |" in out and "| hash-encoder static-avg |" in out


def test_cli_pairs_table_json_and_bad_lines(tmp_path, capsys, stand_in):
    good = _pairs_file(tmp_path / "mine.tsv")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"sentence1": f"a {i}", "sentence2": f"b {i % 3}", "score": i % 4}) + "\n"
                             for i in range(50)), encoding="utf-8")
    out = tmp_path / "r.json"
    assert main(["sts", "--pairs", f"{good},{other}", "--calibration", "none,whitening", "--no-cache",
                 "--pooling", "first-last-avg", "--json", str(out)]) == 0  # no --data-dir needed
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == ("Spearman x100 of cosine similarity on your pairs: mine (120 pairs), "
                                            "other (50 pairs).")
    assert "| encoder + calibration | mine | other | Avg. |" in captured.out
    assert "| hash-encoder first-last-avg + whitening (target) |" in captured.out
    records = json.loads(out.read_text())["results"]
    assert [(r["dataset"], r["calibration"]) for r in records] == [
        ("mine", "none"), ("mine", "whitening"), ("other", "none"), ("other", "whitening")]
    assert all(r["split"] == "pairs" and r["skipped_lines"] == 0 for r in records)
    assert records[1]["fit_sentences"] == 240 and records[1]["fit_distinct_sentences"] == 131
    assert "warning" not in records[1]  # 131 >= 5 x 16
    assert records[3]["fit_distinct_sentences"] == 53 and "53 distinct sentences" in records[3]["warning"]
    assert f"other: {records[3]['warning']}" in captured.err.splitlines()
    assert "mine: the fit corpus" not in captured.err

    bad = _pairs_file(tmp_path / "bad.tsv", bad="a lone sentence")
    assert main(["sts", "--pairs", str(bad), "--calibration", "none", "--no-cache", "--quiet"]) == 2
    assert capsys.readouterr().err == (f"flowcore sts: error: {bad}:4: expected at least 3 columns, found 1\n")
    assert main(["sts", "--pairs", str(bad), "--calibration", "none", "--no-cache", "--skip-bad",
                 "--pooling", "first-last-avg", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{bad}: skipped 1 bad line(s); the first: {bad}:4: expected at least 3 columns" in err
    record, = json.loads(out.read_text())["results"]
    assert record["skipped_lines"] == 1 and record["n_pairs"] == 120


def test_cli_pairs_columns_and_option_errors(tmp_path, capsys, stand_in, sts_data_dir):
    path = tmp_path / "cols.csv"
    path.write_text("x,grade,y\n" + "".join(f"first {i},{i % 5},second {i % 4}\n" for i in range(20)))
    assert main(["sts", "--pairs", str(path), "--pairs-columns", "x,y,grade", "--calibration", "none",
                 "--no-cache", "--quiet"]) == 0
    assert "| cols |" in capsys.readouterr().out
    assert main(["sts", "--pairs", str(path), "--calibration", "none", "--no-cache", "--quiet"]) == 2
    assert "cols.csv:1: neither a header naming both sentences and the score" in capsys.readouterr().err
    for extra, message in ((["--datasets", "STS-B"], "drop --datasets"),
                           (["--fit-corpus", "train"], "--fit-corpus train needs the built-in datasets")):
        assert main(["sts", "--pairs", str(path), "--no-cache"] + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["sts", "--data-dir", str(sts_data_dir), "--skip-bad"]) == 2
    assert "--skip-bad applies to --pairs files only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sts", "--pairs", str(path), "--pairs-columns", "x,y"])
    assert "three comma-separated columns" in capsys.readouterr().err


def test_cli_pairs_of_stsb_match_the_built_in_row(sts_data_dir, tmp_path, capsys, stand_in):
    """The STS-B test set written as a pairs file gives the built-in STS-B row's Spearman."""
    from flowcore.sts.data import load_split

    stsb = load_split(sts_data_dir, "STS-B", "test")
    path = tmp_path / "stsb.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{s!r}\n" for a, b, s in zip(stsb.sentences1, stsb.sentences2, stsb.scores.tolist())))
    results = []
    for source in (["--data-dir", str(sts_data_dir), "--datasets", "STS-B"], ["--pairs", str(path)]):
        out = tmp_path / "r.json"
        assert main(["sts", *source, "--calibration", "none", "--no-cache", "--quiet", "--json", str(out)]) == 0
        results.append(json.loads(out.read_text())["results"][0])
    capsys.readouterr()
    assert results[0]["spearman"] == results[1]["spearman"] and results[1]["n_pairs"] == 1379


def test_cli_flow_file_is_applied_not_fitted(tmp_path, capsys, stand_in):
    import numpy as np

    from flowcore.calibration.file import EncoderProvenance
    from flowcore.calibration.flow import FlowCalibrator

    pairs = _pairs_file(tmp_path / "mine.tsv")
    sentences = [f"corpus sentence {i}" for i in range(200)]
    emb = tmp_path / "emb.npy"
    np.save(emb, HashEncoder().encode(sentences))
    flow = tmp_path / "tiny.flow"
    assert main(["fit", "--embeddings", str(emb), "--out", str(flow), "--calibration", "flow", "--config",
                 "l2_d2_w32", "--batch-size", "64"]) == 0
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(flow), "--pooling", "mean", "--no-cache",
                 "--json", str(out)]) == 0  # default calibrations with --flow: none,flow
    captured = capsys.readouterr()
    assert "fitting" not in captured.err and "| hash-encoder mean + flow (tiny.flow) |" in captured.out
    none, applied = json.loads(out.read_text())["results"]
    assert none["calibration"] == "none" and applied["calibration"] == "flow"
    assert applied["fit_corpus"] == applied["flow_file"] == str(flow) and applied["flow_config"] == "l2_d2_w32"
    assert "fit_sentences" not in applied and "warning" not in applied
    expected = FlowCalibrator.load(flow)
    from flowcore.sts.metrics import cosine_similarity, spearman_of
    from flowcore.sts.pairs import load_pairs

    mine = load_pairs(pairs)
    encoder = HashEncoder()
    similarities = cosine_similarity(expected.transform(encoder.encode(mine.sentences1)),
                                     expected.transform(encoder.encode(mine.sentences2)))
    from scipy.stats import spearmanr

    assert spearman_of(applied, "all") == pytest.approx(100 * spearmanr(similarities, mine.scores)[0], abs=1e-9)

    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(flow), "--calibration", "none,whitening,flow"]) == 2
    assert "--calibration may hold none and flow only, not whitening" in capsys.readouterr().err
    other = tmp_path / "other.flow"
    mismatched = FlowCalibrator(config="l2_d2_w32").fit(np.load(emb), show_progress_bar=False,
                                                        encoder=EncoderProvenance("hash-encoder", "cls"))
    mismatched.save(other)
    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(other), "--pooling", "mean", "--no-cache"]) == 2
    assert "was fitted on 'cls' pooling, not 'mean'" in capsys.readouterr().err
    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(tmp_path / "missing.flow")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_jobs_must_be_positive(sts_data_dir, capsys):
    assert main(["sts", "--data-dir", str(sts_data_dir), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


def test_cli_start_up_imports_neither_torch_nor_scipy():
    """Building the parser (`flowcore --help`, and every command before it runs) imports no torch,
    triton or scipy: they took 7 s of every start-up here; each command imports what it runs."""
    import subprocess
    import sys

    code = ("import sys; from flowcore.cli import build_parser; build_parser(); "
            "print(sorted({'torch', 'triton', 'scipy', 'transformers'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_cli_applies_a_calibrator_file_of_any_method(tmp_path, capsys, stand_in):
    """A whitening fitted by `flowcore fit --calibration whitening` is applied by `sts --calibrator`
    like a flow file."""
    import numpy as np

    import flowcore

    pairs = _pairs_file(tmp_path / "mine.tsv")
    emb = tmp_path / "emb.npy"
    np.save(emb, HashEncoder().encode([f"corpus sentence {i}" for i in range(200)]))
    white = tmp_path / "white.flow"
    assert main(["fit", "--embeddings", str(emb), "--out", str(white), "--calibration", "whitening",
                 "--whitening-power", "0.25", "--whitening-dim", "16"]) == 0
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(white), "--pooling", "mean", "--no-cache", "--quiet",
                 "--json", str(out)]) == 0  # default calibrations with --flow: none and the file's
    captured = capsys.readouterr()
    assert "| hash-encoder mean + whitening-16 power 0.25 (white.flow) |" in captured.out
    none, applied = json.loads(out.read_text())["results"]
    assert (none["calibration"], applied["calibration"]) == ("none", "whitening")
    assert applied["flow_file"] == str(white) and (applied["whitening_dim"], applied["whitening_power"]) == (16, 0.25)
    from flowcore.sts.metrics import cosine_similarity, spearman_of
    from flowcore.sts.pairs import load_pairs

    mine, encoder, loaded = load_pairs(pairs), HashEncoder(), flowcore.load(white)
    from scipy.stats import spearmanr

    similarities = cosine_similarity(loaded.transform(encoder.encode(mine.sentences1)),
                                     loaded.transform(encoder.encode(mine.sentences2)))
    assert spearman_of(applied, "all") == pytest.approx(100 * spearmanr(similarities, mine.scores)[0], abs=1e-9)
    assert main(["sts", "--pairs", str(pairs), "--calibrator", str(white), "--calibration", "none,flow"]) == 2
    assert "--calibrator applies a whitening calibrator file, nothing is fitted: --calibration may hold none and " \
           "whitening only, not flow" in capsys.readouterr().err


def test_cli_tempered_whitening_and_the_earlier_flow_input_spelling(tmp_path, capsys, stand_in):
    pairs = _pairs_file(tmp_path / "mine.tsv")
    out = tmp_path / "r.json"
    assert main(["sts", "--pairs", str(pairs), "--calibration", "whitening,center", "--whitening-power", "0",
                 "--pooling", "mean", "--no-cache", "--quiet", "--json", str(out)]) == 0
    assert "| hash-encoder mean + whitening power 0 (target) |" in capsys.readouterr().out
    whitening, center = json.loads(out.read_text())["results"]
    assert whitening["whitening_power"] == 0 and whitening["spearman"] == pytest.approx(center["spearman"], abs=1e-6)
    assert main(["sts", "--pairs", str(pairs), "--whitening-power", "0.7", "--calibration", "whitening",
                 "--no-cache", "--quiet"]) == 0
    assert "whitening power 0.7" in capsys.readouterr().out
    assert main(["sts", "--pairs", str(pairs), "--whitening-power", "-1", "--no-cache"]) == 2
    assert "--whitening-power must be from 0 to 1" in capsys.readouterr().err
    assert main(["sts", "--pairs", str(pairs), "--calibration", "flow", "--flow-input", "whiten", "--config",
                 "l2_d2_w32", "--epochs", "1", "--no-cache", "--quiet", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("flowcore sts: --flow-input whiten is now spelled --flow-input prewhiten\n")
    assert json.loads(out.read_text())["results"][0]["flow_input"] == "prewhiten"
    with pytest.raises(SystemExit):
        main(["sts", "--flow-input", "sphere"])
    err = capsys.readouterr().err
    assert "invalid choice: 'sphere'" in err and "prewhiten" in err and "'whiten'" not in err


def test_cli_reports_both_aggregations_and_what_auto_chose(sts_data_dir, tmp_path, capsys, stand_in):
    """STS12-16 differ by aggregation: the chosen one's table comes first, the other of all and
    wmean second (the JSON holds all three); a line says what auto chose and on what evidence."""
    out = tmp_path / "r.json"
    assert main(["sts", "--data-dir", str(sts_data_dir), "--datasets", "STS12,STS-B", "--pooling", "mean",
                 "--calibration", "none,auto", "--aggregation", "wmean", "--no-cache", "--quiet",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Spearman x100 of cosine similarity; STS12-16: size-weighted mean")
    records = json.loads(out.read_text())["results"]
    sts12 = next(r for r in records if r["dataset"] == "STS12" and r["calibration"] == "none")
    assert lines[3] == f"| hash-encoder mean | {sts12['spearman_wmean']:.2f} | " + lines[3].split(" | ", 2)[2]
    assert lines[5:7] == ["", "STS12-16: subsets concatenated, one correlation (SBERT, SimCSE, MTEB):"]
    assert lines[9].startswith(f"| hash-encoder mean | {sts12['spearman']:.2f} | ")
    auto = [r for r in records if r["calibration"] == "auto"]
    assert all(r["auto_choice"] == "none" and r["auto_signals"]["hubness"] < 0.265 for r in auto)  # random vectors
    assert lines[-1].startswith("auto, hash-encoder mean (target): none on all 2 datasets (hubness ")
    assert "published" not in "\n".join(lines)  # no published figures for this encoder
