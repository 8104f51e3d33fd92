"""`flowcore calibrate --engine ray` on a local 2-CPU Ray cluster: the single-process job's rows
and vectors and its manifest format, bad rows kept, a worker killed mid-job, reruns that skip
finished shards, and the local job's refusals (a second writer, changed inputs, a signal)."""
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import flowcore.batch.ray as ray_engine
from flowcore.batch.core import InputChangedError, JobMismatchError
from flowcore.batch.job import calibrate_file
from flowcore.batch.text_sources import TextCorpus
from flowcore.cli import main
from flowcore.ray import ShardsFailedError, calibrate_ray, shard_starts

from helpers.tiny_models import WORDS

DIM = 8




def _vectors(folder: Path, name: str):
    shards = sorted((folder / "shards").glob("part-*.parquet"))
    table = pq.read_table(shards[0]) if len(shards) == 1 else __import__("pyarrow").concat_tables(
        [pq.read_table(shard) for shard in shards])
    return table


def _as_matrix(column):
    values = column.combine_chunks()
    dim = values.type.list_size
    matrix = np.full((len(values), dim), np.nan, dtype=np.float32)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    matrix[valid] = values.filter(values.is_valid()).flatten().to_numpy().reshape(-1, dim)
    return matrix


def fail_at_shard(at_shard: int):
    """A worker seam (`_before_shard_write`) that fails (as a full disk would) on one shard."""
    def hook(shard: int) -> None:
        if shard == at_shard:
            raise OSError(28, "No space left on device")
    return hook


def test_embeddings_equal_the_single_process_job_byte_for_byte_after_a_failed_run(ray_session, vector_flow,
                                                                                   tmp_path, capsys, monkeypatch):
    """A folder of two .npy files: a run fails at shard 5 and keeps what it wrote; the rerun (the
    CLI) writes only the rest; the result is the single-process job's, byte for byte."""
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rng = np.random.default_rng(1)
    parts, out = tmp_path / "parts", tmp_path / "out"
    parts.mkdir()
    matrices = [rng.normal(size=(rows, DIM)).astype(np.float32) for rows in (300, 150)]
    matrices[0][7, 3] = np.nan
    matrices[1][20] = np.inf
    for index, matrix in enumerate(matrices):
        np.save(parts / f"part{index}.npy", matrix)
    with monkeypatch.context() as patch, pytest.raises(ShardsFailedError, match=r"shard 5 \(.*part1.npy rows 0-63\): "
                                                       r"OSError: .*No space left on device; the shards already "
                                                       r"written are kept: rerun the same command"):
        patch.setattr(ray_engine, "_before_shard_write", fail_at_shard(5))
        calibrate_ray(vector_flow, out, embeddings=str(parts), chunk_rows=64, threads=1, num_workers=2,
                      show_progress_bar=False)
    done = sorted(p.name for p in (out / "shards").glob("part-*.parquet"))
    assert "part-00000005.parquet" not in done and 0 < len(done) < 8
    command = ["calibrate", "--engine", "ray", "--calibrator", str(vector_flow), "--embeddings", str(parts), "--out",
               str(out), "--chunk-rows", "64", "--threads", "1", "--num-workers", "1", "--quiet"]
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert f"{8 - len(done)} of 8 shards written by this run" in printed
    assert "calibrated 450 rows: 448 ok, 2 rejected (2 NaN/Inf)" in printed
    table = _vectors(out, "embedding")
    assert table.column("id").to_pylist() == list(range(450))  # the files' rows in sorted order
    ray_vectors = _as_matrix(table.column("embedding"))
    for index, offset in ((0, 0), (1, 300)):
        single = tmp_path / f"single{index}.npy"
        calibrate_file(vector_flow, single, embeddings=parts / f"part{index}.npy", chunk_rows=64, threads=1,
                       show_progress_bar=False)
        expected = np.load(single)
        assert ray_vectors[offset:offset + len(expected)].tobytes() == expected.tobytes()  # NaN rows included
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["row"], r["reason"], Path(r["file"]).name) for r in rejects] == [
        (7, "NaN/Inf", "part0.npy"), (320, "NaN/Inf", "part1.npy")]
    folder = tmp_path / "single-folder.parquet"  # the local engine reads the folder as one input too
    calibrate_file(vector_flow, folder, embeddings=parts, chunk_rows=64, threads=1, show_progress_bar=False)
    assert _as_matrix(pq.read_table(folder).column("embedding")).tobytes() == ray_vectors.tobytes()
    assert Path(f"{folder}.rejects.jsonl").read_bytes() == (out / "rejects.jsonl").read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["rows"], manifest["rejected"], len(manifest["shards"]), manifest["dim"]) == (450, 2, 8, DIM)
    local = json.loads(Path(f"{tmp_path / 'single1.npy'}.manifest.json").read_text())  # one manifest format
    assert (manifest["format"], manifest["version"]) == (local["format"], local["version"])
    assert set(local) <= set(manifest) and manifest["calibration"] == local["calibration"]
    assert (manifest["id_type"], manifest["encoder"], manifest["file"]) == ("int64", None, "shards")
    assert manifest["format_versions"]["flow_file"] == local["format_versions"]["flow_file"]
    assert set(manifest["format_versions"]) == {"manifest", "job", "flow_file", "parquet"}

    again = calibrate_ray(vector_flow, out, embeddings=str(parts), chunk_rows=64, threads=1, show_progress_bar=False)
    assert again.shards_written == 0 and again.rows == 450 and again.complete  # a finished job: nothing to redo
    assert str(again).startswith("already complete: an earlier run of this same job calibrated its 450 rows")
    with pytest.raises(JobMismatchError, match=r"job.json records an unfinished run of a different job "
                       r"\(chunk_rows was 64, now 32\)"):
        calibrate_ray(vector_flow, out, embeddings=str(parts), chunk_rows=32, show_progress_bar=False)
    os.utime(parts / "part1.npy", ns=(1, 1))  # an input rewritten since: its shards would mix two contents
    with pytest.raises(InputChangedError, match=r"parts changed since the unfinished run that .*job.json records "
                       r"\(input.files\[.*part1.npy\].mtime_ns was \d+, now 1\)"):
        calibrate_ray(vector_flow, out, embeddings=str(parts), chunk_rows=64, threads=1, show_progress_bar=False)
    assert main([*command[:-3], "--num-workers", "0"]) == 2
    assert "--num-workers must be at least 1" in capsys.readouterr().err
    assert main(command[:1] + command[3:]) == 2  # --num-workers without --engine ray
    assert "need --engine ray" in capsys.readouterr().err


