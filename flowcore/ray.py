"""Calibration on Ray Data, past one machine: `Calibrate` for your own pipelines, `calibrate_ray`
(the engine behind `flowcore calibrate --engine ray`) and `moments` (whitening statistics as a
Ray reduction).

`Calibrate` is a callable class for `Dataset.map_batches`: each actor loads the flow file (and,
for text, the encoder it records) once in `__init__` and adds a vector column and a reject column
to every batch; bad rows are kept, as NaN vectors with their reason.

`calibrate_ray` cuts each input file into shards of `chunk_rows` rows, exactly the chunks of the
single-process job (`flowcore.batch.job`), and lets a pool of actors read, encode, calibrate and
write one shard each (`OUT/shards/part-NNNNNNNN.parquet`, atomically, its rejects beside it).
The resume granularity is one shard: a shard file exists only once complete, so a rerun of the
same command after any failure skips every shard already written; a worker killed mid-shard is
restarted by Ray and its shard redone. Each input file is read by the workers themselves, so
on a multi-node cluster every node must see the input and output paths (a shared file system).

Ray is imported lazily: `import flowcore` never needs it (`pip install 'flowcore[ray]'`).
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from flowcore import defaults
from flowcore._fs import atomic_write_json, file_sha256
from flowcore.batch.outputs import VECTOR_COLUMN, JobMismatchError, ParquetOutput, RejectsLog
from flowcore.batch.rows import EMPTY_TEXT, MISSING_TEXT, MISSING_VECTOR, WRONG_WIDTH, Position, Reject
from flowcore.batch.rows import reject_non_finite as _reject_non_finite
from flowcore.batch.text_sources import TEXT_FORMATS, TextCorpus
from flowcore.batch.vector_sources import EMBEDDING_FORMATS, EmbeddingFile

__all__ = ["JOB_FORMAT", "MANIFEST_FORMAT", "Calibrate", "RayCalibrationSummary", "ShardsFailedError", "calibrate_ray",
           "input_files", "moments", "shard_starts"]

JOB_FORMAT = "flowcore-ray-job"
MANIFEST_FORMAT = "flowcore-ray-vectors-manifest"
FORMAT_VERSION = 1
REJECT_COLUMN = "reject"
"""`Calibrate`'s reject column: the reason a row was rejected, "" for a calibrated row."""
SCAN_BLOCK_BYTES = 1 << 23
ShardHook = Callable[[str, int], None]
_ERROR_LINE = re.compile(r"^(flowcore\.ray\.)?ShardError: ")


class ShardsFailedError(ValueError):
    """A Ray job stopped before every shard was written; the shards already written are kept."""


class ShardError(RuntimeError):
    """A worker could not write a shard: the shard, its input rows and the cause, in one line."""


def _ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is an optional extra
        raise ImportError("the Ray engine needs Ray Data: pip install 'flowcore[ray]'") from None
    return ray


# --------------------------------------------------------------------------------------------
# The callable class for users' own pipelines
# --------------------------------------------------------------------------------------------


