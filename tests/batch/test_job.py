"""The resumable calibration job: results match the in-memory flow, bad rows are reported and
kept as NaN, a job killed with SIGKILL resumes to byte-identical output, changed jobs and
mismatched flows are refused, the writer's stage seam sees every chunk at every stage, and memory
stays flat on a large memory-mapped input."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import flowcore.batch.job as job
from flowcore import FlowCalibrator
from flowcore.batch import outputs
from flowcore.batch.job import CalibrationJob, JobMismatchError, calibrate_file
from flowcore.batch.rows import EMPTY_LINE, NON_FINITE
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix
from flowcore.calibration.file import EncoderProvenance

from helpers.tiny_models import StandInEncoder, save_tiny_bert

DIM = 8
CLI = [sys.executable, "-m", "flowcore"]


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """A small flow fitted on random 8-wide vectors, saved to a file."""
    rng = np.random.default_rng(0)
    calibrator = FlowCalibrator(seed=0).fit(rng.normal(size=(256, DIM)).astype(np.float32), show_progress_bar=False)
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    calibrator.save(path)
    return path, FlowCalibrator.load(path)


def embeddings_with_bad_rows(path: Path, rows: int = 600, dim: int = DIM) -> np.ndarray:
    matrix = np.random.default_rng(1).normal(size=(rows, dim)).astype(np.float32)
    matrix[5, 2] = np.nan
    matrix[rows // 2, 0] = np.inf
    matrix[rows - 1] = -np.inf
    np.save(path, matrix)
    return matrix


def leftovers(folder: Path, out: Path) -> list[str]:
    """Anything a job leaves beside its output except the output, its rejects file and its manifest."""
    keep = {out.name, out.name + ".rejects.jsonl", out.name + ".manifest.json"}
    return sorted(p.name for p in folder.iterdir()
                  if p.name.startswith((out.name, f".{out.name}")) and p.name not in keep)


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in Path(f"{out}.rejects.jsonl").read_text().splitlines()]


def test_npy_output_matches_the_in_memory_flow_and_keeps_bad_rows_as_nan(tmp_path, flow):
    flow_path, calibrator = flow
    matrix = embeddings_with_bad_rows(tmp_path / "in.npy")
    out = tmp_path / "out.npy"
    summary = calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=64, show_progress_bar=False)

    result = np.load(out)
    bad = [5, 300, 599]
    good = np.setdiff1d(np.arange(600), bad)
    assert result.dtype == np.float32 and result.shape == (600, DIM)
    np.testing.assert_allclose(result[good], calibrator.transform(matrix[good]), rtol=1e-5, atol=1e-5)
    assert np.isnan(result[bad]).all()
    assert [(r["row"], r["reason"]) for r in read_rejects(out)] == [(row, NON_FINITE) for row in bad]
    assert (summary.rows, summary.rejected, summary.rows_this_run) == (600, 3, 600)
    assert "600 rows" in str(summary) and "3 rejected (3 NaN/Inf)" in str(summary)
    assert leftovers(tmp_path, out) == []


@pytest.mark.parametrize("name, settings", [("whitening", {"power": 0.3, "dim": 5}), ("abtt", {"k": 2}),
                                            ("zca", {}), ("center", {}), ("none", {})])
@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_any_saved_calibrator_calibrates_a_corpus_like_a_flow_file(tmp_path, name, settings, suffix):
    """A whitening (tempered and truncated here), ABTT, ZCA, centring or identity file from
    `flowcore fit` calibrates a corpus as a flow file does: its transform row by row, bad rows
    kept, the output as wide as the calibrator's output, the method in the manifest."""
    from flowcore.calibration import create, load

    rng = np.random.default_rng(2)
    fitted = create(name, **settings).fit(rng.normal(size=(300, DIM)) @ rng.normal(size=(DIM, DIM)))
    fitted.save(tmp_path / "calibrator.flow")
    matrix = embeddings_with_bad_rows(tmp_path / "in.npy", rows=200)
    out = tmp_path / f"out{suffix}"
    summary = calibrate_file(tmp_path / "calibrator.flow", out, embeddings=tmp_path / "in.npy", chunk_rows=64,
                             show_progress_bar=False)
    result = np.load(out) if suffix == ".npy" else np.array(
        [[np.nan] * fitted.output_dim if v is None else v for v in pq.read_table(out).column("embedding").to_pylist()],
        dtype=np.float32)
    good = np.setdiff1d(np.arange(200), [5, 100, 199])
    assert result.shape == (200, fitted.output_dim) and summary.rejected == 3
    np.testing.assert_allclose(result[good], load(tmp_path / "calibrator.flow").transform(matrix[good]), rtol=1e-6,
                               atol=1e-6)
    assert np.isnan(result[[5, 100, 199]]).all()
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["calibration"]["method"] == name and manifest["dim"] == fitted.output_dim


