"""A `calibrate --engine ray` driver killed by SIGKILL takes the local Ray it started with it: within
seconds no process of that Ray session is left (Ray's own agents would linger, reparented to init,
for a minute or more), and a session the driver did not start is never watched."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flowcore import FlowCalibrator
from flowcore.batch.ray_watchdog import watch_session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

DRIVER = r"""
import sys, time
from pathlib import Path

import ray

import flowcore.batch.ray as engine

flow, vectors, out, folder = sys.argv[1:5]
start_ray = ray.init


def init(*args, **kwargs):  # tells the test where the Ray session it starts lives
    context = start_ray(*args, **kwargs)
    Path(folder, "session").write_text(context.address_info["session_dir"])
    return context


def slow(shard):  # in a worker: tells the test the job runs, and keeps it running
    Path(folder, "writing").touch()
    time.sleep(600)


ray.init, engine._before_shard_write = init, slow
engine.calibrate_ray(flow, out, embeddings=vectors, chunk_rows=16, threads=1, num_workers=1, show_progress_bar=False)
"""


def _session_processes(session: str) -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line)} of every other process whose command line names the session
    folder or that holds any file in it open."""
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        pid = int(name)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's
            continue
        files = []
        for fd in fds:
            with contextlib.suppress(OSError):
                files.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        if pid != os.getpid() and (session in command or any(file.startswith(session + "/") for file in files)):
            found[pid] = (parent, command.strip())
    return found


def test_a_driver_killed_by_sigkill_leaves_no_process_of_its_ray_behind(tmp_path):
    pytest.importorskip("ray")
    rng = np.random.default_rng(0)
    FlowCalibrator(seed=0, epochs=1).fit(rng.normal(size=(256, 8)).astype(np.float32),
                                         show_progress_bar=False).save(tmp_path / "model.flow")
    np.save(tmp_path / "in.npy", rng.normal(size=(64, 8)).astype(np.float32))
    environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}  # a local Ray
    log_path, session = tmp_path / "driver.log", None
    with open(log_path, "wb") as log:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "model.flow"), str(tmp_path / "in.npy"),
                                   str(tmp_path / "out"), str(tmp_path)], stdout=log, stderr=subprocess.STDOUT,
                                  env=environment)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "writing").exists():
            assert driver.poll() is None, f"the driver exited ({driver.returncode}): {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the driver's Ray job did not start within 180 s"
            time.sleep(0.2)
        session = (tmp_path / "session").read_text()
        running = _session_processes(session)
        assert any(parent == driver.pid for parent, _ in running.values())  # the driver started this Ray itself
        assert any(command.startswith("ray::") for _, command in running.values())  # renamed ones are seen too

        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 20
        while (left := _session_processes(session)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes of the killed driver's Ray still there after 20 s: {sorted(left.values())}"
    finally:
        driver.kill()
        driver.wait()
        for pid in _session_processes(session) if session else ():  # what a failed run left, and only that
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_no_watchdog_for_a_ray_session_this_process_did_not_start(tmp_path):
    (tmp_path / "session_1").mkdir()
    assert watch_session(str(tmp_path / "session_1")) is False  # no child of this process names it
    assert watch_session(None) is False  # a Ray client connection has no local session folder
