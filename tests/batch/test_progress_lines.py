"""Logs that talk: when stderr is a file or a pipe, a batch job writes a plain progress line at a
steady interval (rows done, rows/s, time left; never a carriage return), and says at its start
where it resumes and whose lock it took over; `--quiet` silences all of it, `--progress` into a
file writes lines too; on a terminal the job draws a bar."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowcore import FlowCalibrator, defaults
from flowcore._progress import ProgressReport

DIM = 8
REPO = Path(__file__).resolve().parents[2]
LINE = r"calibrate: [\d,]+ of 400 rows \(\d+%\), [\d,]+ rows/s(, \d+:\d\d left)?"

SLOW_CLI = """
import sys, time
import flowcore.batch.job as job
from flowcore import defaults
from flowcore.cli import main

defaults.PROGRESS_INTERVAL_S = 0.05
stop_after = int(sys.argv[1])

def slow(stage, chunk):
    time.sleep(0.06)
    if stage == "committed" and chunk.index + 1 == stop_after:
        raise SystemExit(9)

job._at_stage = slow
sys.exit(main(["calibrate", *sys.argv[2:]]))
"""


@pytest.fixture(scope="module")
def flow(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    FlowCalibrator(seed=0, config="l2_d2_w32").fit(rng.normal(size=(128, DIM)).astype(np.float32),
                                                   show_progress_bar=False).save(path)
    return path


def run_cli(tmp_path: Path, flow: Path, *flags: str, stop_after: int = 0) -> tuple[int, str, str]:
    """`flowcore calibrate` on 400 rows in 10 slowed chunks, stderr into a file (`stop_after`: exit after that
    many chunks); (exit status, stdout, the stderr file's text)."""
    if not (tmp_path / "in.npy").exists():
        np.save(tmp_path / "in.npy", np.random.default_rng(1).normal(size=(400, DIM)).astype(np.float32))
    argv = ["--calibrator", str(flow), "--embeddings", str(tmp_path / "in.npy"), "--out", str(tmp_path / "out.npy"),
            "--chunk-rows", "40", *flags]
    with open(tmp_path / "stderr.log", "w") as stderr:
        done = subprocess.run([sys.executable, "-c", SLOW_CLI, str(stop_after), *argv], stdout=subprocess.PIPE,
                              stderr=stderr, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return done.returncode, done.stdout, (tmp_path / "stderr.log").read_text()


@pytest.mark.parametrize("flags", [[], ["--progress"]])
def test_into_a_file_a_job_writes_plain_progress_lines_and_where_it_resumes(tmp_path, flow, flags):
    import re

    code, _, log = run_cli(tmp_path, flow, *flags, stop_after=3)
    assert code == 9 and "\r" not in log
    assert log.splitlines() and all(re.fullmatch(LINE, line) for line in log.splitlines()), log

    code, printed, log = run_cli(tmp_path, flow, *flags)
    assert code == 0 and "\r" not in log
    lines = log.splitlines()
    assert lines[0] == f"calibrate: resuming {tmp_path / 'out.npy'} at row 120 of 400"  # before any work
    assert len(lines) > 2 and all(re.fullmatch(LINE, line) for line in lines[1:]), log
    assert "resumed at row 120" in printed  # and the summary says it again


def test_quiet_says_nothing_and_a_taken_over_lock_is_said_at_the_start(tmp_path, flow):
    stale = {"pid": 999_999_999, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
    (tmp_path / "out.npy.lock").write_text(json.dumps(stale))
    code, _, log = run_cli(tmp_path, flow, "--quiet", stop_after=2)
    assert code == 9 and log == ""
    (tmp_path / "out.npy.lock").write_text(json.dumps(stale))
    code, printed, log = run_cli(tmp_path, flow)
    took_over = ("took over the lock of a job that is no longer running (pid 999999999 on "
                 f"{socket.gethostname()}, started 2026-01-01T00:00:00+0000)")
    assert code == 0 and log.splitlines()[:2] == [f"calibrate: {took_over}",
                                                  f"calibrate: resuming {tmp_path / 'out.npy'} at row 80 of 400"]
    assert printed.strip().splitlines()[-1] == took_over


class Stderr:
    def __init__(self, terminal: bool):
        self.terminal, self.text = terminal, ""

    def isatty(self):
        return self.terminal

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("terminal, show, expected", [(False, None, "lines"), (False, True, "lines"),
                                                      (True, None, "bar"), (True, True, "bar"),
                                                      (False, False, "off"), (True, False, "off")])
def test_one_policy_a_bar_on_a_terminal_lines_elsewhere_silence_when_asked(monkeypatch, terminal, show, expected):
    stderr = Stderr(terminal)
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(defaults, "PROGRESS_INTERVAL_S", 0.0)
    with ProgressReport("encode", total=300, done=100, show_progress_bar=show) as report:
        assert report.mode == expected
        report.note("resuming at row 100")
        report.advance(100)
        report.advance(100)
    if expected == "off":
        assert stderr.text == ""
    elif expected == "lines":
        lines = stderr.text.splitlines()
        assert lines[0] == "encode: resuming at row 100" and "\r" not in stderr.text
        assert lines[1].startswith("encode: 200 of 300 rows (67%), ") and lines[2].startswith("encode: 300 of 300 rows")
    else:
        assert "encode: resuming at row 100" in stderr.text and "\r" in stderr.text  # tqdm's frames


def test_lines_come_at_the_interval_and_say_the_time_left(monkeypatch):
    stderr, now = Stderr(False), [0.0]
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr("flowcore._progress.time.monotonic", lambda: now[0])
    report = ProgressReport("calibrate", total=10_000)
    for _ in range(10):
        now[0] += 7.0  # 100 rows every 7 s
        report.advance(100)
    assert stderr.text.splitlines() == [  # every 30 s
        "calibrate: 500 of 10,000 rows (5%), 14 rows/s, 11:05 left",
        "calibrate: 1,000 of 10,000 rows (10%), 14 rows/s, 10:30 left"]