class Calibrate:
    """`ds.map_batches(Calibrate, fn_constructor_kwargs={...}, concurrency=N, batch_format="numpy")`:
    calibrate a Ray Dataset's text (or stored vectors) with a flow file, one actor per model copy.

    Each batch comes back with `output_column` (float32, shape (rows, dim)) and `reject` (the
    reason a row was rejected, "" otherwise) added; rejected rows (missing or empty text, a
    missing vector, a wrong width, NaN/Inf) are NaN rows, never dropped.

    Args:
        flow: a flow file written by `flowcore fit`.
        text_column: the column holding sentences (text input).
        vector_column: the column holding stored vectors instead (a (rows, dim) tensor column or
            one array per row); None: text input.
        output_column: the column the calibrated vectors go to.
        model: the encoder for text (default: the one the flow records; another is refused).
        pooling: the pooling for text (default: the flow's).
        batch_size: the encoder's batch size.
        normalize: scale calibrated vectors to unit length.
        threads: torch CPU threads per actor (1 gives the single-process job's text results).
        device: torch device for the encoder and the flow, e.g. "cuda" with `num_gpus=1`.

    Example:
        >>> ds = ray.data.read_parquet("corpus/")
        >>> ds = ds.map_batches(flowcore.ray.Calibrate, fn_constructor_kwargs={"flow": "model.flow"},
        ...                     concurrency=4, batch_size=1024, batch_format="numpy")
        >>> ds.write_parquet("calibrated/")
    """

    def __init__(self, flow: str | os.PathLike, text_column: str = "text", vector_column: str | None = None,
                 output_column: str = VECTOR_COLUMN, model: str | None = None, pooling: str | None = None,
                 batch_size: int = defaults.BATCH_SIZE, normalize: bool = False, threads: int | None = 1, device=None):
        from flowcore.batch.job import encoder_for
        from flowcore.batch.pipeline import encode_with, normalized
        from flowcore.calibration.calibrator import FlowCalibrator
        from flowcore.calibration.flow_file import check_encoder_fits

        self.calibrator = FlowCalibrator.load(flow, device=device)
        self.text_column, self.vector_column, self.output_column = text_column, vector_column, output_column
        self.threads = threads
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        self.encode = None
        if vector_column is None:
            from flowcore.text.encoder import Encoder

            encoder = encoder_for(self.calibrator, model, pooling,
                                   lambda **options: Encoder(device=device, **options), threads)
            requested = model or (self.calibrator.provenance.model if self.calibrator.provenance else None)
            check_encoder_fits(self.calibrator.provenance, self.calibrator.dim, encoder, requested)
            self.encode = encode_with(encoder, batch_size)
        self.transform = normalized(self.calibrator.transform) if normalize else self.calibrator.transform

    def __call__(self, batch: dict) -> dict:
        dim = self.calibrator.dim
        rows = len(next(iter(batch.values()))) if batch else 0
        vectors = np.full((rows, dim), np.nan, dtype=np.float32)
        rejects: list[Reject] = []
        good = np.zeros(rows, dtype=bool)
        if self.vector_column is None:
            texts = batch[self.text_column]
            for row, text in enumerate(texts):
                if not isinstance(text, str):
                    rejects.append(Reject(row, MISSING_TEXT, f"{self.text_column!r} is {type(text).__name__}"))
                elif not text.strip():
                    rejects.append(Reject(row, EMPTY_TEXT))
                else:
                    good[row] = True
            if good.any():
                vectors[good] = self.encode([texts[row] for row in np.flatnonzero(good)])
                rejects += _reject_non_finite(vectors, 0, good, "the encoder returned NaN/Inf")
        else:
            for row, value in enumerate(batch[self.vector_column]):
                if value is None:
                    rejects.append(Reject(row, MISSING_VECTOR))
                    continue
                value = np.asarray(value, dtype=np.float32).reshape(-1)
                if value.shape[0] != dim:
                    rejects.append(Reject(row, WRONG_WIDTH, f"{value.shape[0]} values, expected {dim}"))
                    continue
                vectors[row], good[row] = value, True
            rejects += _reject_non_finite(vectors, 0, good)
        if good.any():
            vectors[good] = self.transform(vectors[good])
        reasons = np.full(rows, "", dtype=object)
        for reject in rejects:
            reasons[reject.row] = reject.reason
        return {**batch, self.output_column: vectors, REJECT_COLUMN: reasons}


# --------------------------------------------------------------------------------------------
# The engine behind `flowcore calibrate --engine ray`
# --------------------------------------------------------------------------------------------


