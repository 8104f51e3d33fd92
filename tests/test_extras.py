"""A missing optional dependency is one line naming the feature and the exact
`pip install 'flowcore[EXTRA]'`, exit status 2, before any work: run with the extra's packages
made unimportable (as in an environment without the extra)."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from flowcore.extras import EXTRAS, MissingExtraError, require

RUN_WITHOUT = textwrap.dedent(
    """
    import sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None  # not installed
    from flowcore.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)

CASES = {  # (modules made unimportable, command, extra)
    "quantize": ("onnxruntime,onnx,onnxscript", ["encode", "--input", "corpus.txt", "--out", "out.npy",
                                                 "--quantize", "int8"], "onnx"),
    "analyze": ("rapidfuzz", ["analyze", "--embeddings", "vectors.npy", "--out", "out.npy"], "analysis"),
    "export": ("sentence_transformers", ["export", "--whitening", "corpus.txt", "--out", "out.npy"], "st"),
    "ray": ("ray", ["calibrate", "--engine", "ray", "--calibrator", "model.flow", "--embeddings", "vectors.npy",
                    "--out", "out.npy"], "ray"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_extra_is_one_line_with_the_pip_command(case, tmp_path):
    modules, command, extra = CASES[case]
    (tmp_path / "corpus.txt").write_text("a cat\nthe dog\n")
    np.save(tmp_path / "vectors.npy", np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32))
    result = subprocess.run([sys.executable, "-c", RUN_WITHOUT, modules, *command], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pip install 'flowcore[{extra}]'" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out.npy").exists()


def test_require_names_the_feature_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidfuzz", None)
    with pytest.raises(MissingExtraError, match=r"^lexical bias needs rapidfuzz, which is not installed: "
                                                r"pip install 'flowcore\[analysis\]'$"):
        require("rapidfuzz", "lexical bias", "analysis")
    assert require("json", "anything", "analysis").dumps([1]) == "[1]"
    with pytest.raises(ValueError, match="unknown extra 'fast'"):
        require("json", "anything", "fast")
    assert set(EXTRAS) == {"onnx", "ray", "st", "mteb", "analysis"}


def test_every_extra_is_installable_by_its_name():
    import importlib.metadata

    assert set(EXTRAS) <= set(importlib.metadata.metadata("flowcore").get_all("Provides-Extra"))