def kill_own_worker_once(marker: str, at_shard: int):
    """A worker seam that SIGKILLs the worker process the first time it is about to write shard
    `at_shard` (the marker file makes it happen once across restarts)."""
    def hook(shard: int) -> None:
        if shard == at_shard and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def test_text_with_a_worker_killed_mid_job_ends_like_the_single_process_job(ray_session, text_flow, tmp_path,
                                                                            monkeypatch):
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rng = np.random.default_rng(2)
    lines = [json.dumps({"id": f"s{i}", "text": " ".join(rng.choice(WORDS, size=rng.integers(1, 10))),
                         "lang": "en"}) for i in range(200)]
    lines[13] = '{"id": "broken", "text": '
    lines[40] = '{"id": ' + "9" * 5000 + ', "text": "a number past the digit limit"}'
    lines[77] = json.dumps({"id": "e", "text": "   "})
    lines[120] = '{"id": "d", "text": "the cat", "text": "a dog"}'
    lines[150] = '{"id": "c", "text": "the cat\rsat"}'  # a raw CR inside the line
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    options = dict(input=corpus, id_field="id", keep_columns=("lang",), chunk_rows=25, threads=1,
                   show_progress_bar=False)
    # one worker (the text job's CPU count): it is killed before writing shard 3, restarted, and redoes it
    single = tmp_path / "single.parquet"
    calibrate_file(text_flow, single, **options)
    marker = tmp_path / "killed"
    monkeypatch.setattr(ray_engine, "_before_shard_write", kill_own_worker_once(str(marker), at_shard=3))
    summary = calibrate_ray(text_flow, tmp_path / "out", num_workers=1, **options)
    assert marker.exists()  # a worker really died mid-job; Ray restarted it and redid its shard
    assert (summary.rows, summary.shards, summary.rejects) == (200, 8, {"broken JSON": 2, "carriage return": 1,
                                                                         "duplicate key": 1, "empty text": 1})
    expected, got = pq.read_table(single), _vectors(tmp_path / "out", "embedding")
    assert got.column("id").to_pylist() == expected.column("id").to_pylist()
    assert got.column("lang").to_pylist() == expected.column("lang").to_pylist()
    a, b = _as_matrix(got.column("embedding")), _as_matrix(expected.column("embedding"))
    ok = ~np.isnan(b).any(axis=1)
    assert np.array_equal(np.isnan(a).any(axis=1), ~ok)
    cosine = (a[ok] * b[ok]).sum(1) / np.linalg.norm(a[ok], axis=1) / np.linalg.norm(b[ok], axis=1)
    assert cosine.min() > 0.99999
    assert a.tobytes() == b.tobytes()  # in fact bit-equal: the same chunks, encoder batches and thread count
    expected_rejects = [json.loads(line) for line in Path(f"{single}.rejects.jsonl").read_text().splitlines()]
    got_rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "file"} for r in got_rejects] == expected_rejects


