"""Numerics never fail silently: rows a flow maps to NaN/Inf are rejected with their row numbers
(never written as results), and a fit that diverges stops `flowcore fit` with one line."""
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from faults_support import DIM, read_rejects

from flowcore import FlowCalibrator
from flowcore.batch.job import calibrate_file
from flowcore.batch.rows import NON_FINITE, NON_FINITE_OUTPUT
from flowcore.cli import main
from flowcore.validation import NonFiniteOutputError


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_rows_the_flow_maps_to_nan_are_rejected_with_their_row_numbers(tmp_path, flow_path, suffix):
    matrix = np.random.default_rng(2).normal(size=(100, DIM)).astype(np.float32)
    matrix[[7, 64]] = 3.4e38  # finite, but past what the flow's float32 arithmetic can hold
    matrix[70, 0] = np.nan
    np.save(tmp_path / "in.npy", matrix)
    with pytest.raises(NonFiniteOutputError, match=r"X row\(s\) 7, 64 \(0-based\) are finite, but calibrated"):
        FlowCalibrator.load(flow_path).transform(matrix[:65])  # the Python API names the rows
    out = tmp_path / f"out{suffix}"
    summary = calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=32, show_progress_bar=False)

    assert [(r["row"], r["reason"]) for r in read_rejects(out)] == [(7, NON_FINITE_OUTPUT), (64, NON_FINITE_OUTPUT),
                                                                    (70, NON_FINITE)]
    assert read_rejects(out)[0]["detail"] == f"calibrated, it holds {DIM} NaN, 0 Inf of {DIM} values"
    assert summary.rejects == {NON_FINITE_OUTPUT: 2, NON_FINITE: 1}
    assert "3 rejected (1 NaN/Inf, 2 non-finite output)" in str(summary)
    if suffix == ".npy":
        result = np.load(out)
        assert np.isnan(result[[7, 64, 70]]).all() and np.isfinite(np.delete(result, [7, 64, 70], axis=0)).all()
    else:
        vectors = pq.read_table(out).column("embedding").to_pylist()
        assert [row for row, vector in enumerate(vectors) if vector is None] == [7, 64, 70]
    manifest = json.loads(open(f"{out}.manifest.json").read())
    assert manifest["rejects"] == {NON_FINITE: 1, NON_FINITE_OUTPUT: 2} and manifest["ok"] == 97


def test_the_python_api_raises_naming_the_rows_a_calibrator_maps_to_nan(flow_path):
    """transform and transform_iter refuse a finite row whose result is NaN/Inf, naming it (the
    rows counted across the stream), as they refuse NaN input; the error carries the output."""
    from flowcore.calibration import create

    matrix = np.random.default_rng(3).normal(size=(40, DIM)).astype(np.float32)
    matrix[5] = 3.4e38
    calibrator = FlowCalibrator.load(flow_path)
    with pytest.raises(NonFiniteOutputError, match=r"row\(s\) 5 \(0-based\)") as raised:
        calibrator.transform(matrix)
    assert list(raised.value.rows) == [5] and np.isfinite(np.delete(raised.value.output, 5, axis=0)).all()
    with pytest.raises(NonFiniteOutputError, match=r"chunk starting at row 15: X row\(s\) 5 ") as raised:
        list(calibrator.transform_iter([matrix[25:], matrix[:20], matrix]))
    assert list(raised.value.rows) == [20]
    whitening = create("whitening").fit(np.random.default_rng(4).normal(size=(200, DIM)).astype(np.float32))
    with pytest.raises(NonFiniteOutputError, match=r"row\(s\) 5 \(0-based\)"):
        whitening.transform(matrix)


def test_a_fit_that_diverges_stops_flowcore_fit_in_one_line_and_writes_no_flow(tmp_path, capsys):
    np.save(tmp_path / "emb.npy", (np.random.default_rng(0).normal(size=(300, DIM)) * 1e18).astype(np.float32))
    code = main(["fit", "--embeddings", str(tmp_path / "emb.npy"), "--out", str(tmp_path / "model.flow"),
                 "--calibration", "flow", "--config", "l2_d2_w32", "--lr", "1e12"])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("flowcore fit: error: the training loss became nan at epoch 1, step ") or \
        last.startswith("flowcore fit: error: the gradients became non-finite at epoch 1, step "), last
    assert "Try a lower learning rate (now 1000000000000.0)" in last
    assert not (tmp_path / "model.flow").exists()