def test_parquet_output_holds_row_numbers_and_null_vectors_for_rejects(tmp_path, flow):
    flow_path, calibrator = flow
    matrix = embeddings_with_bad_rows(tmp_path / "in.npy", rows=200)
    out = tmp_path / "out.parquet"
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=64, show_progress_bar=False)

    table = pq.read_table(out)
    assert table.column_names == ["id", "embedding"]
    assert table.column("id").to_pylist() == list(range(200))
    vectors = table.column("embedding").to_pylist()
    assert [i for i, v in enumerate(vectors) if v is None] == [5, 100, 199]
    np.testing.assert_allclose(np.array(vectors[0:5]), calibrator.transform(matrix[0:5]), rtol=1e-5, atol=1e-5)
    assert pq.ParquetFile(out).num_row_groups == 4  # one per chunk
    assert leftovers(tmp_path, out) == []


class Crash(Exception):
    pass


def crashing_after(calls: int):
    """A transform that works `calls` times, then fails: a job stopped in the middle."""
    state = {"calls": 0}

    def transform(x):
        state["calls"] += 1
        if state["calls"] > calls:
            raise Crash
        return x * 2.0 + 1.0

    return transform, state


def run_job(source_path, out, transform, **options):
    options.setdefault("chunk_rows", 50)
    return CalibrationJob(EmbeddingFile(source_path), out, transform, DIM, show_progress_bar=False, **options).run()


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_stopped_job_resumes_from_its_last_chunk_to_identical_output(tmp_path, suffix):
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=430)
    reference = tmp_path / f"reference{suffix}"
    run_job(tmp_path / "in.npy", reference, crashing_after(10**6)[0])

    out = tmp_path / f"out{suffix}"
    done = 0
    for more_chunks in (0, 2, 3):  # each run resumes where the previous one stopped
        with pytest.raises(Crash):
            run_job(tmp_path / "in.npy", out, crashing_after(more_chunks)[0])
        done += more_chunks
        assert not out.exists(), "an incomplete output must never look complete"
        assert json.loads(Path(f"{out}.progress.json").read_text())["done"]["chunks"] == done
    transform, state = crashing_after(10**6)
    summary = run_job(tmp_path / "in.npy", out, transform)

    assert state["calls"] == 9 - 5  # 9 chunks of 50 rows; the first 5 were already done
    assert summary.resumed_from == 250 and summary.rows == 430 and summary.rejected == 3
    assert out.read_bytes() == reference.read_bytes()
    assert read_rejects(out) == read_rejects(reference)
    assert leftovers(tmp_path, out) == []


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_a_job_stopped_while_finishing_completes_on_the_next_run(tmp_path, monkeypatch, suffix):
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=120)
    reference = tmp_path / f"reference{suffix}"
    run_job(tmp_path / "in.npy", reference, crashing_after(99)[0])
    out = tmp_path / f"out{suffix}"
    def stop_before_renaming_the_rejects_file(self):
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(outputs.RejectsLog, "finish", stop_before_renaming_the_rejects_file)
        with pytest.raises(Crash):  # the output is in place; its rejects file, manifest and progress not yet
            run_job(tmp_path / "in.npy", out, crashing_after(99)[0])
    assert out.exists() and Path(f"{out}.progress.json").exists()
    transform, state = crashing_after(99)
    summary = run_job(tmp_path / "in.npy", out, transform)
    assert state["calls"] == 0 and summary.rows_this_run == 0
    assert out.read_bytes() == reference.read_bytes()
    assert read_rejects(out) == read_rejects(reference)
    assert leftovers(tmp_path, out) == []


