"""The GPU check: on a CUDA machine, run the CUDA kernel tests and the GPU benchmarks in under
five minutes and write a JSON summary (tests, medians, GB/s, speed ratios, goals) to a folder.

    python bench/gpu_check.py --out DIR

Writes DIR/gpu_summary.json (plus the raw pytest/benchmark files beside it) and exits 0 when
every CUDA test passed. The benchmarks run in chunks, most important first (flow step, then the
elementwise kernels), each with its own time limit, so a slow machine still reports what finished.
Goals on an H200: flow step forward+backward >= 2x eager and >= 1.2x torch.compile; elementwise
kernels >= 80 % of HBM bandwidth.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch
from test_bench_kernels_gpu import CHUNKS as BENCH_CHUNKS  # this folder is on sys.path for a script

REPO = Path(__file__).resolve().parents[1]
TESTS = "tests"  # the CUDA tests are the ones marked `gpu` (pytest -m gpu)
BENCH = "bench/test_bench_kernels_gpu.py"
# BENCH_CHUNKS (BENCH's CHUNKS), most important first: each benchmark is marked
# `gpu(chunk=NAME)` and a chunk runs with -m "gpu(chunk='NAME')".
STEP_GOALS = {"eager": 2.0, "compile": 1.2}
HBM_GOAL = 0.8
ELEMENTWISE_GROUPS = ("actnorm forward", "affine coupling forward", "actnorm forward+backward",
                      "affine coupling forward+backward")


def _run(command: list[str], limit: float, env: dict, log: Path) -> dict:
    """Run `command` with a time limit, its output into `log`; returns exit status and time."""
    start = time.monotonic()
    with log.open("w") as stream:
        try:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                  timeout=max(limit, 1)).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"exit": code, "seconds": round(time.monotonic() - start, 1), "log": log.name}


def _junit_counts(path: Path) -> dict:
    if not path.exists():
        return {}
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["failed_tests"] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase") if case.find("failure") is not None or case.find("error") is not None
    ]
    return counts


def _speedups(groups: dict) -> dict:
    """Per benchmark group: ms per op call for each label, eager/triton and compile/triton, GB/s."""
    table = {}
    for group, entry in groups.items():
        medians = entry.get("median_s", {})
        row = {key: round(value, 4) for key, value in entry.items() if key.endswith("_ms_per_op")}
        if "triton" in medians:
            for other in ("eager", "compile"):
                if other in medians:
                    row[f"speedup_vs_{other}"] = round(medians[other] / medians["triton"], 3)
        if "triton_fused" in medians:
            for other in ("triton", "eager", "compile"):
                if other in medians:
                    row[f"fused_speedup_vs_{other}"] = round(medians[other] / medians["triton_fused"], 3)
        for key, value in entry.items():
            if key.endswith(("gbps", "hbm_fraction", "tflops")):
                row[key] = round(value, 3)
        table[group] = row
    return table


def _goals(table: dict) -> dict:
    goals = {}
    for group, row in table.items():
        if group.startswith("flow step forward+backward") and "batch=262144" in group:
            for other, target in STEP_GOALS.items():
                if f"speedup_vs_{other}" in row:
                    goals[f"{group}: >= {target}x {other}"] = row[f"speedup_vs_{other}"] >= target
        if group.startswith(ELEMENTWISE_GROUPS) and "batch=262144" in group and "hbm_fraction" in row:
            goals[f"{group}: >= {HBM_GOAL:.0%} of HBM"] = row["hbm_fraction"] >= HBM_GOAL
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_summary.json and raw results")
    parser.add_argument("--budget", type=float, default=285.0, help="seconds for the whole check (default 285)")
    parser.add_argument("--test-share", type=float, default=0.45, help="part of the budget for the tests")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget

    summary = {"cuda": torch.cuda.is_available(), "torch": torch.__version__}
    if not summary["cuda"]:
        summary["error"] = "no CUDA GPU visible: nothing was run"
        (out / "gpu_summary.json").write_text(json.dumps(summary, indent=2))
        print(summary["error"], file=sys.stderr)
        return 2
    import triton

    summary.update(device=torch.cuda.get_device_name(), triton=triton.__version__)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

    junit = out / "gpu-tests.xml"
    summary["tests"] = _run(pytest + [TESTS, "-m", "gpu", f"--junitxml={junit}"], args.budget * args.test_share,
                            env, out / "gpu-tests.log")
    summary["tests"].update(_junit_counts(junit))

    groups, chunks = {}, {}
    for name in BENCH_CHUNKS:
        left = deadline - time.monotonic()
        if left < 15:
            chunks[name] = {"exit": "not run: time budget spent"}
            continue
        ratios = out / f"bench-{name}.json"
        chunk_env = {**env, "FLOWCORE_BENCH_JSON": str(ratios)}
        selection = ["-m", f"gpu(chunk={name!r})", f"--benchmark-json={out / f'benchmark-{name}.json'}"]
        chunks[name] = _run(pytest + [BENCH, *selection], left, chunk_env, out / f"bench-{name}.log")
        if ratios.exists():
            groups.update(json.loads(ratios.read_text()))
    summary["benchmark_chunks"] = chunks
    summary["benchmarks"] = _speedups(groups)
    summary["goals"] = _goals(summary["benchmarks"])
    (out / "gpu_summary.json").write_text(json.dumps(summary, indent=2))

    tests = summary["tests"]
    print(f"{summary['device']}: tests exit {tests['exit']} "
          f"({tests.get('tests', '?')} run, {tests.get('failures', '?')} failed, {tests.get('skipped', '?')} skipped)")
    for goal, met in summary["goals"].items():
        print(f"  {'met    ' if met else 'NOT met'} {goal}")
    print(f"summary: {out / 'gpu_summary.json'}")
    return 0 if tests["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
