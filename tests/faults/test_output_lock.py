"""One writer per output: a second job on the same output (also a resume, also --restart) is
refused at once naming the holder; a lock left by a killed job is taken over. (Against a job
running in another process: test_interrupts.py, which also leaves a killed holder's lock.)"""
import json
import os
import socket

import pytest
from faults_support import embeddings, leftovers

from flowcore.batch.job import OutputLockedError, calibrate_file
from flowcore.batch.lock import OutputLock
from flowcore.cli import main


def test_a_held_lock_refuses_a_second_job_naming_the_holder_and_touches_nothing(tmp_path, flow_path, capsys):
    embeddings(tmp_path / "in.npy", rows=100)
    out = tmp_path / "out.npy"
    with OutputLock(out):
        holder = json.loads((tmp_path / "out.npy.lock").read_text())
        with pytest.raises(OutputLockedError) as refused:
            calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
        message = str(refused.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}, started {holder['started']}" in message
        assert main(["calibrate", "--calibrator", str(flow_path), "--embeddings", str(tmp_path / "in.npy"),
                     "--out", str(out), "--restart", "--quiet"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"flowcore calibrate: error: {message}"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy", "out.npy.lock"]
    assert not (tmp_path / "out.npy.lock").exists()
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
    assert leftovers(out) == []


def test_a_lock_file_left_by_a_dead_job_is_taken_over(tmp_path, flow_path):
    embeddings(tmp_path / "in.npy", rows=100)
    out = tmp_path / "out.npy"
    stale = {"pid": 999_999_999, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
    (tmp_path / "out.npy.lock").write_text(json.dumps(stale))
    with OutputLock(out) as lock:
        assert lock.took_over == stale
        assert json.loads((tmp_path / "out.npy.lock").read_text())["pid"] == os.getpid()
    (tmp_path / "out.npy.lock").write_text(json.dumps(stale))
    summary = calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", show_progress_bar=False)
    assert summary.rows == 100 and leftovers(out) == []
    assert summary.lock_taken_over == stale
    assert str(summary).splitlines()[-1] == ("took over the lock of a job that is no longer running "
                                             f"(pid 999999999 on {socket.gethostname()}, started {stale['started']})")