def test_resuming_a_changed_job_is_refused_and_restart_starts_over(tmp_path):
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=200)
    out = tmp_path / "out.npy"
    with pytest.raises(Crash):
        run_job(tmp_path / "in.npy", out, crashing_after(2)[0], identity={"flow_sha256": "aaa"})

    with pytest.raises(JobMismatchError, match=r"flow_sha256 was 'aaa', now 'bbb'.*--restart"):
        run_job(tmp_path / "in.npy", out, crashing_after(99)[0], identity={"flow_sha256": "bbb"})
    with pytest.raises(JobMismatchError, match="chunk_rows was 50, now 40"):
        run_job(tmp_path / "in.npy", out, crashing_after(99)[0], identity={"flow_sha256": "aaa"}, chunk_rows=40)
    stat = os.stat(tmp_path / "in.npy")
    os.utime(tmp_path / "in.npy", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(JobMismatchError, match="input.mtime_ns"):
        run_job(tmp_path / "in.npy", out, crashing_after(99)[0], identity={"flow_sha256": "aaa"})

    transform, state = crashing_after(99)
    summary = run_job(tmp_path / "in.npy", out, transform, identity={"flow_sha256": "bbb"}, restart=True)
    assert state["calls"] == 4 and summary.resumed_from == 0
    assert np.isnan(np.load(out)[[5, 100, 199]]).all()


def test_a_missing_partial_output_is_reported_not_silently_refilled(tmp_path):
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=200)
    out = tmp_path / "out.npy"
    with pytest.raises(Crash):
        run_job(tmp_path / "in.npy", out, crashing_after(2)[0])
    Path(f"{out}.partial").unlink()
    with pytest.raises(JobMismatchError, match=r"out.npy.partial is missing.*--restart"):
        run_job(tmp_path / "in.npy", out, crashing_after(99)[0])


def test_the_stage_seam_sees_each_chunk_at_each_stage_with_its_data_durable_before_its_record(tmp_path, flow,
                                                                                             monkeypatch):
    flow_path, _ = flow
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=120)
    out = tmp_path / "out.npy"
    seen = []

    def record(stage, chunk):
        done = json.loads(Path(f"{out}.progress.json").read_text())["done"]["chunks"]
        start = NpyMatrix(f"{out}.partial").header_bytes + chunk.row_start * DIM * 4
        stored = np.frombuffer(Path(f"{out}.partial").read_bytes()[start:start + chunk.vectors.nbytes], np.float32)
        seen.append((stage, chunk.index, done, np.array_equal(stored, chunk.vectors.reshape(-1), equal_nan=True)))

    monkeypatch.setattr(job, "_at_stage", record)
    calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=50, show_progress_bar=False)
    assert [entry[:3] for entry in seen] == [(stage, index, index + (stage == "committed"))
                                             for index in range(3) for stage in ("writing", "written", "committed")]
    assert [entry[3] for entry in seen if entry[0] != "writing"] == [True] * 6


@pytest.mark.parametrize("stage", ["writing", "written"])
def test_a_fault_injected_between_stages_stops_the_job_and_it_resumes_to_identical_output(tmp_path, stage,
                                                                                          monkeypatch):
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=430)
    reference = tmp_path / "reference.npy"
    run_job(tmp_path / "in.npy", reference, crashing_after(10**6)[0])
    out = tmp_path / "out.npy"

    def fail_at_chunk_3(at, chunk):
        if at == stage and chunk.index == 3:
            raise Crash

    with monkeypatch.context() as patch, pytest.raises(Crash):
        patch.setattr(job, "_at_stage", fail_at_chunk_3)
        run_job(tmp_path / "in.npy", out, crashing_after(10**6)[0])
    assert not out.exists()
    assert json.loads(Path(f"{out}.progress.json").read_text())["done"]["chunks"] == 3
    transform, state = crashing_after(10**6)
    summary = run_job(tmp_path / "in.npy", out, transform)
    assert state["calls"] == 9 - 3 and summary.resumed_from == 150
    assert out.read_bytes() == reference.read_bytes()
    assert read_rejects(out) == read_rejects(reference)
    assert leftovers(tmp_path, out) == []


