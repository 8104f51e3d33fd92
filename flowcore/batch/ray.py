"""Calibration on Ray Data (published as `flowcore.ray`): `Calibrate` for `Dataset.map_batches`,
`calibrate_ray` (`flowcore calibrate --engine ray`: the shared `JobLifecycle` and calibration core, plus
shards, the local job's chunks as parquet files a rerun skips, and actors) and `moments`. See docs/scaling.md."""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flowcore import defaults
from flowcore._fs import atomic_write
from flowcore._progress import ProgressReport, progress_wanted
from flowcore.batch import core
from flowcore.batch.core import JobSpec
from flowcore.batch.input_files import InputFiles
from flowcore.batch.interrupts import JobInterrupted, interrupts_named
from flowcore.batch.lifecycle import JobLifecycle, JobRecord, job_identity
from flowcore.batch.lock import OutputLock
from flowcore.batch.outputs import ParquetOutput, RejectsLog
from flowcore.batch.ray_watchdog import watch_session
from flowcore.batch.rows import CalibratedChunk, Chunk, Position, file_changed, one_line
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile
from flowcore.runtime import calibration_threads, job_threads, use_threads_in_this_process

__all__ = ["JOB_FORMAT", "JOB_VERSION", "REJECT_COLUMN", "Calibrate", "ShardsFailedError", "calibrate_ray",
           "moments", "shard_starts"]

JOB_FORMAT = "flowcore-ray-job"
JOB_VERSION = 4
"""`OUT/job.json`, the Ray job's record, kept after the job finishes; another version's is refused."""
PARTS = "shards"
"""The folder in `OUT` of the output's parquet parts (a parquet dataset), one per shard."""
SHARD_REJECTS = "shard-rejects"
"""The folder in `OUT` of each shard's rejects, joined into `OUT/rejects.jsonl` at the end."""
REJECT_COLUMN = "reject"
"""`Calibrate`'s reject column: the reason a row was rejected, "" for a calibrated row."""
_ERROR_LINE = re.compile(r"^(flowcore\.batch\.ray\.)?ShardError: ")


def _before_shard_write(shard: int) -> None:
    """Called in a worker before a shard's vectors are written: a seam for fault-injection tests."""


class ShardsFailedError(ValueError):
    """A Ray job stopped before every shard was written; the shards already written are kept."""


class ShardError(RuntimeError):
    """A worker could not write a shard: the shard, its input rows and the cause, in one line."""


class Calibrate:
    """Calibrate a Ray Dataset's text (or stored vectors) in `Dataset.map_batches`, one actor per model
    copy. Each batch gets `output_column` (float32, (rows, dim)) and `reject` (the reason, "" for a
    calibrated row); a row the local job would reject is rejected alike, a NaN row.

    Args:
        flow: a calibration file written by `flowcore fit`.
        text_column: the column holding sentences (text input).
        vector_column: the column holding stored vectors instead (None: text input).
        output_column: the column the calibrated vectors go to.
        model: the encoder for text (default: the one the flow records; another is refused).
        pooling: the pooling for text (default: the flow's).
        batch_size: the encoder's batch size.
        quantize: "int8" for the encoder's int8 CPU mode (`Encoder(quantize=...)`).
        normalize: scale calibrated vectors to unit length.
        threads: torch CPU threads per actor (default 1: the local job's text results).
        device: torch device for the encoder and the flow, e.g. "cuda" with `num_gpus=1`.

    Example:
        >>> ds = ray.data.read_parquet("corpus/")
        >>> ds = ds.map_batches(flowcore.ray.Calibrate, fn_constructor_kwargs={"flow": "model.flow"},
        ...                     compute=ray.data.ActorPoolStrategy(size=4), batch_size=1024, batch_format="numpy")
        >>> ds.write_parquet("calibrated/")
    """

    def __init__(self, flow: str | os.PathLike, text_column: str = defaults.TEXT_FIELD,
                 vector_column: str | None = None, output_column: str = defaults.VECTOR_COLUMN,
                 model: str | None = None, pooling: str | None = None, batch_size: int = defaults.BATCH_SIZE,
                 normalize: bool = False, threads: int | None = None, device=None, quantize: str | None = None):
        from flowcore.calibration.base import load

        self.threads = threads or job_threads(vector_column is None, actor=True)
        use_threads_in_this_process(calibration_threads(self.threads, vector_column is None))  # results depend on it
        self.calibrator = load(flow, device=device)
        self.column, self.text = vector_column or text_column, vector_column is None
        self.output_column, self.normalize = output_column, normalize
        encoder = (core.load_encoder(self.calibrator, model, pooling, quantize, self.threads, device)
                   if self.text else None)
        self.encode = core.encode_with(encoder, batch_size)

    def calibrated(self, chunk: Chunk) -> CalibratedChunk:
        """`chunk` calibrated as the local job calibrates it (`calibrate_chunk`): its rejects come with it."""
        return core.calibrate_chunk(chunk, self.calibrator.transform, self.calibrator.dim, self.encode,
                               self.calibrator.output_dim, self.normalize)

    def __call__(self, batch: dict) -> dict:
        chunk = core.chunk_of_values(batch[self.column], self.column, None if self.text else self.calibrator.dim)
        calibrated = self.calibrated(chunk)
        reasons = np.full(chunk.rows, "", dtype=object)
        for reject in calibrated.rejects:
            reasons[reject.row] = reject.reason
        return {**batch, self.output_column: calibrated.vectors, REJECT_COLUMN: reasons}