def input_files(pattern: str | os.PathLike, formats: dict[str, str]) -> list[Path]:
    """The files an input names, sorted: a file, a folder (every file below it with a suffix in
    `formats`) or a glob (`corpus/*.jsonl`, `**` allowed). Error naming the input if none match."""
    path = Path(pattern)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in formats)
    else:
        files = sorted(Path(p) for p in glob.glob(str(pattern), recursive=True) if Path(p).is_file())
    if not files:
        raise FileNotFoundError(f"no input files match {pattern} (expected {', '.join(sorted(formats))} files)")
    return files


def shard_starts(source: TextCorpus | EmbeddingFile, chunk_rows: int) -> list[Position]:
    """Where each chunk of `chunk_rows` rows of `source` starts, as the job's reader would reach
    it: row numbers for .npy and parquet; for txt and jsonl (a row per line) one fast pass
    counting newlines; for csv (quoted fields may span lines) one parsing pass."""
    rows = source.rows
    if source.kind == "embeddings" or source.format == "parquet":
        return [Position(row) for row in range(0, rows, chunk_rows)]
    if source.format == "csv":
        starts = [Position()]
        for entry, end in source.entries():
            if end.row % chunk_rows == 0 and end.row < rows:
                starts.append(end)
        return starts
    starts, seen, offset = [Position()], 0, 0
    with open(source.path, "rb") as handle:
        while block := handle.read(SCAN_BLOCK_BYTES):
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            lines = seen + 1 + np.arange(len(newlines))  # the line each newline ends
            for index in np.flatnonzero(lines % chunk_rows == 0):
                if int(lines[index]) < rows:
                    starts.append(Position(int(lines[index]), offset + int(newlines[index]) + 1, int(lines[index])))
            seen += len(newlines)
            offset += len(block)
    return starts


@dataclass
class _Shard:
    """One shard: rows [row_start, row_start + rows) of input file `file`, written as `index`."""

    index: int
    file: int
    start: Position
    rows: int
    global_row: int

    def to_json(self) -> dict:
        return {"index": self.index, "file": self.file, "start": self.start.__dict__, "rows": self.rows,
                "global_row": self.global_row}

    @classmethod
    def from_json(cls, record: dict) -> "_Shard":
        return cls(record["index"], record["file"], Position(**record["start"]), record["rows"], record["global_row"])


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"part-{index:08d}.parquet"


def _rejects_path(folder: Path, index: int) -> Path:
    return folder / f"part-{index:08d}.rejects.jsonl"


