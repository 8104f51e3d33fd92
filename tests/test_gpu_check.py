"""bench/gpu_check.py's plumbing, without a GPU: the test phase streams every result (also when
it is stopped), a failing phase costs the others nothing and the summary is on disk after each
phase, and a machine without CUDA gets a summary saying so."""
import json

from helpers.bench_modules import import_bench

gpu_check = import_bench("gpu_check")
gpu_workloads = import_bench("gpu_workloads")  # gpu_check imports it inside its phases


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


def test_the_benchmark_phases_run_at_a_small_size_on_the_cpu(tmp_path, monkeypatch):
    """Each benchmark phase, on the CPU at a small size (Triton in the interpreter; CPU timers
    for CUDA events; torch.compile left out), fills its part of the summary and its goals."""
    import time

    def cpu_timer(calls, rounds=2, inner=1):
        result = {}
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            seconds = time.perf_counter() - start
            result[label] = {"min_s": seconds, "median_s": seconds}
        return result

    monkeypatch.setattr(gpu_workloads, "time_interleaved", cpu_timer)
    monkeypatch.setattr(gpu_workloads, "_compiled", lambda fn: fn)
    monkeypatch.setattr(gpu_check, "BATCH", 64)
    monkeypatch.setattr(gpu_check, "DIM", 48)
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "CALIBRATION_ROWS", 20000)
    check = gpu_check.Check(tmp_path, budget=600)
    check.summary["ceilings"] = {"copy_gbps": 10.0, "h2d_gbps": 5.0}
    for name, phase, args in (("step_float32", gpu_check.bench_step, (check, "float32")),
                              ("elementwise", gpu_check.bench_elementwise, (check,)),
                              ("calibration", gpu_check.bench_calibration, (check,))):
        check.phase(name, phase, *args)
        assert check.summary["phases"][name]["status"] == "ok", check.summary["phases"][name]
    step = check.summary["step_float32"]
    assert {"triton", "torch", "eager", "compile", "cublas"} <= step.keys()
    assert step["eager"]["bytes_moved"] > step["triton"]["bytes_moved"] > 0
    assert len(check.summary["elementwise"]) == 4
    assert check.summary["calibration"]["max_relative_error_vs_cpu"] == 0.0
    goals = check.summary["goals"]
    assert sum(name.startswith("step fwd+bwd float32") for name in goals) == 2
    assert sum("copy bandwidth" in name for name in goals) == 4 and sum("calibrate" in name for name in goals) == 2