def shard_starts(source: TextCorpus | EmbeddingFile, chunk_rows: int) -> list[Position]:
    """Where each chunk of `chunk_rows` rows of `source` starts (newlines counted for txt and jsonl, csv parsed)."""
    rows = source.rows
    if not rows:
        return []
    if source.kind == "embeddings" or source.format == "parquet":
        return [Position(row) for row in range(0, rows, chunk_rows)]
    if source.format == "csv":
        return [Position(), *(end for _, end in source.entries() if end.row % chunk_rows == 0 and end.row < rows)]
    starts, seen, offset = [Position()], 0, 0
    with open(source.path, "rb") as handle:
        while block := handle.read(defaults.SCAN_BLOCK_BYTES):
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            lines = seen + 1 + np.arange(len(newlines))  # the line each newline ends
            for index in np.flatnonzero((lines % chunk_rows == 0) & (lines < rows)):
                starts.append(Position(int(lines[index]), offset + int(newlines[index]) + 1, int(lines[index])))
            seen += len(newlines)
            offset += len(block)
    return starts


@dataclass
class _Shard:
    """Rows [start.row, start.row + rows) of input file `file` (from `global_row` of the input), shard `index`."""

    index: int
    file: int
    start: Position
    rows: int
    global_row: int


def _plan(source: InputFiles, chunk_rows: int) -> list[_Shard]:
    """The shards of `source`: each file's chunks, numbered as the local job numbers them."""
    shards = []
    for file, part in enumerate(source.sources):
        for start in shard_starts(part, chunk_rows):
            shards.append(_Shard(len(shards), file, start, min(chunk_rows, part.rows - start.row),
                                 source.starts[file] + start.row))
    return shards


def _shard_path(folder: Path, index: int, suffix: str = ".parquet") -> Path:
    return folder / f"part-{index:08d}{suffix}"


STOPPING = ".stopping"
"""A file in the output folder while a stopped driver lets the shards in flight finish: no new one begins."""


