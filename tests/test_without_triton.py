"""flowcore without Triton (as on macOS and Windows, where no Triton wheel exists): `import
flowcore`, `Glow`, `fit`, `FlowCalibrator` and the whole CPU batch job work, and asking for the
Triton backend is one clear error. Runs in a subprocess in which Triton cannot be imported (also
run by CI in a virtual environment without Triton)."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["triton"] = None  # as if Triton were not installed (a no-op where it is not)
    import json, os, tempfile
    import numpy as np, torch
    import flowcore
    from flowcore.cli import main

    from flowcore.kernels import HAS_TRITON
    assert not HAS_TRITON
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((400, 16)) @ rng.standard_normal((16, 16))).astype(np.float32)
    glow = flowcore.Glow(16, levels=2, depth=2, width=8)
    losses = flowcore.fit(glow, X, epochs=1, batch_size=32, show_progress_bar=False)
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=1).fit(X, show_progress_bar=False)
    folder = tempfile.mkdtemp()
    calibrator.save(os.path.join(folder, "model.flow"))
    loaded = flowcore.FlowCalibrator.load(os.path.join(folder, "model.flow"))
    assert np.array_equal(loaded.transform(X), calibrator.transform(X))
    np.save(os.path.join(folder, "vectors.npy"), X)
    with open(os.path.join(folder, "corpus.txt"), "w") as corpus:
        corpus.write("a cat sat on the mat\\nthe dog barked\\n\\nstocks fell sharply\\n")
    main(["fit", "--input", os.path.join(folder, "corpus.txt"), "--out", os.path.join(folder, "text.flow"),
          "--calibration", "flow", "--recipe", "standardized", "--epochs", "1", "--train-batch-size", "2"])
    for source, out in ((["--embeddings", "vectors.npy", "--calibrator", "model.flow"], "vectors.out.npy"),
                        (["--input", "corpus.txt", "--calibrator", "text.flow"], "text.out.npy")):
        main(["calibrate", *[os.path.join(folder, a) if a.endswith((".npy", ".flow", ".txt")) else a
                             for a in source], "--out", os.path.join(folder, out), "--quiet"])
    assert np.load(os.path.join(folder, "vectors.out.npy")).shape == (400, 16)
    assert np.isnan(np.load(os.path.join(folder, "text.out.npy"))[2]).all()  # the empty line, kept as a reject
    try:
        with flowcore.use_backend("triton"):
            glow(torch.randn(4, 16))
    except flowcore.BackendUnavailableError as error:
        print("ERROR:", error)
    print("ok", len(losses), "triton" in sys.modules and sys.modules["triton"] is None)
    """
)


def test_flowcore_works_without_triton(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ok 1 True" in result.stdout
    assert "ERROR: the Triton backend was requested" in result.stdout and "Triton is not installed" in result.stdout
