"""Every command reports progress by one policy (`flowcore._progress.ProgressReport`): with
--progress into a file or a pipe, plain lines (what, units done of all, units/s; never a carriage
return), the encoder's and the flow's training included; --quiet says nothing."""
import re
import subprocess
import sys

import pytest

from helpers.tiny_models import WORDS

RUN = """
import sys
from flowcore import defaults
from flowcore.cli import main

defaults.PROGRESS_INTERVAL_S = 0.0
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(" ".join(WORDS[i:i + 5]) + "\n" for i in range(len(WORDS) - 5)) * 3)
    return path


def _stderr(*command, cwd):
    result = subprocess.run([sys.executable, "-c", RUN, *map(str, command)], capture_output=True, text=True, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.parametrize("flag", ["--progress", "--quiet"])
def test_encode_and_fit_write_plain_lines_or_nothing(tiny_bert, corpus, tmp_path, flag):
    sentences = len(set(corpus.read_text().splitlines()))
    encoded = _stderr("encode", "--input", corpus, "--model", tiny_bert, "--out", tmp_path / "e.npy", flag,
                      cwd=tmp_path)
    fitted = _stderr("fit", "--input", corpus, "--model", tiny_bert, "--calibration", "flow", "--config",
                     "l2_d2_w32", "--epochs", "1", "--train-batch-size", "8", "--no-cache", "--out",
                     tmp_path / "m.flow", flag, cwd=tmp_path)
    assert "\r" not in encoded + fitted
    if flag == "--quiet":
        assert encoded == "" and "fit flow" not in fitted and "encode" not in fitted
        return
    assert re.search(rf"^encode: {sentences} of {sentences} sentences \(100%\), [\d,]+ sentences/s", encoded, re.M)
    assert re.search(r"^encode: \d+ of \d+ rows \(100%\)", fitted, re.M)  # the corpus, into the cache
    assert re.search(r"^fit flow: \d+ of \d+ steps \(\d+%\), [\d,]+ steps/s(, \d+:\d\d left)?; loss -?\d+\.\d{4}$",
                     fitted, re.M)  # the whitened recipe may stop early