class _ShardWriter:
    """The engine's actor: reads, calibrates and writes whole shards (indices into `shards`; `files`: identities)."""

    def __init__(self, spec: JobSpec, files: list[dict], shards: list[_Shard], out: str, device, before_write):
        self.spec, self.files, self.shards, self.before_write = spec, files, shards, before_write
        self.calibrate = Calibrate(spec.flow, vector_column=spec.vector_field if spec.kind == "embeddings" else None,
                                   model=spec.model, pooling=spec.pooling, batch_size=spec.batch_size, device=device,
                                   normalize=spec.normalize, threads=spec.threads, quantize=spec.quantize)
        self.folder, self.rejects_folder = Path(out) / PARTS, Path(out) / SHARD_REJECTS
        self._open = functools.cache(spec.open)  # one source per input file

    def __call__(self, batch: dict) -> dict:
        shards = [self.shards[index] for index in batch["shard"]]
        if (self.folder.parent / STOPPING).exists():  # the driver was stopped: begin no new shard
            return {"rows": np.zeros(len(shards), dtype=np.int64)}
        for shard in shards:
            try:
                self._write(shard)
            except Exception as error:
                where = f"{self.files[shard.file]['path']} rows {shard.start.row}-{shard.start.row + shard.rows - 1}"
                raise ShardError(f"shard {shard.index} ({where}): {type(error).__name__}: {one_line(error)}") from error
        return {"rows": np.array([shard.rows for shard in shards])}

    def _write(self, shard: _Shard) -> None:
        """Read, calibrate and write one shard: its rejects (each naming its file), then its parquet file."""
        file = self.files[shard.file]
        source = self._open(file["path"])
        chunk = next(source.chunks(self.spec.chunk_rows, shard.start))
        calibrated = self.calibrate.calibrated(chunk)
        changed = file_changed(file)
        if changed is None and chunk.rows != shard.rows:
            changed = f"shard {shard.index} has {chunk.rows} rows, expected {shard.rows}"
        if changed is not None:
            raise core.InputChangedError.while_read(source.path, changed)
        shift = shard.global_row - calibrated.row_start
        calibrated = replace(calibrated, index=shard.index, row_start=shard.global_row,
                             rejects=[replace(reject, row=reject.row + shift, file=file["path"])
                                      for reject in calibrated.rejects])
        log = RejectsLog(_shard_path(self.rejects_folder, shard.index, ".rejects.jsonl"))
        log.open(None)
        log.append(calibrated.rejects)
        log.finish()
        self.before_write(shard.index)
        output = ParquetOutput(self.folder / "vectors.parquet", shard.rows, self.calibrate.calibrator.output_dim,
                               with_ids=source.id_field is not None, vector_column=self.spec.vector_column,
                               meta_types=source.meta_types(), parts=self.folder)  # shard files are its part files
        output.write(calibrated)
        output.sync()


