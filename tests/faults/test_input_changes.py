"""Inputs that change under a job: appended, truncated or replaced between runs (even with the
same size and mtime) are refused on resume by the progress file's pin, changed while the job
reads them stop it; --restart starts over."""
import os

import numpy as np
import pytest
from faults_support import DIM, at_stage, chunks_done, embeddings, leftovers

from flowcore.batch.job import CalibrationJob, InputChangedError, calibrate_file
from flowcore.batch.text_sources import TextCorpus
from flowcore.cli import main


class Stop(Exception):
    pass


def stop_at_chunk(index: int):
    def hook(stage, chunk):
        if stage == "committed" and chunk.index == index:
            raise Stop

    return hook


def calibrate(flow_path, source, out, **options):
    return calibrate_file(flow_path, out, embeddings=source, chunk_rows=40, show_progress_bar=False, **options)


def appended(path):
    matrix = np.load(path)
    np.save(path, np.vstack([matrix, matrix[:7]]))


def truncated(path):
    np.save(path, np.load(path)[:-40])


def replaced_keeping_size_and_mtime(path):
    stat = os.stat(path)
    matrix = np.load(path)
    matrix[-1] += 1.0  # the last rows differ: the same size, and the mtime is put back
    np.save(path, matrix)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("change, what", [
    (appended, "input.size was 12928, now 13152"),
    (truncated, "input.size was 12928, now 11648"),
    (replaced_keeping_size_and_mtime, "input.fingerprint was"),
])
def test_an_input_changed_between_runs_is_refused_and_restart_starts_over(tmp_path, flow_path, change, what):
    embeddings(tmp_path / "in.npy", rows=400)
    out = tmp_path / "out.npy"
    with pytest.raises(Stop), at_stage(stop_at_chunk(2)):
        calibrate(flow_path, tmp_path / "in.npy", out)
    change(tmp_path / "in.npy")
    with pytest.raises(InputChangedError) as refused:
        calibrate(flow_path, tmp_path / "in.npy", out)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'in.npy'} changed since the unfinished run that {out}.progress.json "
                              "records (")
    assert what in message and message.endswith("restore it, or add --restart to start over")
    assert chunks_done(out) == 3  # the refusal changed nothing

    summary = calibrate(flow_path, tmp_path / "in.npy", out, restart=True)
    assert summary.resumed_from == 0 and summary.rows == len(np.load(tmp_path / "in.npy"))
    assert leftovers(out) == []


def test_embeddings_appended_while_the_job_runs_stop_it_in_one_line(tmp_path, flow_path, capsys):
    embeddings(tmp_path / "in.npy", rows=400)
    out = tmp_path / "out.npy"
    def append_at_chunk_1(stage, chunk):
        if stage == "committed" and chunk.index == 1:
            with open(tmp_path / "in.npy", "ab") as handle:
                handle.write(bytes(DIM * 4))

    with pytest.raises(InputChangedError) as stopped, at_stage(append_at_chunk_1):
        calibrate(flow_path, tmp_path / "in.npy", out)
    assert str(stopped.value) == (f"{tmp_path / 'in.npy'} changed while the job read it (its size went from 12,928 "
                                  "to 12,960 bytes); the output so far is kept as it was, and a rerun is refused: "
                                  "add --restart to start over")
    assert chunks_done(out) == 2 and not out.exists()
    assert main(["calibrate", "--calibrator", str(flow_path), "--embeddings", str(tmp_path / "in.npy"),
                 "--out", str(out), "--chunk-rows", "40", "--quiet"]) == 2
    assert "in.npy: 32 bytes after the 400 x 8 rows its header describes" in capsys.readouterr().err


def test_a_text_corpus_rewritten_while_the_job_reads_it_stops_the_job(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(100)))
    out = tmp_path / "out.npy"

    def rewrite_at_chunk_0(stage, chunk):
        if stage == "writing" and chunk.index == 0:
            corpus.write_text("".join(f"other {i}\n" for i in range(100)))
            stat = os.stat(corpus)
            os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    job = CalibrationJob(TextCorpus(corpus), out, lambda x: x, DIM, show_progress_bar=False, chunk_rows=10,
                         encode=lambda texts: np.ones((len(texts), DIM), dtype=np.float32))
    with pytest.raises(InputChangedError, match="changed while the job read it"), at_stage(rewrite_at_chunk_0):
        job.run()
    assert not out.exists()


def test_a_progress_file_from_before_input_fingerprints_is_refused_until_restart(tmp_path, flow_path):
    import json

    from flowcore.batch.job import JobMismatchError

    embeddings(tmp_path / "in.npy", rows=400)
    reference = tmp_path / "reference.npy"
    calibrate(flow_path, tmp_path / "in.npy", reference)
    out = tmp_path / "out.npy"
    with pytest.raises(Stop), at_stage(stop_at_chunk(2)):
        calibrate(flow_path, tmp_path / "in.npy", out)
    progress = tmp_path / "out.npy.progress.json"
    record = json.loads(progress.read_text())
    del record["job"]["input"]["fingerprint"]
    progress.write_text(json.dumps(record))
    with pytest.raises(JobMismatchError) as refused:
        calibrate(flow_path, tmp_path / "in.npy", out)
    assert str(refused.value) == (f"{progress} records an unfinished run of an earlier flowcore, which this version "
                                  "cannot resume; rerun with --restart to start over")
    assert calibrate(flow_path, tmp_path / "in.npy", out, restart=True).resumed_from == 0
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", '{"format": "flowcore-calibrate-progress", "version": 2}',
                                     '{"format": "flowcore-calibrate-progress", "version": 2, "job": 3, "rows": 1, '
                                     '"done": {}}'])
def test_a_damaged_progress_file_is_refused_in_one_line(tmp_path, flow_path, content):
    from flowcore.batch.job import JobMismatchError

    embeddings(tmp_path / "in.npy", rows=40)
    (tmp_path / "out.npy.progress.json").write_text(content)
    with pytest.raises(JobMismatchError) as refused:
        calibrate(flow_path, tmp_path / "in.npy", tmp_path / "out.npy")
    assert str(refused.value).startswith(f"{tmp_path / 'out.npy.progress.json'}: unreadable progress file (")
    assert str(refused.value).endswith("rerun with --restart to start over")
