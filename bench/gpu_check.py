"""The GPU check: every CUDA test and GPU benchmark of flowcore in one short run (under five
minutes on an H200), its figures in one JSON summary.

    python3 -m pip install --no-deps --no-build-isolation -e .   # once, with the machine's torch
    python3 bench/gpu_check.py --out DIR

Phases, the summary (DIR/gpu_summary.json) rewritten after each one and printed last:
1. preflight: Python, torch, Triton and ptxas versions, the device, its SMs, shared memory per
   block and clocks; `flowcore.kernels` must import (else the install line above is run);
2. ceilings measured here: device copy bandwidth, pinned host-to-device bandwidth, cuBLAS GEMM
   throughput in bf16 and TF32;
3. pre-compile: every Triton variant the library launches, compiled in parallel processes
   (`tests/helpers/sm90_compile.py`), which fills Triton's cache for the tests and benchmarks;
4. the CUDA tests (`pytest -m gpu`, 8 workers with pytest-xdist), within a share of the time,
   each result streamed to DIR/gpu-tests.jsonl as it finishes;
5. benchmarks at batch 262144, d = 768, goal groups first, each only if time is left: the training
   step fwd+bwd in bf16 and fp32/TF32 (Triton, flowcore's PyTorch backend, eager, torch.compile
   with static shapes, the step's cuBLAS GEMMs alone), the four elementwise groups against the
   copy bandwidth, calibrating 10 M x 768 vectors from host memory against the host-to-device
   bandwidth, and the encoder against sentence-transformers.
Files written (at most 8): gpu_summary.json, gpu-tests.jsonl, gpu-tests.log, sm90-variants.json,
bench-encoder.json, bench-encoder.log. Exit status 0 when every CUDA test passed.

Goals (issue 11): step >= 2x eager and >= 1.2x torch.compile; elementwise >= 80 % of the copy
bandwidth; the 10 M x 768 calibration correct and >= 50 % of the host-to-device bandwidth.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
BATCH, DIM = 262144, 768
DEVICE = "cuda"  # the benchmarks' device (tests run the phases on the CPU at small sizes)
STEP_GOALS = {"eager": 2.0, "compile": 1.2}
COPY_FRACTION_GOAL = 0.8
H2D_FRACTION_GOAL = 0.5
CALIBRATION_ROWS = 10_000_000


class Check:
    """The summary, rewritten to disk after every phase, and the time left."""

    def __init__(self, out: Path, budget: float):
        self.out, self.deadline = out, time.monotonic() + budget
        self.summary: dict = {"phases": {}, "goals": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self) -> None:
        path = self.out / "gpu_summary.json"
        path.with_suffix(".tmp").write_text(json.dumps(self.summary, indent=1, default=str))
        path.with_suffix(".tmp").replace(path)

    def phase(self, name: str, fn, *args) -> None:
        """Run one phase, recording its time and any error; the summary is written either way."""
        start = time.monotonic()
        try:
            self.summary[name] = fn(*args)
            status = "ok"
        except Exception as error:  # a failed phase must not cost the others their figures
            status = f"error: {type(error).__name__}: {str(error)[:500]}"
        self.summary["phases"][name] = {"status": status, "seconds": round(time.monotonic() - start, 1)}
        self.write()

    def goal(self, name: str, measured: float, target: float) -> None:
        self.summary["goals"][name] = {"measured": round(measured, 3), "target": target, "met": measured >= target}


def _ensure_installed() -> None:
    """Install flowcore with the machine's own torch and Triton (offline) if it does not import,
    then start again: a running interpreter does not see a fresh editable install."""
    try:
        import flowcore.kernels  # noqa: F401
    except ImportError:
        if os.environ.get("FLOWCORE_GPU_CHECK_INSTALLED"):
            raise
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                        str(REPO)], check=True)
        os.environ["FLOWCORE_GPU_CHECK_INSTALLED"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def preflight() -> dict:
    import torch
    import triton

    import flowcore.kernels  # noqa: F401

    props = torch.cuda.get_device_properties(0)
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "device": props.name, "sms": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
            "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None)}
    try:
        import triton.backends.nvidia.compiler as nvidia
        try:
            ptxas = nvidia.get_ptxas(90)
        except TypeError:  # Triton 3.6: no architecture argument
            ptxas = nvidia.get_ptxas()
        info["ptxas"] = subprocess.run([ptxas.path, "--version"], capture_output=True, text=True).stdout.split(
            "\n")[-2:]
    except Exception as error:
        info["ptxas"] = f"unknown ({error})"
    try:
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw",
                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        info["clocks_sm_maxsm_mem_power"] = clocks.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["clocks_sm_maxsm_mem_power"] = "nvidia-smi not available"
    return info


def ceilings() -> dict:
    import torch
    from gpu_workloads import copy_bandwidth_gbps, gemm_tflops, host_to_device_gbps

    torch.set_float32_matmul_precision("high")
    return {"copy_gbps": round(copy_bandwidth_gbps(), 1), "h2d_gbps": round(host_to_device_gbps(), 1),
            "gemm_bf16_tflops": round(gemm_tflops(torch.bfloat16), 1),
            "gemm_tf32_tflops": round(gemm_tflops(torch.float32), 1)}


def precompile(out: Path, limit: float) -> dict:
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "sm90_compile.py"),
                             "--json", str(out / "sm90-variants.json")],
                            capture_output=True, text=True, timeout=max(limit, 10),
                            env={**os.environ, "PYTHONPATH": str(REPO / "tests")})  # the tests' env: same cache keys
    return {"exit": result.returncode, "seconds": round(time.monotonic() - start, 1),
            "report": (result.stdout + result.stderr).strip().splitlines()[-6:]}


def run_tests(out: Path, limit: float, paths: tuple[str, ...] = ("tests",)) -> dict:
    """The CUDA tests (marked `gpu`) under `paths`, stopped after `limit` seconds; counts and
    failures from the results streamed so far."""
    import importlib.util
    results = out / "gpu-tests.jsonl"
    results.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "jsonl_results", "-m", "gpu",
               *paths]
    if importlib.util.find_spec("xdist"):
        command += ["-n", "8"]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1", "FLOWCORE_TEST_JSONL": str(results),
           "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    with (out / "gpu-tests.log").open("w") as log:
        try:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=max(limit, 10)).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    counts = {outcome: sum(r["outcome"] == outcome for r in rows) for outcome in ("passed", "failed", "skipped")}
    return {"exit": code, "seconds": round(time.monotonic() - start, 1), **counts,
            "failed_tests": [{"test": r["test"], "message": r["message"]} for r in rows if r["outcome"] == "failed"]}


def _ratios(times: dict, first: str = "triton") -> dict:
    """Medians in ms, and other / first for every other implementation."""
    row = {label: {"min_ms": round(t["min_s"] * 1e3, 3), "median_ms": round(t["median_s"] * 1e3, 3)}
           for label, t in times.items()}
    for label, t in times.items():
        if label != first:
            row[label][f"{label}_over_{first}"] = round(t["median_s"] / times[first]["median_s"], 3)
    return row


def bench_step(check: Check, dtype_name: str) -> dict:
    import torch
    from gpu_workloads import bytes_moved, flow_step_train, time_interleaved

    torch.set_float32_matmul_precision("high")
    dtype = getattr(torch, dtype_name)
    workload = flow_step_train(BATCH, DIM, dtype, device=DEVICE)
    times = time_interleaved(workload["calls"], rounds=5, inner=3)
    row = _ratios(times)
    for label in ("triton", "torch", "eager", "cublas"):  # compiled code runs outside the dispatcher
        row[label]["bytes_moved"] = bytes_moved(workload["calls"][label])
    triton_s = times["triton"]["median_s"]
    row["triton"]["tflops"] = round(workload["flops"] / triton_s / 1e12, 1)
    row["triton"]["gbps_minimum_bytes"] = round(workload["bytes"] / triton_s / 1e9, 1)
    for other, target in STEP_GOALS.items():
        check.goal(f"step fwd+bwd {dtype_name} {BATCH}x{DIM}: {other} / triton >= {target}",
                   times[other]["median_s"] / triton_s, target)
    return row


def bench_elementwise(check: Check) -> dict:
    import torch
    from gpu_workloads import ELEMENTWISE, time_interleaved

    copy_gbps = check.summary["ceilings"]["copy_gbps"]
    table = {}
    for name, build in ELEMENTWISE.items():
        if check.left() < 20:
            table[name] = "not run: time budget spent"
            continue
        workload = build(BATCH, DIM, torch.bfloat16, device=DEVICE)
        times = time_interleaved(workload["calls"], rounds=5, inner=5)
        row = _ratios(times)
        for label, t in times.items():
            row[label]["gbps"] = round(workload["bytes"] / t["median_s"] / 1e9, 1)
            row[label]["copy_fraction"] = round(row[label]["gbps"] / copy_gbps, 3)
        check.goal(f"{name} bf16 {BATCH}x{DIM}: triton >= {COPY_FRACTION_GOAL:.0%} of copy bandwidth",
                   row["triton"]["copy_fraction"], COPY_FRACTION_GOAL)
        table[name] = row
        check.summary["elementwise"] = table
        check.write()
    return table


def bench_calibration(check: Check) -> dict:
    """10 M x 768 float32 vectors in host memory through a fitted calibrator on the GPU, in one
    call: checked against the CPU on a spread of rows, timed against the host-to-device bandwidth."""
    import numpy as np
    import torch

    import flowcore

    torch.set_float32_matmul_precision("highest")  # float32 to float32 tolerance: no TF32
    rng = np.random.default_rng(0)
    sample = (rng.standard_normal((8192, DIM)) @ rng.standard_normal((DIM, DIM)) / DIM**0.5).astype(np.float32)
    path = check.out / "calibrator.flow"
    flowcore.FlowCalibrator(epochs=1, batch_size=256, seed=0).fit(sample, show_progress_bar=False).save(path)
    cpu, gpu = flowcore.FlowCalibrator.load(path), flowcore.FlowCalibrator.load(path, device=DEVICE)
    path.unlink()
    X = np.empty((CALIBRATION_ROWS, DIM), dtype=np.float32)
    for start in range(0, CALIBRATION_ROWS, len(sample)):
        X[start : start + len(sample)] = sample[: CALIBRATION_ROWS - start]
    X[:: len(sample) + 1] += 1.0  # rows that differ from the sample they were copied from
    gpu.transform(X[: CALIBRATION_ROWS // 10])  # warm up: compiles, cuBLAS heuristics, pinned buffers
    start = time.monotonic()
    Z = gpu.transform(X)
    seconds = time.monotonic() - start
    middle = CALIBRATION_ROWS // 2
    rows = np.concatenate([np.arange(4096), np.arange(middle, middle + 4096),
                           np.arange(CALIBRATION_ROWS - 4096, CALIBRATION_ROWS),
                           np.arange(0, CALIBRATION_ROWS, len(sample) + 1)])
    expected = cpu.transform(X[rows])
    error = float(np.abs(Z[rows] - expected).max() / max(np.abs(expected).max(), 1e-30))
    gbps = X.nbytes / seconds / 1e9
    fraction = gbps / check.summary["ceilings"]["h2d_gbps"]
    check.goal(f"calibrate {CALIBRATION_ROWS}x{DIM} from host: >= {H2D_FRACTION_GOAL:.0%} of host-to-device bandwidth",
               fraction, H2D_FRACTION_GOAL)
    check.goal(f"calibrate {CALIBRATION_ROWS}x{DIM}: max |gpu - cpu| / max |cpu| <= 1e-4 (1 = met)",
               float(error <= 1e-4), 1.0)
    return {"seconds": round(seconds, 2), "input_gbps": round(gbps, 1), "h2d_fraction": round(fraction, 3),
            "max_relative_error_vs_cpu": error, "checked_rows": int(len(rows))}


def bench_encoder(check: Check, limit: float) -> dict:
    ratios = check.out / "bench-encoder.json"
    env = {**os.environ, "FLOWCORE_BENCH_JSON": str(ratios), "TRITON_INTERPRET": "0"}
    with (check.out / "bench-encoder.log").open("w") as log:
        try:
            code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "bench/test_bench_encoder_gpu.py"], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=max(limit, 10)).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    result = json.loads(ratios.read_text()) if ratios.exists() else {}
    for name, row in result.get("goals", {}).items():
        check.summary["goals"][name] = row
    return {"exit": code, **{k: v for k, v in result.items() if k != "goals"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_summary.json and the raw results")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for the whole check (default 280)")
    parser.add_argument("--test-seconds", type=float, default=100.0, help="time limit of the CUDA tests")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out.resolve(), args.budget)
    import torch
    if torch.cuda.is_available():
        _ensure_installed()
    else:
        check.summary["error"] = "no CUDA GPU visible: nothing was run"
        check.write()
        print(json.dumps(check.summary))
        return 2
    check.phase("preflight", preflight)
    check.phase("ceilings", ceilings)
    check.phase("precompile", precompile, check.out, min(60.0, check.left() - 200))
    check.phase("tests", run_tests, check.out, min(args.test_seconds, check.left() - 120))
    for dtype_name in ("bfloat16", "float32"):
        if check.left() > 60:
            check.phase(f"step_{dtype_name}", bench_step, check, dtype_name)
    if check.left() > 40:
        check.phase("elementwise", bench_elementwise, check)
    if check.left() > 40:
        check.phase("calibration", bench_calibration, check)
    if check.left() > 25:
        check.phase("encoder", bench_encoder, check, check.left() - 5)
    check.summary["seconds_left"] = round(check.left(), 1)
    check.write()
    print(json.dumps(check.summary, default=str))
    tests = check.summary.get("tests", {})
    return 0 if tests.get("exit") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
