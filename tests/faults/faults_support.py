"""What the fault tests share: a small fitted flow, inputs with known bad rows, the `flowcore
calibrate` command run in a child process with each chunk slowed down (so that a signal or a
second job lands mid-job), the job's stage seam, and readers of what a job left behind."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DIM = 8
REPO = Path(__file__).resolve().parents[2]

SLOW_CLI = """
import sys, time
import flowcore.batch.job as job
from flowcore.cli import main

seconds = float(sys.argv[1])

def slow(stage, chunk):  # half before a chunk's write, half between its write and its commit
    if stage in ("writing", "written"):
        time.sleep(seconds / 2)

job._at_stage = slow
sys.exit(main(["calibrate", *sys.argv[2:], "--quiet"]))
"""


@contextlib.contextmanager
def at_stage(hook):
    """The local job's stage seam (`flowcore.batch.job._at_stage`) set to `hook(stage, chunk)`
    inside the block."""
    import flowcore.batch.job as job

    saved, job._at_stage = job._at_stage, hook
    try:
        yield
    finally:
        job._at_stage = saved


def fitted_flow(folder: Path, dim: int = DIM, seed: int = 0) -> Path:
    """A small flow fitted on random `dim`-wide vectors, saved in `folder`."""
    from flowcore import FlowCalibrator

    rng = np.random.default_rng(seed)
    calibrator = FlowCalibrator(seed=0, config="l2_d2_w32").fit(rng.normal(size=(128, dim)).astype(np.float32),
                                                                show_progress_bar=False)
    path = folder / f"model-{dim}.flow"
    calibrator.save(path)
    return path


def embeddings(path: Path, rows: int = 400, dim: int = DIM) -> np.ndarray:
    """Random float32 embeddings with NaN/Inf rows at 5 and rows // 2, saved as .npy."""
    matrix = np.random.default_rng(1).normal(size=(rows, dim)).astype(np.float32)
    matrix[5, 1] = np.nan
    matrix[rows // 2, 0] = np.inf
    np.save(path, matrix)
    return matrix


def cli_args(flow: Path, source: Path, out: Path, chunk_rows: int = 40) -> list[str]:
    return ["--calibrator", str(flow), "--embeddings", str(source), "--out", str(out), "--chunk-rows", str(chunk_rows)]


def start_slow_cli(args: list[str], seconds_per_chunk: float = 0.3) -> subprocess.Popen:
    """`flowcore calibrate ARGS` in a child process, each chunk slowed by `seconds_per_chunk`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(seconds_per_chunk), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    """`flowcore calibrate ARGS` to the end, in a child process."""
    return subprocess.run([sys.executable, "-m", "flowcore", "calibrate", *args, "--quiet"],
                          capture_output=True, text=True)


def chunks_done(out: Path) -> int:
    """The chunks the progress file records (-1 when there is none yet)."""
    try:
        return json.loads(Path(f"{out}.progress.json").read_text())["done"]["chunks"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


def wait_for_chunks(process: subprocess.Popen, out: Path, chunks: int, timeout: float = 120) -> int:
    """Wait until the progress file of `process`'s job records at least `chunks` chunks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"finished early: {process.communicate()}"
        if (done := chunks_done(out)) >= chunks:
            return done
        time.sleep(0.01)
    raise AssertionError(f"no {chunks} chunks within {timeout} s")


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in Path(f"{out}.rejects.jsonl").read_text(encoding="utf-8").splitlines()]


def leftovers(out: Path) -> list[str]:
    """What a job left beside `out` except the output, its rejects file and its manifest."""
    keep = {out.name, out.name + ".rejects.jsonl", out.name + ".manifest.json"}
    return sorted(p.name for p in out.parent.iterdir()
                  if p.name.startswith((out.name, f".{out.name}")) and p.name not in keep)


def same_result(out: Path, reference: Path) -> bool:
    """The output and its rejects file are byte-identical to the reference run's."""
    return (out.read_bytes() == reference.read_bytes()
            and Path(f"{out}.rejects.jsonl").read_bytes() == Path(f"{reference}.rejects.jsonl").read_bytes())
