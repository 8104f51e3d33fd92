"""Flat memory, measured: peak RSS of `flowcore calibrate` on 1 M and 8 M x 384 float32 .npy
inputs (goal: the 8 M peak within 10 % of the 1 M peak), of a streaming whitening fit over
2 M x 768 vectors read block by block from a memory-mapped .npy (goal: < 1 GB above the
interpreter's own baseline with the same imports), and of `flowcore fit --embeddings` on 1 M and
4 M x 384 (one epoch, batch 4096; the fit's own memory is O(d² + batch·d), so what grows is the
memory map's file pages that training touched, which the kernel can drop at any time; the goal:
RssAnon, measured with glibc's mmap threshold fixed, grows by less than a copy of the extra rows).

Peaks are `/usr/bin/time -v`'s "Maximum resident set size" of a child process (or the child's
`resource.getrusage` peak where /usr/bin/time is missing). Inputs are written in chunks to
$FLOWCORE_BENCH_DIR (default /tmp) and deleted afterwards. The full sizes need ~25 GB of disk
(8 M x 384 in and out) and take minutes, so they run only with FLOWCORE_BENCH_BIG=1; otherwise
the same measurements run at 1/40 of the rows (25 000 against 200 000 rows for calibrate:
still an 8-fold growth of the input).

Run: `FLOWCORE_BENCH_BIG=1 pytest bench/test_bench_memory.py -s`.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

BIG = os.environ.get("FLOWCORE_BENCH_BIG") == "1"
SCALE = 1 if BIG else 40
TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
WHITENING_FIT = """
import sys, resource
from flowcore.batch.vector_sources import NpyMatrix
from flowcore.calibration.whitening import Whitening
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] != "baseline":
    whitening = Whitening().fit_chunks(block for _, block in NpyMatrix(sys.argv[1]).blocks(16384))
    print("rank", whitening.rank, "rows", whitening.rows)
