"""Full disks and failing writes: each is one line naming the path (and the bytes a write
needed), the progress file still describes only completed chunks, and a rerun once the fault is
gone resumes to a byte-identical result. Injected in this process (a write raising ENOSPC, EDQUOT,
EROFS, EIO; the output folder removed mid-job) and, where a mount namespace is allowed, on a real
small tmpfs that fills up and is remounted read-only."""
import errno
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from faults_support import REPO, at_stage, chunks_done, embeddings, fitted_flow, leftovers, same_result

import flowcore.batch.job as job
import flowcore.batch.lifecycle as lifecycle
import flowcore.batch.lock as lock
import flowcore.batch.outputs as outputs
from flowcore._fs import OutputWriteError
from flowcore.batch.job import calibrate_file

ADVICE = "the progress file records only the chunks completed before it; fix this and rerun the same command"


def calibrate(flow_path, source, out, **options):
    return calibrate_file(flow_path, out, embeddings=source, chunk_rows=40, show_progress_bar=False, **options)


class Faults:
    """Counts calls of one kind of write and fails the `fail_at`-th (0-based) with `code`."""

    def __init__(self, code: int, fail_at: int):
        self.code, self.fail_at, self.calls = code, fail_at, 0

    def hit(self) -> None:
        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise OSError(self.code, os.strerror(self.code))


def inject(monkeypatch, site: str, faults: Faults) -> None:
    """Make the `site` write of the job fail: a chunk's rows (npy or a parquet part), its rejects, or
    the progress file (its commit after each chunk, the first being the job's start)."""
    if site == "npy rows":
        real = os.pwrite

        def pwrite(descriptor, data, position):
            if os.readlink(f"/proc/self/fd/{descriptor}").endswith(".npy.partial"):
                faults.hit()
            return real(descriptor, data, position)

        monkeypatch.setattr(outputs.os, "pwrite", pwrite)
    elif site == "parquet part":
        real_atomic = outputs.atomic_write

        def atomic_write(path, write, **options):
            faults.hit()
            return real_atomic(path, write, **options)

        monkeypatch.setattr(outputs, "atomic_write", atomic_write)
    elif site == "rejects":
        real_append = outputs.RejectsLog.append

        def append(self, rejects):
            faults.hit()
            return real_append(self, rejects)

        monkeypatch.setattr(outputs.RejectsLog, "append", append)
    else:
        real_json = lifecycle.atomic_write_json

        def atomic_write_json(path, payload, **options):
            if str(path).endswith(".progress.json"):
                faults.hit()
            return real_json(path, payload, **options)

        monkeypatch.setattr(lifecycle, "atomic_write_json", atomic_write_json)


@pytest.mark.parametrize("site, code, suffix, path, problem", [
    ("npy rows", errno.ENOSPC, ".npy", "out.npy.partial", "no space left on the device (this write needed 1,280 bytes"),
    ("parquet part", errno.EDQUOT, ".parquet", "out.parquet.parts/part-00000003.parquet",
     "the disk quota is exhausted (this write needed 1,280 bytes"),
    ("rejects", errno.EIO, ".npy", "out.npy.rejects.jsonl.partial", "an I/O error (failing disk?)"),
    ("progress", errno.EROFS, ".npy", "out.npy.progress.json", "the file system is read-only"),
])
def test_a_failed_write_is_one_line_naming_the_path_and_a_rerun_resumes_identically(
        tmp_path, flow_path, monkeypatch, site, code, suffix, path, problem):
    embeddings(tmp_path / "in.npy", rows=400)
    reference = tmp_path / f"reference{suffix}"
    calibrate(flow_path, tmp_path / "in.npy", reference)
    out = tmp_path / f"out{suffix}"
    with monkeypatch.context() as patch:
        inject(patch, site, Faults(code, fail_at=4 if site == "progress" else 3))  # chunk 3's write
        with pytest.raises(OutputWriteError) as failed:
            calibrate(flow_path, tmp_path / "in.npy", out)
    message = str(failed.value)
    assert message.startswith(f"cannot write {tmp_path / path}: {problem}") and message.endswith(ADVICE)
    assert "\n" not in message and failed.value.errno == code
    assert chunks_done(out) == 3 and not out.exists()

    summary = calibrate(flow_path, tmp_path / "in.npy", out)
    assert summary.resumed_from == 120
    assert same_result(out, reference) and leftovers(out) == []


def test_an_output_too_large_for_the_free_space_is_refused_before_any_work(tmp_path, flow_path, monkeypatch):
    embeddings(tmp_path / "in.npy", rows=400)
    monkeypatch.setattr(job, "free_bytes", lambda folder: 1000)
    with pytest.raises(OutputWriteError, match=r"out.npy.partial: it needs 12,928 bytes and only 1,000 are free"):
        calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]


def test_a_read_only_output_folder_is_refused_in_one_line(tmp_path, flow_path, monkeypatch):
    embeddings(tmp_path / "in.npy", rows=40)
    real_open = lock.os.open

    def read_only_open(path, flags, *mode):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(lock.os, "open", read_only_open)
    with pytest.raises(OutputWriteError) as refused:
        calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy")
    assert str(refused.value) == (f"cannot write {tmp_path / 'out.npy.lock'}: the file system is read-only; "
                                  "choose a writable output folder")


