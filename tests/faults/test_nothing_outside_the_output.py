"""Nothing outside the output is ever touched: every writer writes a temporary file and renames it over its
target, so a link there is replaced and its target never written; a device, pipe, socket or link loop at an
output (or at a lock, partial or side file) is refused in one line before any work; a folder that cannot be
written is named before any work; a failed write names its path."""
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest
from faults_support import DIM, REPO, embeddings, leftovers

import flowcore.sts.report as report
from flowcore._fs import OutputWriteError, atomic_write
from flowcore.batch.job import calibrate_file
from flowcore.batch.lock import OutputLock, OutputLockedError
from flowcore.cli import main
from flowcore.text.cache import EmbeddingCache


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"flowcore {command}: error: "), err
    return err


@pytest.fixture
def precious(tmp_path):
    """A file outside the output folder that no command may touch."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = elsewhere / "precious.txt"
    path.write_text("keep me")
    return path


@pytest.fixture
def inputs(tmp_path, flow_path):
    (tmp_path / "corpus.txt").write_text("a cat\nthe dog\n")
    embeddings(tmp_path / "in.npy", rows=60)  # with NaN/Inf rows, rejected by calibrate
    np.save(tmp_path / "clean.npy", np.random.default_rng(0).normal(size=(60, DIM)).astype(np.float32))
    return {"flow": str(flow_path), "txt": str(tmp_path / "corpus.txt"), "npy": str(tmp_path / "in.npy"),
            "clean": str(tmp_path / "clean.npy")}


WRITERS = {  # the commands that write one file at OUT
    "encode": ["encode", "--input", "{txt}", "--out", "OUT", "--model", "default"],
    "fit": ["fit", "--embeddings", "{clean}", "--out", "OUT", "--calibration", "whitening"],
    "calibrate": ["calibrate", "--calibrator", "{flow}", "--embeddings", "{npy}", "--out", "OUT"],
    "sts": ["sts", "--data-dir", "{sts}", "--json", "OUT"],
}


def special_file(path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private copy of /dev/null
        except PermissionError:
            pytest.skip("creating a device node needs privileges")


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_that_is_a_device_pipe_or_socket_is_refused_and_kept(writer, kind, inputs, tmp_path, capsys):
    out = tmp_path / "out.npy" if writer == "encode" else tmp_path / f"out{'.npy' if writer == 'calibrate' else ''}"
    special_file(out, kind)
    mode = os.lstat(out).st_mode
    (tmp_path / "sts").mkdir()
    argv = [part.format(**inputs, sts=tmp_path / "sts").replace("OUT", str(out)) for part in WRITERS[writer]]
    assert main(argv) == 2
    error = one_line_error(capsys, writer)
    assert f"--{'json' if writer == 'sts' else 'out'} {out} is a " in error and "not a regular file" in error
    assert os.lstat(out).st_mode == mode


def test_a_link_at_the_output_is_replaced_never_written_through(inputs, tmp_path, precious):
    for name, argv in (("fit.flow", ["fit", "--embeddings", inputs["clean"], "--calibration", "center"]),
                       ("calibrated.npy", ["calibrate", "--calibrator", inputs["flow"], "--embeddings", inputs["npy"],
                                           "--quiet"])):
        out = tmp_path / name
        out.symlink_to(precious)
        assert main([*argv, "--out", str(out)]) == 0
        assert not out.is_symlink() and out.stat().st_size > 0
        assert precious.read_text() == "keep me"


def test_sts_json_replaces_a_link_and_names_its_path_when_the_disk_is_full(tmp_path, precious, monkeypatch):
    link = tmp_path / "results.json"
    link.symlink_to(precious)
    report.write_json([{"dataset": "STS-B", "spearman": float("nan")}], link, seconds=1.0)
    assert precious.read_text() == "keep me"
    assert not link.is_symlink() and json.loads(link.read_text())["results"] == [{"dataset": "STS-B",
                                                                                  "spearman": None}]

    def full(path, write, **options):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(report, "atomic_write", full)
    with pytest.raises(OutputWriteError) as error:
        report.write_json([], tmp_path / "full.json")
    assert str(error.value).startswith(f"cannot write {tmp_path / 'full.json'}: no space left on the device")


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_a_link_planted_at_the_lock_is_refused_and_its_target_kept(engine, inputs, tmp_path, precious, capsys):
    if engine == "local":
        out = tmp_path / "v.npy"
        lock = tmp_path / "v.npy.lock"
    else:
        out = tmp_path / "vectors"
        out.mkdir()
        lock = out / "job.lock"
    lock.symlink_to(precious)
    assert main(["calibrate", "--engine", engine, "--calibrator", inputs["flow"], "--embeddings", inputs["npy"],
                 "--out", str(out), "--quiet"]) == 2
    error = one_line_error(capsys, "calibrate")
    assert f"{lock} is a symbolic link, so it is not a lock flowcore made" in error
    assert precious.read_text() == "keep me" and lock.is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_lock_path_holding_another_kind_of_file_is_refused(tmp_path, kind):
    special_file(tmp_path / "out.npy.lock", kind)
    with pytest.raises(OutputLockedError, match="is not a regular file, so it is not a lock flowcore made"):
        OutputLock(tmp_path / "out.npy").acquire()


@pytest.mark.parametrize("planted", ["out.npy.partial", "out.npy.rejects.jsonl.partial", "out.npy.rejects.jsonl",
                                     "out.npy.manifest.json", "out.parquet.parts"])
def test_links_planted_beside_the_output_are_never_written_through(inputs, tmp_path, precious, planted):
    out = tmp_path / ("out.parquet" if "parquet" in planted else "out.npy")
    target = precious.parent if planted.endswith(".parts") else precious
    before = sorted(os.listdir(precious.parent))
    (tmp_path / planted).symlink_to(target)
    summary = calibrate_file(inputs["flow"], out, embeddings=inputs["npy"], show_progress_bar=False)
    assert summary.rows == 60 and leftovers(out) == []
    assert precious.read_text() == "keep me" and sorted(os.listdir(precious.parent)) == before


def test_an_output_that_is_a_link_loop_is_one_line(inputs, tmp_path, capsys):
    (tmp_path / "a.npy").symlink_to(tmp_path / "b.npy")
    (tmp_path / "b.npy").symlink_to(tmp_path / "a.npy")
    assert main(["calibrate", "--calibrator", inputs["flow"], "--embeddings", inputs["npy"], "--out",
                 str(tmp_path / "a.npy")]) == 2
    assert one_line_error(capsys, "calibrate").endswith(f"--out {tmp_path / 'a.npy'} is a symbolic link loop; "
                                                        "remove it or choose another path")
    with pytest.raises(OutputWriteError, match="is a symbolic link loop"):
        calibrate_file(inputs["flow"], tmp_path / "a.npy", embeddings=inputs["npy"], show_progress_bar=False)


def test_atomic_write_refuses_every_kind_of_file_but_a_regular_one(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OutputWriteError, match=r"pipe is a named pipe \(FIFO\), not a regular file"):
        atomic_write(tmp_path / "pipe", lambda stream: stream.write(b"x"))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    atomic_write(tmp_path / "dangling", lambda stream: stream.write(b"x"))
    assert not (tmp_path / "dangling").is_symlink() and not (tmp_path / "nowhere").exists()


def test_an_unwritable_embedding_cache_says_how_to_do_without(tmp_path):
    (tmp_path / "a-file").write_text("")

    class Encoder:
        model_id, pooling, dim = "stand-in", "mean", 4

        def encode(self, sentences, batch_size=64, show_progress_bar=None):
            return np.ones((len(sentences), 4), dtype=np.float32)

    with pytest.raises(OutputWriteError) as error:
        EmbeddingCache(tmp_path / "a-file" / "cache").embed(Encoder(), ["a sentence"])
    message = str(error.value)
    assert message.startswith(f"cannot write {tmp_path / 'a-file' / 'cache'}") and "\n" not in message
    assert "--cache-dir DIR (or $FLOWCORE_CACHE)" in message and "--no-cache" in message


READ_ONLY_FIT = """
import subprocess, sys
from pathlib import Path
from flowcore.cli import main
import flowcore.calibration.linear as linear