print("peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "baseline_kib", baseline)
"""


@pytest.fixture(scope="module")
def folder():
    path = Path(tempfile.mkdtemp(prefix="flowcore-bench-", dir=os.environ.get("FLOWCORE_BENCH_DIR", "/tmp")))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_npy(path: Path, rows: int, dim: int, seed: int = 0, block: int = 262144) -> Path:
    """A float32 (rows, dim) .npy written a block at a time through a memory map."""
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)).astype(np.float32) / np.sqrt(dim)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        matrix[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32) @ mixing
    matrix.flush()
    del matrix
    return path


def peak_rss_kib(command: list[str]) -> tuple[int, str]:
    """(peak resident set size in KiB, stdout) of `command` run as a child process."""
    if TIME is not None:
        result = subprocess.run([TIME, "-v", *command], capture_output=True, text=True, check=True)
        peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
        return peak, result.stdout
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
               "print('peak_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True, check=True)
    return int(re.search(r"peak_kib (\d+)", result.stderr).group(1)), result.stdout


def test_calibrate_peak_rss_does_not_grow_with_the_input(folder, goal):
    from flowcore import FlowCalibrator

    dim, small, large = 384, 1_000_000 // SCALE, 8_000_000 // SCALE
    flow = folder / "model.flow"
    sample = np.random.default_rng(1).normal(size=(4096, dim)).astype(np.float32)
    FlowCalibrator(config="l2_d2_w32", epochs=1, batch_size=256, seed=0).fit(sample, show_progress_bar=False).save(flow)
    peaks = {}
    for rows in (small, large):
        source = write_npy(folder / f"in-{rows}.npy", rows, dim)
        out = folder / f"out-{rows}.npy"
        peaks[rows], _ = peak_rss_kib([sys.executable, "-m", "flowcore", "calibrate", "--flow", str(flow),
                                       "--embeddings", str(source), "--out", str(out), "--no-progress"])
        assert np.load(out, mmap_mode="r").shape == (rows, dim)
        source.unlink()
        out.unlink()
    ratio = peaks[large] / peaks[small]
    print(f"\ncalibrate peak RSS: {small:,} x {dim}: {peaks[small] / 1024:.0f} MiB; "
          f"{large:,} x {dim}: {peaks[large] / 1024:.0f} MiB; ratio {ratio:.3f}")
    goal(f"calibrate: peak RSS at {large:,} rows / at {small:,} rows", ratio, 1.10, at_most=True,
         how=f"{peaks[large] / 1024:.0f} / {peaks[small] / 1024:.0f} MiB, x {dim} .npy")
    assert ratio <= 1.10


def test_streaming_whitening_fit_stays_under_a_gigabyte_above_baseline(folder, goal):
    dim, rows = 768, 2_000_000 // SCALE
    source = write_npy(folder / "whiten.npy", rows, dim, seed=2)
    baseline, _ = peak_rss_kib([sys.executable, "-c", WHITENING_FIT, "baseline"])
    peak, printed = peak_rss_kib([sys.executable, "-c", WHITENING_FIT, str(source)])
    source.unlink()
    assert f"rows {rows}" in printed
    above = (peak - baseline) / 1024
    print(f"\nstreaming whitening fit over {rows:,} x {dim} ({rows * dim * 4 / 2**30:.1f} GiB): peak "
          f"{peak / 1024:.0f} MiB, interpreter baseline {baseline / 1024:.0f} MiB, {above:.0f} MiB above it")
    goal(f"streaming whitening fit over {rows:,} x {dim}: MiB above the interpreter's baseline", above, 1024,
         at_most=True, how=f"peak {peak / 1024:.0f} MiB, baseline {baseline / 1024:.0f} MiB")
    assert above < 1024


def peak_rss_and_anonymous_kib(command: list[str], interval: float = 0.2, env: dict | None = None
                               ) -> tuple[int, int, str]:
    """(`/usr/bin/time -v`'s peak RSS, the peak of RssAnon sampled every `interval` s, stdout), in
    KiB, of `command`: RSS counts the pages of a memory-mapped input that were read (file pages the
    kernel may drop at any time), RssAnon only the process's own memory."""
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen([TIME, "-v", *command], stdout=subprocess.PIPE, stderr=errors, text=True,
                                   env=None if env is None else {**os.environ, **env})
        anonymous = 0
        while process.poll() is None:
            try:
                with open(f"/proc/{process.pid}/task/{process.pid}/children") as children:
                    for child in children.read().split():
                        with open(f"/proc/{child}/status") as status:
                            for line in status:
                                if line.startswith("RssAnon:"):
                                    anonymous = max(anonymous, int(line.split()[1]))
            except OSError:  # the child is starting or has just ended
                pass
            time.sleep(interval)
        stdout = process.stdout.read()
        errors.seek(0)
        stderr = errors.read()
    if process.returncode != 0:
        raise AssertionError(f"{command} failed ({process.returncode}): {stderr[-2000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr).group(1))
    return peak, anonymous, stdout


@pytest.mark.skipif(TIME is None or not os.path.exists("/proc/self/status"), reason="needs /usr/bin/time and /proc")
def test_fit_peak_rss_on_a_memory_mapped_corpus(folder, goal):
    """RssAnon growth from the small to the large corpus, with glibc's mmap threshold fixed (1 MiB):
    its default threshold rises with each large block freed, after which freed blocks stay in the
    heap and RssAnon counts them as if live; fixed, RssAnon is live memory, which is what a copy
    of the data would add. Both are printed."""
    dim, small, large = 384, 1_000_000 // SCALE, 4_000_000 // SCALE
    peaks = {}
    for rows in (small, large):
        source = write_npy(folder / f"fit-{rows}.npy", rows, dim, seed=3)
        out = folder / f"fit-{rows}.flow"
        command = [sys.executable, "-m", "flowcore", "fit", "--embeddings", str(source), "--out", str(out),
                   "--calibration", "flow", "--config", "l2_d2_w32", "--epochs", "1", "--batch-size", "4096"]
        for allocator, env in (("default", None), ("fixed", {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)})):
            *peaks[rows, allocator], printed = peak_rss_and_anonymous_kib(command, env=env)
            assert f"on {rows} x {dim}" in printed and out.exists()
            out.unlink()
            print(f"\nfit on {rows:,} x {dim} (memory-mapped, {rows * dim * 4 / 2**20:.0f} MiB), {allocator} mmap "
                  f"threshold: peak RSS {peaks[rows, allocator][0] / 1024:.0f} MiB, peak RssAnon "
                  f"{peaks[rows, allocator][1] / 1024:.0f} MiB")
        source.unlink()
    extra = (large - small) * dim * 4
    for allocator in ("default", "fixed"):
        growth = (peaks[large, allocator][1] - peaks[small, allocator][1]) * 1024
        print(f"RssAnon growth, {allocator} mmap threshold: {growth / 2**20:.0f} MiB for {extra / 2**20:.0f} MiB "
              f"more input")
    growth = (peaks[large, "fixed"][1] - peaks[small, "fixed"][1]) * 1024
    default = (peaks[large, "default"][1] - peaks[small, "default"][1]) * 1024
    goal(f"fit on a memory-mapped corpus, {small:,} -> {large:,} rows: RssAnon growth / a copy of the extra rows",
         growth / extra, 1.0, at_most=True,
         how=f"glibc mmap threshold fixed; {growth / 2**20:.0f} / {extra / 2**20:.0f} MiB (default threshold: "
             f"{default / 2**20:.0f} MiB)")
    assert growth < extra  # one in-memory copy of the extra rows would add at least that