def test_shard_starts_are_the_single_process_reader_chunk_boundaries(tmp_path):
    rows = [json.dumps({"text": f"row {i}", "n": i}) for i in range(103)]
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode())  # BOM, no final newline
    (tmp_path / "a.txt").write_text("".join(f"line {i}\r\n" for i in range(40)))
    (tmp_path / "a.csv").write_text("text,n\n" + "".join(f'"multi\nline {i}",{i}\n' for i in range(30)))
    for name in ("a.jsonl", "a.txt", "a.csv"):
        source = TextCorpus(tmp_path / name)
        expected = [chunk.end for chunk in source.chunks(10)][:-1]
        starts = shard_starts(source, 10)
        assert starts[1:] == expected and starts[0].row == 0, name


def test_the_output_is_one_parquet_dataset_and_an_earlier_layout_is_refused(ray_session, vector_flow, tmp_path):
    """`summary.out` (OUT/shards) holds the parquet parts only, so pyarrow reads the whole output from
    it, in row order; each shard's rejects are in OUT/shard-rejects. An output of the earlier layout
    (each shard's rejects beside its part) is refused, naming --restart, which rewrites it."""
    import pyarrow.dataset as ds

    vectors = np.random.default_rng(6).normal(size=(100, DIM)).astype(np.float32)
    vectors[[5, 40]] = np.nan
    np.save(tmp_path / "in.npy", vectors)
    out = tmp_path / "out"
    options = dict(embeddings=str(tmp_path / "in.npy"), chunk_rows=16, threads=1, num_workers=1,
                   show_progress_bar=False)
    summary = calibrate_ray(vector_flow, out, **options)
    assert summary.out == out / "shards"
    table = pq.read_table(summary.out)
    assert table.column("id").to_pylist() == list(range(100))  # the parts' names sort in row order
    assert table.column("embedding").null_count == 2 and ds.dataset(summary.out).count_rows() == 100
    floats = pq.ParquetFile(summary.out / "part-00000000.parquet").metadata.row_group(0).column(1)
    assert floats.encodings == ("RLE", "BYTE_STREAM_SPLIT") and floats.compression == "ZSTD"  # the local job's
    parts = [f"part-{index:08d}.parquet" for index in range(7)]
    assert sorted(path.name for path in summary.out.iterdir()) == parts
    assert sorted(path.name for path in (out / "shard-rejects").iterdir()) == [
        f"part-{index:08d}.rejects.jsonl" for index in range(7)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["file"] == "shards" and [shard["file"] for shard in manifest["shards"]] == [
        f"shards/{part}" for part in parts]

    # writes cut short by a killed worker: a rerun of the finished job clears them
    (summary.out / ".part-00000003.parquet.k1ll3d.tmp").write_bytes(b"PAR1")
    (out / "shard-rejects" / "part-00000003.rejects.jsonl.partial").write_bytes(b"")
    again = calibrate_ray(vector_flow, out, **options)
    assert again.shards_written == 0 and sorted(path.name for path in again.out.iterdir()) == parts
    assert not list((out / "shard-rejects").glob("*.partial"))

    job = json.loads((out / "job.json").read_text())  # the earlier layout, as its version wrote it
    (out / "job.json").write_text(json.dumps({**job, "version": 2}))
    for rejects in (out / "shard-rejects").iterdir():
        rejects.rename(summary.out / rejects.name)
    (out / "shard-rejects").rmdir()
    with pytest.raises(JobMismatchError, match=r"job.json records a run of an earlier flowcore \(Ray job file version "
                       r"2, this one writes 4\), which this version cannot continue; add --restart to start over$"):
        calibrate_ray(vector_flow, out, **options)
    assert len(list(summary.out.iterdir())) == 14 and json.loads((out / "job.json").read_text())["version"] == 2
    restarted = calibrate_ray(vector_flow, out, restart=True, **options)
    assert restarted.shards_written == 7 and sorted(path.name for path in restarted.out.iterdir()) == parts
    assert pq.read_table(restarted.out).num_rows == 100 and restarted.rejects == {"NaN/Inf": 2}


def signal_driver_at_shard(driver: int, at_shard: int):
    """A worker seam that sends SIGINT to the driver process before writing shard `at_shard`,
    each shard taking a while (so that the driver stops before the last one)."""
    def hook(shard: int) -> None:
        if shard == at_shard:
            os.kill(driver, signal.SIGINT)
        time.sleep(0.3)
    return hook


def rewrite_at_shard(path: str, at_shard: int):
    """A worker seam that rewrites an input file (same size, later mtime) before writing shard `at_shard`."""
    def hook(shard: int) -> None:
        if shard == at_shard:
            np.save(path, np.load(path) + 1.0)
            stat = os.stat(path)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    return hook


def test_the_ray_engine_refuses_and_stops_as_the_local_job_does(ray_session, vector_flow, tmp_path, monkeypatch):
    """A second writer is refused, a signal stops the job at a shard boundary and the rerun
    finishes it, an input that changes under a worker stops the job and its rerun is refused,
    and an output folder that holds the input is refused."""
    from flowcore.batch.interrupts import JobInterrupted
    from flowcore.batch.lock import OutputLock, OutputLockedError

    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    np.save(tmp_path / "in.npy", np.random.default_rng(3).normal(size=(128, DIM)).astype(np.float32))
    out = tmp_path / "out"
    options = dict(embeddings=str(tmp_path / "in.npy"), chunk_rows=16, num_workers=1, show_progress_bar=False)
    out.mkdir()
    with OutputLock(out, out / "job.lock"):
        with pytest.raises(OutputLockedError, match=r"out is being written by another flowcore job .*job.lock"):
            calibrate_ray(vector_flow, out, **options)

    installed = signal.getsignal(signal.SIGINT)  # Python's own, or "ignored" under nohup or `&`
    with monkeypatch.context() as patch, pytest.raises(JobInterrupted) as stopped:
        patch.setattr(ray_engine, "_before_shard_write", signal_driver_at_shard(os.getpid(), at_shard=1))
        calibrate_ray(vector_flow, out, **options)
    assert str(stopped.value).startswith("SIGINT: stopped at row ") and stopped.value.exit_status == 130
    assert signal.getsignal(signal.SIGINT) is installed  # the handler is given back
    written = len(list((out / "shards").glob("part-*.parquet")))
    assert 0 < written < 8 and not (out / "manifest.json").exists()
    summary = calibrate_ray(vector_flow, out, **options)
    assert (summary.rows, summary.shards, summary.shards_written) == (128, 8, 8 - written)
    calibrate_file(vector_flow, tmp_path / "single.parquet", embeddings=tmp_path / "in.npy", chunk_rows=16,
                   threads=1, show_progress_bar=False)
    assert np.array_equal(_as_matrix(_vectors(out, "embedding").column("embedding")),
                          _as_matrix(pq.read_table(tmp_path / "single.parquet").column("embedding")))

    monkeypatch.setattr(ray_engine, "_before_shard_write", rewrite_at_shard(str(tmp_path / "in.npy"), at_shard=2))
    with pytest.raises(ShardsFailedError, match=r"in.npy changed while the job read it \(it was modified") as failed:
        calibrate_ray(vector_flow, out, restart=True, **options)
    assert "add --restart to start over" in str(failed.value) and "rerun the same command" not in str(failed.value)
    with pytest.raises(InputChangedError, match=r"in.npy changed since the unfinished run that .*job.json records"):
        calibrate_ray(vector_flow, out, **options)
    with pytest.raises(ValueError, match="the output folder .* holds the input"):
        calibrate_ray(vector_flow, tmp_path, embeddings=str(tmp_path / "in.npy"), show_progress_bar=False)


def test_quantize_works_on_the_ray_engine_as_on_the_local_job(ray_session, text_flow, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(4)
    (tmp_path / "c.txt").write_text("".join(" ".join(rng.choice(WORDS, size=rng.integers(1, 10))) + "\n"
                                            for _ in range(60)))
    options = ["--calibrator", str(text_flow), "--input", str(tmp_path / "c.txt"), "--chunk-rows", "20",
               "--threads", "1", "--quantize", "int8", "--quiet"]
    assert main(["calibrate", *options, "--out", str(tmp_path / "single.parquet")]) == 0
    ray_data_lines = _Records()
    logging.getLogger("ray.data").addHandler(ray_data_lines)
    try:
        assert main(["calibrate", *options, "--out", str(tmp_path / "out"), "--engine", "ray",
                     "--num-workers", "1"]) == 0
    finally:
        logging.getLogger("ray.data").removeHandler(ray_data_lines)
    assert not ray_data_lines.records, "--quiet: Ray Data's execution plans stay out of the user's terminal"
    assert "calibrated 60 rows: 60 ok, 0 rejected" in capsys.readouterr().out
    expected = pq.read_table(tmp_path / "single.parquet").column("embedding")
    assert _as_matrix(_vectors(tmp_path / "out", "embedding").column("embedding")).tobytes() == \
        _as_matrix(expected).tobytes()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["encoder"]["quantize"] == "int8"
    assert json.loads((tmp_path / "out" / "job.json").read_text())["job"]["encoder"]["quantize"] == "int8"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)  # what a terminal can show (a DEBUG line from a closing thread may come late)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def test_ctrl_c_on_the_ray_engine_says_where_it_stopped(ray_session, vector_flow, tmp_path, monkeypatch, capsys):
    """`flowcore calibrate --engine ray` stopped by SIGINT prints the local engine's line (the rows
    written, and that the same command resumes), exit 130; a Ctrl-C before the job begins (while
    Ray starts or the model loads) says so, never an empty message."""
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    np.save(tmp_path / "in.npy", np.random.default_rng(3).normal(size=(128, DIM)).astype(np.float32))
    argv = ["calibrate", "--engine", "ray", "--calibrator", str(vector_flow), "--embeddings", str(tmp_path / "in.npy"),
            "--out", str(tmp_path / "out"), "--chunk-rows", "16", "--num-workers", "1", "--quiet"]
    with monkeypatch.context() as patch:
        patch.setattr(ray_engine, "_before_shard_write", signal_driver_at_shard(os.getpid(), at_shard=1))
        assert main(argv) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("flowcore calibrate: SIGINT: stopped at row ") and \
        last.endswith("; rerun the same command to resume"), last

    def interrupted_while_starting(*args, **kwargs):
        raise KeyboardInterrupt  # what Python raises for a Ctrl-C before any handler of flowcore's is installed

    monkeypatch.setattr(ray_engine.JobSpec, "prepare", interrupted_while_starting)
    assert main([*argv[:8], str(tmp_path / "other"), *argv[9:]]) == 130
    assert capsys.readouterr().err.strip() == ("flowcore calibrate: SIGINT: stopped before the job began; rerun the "
                                               "same command to resume")


def test_off_a_terminal_the_ray_engine_writes_progress_lines_and_where_it_resumes(ray_session, vector_flow, tmp_path,
                                                                                  monkeypatch, capsys):
    """The local engine's policy (`ProgressReport`): stderr not a terminal, a plain line per interval and none
    of Ray Data's carriage-return bars; a rerun says first which shards are written already."""
    import re

    from flowcore import defaults

    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    np.save(tmp_path / "in.npy", np.random.default_rng(3).normal(size=(128, DIM)).astype(np.float32))
    options = dict(embeddings=str(tmp_path / "in.npy"), chunk_rows=16, num_workers=1)
    with monkeypatch.context() as patch, pytest.raises(ShardsFailedError):
        patch.setattr(ray_engine, "_before_shard_write", fail_at_shard(3))
        calibrate_ray(vector_flow, tmp_path / "out", show_progress_bar=False, **options)
    capsys.readouterr()
    monkeypatch.setattr(defaults, "PROGRESS_INTERVAL_S", 0.0)
    summary = calibrate_ray(vector_flow, tmp_path / "out", **options)
    lines = capsys.readouterr().err.splitlines()
    written = summary.shards - summary.shards_written
    assert lines[0] == (f"calibrate: resuming {tmp_path / 'out'}: {written} of 8 shards ({written * 16} rows) are "
                        "written")
    assert lines[-1].startswith("calibrate: 128 of 128 rows (100%), ")
    assert all(re.fullmatch(r"calibrate: [\d,]+ of 128 rows \(\d+%\), [\d,]+ rows/s(, \d+:\d\d left)?", line)
               for line in lines[1:]), lines