folder = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)], check=True)
def never(*args, **kwargs):
    raise AssertionError("fitted before the output folder was checked")
linear.LinearCalibrator.fit_chunks = never
sys.exit(main(["fit", "--embeddings", sys.argv[2], "--calibration", "whitening", "--out", str(folder / "w.flow")]))
"""


def _mount_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _mount_namespaces_work(), reason="no unprivileged mount namespace to mount a tmpfs in")
def test_fit_into_a_read_only_folder_is_refused_before_fitting(inputs, tmp_path):
    (tmp_path / "ro").mkdir()
    result = subprocess.run(["unshare", "-rm", sys.executable, "-c", READ_ONLY_FIT, str(tmp_path / "ro"),
                             inputs["clean"]], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"flowcore fit: error: --out {tmp_path / 'ro' / 'w.flow'}: cannot write in "
                                     f"{tmp_path / 'ro'}: the file system is read-only")


def test_the_vectors_are_those_of_a_run_without_planted_links(inputs, tmp_path, precious):
    reference = tmp_path / "reference.npy"
    calibrate_file(inputs["flow"], reference, embeddings=inputs["npy"], show_progress_bar=False)
    out = tmp_path / "out.npy"
    (tmp_path / "out.npy.partial").symlink_to(precious)
    calibrate_file(inputs["flow"], out, embeddings=inputs["npy"], show_progress_bar=False)
    assert out.read_bytes() == reference.read_bytes() and precious.read_text() == "keep me"
    assert np.load(out).shape == (60, DIM)