def test_embeddings_of_another_width_are_refused_before_any_work(tmp_path, flow):
    flow_path, _ = flow
    np.save(tmp_path / "in.npy", np.zeros((10, DIM + 1), dtype=np.float32))
    with pytest.raises(ValueError, match=r"holds 9-wide vectors but the calibrator expects 8"):
        calibrate_file(flow_path, tmp_path / "out.npy", embeddings=tmp_path / "in.npy", show_progress_bar=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]




def test_text_is_refused_with_another_encoder_pooling_or_width(tmp_path, flow):
    calibrator = FlowCalibrator.load(flow[0])
    calibrator.provenance = EncoderProvenance("stand-in", "mean")
    calibrator.save(tmp_path / "text.flow")
    (tmp_path / "c.txt").write_text("one\ntwo\n")

    def calibrate(encoder=StandInEncoder(), **options):
        return calibrate_file(tmp_path / "text.flow", tmp_path / "out.npy", input=tmp_path / "c.txt", encoder=encoder,
                              show_progress_bar=False, **options)

    with pytest.raises(ValueError, match="fitted on embeddings from encoder 'stand-in', not 'other'"):
        calibrate(StandInEncoder(model="other"))
    with pytest.raises(ValueError, match="fitted on 'mean' pooling, not 'cls'"):
        calibrate(StandInEncoder(pooling="cls"))
    with pytest.raises(ValueError, match="an encoder is for text input, instead of model/pooling/quantize"):
        calibrate(model="stand-in")
    with pytest.raises(ValueError, match="--model/--pooling/--quantize apply to text input"):
        calibrate_file(tmp_path / "text.flow", tmp_path / "out.npy", embeddings=tmp_path / "c.txt", model="x")
    with pytest.raises(ValueError, match="--model/--pooling/--quantize apply to text input"):
        calibrate_file(tmp_path / "text.flow", tmp_path / "out.npy", embeddings=tmp_path / "c.txt", quantize="int8")
    assert not (tmp_path / "out.npy").exists() and not (tmp_path / "out.npy.progress.json").exists()
    summary = calibrate()
    assert summary.rows == 2 and np.isfinite(np.load(tmp_path / "out.npy")).all()


def test_text_rows_are_encoded_calibrated_and_rejects_kept_in_place(tmp_path, flow):
    calibrator = FlowCalibrator.load(flow[0])
    calibrator.provenance = EncoderProvenance("stand-in", "mean")
    calibrator.save(tmp_path / "text.flow")
    (tmp_path / "c.txt").write_bytes(b"one\n\ntwo words\n\xff\nthree\n")
    out = tmp_path / "out.npy"
    calibrate_file(tmp_path / "text.flow", out, input=tmp_path / "c.txt", encoder=StandInEncoder(), chunk_rows=2,
                   show_progress_bar=False)
    result = np.load(out)
    expected = calibrator.transform(StandInEncoder().encode(["one", "two words", "three"]))
    np.testing.assert_allclose(result[[0, 2, 4]], expected, rtol=1e-5, atol=1e-5)
    assert np.isnan(result[[1, 3]]).all()
    assert read_rejects(out) == [{"row": 1, "line": 2, "reason": EMPTY_LINE},
                                 {"row": 3, "line": 4, "reason": "invalid UTF-8", "detail": "byte 0 of the line"}]


SLOW_CLI = """
import sys, time
import flowcore.batch.job as job
from flowcore.cli import main

seconds = float(sys.argv[1])

def slow(stage, chunk):  # half before a chunk's write, half between its write and its commit
    if stage in ("writing", "written"):
        time.sleep(seconds / 2)

job._at_stage = slow
sys.exit(main(["calibrate", *sys.argv[2:]]))
"""


