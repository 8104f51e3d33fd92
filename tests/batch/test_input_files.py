"""A folder or a glob of shards is one corpus on the local engine: its files are read in sorted
order, row numbers, ids and rejects count across them (each reject naming its file and its line
there), a chunk never spans two files (so each file's vectors are a job over that file alone), a
stopped job resumes byte-identically, and a shard added, removed or changed between runs is named."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flowcore.batch.job as job
from flowcore import FlowCalibrator
from flowcore.batch.core import InputChangedError
from flowcore.batch.job import calibrate_file
from flowcore.calibration.file import EncoderProvenance
from flowcore.cli import main

from helpers.tiny_models import StandInEncoder

DIM = 8
SHARD_ROWS = {"a": 7, "b": 0, "c": 12, "d": 5}
"""Rows of each shard (b is empty); row 3 of shard c is an empty text, or a NaN vector."""


@pytest.fixture(scope="module")
def flow(tmp_path_factory) -> Path:
    """A small flow fitted on random 8-wide vectors, recording a stand-in encoder."""
    rng = np.random.default_rng(0)
    calibrator = FlowCalibrator(seed=0, config="l2_d2_w32").fit(rng.normal(size=(256, DIM)).astype(np.float32),
                                                                show_progress_bar=False)
    calibrator.provenance = EncoderProvenance("stand-in", "mean")
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    calibrator.save(path)
    return path




def write_text_shards(folder: Path, suffix: str) -> None:
    folder.mkdir()
    for name, rows in SHARD_ROWS.items():
        texts = [f"sentence {i} of shard {name}" for i in range(rows)]
        if name == "c":
            texts[3] = ""
        ids = [f"{name}{i}" for i in range(rows)]
        path = folder / f"{name}{suffix}"
        if suffix == ".txt":
            path.write_text("".join(f"{text}\n" for text in texts))
        elif suffix == ".jsonl":
            path.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in zip(ids, texts)))
        elif suffix == ".csv":
            path.write_text("id,text\n" + "".join(f"{i},{text}\n" for i, text in zip(ids, texts)))
        else:
            pq.write_table(pa.table({"id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string())}), path)
    (folder / "notes.md").write_text("not a shard: a folder's files of other kinds are left out\n")


def write_vector_shards(folder: Path, suffix: str) -> None:
    folder.mkdir()
    rng = np.random.default_rng(1)
    for name, rows in SHARD_ROWS.items():
        vectors = rng.normal(size=(rows, DIM)).astype(np.float32)
        if name == "c":
            vectors[3, 0] = np.nan
        if suffix == ".npy":
            np.save(folder / f"{name}.npy", vectors)
        else:
            pq.write_table(pa.table({"embedding": pa.array(list(vectors), pa.list_(pa.float32(), DIM))}),
                           folder / f"{name}.parquet")


class Stop(Exception):
    pass


def stop_after_chunk(index: int):
    def hook(stage, chunk):
        if stage == "committed" and chunk.index == index:
            raise Stop
    return hook


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in Path(f"{out}.rejects.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv", ".parquet"])
def test_a_folder_of_text_shards_is_one_corpus_that_resumes_byte_identically(tmp_path, flow, suffix, monkeypatch):
    write_text_shards(tmp_path / "corpus", suffix)
    options = dict(input=tmp_path / "corpus", encoder=StandInEncoder(), chunk_rows=4, show_progress_bar=False,
                   **({} if suffix == ".txt" else {"id_field": "id"}))
    reference = tmp_path / "reference.parquet"
    calibrate_file(flow, reference, **options)
    out = tmp_path / "out.parquet"
    with monkeypatch.context() as patch, pytest.raises(Stop):
        patch.setattr(job, "_at_stage", stop_after_chunk(2))  # a's 2 chunks and c's first
        calibrate_file(flow, out, **options)
    summary = calibrate_file(flow, out, **options)

    reason = "empty line" if suffix == ".txt" else "empty text"
    assert (summary.rows, summary.resumed_from, summary.rejects) == (24, 11, {reason: 1})
    assert out.read_bytes() == reference.read_bytes()
    assert Path(f"{out}.rejects.jsonl").read_bytes() == Path(f"{reference}.rejects.jsonl").read_bytes()
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids == (list(range(24)) if suffix == ".txt" else
                   [f"{name}{i}" for name, rows in SHARD_ROWS.items() for i in range(rows)])
    c = str((tmp_path / "corpus" / f"c{suffix}").resolve())
    line = {".txt": 4, ".jsonl": 4, ".csv": 5, ".parquet": None}[suffix]
    assert read_rejects(out) == [{"row": 10, **({} if suffix == ".txt" else {"id": "c3"}),
                                  **({"line": line} if line else {}), "reason": reason, "file": c}]
    for shard in ("a", "c", "d"):  # each file's vectors are those of a job over that file alone
        alone = tmp_path / f"{shard}.parquet"
        calibrate_file(flow, alone, **{**options, "input": tmp_path / "corpus" / f"{shard}{suffix}"})
        start = sum(rows for name, rows in SHARD_ROWS.items() if name < shard)
        expected = pq.read_table(alone).column("embedding")
        assert pq.read_table(out).column("embedding").slice(start, SHARD_ROWS[shard]).to_pylist() == \
            expected.to_pylist()
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert [Path(file["path"]).name for file in manifest["input"]["files"]] == [f"{name}{suffix}" for name in "abcd"]
    assert manifest["rows"] == 24 and (suffix != ".txt" or manifest["id_source"] == "row number (files in sorted "
                                                                                      "order)")


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_a_glob_of_vector_shards_is_one_input_with_row_number_ids(tmp_path, flow, suffix):
    write_vector_shards(tmp_path / "vectors", suffix)
    out = tmp_path / "out.parquet"
    summary = calibrate_file(flow, out, embeddings=str(tmp_path / "vectors" / f"*{suffix}"), chunk_rows=5,
                             show_progress_bar=False)
    table = pq.read_table(out)
    assert summary.rows == 24 and table.column("id").to_pylist() == list(range(24))
    assert [r["row"] for r in read_rejects(out)] == [10] and read_rejects(out)[0]["file"].endswith(f"c{suffix}")
    alone = tmp_path / "d.parquet"
    calibrate_file(flow, alone, embeddings=tmp_path / "vectors" / f"d{suffix}", chunk_rows=5, show_progress_bar=False)
    assert table.column("embedding").slice(19, 5).to_pylist() == pq.read_table(alone).column("embedding").to_pylist()
    assert pq.ParquetFile(out).num_row_groups == 2 + 3 + 1  # a's 2 chunks, c's 3, d's 1: none spans two files


def add_shard(folder: Path) -> str:
    np.save(folder / "e.npy", np.ones((3, DIM), dtype=np.float32))
    return r"input.files: .*/e.npy was added"


def remove_shard(folder: Path) -> str:
    (folder / "d.npy").unlink()
    return r"input.files: .*/d.npy was removed"


def change_shard(folder: Path) -> str:
    np.save(folder / "a.npy", np.ones((8, DIM), dtype=np.float32))
    return r"input.files\[.*/a.npy\].size was 352, now 384"


@pytest.mark.parametrize("change", [add_shard, remove_shard, change_shard])
def test_a_shard_added_removed_or_changed_between_runs_is_named_and_restart_starts_over(tmp_path, flow, change,
                                                                                       monkeypatch):
    write_vector_shards(tmp_path / "vectors", ".npy")
    options = dict(embeddings=tmp_path / "vectors", chunk_rows=4, show_progress_bar=False)
    out = tmp_path / "out.npy"
    with monkeypatch.context() as patch, pytest.raises(Stop):
        patch.setattr(job, "_at_stage", stop_after_chunk(1))
        calibrate_file(flow, out, **options)
    what = change(tmp_path / "vectors")
    with pytest.raises(InputChangedError, match=rf"vectors changed since the unfinished run that .*out.npy.progress."
                                                rf"json records \({what}\): the rows done so far came from its old "
                                                "content"):
        calibrate_file(flow, out, **options)
    assert calibrate_file(flow, out, restart=True, **options).resumed_from == 0


def test_one_format_the_same_kept_columns_and_an_output_out_of_the_inputs_way(tmp_path, flow):
    write_vector_shards(tmp_path / "vectors", ".npy")
    pq.write_table(pa.table({"embedding": pa.array([[0.0] * DIM], pa.list_(pa.float32(), DIM))}),
                   tmp_path / "vectors" / "z.parquet")
    with pytest.raises(ValueError, match=r"vectors holds npy and parquet files \(.*a.npy, .*z.parquet\); a job reads "
                                         "one format"):
        calibrate_file(flow, tmp_path / "out.npy", embeddings=tmp_path / "vectors")
    calibrate_file(flow, tmp_path / "out.npy", embeddings=str(tmp_path / "vectors" / "*.npy"), show_progress_bar=False)
    (tmp_path / "vectors" / "z.parquet").rename(tmp_path / "z.parquet")
    for out, given in ((tmp_path / "vectors" / "out.npy", tmp_path / "vectors"),
                       (tmp_path / "vectors" / "new.npy", str(tmp_path / "vectors" / "*.npy")),
                       (tmp_path / "p.parquet", str(tmp_path / "**" / "*.parquet"))):
        with pytest.raises(ValueError, match="finds its files, so a rerun would read it as input; choose another"):
            calibrate_file(flow, out, embeddings=given)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty is a folder without \.npy, \.parquet, \.pq files"):
        calibrate_file(flow, tmp_path / "out.npy", embeddings=tmp_path / "empty")

    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": ["a"], "n": pa.array([1], pa.int64())}), tmp_path / "text" / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "n": ["one"]}), tmp_path / "text" / "b.parquet")
    with pytest.raises(ValueError, match=r"b.parquet keeps its columns as n: string, but .*a.parquet as n: int64"):
        calibrate_file(flow, tmp_path / "t.parquet", input=tmp_path / "text", keep_columns=["n"],
                       encoder=StandInEncoder())


def test_the_command_line_takes_a_folder_of_shards(tmp_path, flow, capsys):
    write_vector_shards(tmp_path / "vectors", ".npy")
    argv = ["calibrate", "--calibrator", str(flow), "--embeddings", str(tmp_path / "vectors"), "--out",
            str(tmp_path / "out.npy"), "--chunk-rows", "4", "--quiet"]
    assert main(argv) == 0
    assert "calibrated 24 rows: 23 ok, 1 rejected (1 NaN/Inf)" in capsys.readouterr().out
    assert np.load(tmp_path / "out.npy").shape == (24, DIM)