class _ShardWriter:
    """The engine's actor: loads the flow (and encoder) once, then reads, calibrates and writes
    whole shards through flowcore's own readers, pipeline and parquet writer."""

    def __init__(self, job: dict, on_shard: ShardHook | None = None):
        from flowcore.calibration.calibrator import FlowCalibrator

        self.job, self.on_shard = job, on_shard
        self.threads = job["threads"]
        import torch

        torch.set_num_threads(self.threads)
        device = "cuda" if job["gpus_per_worker"] > 0 else None
        self.calibrator = FlowCalibrator.load(job["flow"], device=device)
        self.encode = None
        if job["kind"] == "text":  # transformers is imported only by text workers
            from flowcore.batch.job import encoder_for
            from flowcore.batch.pipeline import encode_with
            from flowcore.text.encoder import Encoder

            encoder = encoder_for(self.calibrator, job["model"], job["pooling"],
                                   lambda **options: Encoder(device=device, **options), self.threads)
            self.encode = encode_with(encoder, job["batch_size"])
        self.folder = Path(job["out"]) / "shards"
        self._sources: dict[int, TextCorpus | EmbeddingFile] = {}

    def _source(self, file: int):
        if file not in self._sources:
            self._sources[file] = _open_source(self.job, self.job["inputs"][file])
        return self._sources[file]

    def __call__(self, batch: dict) -> dict:
        from flowcore.batch.pipeline import normalized

        transform = normalized(self.calibrator.transform) if self.job["normalize"] else self.calibrator.transform
        summaries = []
        for record in batch["shard"]:
            shard = _Shard.from_json(json.loads(record))
            started = time.perf_counter()
            try:
                self._write(shard, transform)
            except Exception as error:
                where = f"{self.job['inputs'][shard.file]} rows {shard.start.row}-{shard.start.row + shard.rows - 1}"
                detail = " ".join(str(error).split())
                raise ShardError(f"shard {shard.index} ({where}): {type(error).__name__}: {detail}") from error
            summaries.append(json.dumps({"index": shard.index, "rows": shard.rows,
                                         "seconds": time.perf_counter() - started}))
        return {"summary": np.array(summaries, dtype=object)}

    def _write(self, shard: _Shard, transform) -> None:
        """Read, calibrate and write one shard: its rejects first, then its parquet file (atomically)."""
        from flowcore.batch.pipeline import calibrate_chunks

        source = self._source(shard.file)
        chunk = next(source.chunks(self.job["chunk_rows"], shard.start))
        if chunk.rows != shard.rows:
            raise JobMismatchError(f"{source.path} changed: shard {shard.index} has {chunk.rows} rows, "
                                   f"expected {shard.rows}; rerun with --restart")
        calibrated = next(calibrate_chunks(iter([chunk]), transform, self.calibrator.dim, self.encode, prefetch=1))
        shift = shard.global_row - calibrated.row_start
        calibrated = replace(calibrated, index=shard.index, row_start=shard.global_row,
                             rejects=[replace(reject, row=reject.row + shift) for reject in calibrated.rejects])
        log = RejectsLog(_rejects_path(self.folder, shard.index))
        log.open(None)
        log.append(calibrated.rejects)
        log.finish()
        if self.on_shard is not None:
            self.on_shard("writing", shard.index)
        output = ParquetOutput(self.folder / "vectors.parquet", shard.rows, self.calibrator.dim,
                               with_ids=source.id_field is not None, vector_column=self.job["vector_column"],
                               meta_types=source.meta_types() if source.keep_columns else (),
                               parts=self.folder)  # shard files are the output's part files
        output.write(calibrated)
        output.sync()


def _open_source(job: dict, path: str) -> TextCorpus | EmbeddingFile:
    if job["kind"] == "text":
        return TextCorpus(path, text_field=job["text_field"], id_field=job["id_field"],
                          keep_columns=job["keep_columns"])
    return EmbeddingFile(path, vector_field=job["vector_field"], id_field=job["id_field"],
                         keep_columns=job["keep_columns"])


@dataclass
class RayCalibrationSummary:
    """What a Ray job did: all rows and rejects, and the shards this run wrote and skipped."""

    rows: int
    rejects: dict[str, int]
    shards: int
    shards_written: int
    rows_this_run: int
    seconds: float
    out: Path

    @property
    def rows_per_second(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else float("inf")

    def __str__(self) -> str:
        rejected = sum(self.rejects.values())
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(self.rejects.items()))
        return (f"calibrated {self.rows:,} rows: {self.rows - rejected:,} ok, {rejected:,} rejected"
                + (f" ({reasons})" if reasons else "")
                + f"; {self.shards_written} of {self.shards} shards written by this run ({self.rows_this_run:,} rows "
                f"in {self.seconds:.1f} s, {self.rows_per_second:,.0f} rows/s)\noutput: {self.out}/shards\n"
                f"rejects: {self.out / 'rejects.jsonl'}\nmanifest: {self.out / 'manifest.json'}")