def test_an_output_folder_removed_mid_job_is_reported_and_a_rerun_starts_over_identically(tmp_path, flow_path):
    embeddings(tmp_path / "in.npy", rows=400)
    reference = tmp_path / "reference.npy"
    calibrate(flow_path, tmp_path / "in.npy", reference)
    folder = tmp_path / "vectors"
    folder.mkdir()
    out = folder / "out.npy"

    def remove_folder(stage, chunk):
        if stage == "written" and chunk.index == 2:
            shutil.rmtree(folder)

    with pytest.raises(OutputWriteError, match=r"out.npy.progress.json: the output folder no longer exists"):
        with at_stage(remove_folder):
            calibrate(flow_path, tmp_path / "in.npy", out)
    with pytest.raises(FileNotFoundError, match=f"output folder not found: {folder}"):
        calibrate(flow_path, tmp_path / "in.npy", out)
    folder.mkdir()
    summary = calibrate(flow_path, tmp_path / "in.npy", out)
    assert summary.resumed_from == 0
    assert same_result(out, reference) and leftovers(out) == []


TMPFS_DRIVER = """
import json, os, shutil, subprocess, sys
from pathlib import Path
import flowcore.batch.job as job
from flowcore.batch.job import calibrate_file

work, flow, source = map(Path, sys.argv[1:4])
mount = work / "tmpfs"
mount.mkdir()
seen = {}

def remount(options):
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)] if "remount" not in options
                   else ["mount", "-o", options, str(mount)], check=True)

def attempt(name, out, hook=lambda stage, chunk: None):
    job._at_stage = hook
    try:
        summary = calibrate_file(flow, out, embeddings=source, chunk_rows=40, show_progress_bar=False)
        seen[name] = {"ok": True, "resumed_from": summary.resumed_from}
    except Exception as error:
        seen[name] = {"ok": False, "error": str(error), "type": type(error).__name__}
    progress = Path(f"{out}.progress.json")
    seen[name]["chunks"] = json.loads(progress.read_text())["done"]["chunks"] if progress.exists() else None

remount("size=16k")
attempt("too small", mount / "out.npy")
remount("remount,size=1m")

def fill_at_chunk_2(stage, chunk):
    if stage == "writing" and chunk.index == 2:
        with open(mount / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(bytes(1 << 14))
                    filler.flush()
            except OSError:
                pass

attempt("fills up", mount / "out.npy", fill_at_chunk_2)
os.remove(mount / "filler")
attempt("space again", mount / "out.npy")
shutil.copy(mount / "out.npy", work / "out.npy")
shutil.copy(mount / "out.npy.rejects.jsonl", work / "out.npy.rejects.jsonl")

def stop_at_chunk_2(stage, chunk):
    if stage == "written" and chunk.index == 2:
        raise RuntimeError("stopped by the test")

attempt("stopped", mount / "second.npy", stop_at_chunk_2)
remount("remount,ro")
attempt("read-only", mount / "second.npy")
remount("remount,rw")
attempt("writable again", mount / "second.npy")
shutil.copy(mount / "second.npy", work / "second.npy")
print(json.dumps(seen))
"""


def _mount_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _mount_namespaces_work(), reason="no unprivileged mount namespace to mount a tmpfs in")
def test_a_real_tmpfs_that_fills_up_or_turns_read_only_then_recovers(tmp_path):
    flow = fitted_flow(tmp_path, dim=64)  # 10 kB chunks: each write needs pages of its own
    embeddings(tmp_path / "in.npy", rows=400, dim=64)
    reference = tmp_path / "reference.npy"
    calibrate(flow, tmp_path / "in.npy", reference)
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(["unshare", "-rm", sys.executable, "-c", TMPFS_DRIVER, str(work), str(flow),
                             str(tmp_path / "in.npy")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    mount = work / "tmpfs"

    assert re.fullmatch(f"cannot write {re.escape(str(mount / 'out.npy.partial'))}: it needs 102,528 bytes and "
                        r"only \d+,\d{3} are free on its file system; free some space or choose another --out",
                        seen["too small"]["error"])
    assert seen["too small"]["chunks"] is None
    failed = seen["fills up"]
    assert not failed["ok"] and failed["type"] == "OutputWriteError" and failed["chunks"] == 2
    assert failed["error"] == (f"cannot write {mount / 'out.npy.partial'}: no space left on the device (this write "
                               f"needed 10,240 bytes, 0 are free); {ADVICE}")
    assert seen["space again"] == {"ok": True, "resumed_from": 80, "chunks": None}
    assert same_result(work / "out.npy", reference)

    assert seen["stopped"]["chunks"] == 2
    assert seen["read-only"]["error"] == (f"cannot write {mount / 'second.npy.lock'}: the file system is read-only; "
                                          "choose a writable output folder")
    assert seen["writable again"] == {"ok": True, "resumed_from": 80, "chunks": None}
    assert (work / "second.npy").read_bytes() == reference.read_bytes()