@interrupts_named()
def calibrate_ray(flow_path: str | os.PathLike, out: str | os.PathLike, *, address: str | None = None,
                  num_workers: int | None = None, gpus_per_worker: float = 0, restart: bool = False,
                  show_progress_bar: bool | None = None, **options) -> core.CalibrationSummary:
    """Calibrate a file, folder or glob of text (`input`) or stored vectors (`embeddings`) on Ray into the folder
    `out`: parquet shards (`out/shards/`, the summary's `out`: a parquet dataset), `rejects.jsonl`, `manifest.json`.

    Rows and vectors are the local job's on each file; ids are the `id_field` values or the row number over the
    files in sorted order. Like the local job it holds a lock, refuses a changed job or input, stops on
    SIGINT/SIGTERM once the shards in flight are written (`JobInterrupted`), and does nothing again when finished.

    Args:
        flow_path: a calibration file from `flowcore fit`.
        out: the output folder (created).
        address: a running Ray cluster ("auto", "ray://host:10001"); None: this process's or a new local one.
        num_workers: actors (model copies); default: one per CPU (per GPU with `gpus_per_worker`).
        gpus_per_worker: GPUs per actor (0: CPU).
        restart: ignore the shards of an earlier run and start over.
        show_progress_bar: False for silence; else a bar on a terminal, progress lines elsewhere
            (`ProgressReport`); True or (None) a terminal also shows Ray's own log lines.
        **options: the job, as `flowcore.batch.core.JobSpec` takes it.

    Example:
        >>> calibrate_ray("model.flow", "vectors/", input="corpus/*.jsonl", id_field="id", num_workers=8)
    """
    from flowcore.extras import require  # Ray with Ray Data, or an error naming `pip install 'flowcore[ray]'`

    feature = "the Ray engine (--engine ray, flowcore.ray)"
    require("ray.data", feature, "ray")
    ray, out = require("ray", feature, "ray"), Path(out)
    spec = JobSpec(flow_path, actor=True, **options)
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"--num-workers must be at least 1, got {num_workers}")
    if gpus_per_worker < 0:
        raise ValueError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
    if gpus_per_worker and spec.quantize is not None:
        raise ValueError("--quantize is a CPU mode (ONNX Runtime); drop it with --gpus-per-worker")
    source = spec.source()
    if out.suffix.lower() == ".npy" or out.is_file():
        raise ValueError(f"{out}: the Ray engine writes a folder (parquet shards, rejects.jsonl, manifest.json); "
                         "give --out a folder name")
    folder, rejects_folder = out / PARTS, out / SHARD_REJECTS
    if any(out.resolve() in part.path.resolve().parents for part in source.sources):
        raise ValueError(f"the output folder {out} holds the input; choose another --out")
    if not source.single and source.reaches(_shard_path(folder, 0)):
        raise ValueError(f"the output folder {out} is where the input {source.path} finds its files, so a rerun "
                         "would read its shards as input; choose another --out")
    calibrator, encoder = spec.prepare(source)
    spec.chunk_rows = spec.chunk_rows or core.default_chunk_rows(source, calibrator.dim)  # what the actors cut
    spec.vector_column = spec.vector_column or defaults.VECTOR_COLUMN
    files = [part.identity() for part in source.sources]
    identity = job_identity(source, out, "parquet", spec.vector_column, calibrator.dim, calibrator.output_dim,
                            spec.chunk_rows, spec.normalize, spec.threads, **spec.identity(encoder))
    out.mkdir(parents=True, exist_ok=True)
    record = JobRecord(out / "job.json", JOB_FORMAT, JOB_VERSION, "Ray job file", kept=True)
    lifecycle = JobLifecycle(folder, OutputLock(out, out / "job.lock"), record, identity, spec.path, restart,
                             out / "rejects.jsonl", out / "manifest.json")
    with lifecycle as job:
        for written in (folder, rejects_folder):
            if job.earlier is None and written.exists():  # a new job, or --restart
                shutil.rmtree(written)
            written.mkdir(exist_ok=True)
        job.commit()
        shards = _plan(source, spec.chunk_rows)
        pending = [shard for shard in shards if not _shard_path(folder, shard.index).is_file()]
        if not pending:
            _clear_leftovers(folder, rejects_folder)
            if done := job.complete(True, shards=len(shards), shards_written=0):
                return done
        rows_this_run = sum(shard.rows for shard in pending)
        done = source.rows - rows_this_run
        resumed = (f"resuming {out}: {len(shards) - len(pending)} of {len(shards)} shards ({done:,} rows) are "
                   "written" if 0 < len(pending) < len(shards) else None)
        with job.report(source.rows, done, show_progress_bar, resumed) as report:
            if pending:
                _run_shards(ray, spec, files, shards, pending, out, address, num_workers, gpus_per_worker,
                            progress_wanted(show_progress_bar), job, report)
        missing = [shard.index for shard in shards if not _shard_path(folder, shard.index).is_file()]
        if missing:
            raise ShardsFailedError(f"{len(missing)} shard(s) were not written (first: {missing[0]}); rerun the same "
                                    "command to write them")
        _clear_leftovers(folder, rejects_folder)
        rejects = _join_rejects(out, rejects_folder, shards)
        described = core.manifest(
            file=PARTS, parquet=_shard_path(folder, 0), rows=source.rows, rejects=rejects,
            rejects_file="rejects.jsonl", dim=calibrator.output_dim, normalized=spec.normalize,
            vector_column=spec.vector_column, source=source, description=spec.describe(calibrator, encoder),
            threads=spec.threads, chunk_rows=spec.chunk_rows, versions={"job": JOB_VERSION})
        described["shards"] = [{"file": f"{PARTS}/{_shard_path(folder, shard.index).name}",
                                "input": files[shard.file]["path"], "input_row": shard.start.row, "rows": shard.rows,
                                "first_id_row": shard.global_row} for shard in shards]
        job.finish({**described, "resume_granularity": "one shard"})
        return job.summary(source.rows, rejects, rows_this_run, shards=len(shards), shards_written=len(pending))


def _clear_leftovers(*folders: Path) -> None:
    """Remove writes cut short by a killed worker (hidden temporaries, partial files)."""
    for written in folders:
        for leftover in [*written.glob(".*"), *written.glob("*.partial")]:
            leftover.unlink(missing_ok=True)