def calibrate_ray(flow_path: str | os.PathLike, out: str | os.PathLike, *, input: str | None = None,
                  embeddings: str | None = None, text_field: str = "text", id_field: str | None = None,
                  vector_field: str = "embedding", model: str | None = None, pooling: str | None = None,
                  batch_size: int = defaults.BATCH_SIZE, chunk_rows: int | None = None, restart: bool = False,
                  progress: bool = True,
                  threads: int | None = None, keep_columns=(), vector_column: str | None = None,
                  normalize: bool = False, address: str | None = None, num_workers: int | None = None,
                  gpus_per_worker: float = 0, on_shard: ShardHook | None = None) -> RayCalibrationSummary:
    """Calibrate a file, folder or glob of text (`input`) or stored vectors (`embeddings`) on Ray
    into the folder `out`: parquet shards, `rejects.jsonl` and `manifest.json`; see the module
    docstring for the layout and the resume granularity.

    Rows and vectors are those of `flowcore calibrate` run on each file by itself: the same
    chunks (`chunk_rows`), the same torch thread count (`threads`, default 1 per worker) and the
    same encoder batch size give byte-identical vectors on CPU. Ids are the `id_field` values or,
    without one, the row number in the files taken in sorted order (one file: its row number).

    Args:
        flow_path: a flow file from `flowcore fit`.
        out: the output folder (created).
        input / embeddings: exactly one, a file, a folder or a glob.
        address: a running Ray cluster ("auto", "ray://host:10001"); None starts a local one,
            or uses the Ray session already initialised in this process.
        num_workers: actors (model copies); default: one per CPU (per GPU with `gpus_per_worker`).
        gpus_per_worker: GPUs per actor (0: CPU).
        on_shard: `on_shard(stage, shard)` in the worker before a shard's vectors are written
            ("writing"): a hook for fault injection.
        Others: as `flowcore.batch.job.calibrate_file`.

    Example:
        >>> calibrate_ray("model.flow", "vectors/", input="corpus/*.jsonl", id_field="id", num_workers=8)
    """
    from flowcore.batch.job import encoder_for
    from flowcore.batch.pipeline import check_compatible, default_chunk_rows
    from flowcore.calibration.calibrator import FlowCalibrator
    from flowcore.runtime import check_threads

    ray = _ray()
    if (input is None) == (embeddings is None):
        raise ValueError("give exactly one of a text corpus (input) or stored embeddings (embeddings)")
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"--num-workers must be at least 1, got {num_workers}")
    if gpus_per_worker < 0:
        raise ValueError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
    threads = check_threads(threads) or 1
    kind = "text" if input is not None else "embeddings"
    files = input_files(input if input is not None else embeddings, TEXT_FORMATS if input else EMBEDDING_FORMATS)
    out = Path(out)
    if out.suffix.lower() == ".npy" or out.is_file():
        raise ValueError(f"{out}: the Ray engine writes a folder (parquet shards, rejects.jsonl, manifest.json); "
                         "give --out a folder name")
    job = {"kind": kind, "flow": str(Path(flow_path).resolve()), "out": str(out.resolve()),
           "inputs": [str(path.resolve()) for path in files], "text_field": text_field, "id_field": id_field,
           "vector_field": vector_field, "keep_columns": list(keep_columns or ()), "model": model,
           "pooling": pooling, "batch_size": batch_size, "threads": threads, "normalize": bool(normalize),
           "vector_column": vector_column or VECTOR_COLUMN, "gpus_per_worker": gpus_per_worker}
    sources = [_open_source(job, path) for path in job["inputs"]]
    calibrator = FlowCalibrator.load(flow_path)
    encoder = None
    if kind == "text":
        encoder = encoder_for(calibrator, model, pooling, None, threads)
    requested = model or (calibrator.provenance.model if calibrator.provenance else None)
    for source in sources:
        check_compatible(calibrator, source, encoder, requested)
    job["chunk_rows"] = chunk_rows or default_chunk_rows(sources[0], calibrator.dim)
    if job["chunk_rows"] < 1:
        raise ValueError(f"chunk_rows must be at least 1, got {job['chunk_rows']}")
    identity = {"format": JOB_FORMAT, "version": FORMAT_VERSION, "flow_sha256": file_sha256(flow_path),
                "input_files": [source.identity() for source in sources],
                **{key: value for key, value in job.items() if key not in ("out", "gpus_per_worker")}}
    folder = out / "shards"
    job_path = out / "job.json"
    out.mkdir(parents=True, exist_ok=True)
    if job_path.exists() and not restart:
        recorded = json.loads(job_path.read_text(encoding="utf-8"))
        if recorded != identity:
            changed = sorted(key for key in set(recorded) | set(identity) if recorded.get(key) != identity.get(key))
            raise JobMismatchError(f"{job_path} records another job (different {', '.join(changed)}); rerun the "
                                   "original command to finish it, or add --restart to start over")
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(exist_ok=True)
    atomic_write_json(job_path, identity, indent=1)

    shards, global_row = [], 0
    for file, source in enumerate(sources):
        starts = shard_starts(source, job["chunk_rows"])
        for start in starts:
            rows = min(job["chunk_rows"], source.rows - start.row)
            shards.append(_Shard(len(shards), file, start, rows, global_row + start.row))
        global_row += source.rows
    pending = [shard for shard in shards if not _shard_path(folder, shard.index).is_file()]

    started = time.perf_counter()
    if pending:
        _run_shards(ray, job, pending, address, num_workers, gpus_per_worker, on_shard, progress)
    missing = [shard.index for shard in shards if not _shard_path(folder, shard.index).is_file()]
    if missing:
        raise ShardsFailedError(f"{len(missing)} shard(s) were not written (first: {missing[0]}); rerun the same "
                           "command to write them")
    seconds = time.perf_counter() - started
    for leftover in [*folder.glob(".*"), *folder.glob("*.partial")]:  # writes cut short by a killed worker
        leftover.unlink(missing_ok=True)
    rejects = _join_rejects(out, folder, shards, job["inputs"])
    manifest = _manifest(job, identity, shards, sources, rejects, calibrator, encoder, folder)
    atomic_write_json(out / "manifest.json", manifest, indent=1)
    return RayCalibrationSummary(global_row, manifest["rejects"], len(shards), len(pending),
                                 sum(shard.rows for shard in pending), seconds, out)


