"""bench/gpu_check.py's plumbing, without a GPU: the test phase streams every result (also when
it is stopped), a failing phase costs the others nothing and the summary is on disk after each
phase, and a machine without CUDA gets a summary saying so."""
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
gpu_check = pytest.importorskip("gpu_check")


def test_the_test_phase_streams_each_result(tmp_path):
    result = gpu_check.run_tests(tmp_path, limit=300, paths=("tests/kernels/test_gpu.py",))
    lines = [json.loads(line) for line in (tmp_path / "gpu-tests.jsonl").read_text().splitlines()]
    assert result["exit"] == 0 and result["failed"] == 0
    assert result["skipped"] == len(lines) > 5  # no CUDA here: every GPU test skips, and says so
    assert all(line["outcome"] == "skipped" and "CUDA" in line["message"] for line in lines)


def test_a_failing_phase_is_recorded_and_the_summary_written(tmp_path):
    check = gpu_check.Check(tmp_path, budget=60)
    check.phase("fine", lambda: {"value": 1})
    check.phase("broken", lambda: 1 / 0)
    check.goal("ratio >= 2", 2.5, 2.0)
    check.write()
    summary = json.loads((tmp_path / "gpu_summary.json").read_text())
    assert summary["fine"] == {"value": 1} and summary["phases"]["fine"]["status"] == "ok"
    assert summary["phases"]["broken"]["status"].startswith("error: ZeroDivisionError")
    assert summary["goals"]["ratio >= 2"] == {"measured": 2.5, "target": 2.0, "met": True}


def test_without_cuda_the_summary_says_so(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU" in json.loads((tmp_path / "gpu_summary.json").read_text())["error"]
    assert "no CUDA GPU" in capsys.readouterr().out