def _run_shards(ray, spec: JobSpec, files: list[dict], shards: list[_Shard], pending: list[_Shard], out: Path,
                address, num_workers, gpus_per_worker, verbose: bool, job: JobLifecycle,
                report: ProgressReport) -> None:
    """Write `pending` shards on an actor pool; after a stop signal the shards in flight finish (`JobInterrupted`).
    `verbose`: Ray's own log lines."""
    def stopped() -> JobInterrupted:
        written = sum(shard.rows for shard in shards if _shard_path(out / PARTS, shard.index).is_file())
        return JobInterrupted(written, job.stop.signum)

    if job.stop.requested:
        raise stopped()
    if not ray.is_initialized():
        context = ray.init(address=address, include_dashboard=False, log_to_driver=verbose,
                           logging_level=logging.INFO if verbose else logging.ERROR)
        if address is None:  # a local Ray this process started (not one it joined) ends with it, even on SIGKILL
            watch_session((getattr(context, "address_info", None) or {}).get("session_dir"))
    ray.data.DataContext.get_current().enable_progress_bars = False  # the job's own report shows the progress
    if num_workers is None:
        resources = ray.cluster_resources()
        available = resources.get("GPU", 0) if gpus_per_worker else resources.get("CPU", 1)
        num_workers = max(1, int(available // (gpus_per_worker or 1)))
    num_workers = min(num_workers, len(pending))
    dataset = ray.data.from_items([{"shard": shard.index} for shard in pending], override_num_blocks=len(pending))
    resources_per_worker = {"num_cpus": spec.threads, **({"num_gpus": gpus_per_worker} if gpus_per_worker else {})}
    writer = {"spec": spec, "files": files, "shards": shards, "out": str(out),
              "device": "cuda" if gpus_per_worker > 0 else None, "before_write": _before_shard_write}
    dataset = dataset.map_batches(_ShardWriter, fn_constructor_kwargs=writer, batch_size=1, batch_format="numpy",
                                  compute=ray.data.ActorPoolStrategy(size=num_workers), **resources_per_worker)
    if job.stop.requested:  # a signal while Ray started: no shard is begun
        raise stopped()
    done, stopping = 0, out / STOPPING
    stopping.unlink(missing_ok=True)
    logger = logging.getLogger("ray.data")  # its INFO and WARNING lines (execution plans) only when verbose
    level = logger.level
    logger.setLevel(level if verbose else logging.ERROR)
    try:
        for batch in dataset.iter_batches(batch_size=None):
            rows = int(batch["rows"].sum())
            done += rows
            report.advance(rows)
            if job.stop.requested and not stopping.exists():  # the shards in flight finish, no new one begins
                stopping.touch()
    except Exception as error:  # a worker's error reaches the driver as text inside Ray's: one line for the user
        reasons = [line.strip() for line in str(error).splitlines() if _ERROR_LINE.match(line.strip())]
        reason = reasons[-1] if reasons else f"{type(error).__name__}: {str(error).splitlines()[0]}"
        # a changed input's message says that only --restart runs the job again
        advice = "" if "InputChangedError" in reason else ": rerun the same command to finish"
        raise ShardsFailedError(f"the Ray job stopped: {reason}; the shards already written are kept{advice}") from None
    finally:
        logger.setLevel(level)
        stopping.unlink(missing_ok=True)
    if job.stop.requested and done < sum(shard.rows for shard in pending):
        raise stopped()


def _join_rejects(out: Path, folder: Path, shards: list[_Shard]) -> dict[str, int]:
    """`OUT/rejects.jsonl`: every shard's rejects (in `folder`) in row order; returns the counts by reason."""
    parts = [_shard_path(folder, shard.index, ".rejects.jsonl").read_bytes() for shard in shards]
    counts = Counter(json.loads(line)["reason"] for part in parts for line in part.splitlines())
    atomic_write(out / "rejects.jsonl", lambda stream: stream.write(b"".join(parts)))
    return dict(sorted(counts.items()))


def _batch_moments(batch: dict, column: str) -> dict:
    from flowcore.calibration.moments import Moments

    values = np.asarray(np.stack(list(batch[column])) if batch[column].dtype == object else batch[column])
    moments = Moments.of(values)
    return {"count": np.array([moments.count]), "mean": moments.mean[None], "comoment": moments.comoment[None]}


def moments(dataset, column: str = defaults.VECTOR_COLUMN):
    """The float64 `Moments` of a Ray Dataset's vector column, each block summarised where it lives and
    merged on the driver, e.g. for `Whitening.from_moments` of a distributed corpus.

    Args:
        dataset: a `ray.data.Dataset` with a (rows, d) tensor column or one array per row.
        column: the vector column.

    Example:
        >>> whitening = flowcore.Whitening.from_moments(flowcore.ray.moments(ds, "embedding"), keep=256)
    """
    from flowcore.calibration.moments import Moments, MomentsAccumulator

    accumulator = MomentsAccumulator()
    partial = dataset.map_batches(_batch_moments, fn_kwargs={"column": column}, batch_format="numpy", batch_size=65536)
    for batch in partial.iter_batches(batch_size=None, batch_format="numpy"):
        for count, mean, comoment in zip(batch["count"], batch["mean"], batch["comoment"]):
            accumulator.add_moments(Moments(int(count), np.asarray(mean), np.asarray(comoment)))
    return accumulator.total()