def _run_shards(ray, job: dict, pending: list[_Shard], address, num_workers, gpus_per_worker, on_shard,
                progress: bool) -> None:
    """Write `pending` shards on an actor pool of the cluster at `address` (or the running one)."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=progress)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    resources = ray.cluster_resources()
    if num_workers is None:
        per_worker = gpus_per_worker or 1
        available = resources.get("GPU", 0) if gpus_per_worker else resources.get("CPU", 1)
        num_workers = max(1, int(available // per_worker))
    num_workers = min(num_workers, len(pending))
    items = [{"shard": json.dumps(shard.to_json())} for shard in pending]
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    resources_per_worker = {"num_cpus": job["threads"], **({"num_gpus": gpus_per_worker} if gpus_per_worker else {})}
    dataset = dataset.map_batches(_ShardWriter, fn_constructor_kwargs={"job": job, "on_shard": on_shard},
                                  batch_size=1, batch_format="numpy", concurrency=num_workers, **resources_per_worker)
    try:
        for _ in dataset.iter_batches(batch_size=None):
            pass
    except Exception as error:  # a worker's error reaches the driver as text inside Ray's: one line for the user
        reasons = [line.strip() for line in str(error).splitlines() if _ERROR_LINE.match(line.strip())]
        reason = reasons[-1] if reasons else f"{type(error).__name__}: {str(error).splitlines()[0]}"
        raise ShardsFailedError(f"the Ray job stopped: {reason}; the shards already written are kept: rerun the "
                                "same command to finish") from None


def _join_rejects(out: Path, folder: Path, shards: list[_Shard], inputs: list[str]) -> dict[str, int]:
    """`OUT/rejects.jsonl`: every shard's rejects in row order, each naming its input file; the counts by reason."""
    counts: dict[str, int] = {}
    lines = []
    for shard in shards:
        with open(_rejects_path(folder, shard.index), encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                counts[record["reason"]] = counts.get(record["reason"], 0) + 1
                lines.append(json.dumps({**record, "file": inputs[shard.file]}, ensure_ascii=False))
    from flowcore._fs import atomic_write

    payload = "".join(line + "\n" for line in lines).encode("utf-8")
    atomic_write(out / "rejects.jsonl", lambda stream: stream.write(payload))
    return dict(sorted(counts.items()))


def _manifest(job, identity, shards, sources, rejects, calibrator, encoder, folder: Path) -> dict:
    import pyarrow.parquet as pq

    import flowcore
    from flowcore.batch.job import arrow_type_name

    schema = pq.read_schema(_shard_path(folder, 0))
    rows = sum(source.rows for source in sources)
    rejected = sum(rejects.values())
    described = None
    if encoder is not None:
        described = {**encoder.describe(), "batch_size": job["batch_size"]}
    return {
        "format": MANIFEST_FORMAT, "version": FORMAT_VERSION, "flowcore_version": flowcore.__version__,
        "rows": rows, "ok": rows - rejected, "rejected": rejected, "rejects": rejects, "rejects_file": "rejects.jsonl",
        "dim": calibrator.dim, "dtype": "float32", "normalized": job["normalize"], "rejected_rows": "null vector",
        "id_column": "id", "id_source": job["id_field"] or "row number (files in sorted order)",
        "vector_column": job["vector_column"], "kept_columns": job["keep_columns"],
        "columns": [{"name": field.name, "type": arrow_type_name(field.type)} for field in schema],
        "shards": [{"file": f"shards/{_shard_path(folder, shard.index).name}", "input": job["inputs"][shard.file],
                    "input_row": shard.start.row, "rows": shard.rows, "first_id_row": shard.global_row}
                   for shard in shards],
        "input": {"kind": job["kind"], "files": identity["input_files"]},
        "encoder": described,
        "calibration": {"method": "bert-flow", "path": job["flow"], "sha256": identity["flow_sha256"],
                        "config": calibrator.config},
        "threads": job["threads"], "chunk_rows": job["chunk_rows"], "resume_granularity": "one shard",
    }


# --------------------------------------------------------------------------------------------
# Whitening statistics as a Ray reduction
# --------------------------------------------------------------------------------------------


def _batch_moments(batch: dict, column: str) -> dict:
    from flowcore.calibration.moments import Moments

    values = np.asarray(np.stack(list(batch[column])) if batch[column].dtype == object else batch[column])
    moments = Moments.of(values)
    return {"count": np.array([moments.count]), "mean": moments.mean[None], "comoment": moments.comoment[None]}


def moments(dataset, column: str = VECTOR_COLUMN):
    """The float64 `Moments` (count, mean, co-moment) of a Ray Dataset's vector column, each
    block summarised where it lives and merged pairwise on the driver (O(d²) memory), e.g.
    `Whitening.from_moments(flowcore.ray.moments(ds))` for BERT-whitening of a distributed corpus.

    Args:
        dataset: a `ray.data.Dataset` with a (rows, d) tensor column or one array per row.
        column: the vector column.

    Example:
        >>> whitening = flowcore.Whitening.from_moments(flowcore.ray.moments(ds, "embedding"), dim=256)
    """
    from flowcore.calibration.moments import Moments, MomentsAccumulator

    accumulator = MomentsAccumulator()
    partial = dataset.map_batches(_batch_moments, fn_kwargs={"column": column}, batch_format="numpy",
                                  batch_size=65536)
    for batch in partial.iter_batches(batch_size=None, batch_format="numpy"):
        for count, mean, comoment in zip(batch["count"], batch["mean"], batch["comoment"]):
            accumulator.add_moments(Moments(int(count), np.asarray(mean), np.asarray(comoment)))
    return accumulator.total()