def start_slow_cli(args, seconds_per_chunk: float):
    """`flowcore calibrate ARGS`, with each chunk slowed down through the job's stage seam."""
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(seconds_per_chunk), *map(str, args), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after_chunks(process, progress: Path, chunks: int, extra_seconds: float) -> int:
    """SIGKILL `process` `extra_seconds` after its progress file records `chunks` chunks done;
    returns the chunks recorded at the kill."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"finished before it could be killed: {process.communicate()}"
        try:
            done = json.loads(progress.read_text())["done"]["chunks"]
        except (FileNotFoundError, json.JSONDecodeError):
            done = -1
        if done >= chunks:
            time.sleep(extra_seconds)
            process.send_signal(signal.SIGKILL)
            process.communicate()
            assert process.returncode == -signal.SIGKILL
            return json.loads(progress.read_text())["done"]["chunks"]
        time.sleep(0.01)
    raise AssertionError("no progress within 2 minutes")


def assert_kill_and_resume_gives_identical_output(args, out: Path, reference: Path, kills):
    """Kill the CLI with SIGKILL at each (chunks done, seconds later) point of `kills`, resume
    each time, and compare the finished output with `reference`. Each chunk waits 0.15 s before
    its write and 0.15 s before its commit, so the seconds choose where in a chunk a kill lands."""
    progress = Path(f"{out}.progress.json")
    recorded = []
    for chunks, extra in kills:
        recorded.append(kill_after_chunks(start_slow_cli(args, 0.3), progress, chunks, extra))
        assert not out.exists(), "an incomplete output must never look complete"
    assert recorded == sorted(recorded)
    finished = subprocess.run([*CLI, "calibrate", *map(str, args), "--quiet"], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert "resumed at row" in finished.stdout
    assert out.read_bytes() == reference.read_bytes()
    assert Path(f"{out}.rejects.jsonl").read_bytes() == Path(f"{reference}.rejects.jsonl").read_bytes()
    assert leftovers(out.parent, out) == []


def test_cli_killed_at_several_points_resumes_to_byte_identical_npy(tmp_path, flow):
    flow_path, _ = flow
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=500)
    reference = tmp_path / "reference.npy"
    calibrate_file(flow_path, reference, embeddings=tmp_path / "in.npy", chunk_rows=50, show_progress_bar=False)
    out = tmp_path / "out.npy"
    args = ["--calibrator", flow_path, "--embeddings", tmp_path / "in.npy", "--out", out, "--chunk-rows", 50]
    # before any chunk is done; before a chunk's write; between a chunk's write and its commit
    assert_kill_and_resume_gives_identical_output(args, out, reference, kills=[(0, 0.05), (2, 0.1), (6, 0.22)])
    np.testing.assert_array_equal(np.isnan(np.load(out)).any(axis=1).nonzero()[0], [5, 250, 499])


def test_cli_refuses_a_mismatched_flow_in_one_clean_line(tmp_path, flow, capsys):
    from flowcore.cli import main

    flow_path, _ = flow
    np.save(tmp_path / "in.npy", np.zeros((4, 3), dtype=np.float32))
    code = main(["calibrate", "--calibrator", str(flow_path), "--embeddings", str(tmp_path / "in.npy"),
                 "--out", str(tmp_path / "out.npy")])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"flowcore calibrate: error: {tmp_path / 'in.npy'} holds 3-wide vectors but the calibrator expects {DIM}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]


CHILD_JOB = """
import re, sys
from flowcore.batch.job import CalibrationJob
from flowcore.batch.vector_sources import EmbeddingFile, NpyMatrix
source = EmbeddingFile(sys.argv[1])
CalibrationJob(source, sys.argv[2], lambda x: x * 2.0, source.dim, show_progress_bar=False).run()
print(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
"""


def child_peak_rss_bytes(*args) -> int:
    """Run the streaming job (reader, chunked transform, writer) in a child process and return
    its peak resident memory (VmHWM: this process image only, unlike ru_maxrss, which keeps the
    forking parent's high-water mark)."""
    result = subprocess.run([sys.executable, "-c", CHILD_JOB, *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1]) * 1024


def test_memory_stays_flat_on_a_large_memory_mapped_input(tmp_path):
    rows, dim = 300_000, 384  # 461 MB of float32
    large = np.lib.format.open_memmap(tmp_path / "large.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, 50_000):
        large[start:start + 50_000] = np.random.default_rng(start).normal(size=(50_000, dim))
    large.flush()
    del large
    np.save(tmp_path / "small.npy", np.ones((100, dim), dtype=np.float32))
    size = os.path.getsize(tmp_path / "large.npy")

    baseline = child_peak_rss_bytes(tmp_path / "small.npy", tmp_path / "small-out.npy")
    peak = child_peak_rss_bytes(tmp_path / "large.npy", tmp_path / "large-out.npy")

    grown = f"peak RSS grew by {(peak - baseline) / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB input"
    assert peak - baseline < size / 5, grown
    assert os.path.getsize(tmp_path / "large-out.npy") == size
    out = np.load(tmp_path / "large-out.npy", mmap_mode="r")
    np.testing.assert_array_equal(out[-3:], np.load(tmp_path / "large.npy", mmap_mode="r")[-3:] * 2.0)


WORDS = "the a cat dog sat on mat ran fast slow big small red blue house tree".split()


def tiny_bert(folder: Path, seed: int) -> str:
    """A random 2-layer BERT with a small word vocabulary, saved like a hub model folder."""
    return save_tiny_bert(folder, WORDS, hidden_size=DIM * 2, num_layers=2, seed=seed)


def sentences(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(count)]


@pytest.fixture(scope="module")
def text_flow(tmp_path_factory):
    """A flow fitted on a tiny BERT's first-last-avg vectors, recording that encoder; a second,
    different tiny BERT."""
    from flowcore import Encoder

    folder = tmp_path_factory.mktemp("text-flow")
    model = tiny_bert(folder / "bert", seed=0)
    encoder = Encoder(model=model, pooling="first-last-avg")
    calibrator = FlowCalibrator(seed=0).fit(encoder.encode(sentences(256, seed=0)), show_progress_bar=False,
                                            encoder=encoder)
    calibrator.save(folder / "text.flow")
    return folder / "text.flow", encoder, tiny_bert(folder / "other-bert", seed=1)


def corpus_with_every_bad_row_kind(path: Path, good_rows: int) -> dict[int, str]:
    """A jsonl corpus of good rows with every kind of bad row mixed in; returns {row: reason}."""
    bad = [(b"", EMPTY_LINE), (b'{"id": "x", "text": "unterminated', "broken JSON"),
           (b'{"id": "y", "title": "no text"}', "missing text field"),
           (b'{"id": "z", "text": "caf\xc3\x28"}', "invalid UTF-8"),
           (b'{"id": "w", "text": "  "}', "empty text"), (b'{"text": "no id here"}', "missing id field")]
    lines, reasons = [], {}
    for index, text in enumerate(sentences(good_rows, seed=2)):
        if index % 25 == 3:
            line, reason = bad[(index // 25) % len(bad)]
            reasons[len(lines)] = reason
            lines.append(line)
        lines.append(json.dumps({"id": f"s{index}", "text": text}).encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return reasons


def test_text_corpus_every_bad_row_kind_is_rejected_and_good_rows_calibrated(tmp_path, text_flow):
    flow_path, encoder, _ = text_flow
    reasons = corpus_with_every_bad_row_kind(tmp_path / "c.jsonl", good_rows=150)
    out = tmp_path / "out.npy"
    summary = calibrate_file(flow_path, out, input=tmp_path / "c.jsonl", id_field="id", chunk_rows=40,
                             show_progress_bar=False)

    rejects = read_rejects(out)
    assert {r["row"]: r["reason"] for r in rejects} == reasons
    assert set(reasons.values()) == {EMPTY_LINE, "broken JSON", "missing text field", "invalid UTF-8", "empty text",
                                     "missing id field"}
    assert all(r["line"] == r["row"] + 1 for r in rejects)
    assert summary.rejects == dict(Counter(reasons.values())) and summary.rows == 150 + len(reasons)
    result = np.load(out)
    good = [row for row in range(summary.rows) if row not in reasons]
    assert np.isnan(result[sorted(reasons)]).all() and np.isfinite(result[good]).all()
    calibrator = FlowCalibrator.load(flow_path)
    np.testing.assert_allclose(result[good], calibrator.transform(encoder.encode(sentences(150, seed=2))),
                               rtol=1e-4, atol=1e-4)


def test_cli_killed_on_a_text_corpus_resumes_to_byte_identical_parquet(tmp_path, text_flow):
    flow_path, _, _ = text_flow
    corpus_with_every_bad_row_kind(tmp_path / "c.jsonl", good_rows=300)
    options = dict(input=tmp_path / "c.jsonl", id_field="id", chunk_rows=32, keep_columns=["text"], normalize=True,
                   vector_column="vector")
    reference = tmp_path / "reference.parquet"
    calibrate_file(flow_path, reference, show_progress_bar=False, **options)
    out = tmp_path / "out.parquet"
    args = ["--calibrator", flow_path, "--input", tmp_path / "c.jsonl", "--id-field", "id", "--out", out,
            "--chunk-rows", 32,
            "--keep-columns", "text", "--normalize", "--vector-column", "vector"]
    assert_kill_and_resume_gives_identical_output(args, out, reference, kills=[(1, 0.22), (5, 0.05)])
    table = pq.read_table(out)
    assert table.column_names == ["id", "vector", "text"]
    assert table.column("id").to_pylist()[:4] == ["s0", "s1", "s2", None]  # row 3 is an empty line
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["normalized"] is True and manifest["rows"] == table.num_rows


def test_text_with_another_encoder_or_pooling_is_refused_before_any_work(tmp_path, text_flow, capsys):
    from flowcore.cli import main

    flow_path, encoder, other_model = text_flow
    (tmp_path / "c.txt").write_text("the cat sat\n")
    base = ["calibrate", "--calibrator", str(flow_path), "--input", str(tmp_path / "c.txt"),
            "--out", str(tmp_path / "o.npy")]
    assert main(base + ["--model", other_model]) == 2
    assert f"fitted on embeddings from encoder {encoder.model_id!r}" in capsys.readouterr().err
    assert main(base + ["--pooling", "mean"]) == 2
    assert "fitted on 'first-last-avg' pooling, not 'mean'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]
    assert main(base + ["--quiet"]) == 0
    assert "calibrated 1 rows: 1 ok, 0 rejected" in capsys.readouterr().out


def test_a_finished_job_run_again_says_it_is_complete_and_does_nothing_until_restart(tmp_path, flow, capsys):
    from flowcore.cli import main

    flow_path, _ = flow
    embeddings_with_bad_rows(tmp_path / "in.npy", rows=200)
    out = tmp_path / "out.parquet"
    argv = ["calibrate", "--calibrator", str(flow_path), "--embeddings", str(tmp_path / "in.npy"), "--out", str(out),
            "--chunk-rows", "50", "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    written = {path: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "already complete: an earlier run of this same job calibrated its 200 rows (197 ok, 3 rejected (3 NaN/Inf)); "
        "nothing to do (add --restart to calibrate them again)")
    assert {path: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == written  # nothing touched
    summary = calibrate_file(flow_path, out, embeddings=tmp_path / "in.npy", chunk_rows=50, show_progress_bar=False)
    assert summary.complete and (summary.rows, summary.rows_this_run, summary.rejected) == (200, 0, 3)

    before = out.read_bytes()
    assert main([*argv, "--restart"]) == 0
    assert capsys.readouterr().out.startswith("calibrated 200 rows: 197 ok, 3 rejected (3 NaN/Inf); 200 rows in")
    assert out.stat().st_mtime_ns != written[out] and out.read_bytes() == before
    assert main([*argv[:-2], "40", "--quiet"]) == 0  # another job into the same output is done, as asked
    assert capsys.readouterr().out.startswith("calibrated 200 rows")
    assert pq.ParquetFile(out).num_row_groups == 5


def test_a_text_job_leaves_its_threads_to_the_encoder_and_calibrates_on_one(tmp_path):
    """A text job's `threads` are its encoder's (batches side by side, one torch thread each): a team of
    torch threads in the job's own thread would wait for its slowest member. Stored vectors get them all."""
    import torch

    (tmp_path / "c.txt").write_text("one\ntwo words\nthree\n")
    np.save(tmp_path / "in.npy", np.ones((3, DIM), dtype=np.float32))
    seen = []

    def transform(vectors):
        seen.append(("transform", torch.get_num_threads()))
        return vectors

    def encode(texts):
        seen.append(("encode", torch.get_num_threads()))
        return np.ones((len(texts), DIM), dtype=np.float32)

    CalibrationJob(TextCorpus(tmp_path / "c.txt"), tmp_path / "t.npy", transform, DIM, encode=encode, threads=2,
                   show_progress_bar=False).run()
    CalibrationJob(EmbeddingFile(tmp_path / "in.npy"), tmp_path / "v.npy", transform, DIM, threads=2,
                   show_progress_bar=False).run()
    assert seen == [("encode", 1), ("transform", 1), ("transform", 2)]
