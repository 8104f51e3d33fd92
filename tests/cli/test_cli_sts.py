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
    """A stand-in encoder: stderr carries the progress lines exactly, stdout the table; --quiet
    prints no progress; the `flowcore.sts` logger is left as it was found."""
    monkeypatch.setattr("flowcore.text.encoder.Encoder",
                        lambda model, pooling, max_length, device: HashEncoder(pooling=pooling))
    command = ["sts", "--data-dir", str(sts_data_dir), "--datasets", "STS-B", "--pooling", "mean",
               "--calibration", "none,whitening", "--no-cache"]
    logger = logging.getLogger("flowcore.sts")
    before = logger.level, logger.propagate, list(logger.handlers)
    assert main(command) == 0
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
