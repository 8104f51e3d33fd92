"""Ctrl-C and kill: the first SIGINT/SIGTERM stops a job at a chunk boundary with one line saying
where and exit status 130/143, a second exits at once; nothing half-written is visible and the
same command resumes to a byte-identical result."""
import json
import os
import signal
import socket

import pytest
from faults_support import (
    at_stage,
    chunks_done,
    cli_args,
    embeddings,
    leftovers,
    same_result,
    start_slow_cli,
    wait_for_chunks,
)

from flowcore.batch.job import JobInterrupted, calibrate_file
from flowcore.cli import main


def test_a_signal_in_process_stops_at_a_chunk_boundary_and_the_job_resumes(tmp_path, flow_path):
    embeddings(tmp_path / "in.npy", rows=400)
    reference = tmp_path / "reference.npy"
    calibrate_file(flow_path, reference, embeddings=tmp_path / "in.npy", chunk_rows=40, show_progress_bar=False)
    out = tmp_path / "out.npy"
    installed = signal.getsignal(signal.SIGINT)  # Python's own, or "ignored" under nohup or `&`

    def interrupt(stage, chunk):
        if stage == "written" and chunk.index == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(JobInterrupted) as stopped, at_stage(interrupt):
        calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=40, show_progress_bar=False)
    rows = stopped.value.rows
    assert rows % 40 == 0 and 120 <= rows < 400 and chunks_done(out) * 40 == rows
    assert stopped.value.exit_status == 130
    assert str(stopped.value) == f"SIGINT: stopped at row {rows}; rerun the same command to resume"
    assert not out.exists() and not (tmp_path / "out.npy.lock").exists()
    assert signal.getsignal(signal.SIGINT) is installed  # the handler is given back

    summary = calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=40, show_progress_bar=False)
    assert summary.resumed_from == rows
    assert same_result(out, reference) and leftovers(out) == []


def test_cli_sigint_exits_130_with_one_line_saying_where_it_stopped(tmp_path, flow_path, monkeypatch, capsys):
    import flowcore.batch.job as job

    embeddings(tmp_path / "in.npy", rows=200)
    out = tmp_path / "out.npy"

    def interrupt(stage, chunk):
        if stage == "committed" and chunk.index == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(job, "_at_stage", interrupt)
    assert main(["calibrate", *cli_args(flow_path, tmp_path / "in.npy", out), "--quiet"]) == 130
    rows = chunks_done(out) * 40
    assert rows >= 80
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"flowcore calibrate: SIGINT: stopped at row {rows}; rerun the same command to resume")


def test_cli_a_second_job_is_refused_then_sigterm_and_a_double_sigint_stop_cleanly_and_it_resumes_identically(
        tmp_path, flow_path, capsys):
    """One child process per stop (they are slow to start): while the first runs, a second job
    (here, in this process; also with --restart) is refused naming it; SIGTERM stops it; a
    second child gets two SIGINTs and exits at once, leaving a stale lock file that the final
    resume takes over."""
    embeddings(tmp_path / "in.npy", rows=400)
    reference = tmp_path / "reference.npy"
    calibrate_file(flow_path, reference, embeddings=tmp_path / "in.npy", chunk_rows=40, show_progress_bar=False)
    out = tmp_path / "out.npy"
    args = cli_args(flow_path, tmp_path / "in.npy", out)

    process = start_slow_cli(args, seconds_per_chunk=0.6)
    wait_for_chunks(process, out, 1)
    for extra in ([], ["--restart"]):  # --restart must not wipe the running job's work either
        assert main(["calibrate", *args, *extra, "--quiet"]) == 2
        started = json.loads((tmp_path / "out.npy.lock").read_text())["started"]
        assert capsys.readouterr().err.strip().splitlines() == [
            f"flowcore calibrate: error: {out} is being written by another flowcore job (pid {process.pid} on "
            f"{socket.gethostname()}, started {started}); wait for it to finish or stop it, then rerun "
            f"(the lock is {out}.lock)"]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate()
    assert process.returncode == 143, stderr
    rows = chunks_done(out) * 40
    assert stderr.strip().splitlines()[-1] == (f"flowcore calibrate: SIGTERM: stopped at row {rows}; "
                                               "rerun the same command to resume")
    assert not out.exists(), "an incomplete output must never look complete"

    process = start_slow_cli(args, seconds_per_chunk=2.0)  # a second Ctrl-C while the first waits for a chunk
    wait_for_chunks(process, out, chunks_done(out) + 1)
    process.send_signal(signal.SIGINT)
    while "stopping" not in process.stderr.readline():
        pass
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate()
    assert process.returncode == 130
    assert stderr.strip().splitlines()[-1] == "SIGINT again: exiting now; rerun the same command to resume"
    assert not out.exists() and (tmp_path / "out.npy.lock").exists()  # a stale lock, its flock released

    assert main(["calibrate", *args, "--quiet"]) == 0
    assert "resumed at row" in capsys.readouterr().out
    assert same_result(out, reference) and leftovers(out) == []
