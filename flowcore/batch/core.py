"""The calibration core both batch engines run, so that they refuse, reject and write alike:
`JobSpec`, `calibrate_chunk`, `check_identity`, `CalibrationSummary` and `manifest` (its keys
are in docs/batch.md)."""
from __future__ import annotations

import os
from dataclasses import InitVar, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from flowcore import defaults
from flowcore._vectors import unit_rows
from flowcore.batch import rows
from flowcore.batch.input_files import InputFiles
from flowcore.batch.lock import took_over
from flowcore.batch.text_sources import TEXT_FORMATS, TextCorpus
from flowcore.batch.vector_sources import EMBEDDING_FORMATS, EmbeddingFile
from flowcore.runtime import check_threads, job_threads

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "CalibrationSummary", "InputChangedError", "JobMismatchError",
           "JobSpec", "arrow_type_name", "calibrate_chunk", "calibrated", "check_compatible", "check_identity",
           "chunk_of_values", "default_chunk_rows", "encode_with", "load_encoder", "manifest"]

MANIFEST_FORMAT = "flowcore-vectors-manifest"
MANIFEST_VERSION = 1


class JobMismatchError(ValueError):
    """A job's record (progress file, Ray job file) or its partial output does not match the job requested."""


class InputChangedError(JobMismatchError):
    """The input changed while a job read it (appended, truncated, replaced, rewritten)."""

    @classmethod
    def while_read(cls, path, change: str) -> InputChangedError:
        return cls(f"{path} changed while the job read it ({change}); the output so far is kept as it was, "
                   "and a rerun is refused: add --restart to start over")


def default_chunk_rows(source: TextCorpus | EmbeddingFile, dim: int) -> int:
    """Text: `defaults.TEXT_CHUNK_ROWS`; embeddings: a power of two of rows within `defaults.EMBEDDING_CHUNK_BYTES`."""
    if source.kind == "text":
        return defaults.TEXT_CHUNK_ROWS
    fit = max(1, defaults.EMBEDDING_CHUNK_BYTES // (4 * dim))
    return 1 << (fit.bit_length() - 1)


def calibrated(transform: Callable[[np.ndarray], np.ndarray], vectors: np.ndarray) -> np.ndarray:
    """`transform(vectors)`, or on a `NonFiniteOutputError` its output (the core rejects its NaN/Inf rows)."""
    from flowcore.validation import NonFiniteOutputError

    try:
        return transform(vectors)
    except NonFiniteOutputError as error:
        return error.output


def encode_with(encoder, batch_size: int) -> Callable[[list[str]], np.ndarray] | None:
    """The `encode` function of `calibrate_chunk` for an `Encoder` (None for None)."""
    if encoder is None:
        return None
    return lambda texts: encoder.encode(texts, batch_size=batch_size, show_progress_bar=False)


def load_encoder(calibrator, model: str | None = None, pooling: str | None = None, quantize: str | None = None,
                 threads: int | None = None, device=None):
    """The `Encoder` for a calibration's text: its recorded model and pooling unless others are asked for."""
    from flowcore.text.encoder import Encoder

    recorded = calibrator.provenance
    if recorded is None and model is None:
        raise ValueError("the calibrator records no encoder: it was fitted on vectors that did not come from a "
                         "flowcore Encoder (stored or foreign vectors); pass --model and --pooling for the encoder "
                         "that produced them")
    requested = model or recorded.model
    pooling = pooling or (recorded.pooling if recorded is not None else None)
    encoder = Encoder(model=requested, threads=threads, device=device, quantize=quantize,
                      **({"pooling": pooling} if pooling else {}))
    calibrator.check_encoder(encoder, requested)
    return encoder


@dataclass
class JobSpec:
    """One calibration job, as both engines run it; contradictions are refused on construction.

    Args:
        flow: a calibration file (`flowcore fit`).
        input / embeddings: exactly one: a txt/jsonl/csv/parquet corpus, or .npy/parquet vectors: a file,
            a folder or a glob of them (read as one input, `InputFiles`).
        text_field, id_field, vector_field: the columns of the text, the id (default: row number), the vector.
        model, pooling, quantize, batch_size: the text encoder (default: the calibration's record).
        chunk_rows: rows per chunk, the resume granularity (default: `default_chunk_rows`).
        threads: torch CPU threads (default: `flowcore.runtime.job_threads`; `actor`: per Ray actor).
        keep_columns, vector_column: input columns copied to parquet output; its vector column.
        normalize: scale calibrated rows to unit length.
        device: torch device for the encoder and the calibration (default: CPU).

    Example:
        >>> spec = JobSpec("model.flow", input="corpus.jsonl", id_field="id", quantize="int8")
    """

    flow: str | os.PathLike
    input: str | os.PathLike | None = None
    embeddings: str | os.PathLike | None = None
    text_field: str = defaults.TEXT_FIELD
    id_field: str | None = None
    vector_field: str = defaults.VECTOR_COLUMN
    model: str | None = None
    pooling: str | None = None
    quantize: str | None = None
    batch_size: int = defaults.BATCH_SIZE
    chunk_rows: int | None = None
    threads: int | None = None
    keep_columns: tuple = ()
    vector_column: str | None = None
    normalize: bool = False
    device: str | None = None
    actor: InitVar[bool] = False

    def __post_init__(self, actor: bool) -> None:
        from flowcore._fs import file_sha256
        from flowcore.calibration.file import read_calibrator_file

        if (self.input is None) == (self.embeddings is None):
            raise ValueError("give exactly one of a text corpus (input) or stored embeddings (embeddings)")
        self.kind = "text" if self.input is not None else "embeddings"
        self.path = str(self.input if self.kind == "text" else self.embeddings)  # a file, a folder or a glob
        if self.kind == "embeddings" and (self.model or self.pooling or self.quantize):
            raise ValueError("--model/--pooling/--quantize apply to text input, not to stored embeddings")
        if self.chunk_rows is not None and self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {self.chunk_rows}")
        if self.vector_column is not None and (not isinstance(self.vector_column, str) or not self.vector_column):
            raise ValueError(f"the vector column needs a non-empty name, got {self.vector_column!r}")
        self.threads = check_threads(self.threads) or job_threads(self.kind == "text", actor)
        if not isinstance(self.keep_columns, str):  # a string is refused by the source, naming it
            self.keep_columns = tuple(self.keep_columns or ())
        if not os.path.isfile(self.flow):  # missing, a folder or a pipe: the loader's one-line error
            read_calibrator_file(self.flow)
        self.flow_sha256 = file_sha256(self.flow)
        self.flow = Path(self.flow).resolve()

    def open(self, path: str | os.PathLike) -> TextCorpus | EmbeddingFile:
        """One input file as a source, read the way the spec says."""
        if self.kind == "text":
            return TextCorpus(path, text_field=self.text_field, id_field=self.id_field, keep_columns=self.keep_columns)
        return EmbeddingFile(path, vector_field=self.vector_field, id_field=self.id_field,
                             keep_columns=self.keep_columns)

    def source(self) -> InputFiles:
        """The input (a file, a folder or a glob) as one source, each file read the way the spec says."""
        return InputFiles.open(self.path, self.open, TEXT_FORMATS if self.kind == "text" else EMBEDDING_FORMATS)

    def prepare(self, source: InputFiles, encoder=None) -> tuple:
        """(calibrator, encoder) for `source`, checked to fit it (`check_compatible`); `encoder`: (text) an
        `Encoder` to use instead of the one the spec names."""
        if encoder is not None and (self.kind == "embeddings" or self.model or self.pooling or self.quantize):
            raise ValueError("an encoder is for text input, instead of model/pooling/quantize")
        from flowcore.calibration.base import load

        calibrator = load(self.flow, device=self.device)
        if self.kind == "text" and encoder is None:  # checked as it is loaded
            encoder = load_encoder(calibrator, self.model, self.pooling, self.quantize, self.threads, self.device)
        else:
            check_compatible(calibrator, source, encoder)
        return calibrator, encoder

    def identity(self, encoder) -> dict:
        """What a job's record pins besides its input and output: the calibration's hash, the device, the encoder."""
        identity: dict = {"flow_sha256": self.flow_sha256}
        if self.device not in (None, "cpu"):  # another device's floats must never continue a CPU run
            identity["device"] = self.device
        if encoder is not None:
            identity["encoder"] = {"model": encoder.model_id, "pooling": encoder.pooling, "batch_size": self.batch_size}
            if getattr(encoder, "quantize", None) is not None:
                identity["encoder"]["quantize"] = encoder.quantize
        return identity

    def describe(self, calibrator, encoder) -> dict:
        """The manifest entries the spec knows: the encoder (None for stored embeddings), the calibration."""
        from safetensors import safe_open

        with safe_open(str(self.flow), framework="pt") as reader:
            file_version = (reader.metadata() or {}).get("format_version")
        described = None
        if encoder is not None:
            describe = getattr(encoder, "describe", None)
            described = describe() if describe is not None else {"model": encoder.model_id, "pooling": encoder.pooling}
            described["batch_size"] = self.batch_size
        recorded, settings = calibrator.provenance, calibrator.settings()
        return {
            "encoder": described,
            "calibration": {"method": calibrator.name, "path": str(self.flow), "sha256": self.flow_sha256,
                            "settings": settings, "config": settings.get("config"),
                            "fitted_for": recorded.to_json() if recorded else None},
            "format_versions": {"flow_file": file_version},
        }


def check_compatible(calibrator, source: TextCorpus | EmbeddingFile | InputFiles, encoder=None) -> None:
    """Refuse inputs the calibration was not fitted for: embeddings of another width, or text through
    another encoder or pooling than its record."""
    if source.kind == "embeddings":
        source.expect_width(calibrator.dim)
        return
    if encoder is None:
        raise ValueError(f"{source.path} is text: an encoder is needed to embed it")
    calibrator.check_encoder(encoder)


def calibrate_chunk(chunk: rows.Chunk, transform: Callable[[np.ndarray], np.ndarray], dim: int,
                    encode: Callable[[list[str]], np.ndarray] | None = None,
                    output_dim: int | None = None, normalize: bool = False) -> rows.CalibratedChunk:
    """The one path every row takes, in both engines: a text chunk's good texts are encoded
    (`dim`-wide), the good rows calibrated (`output_dim`-wide, default `dim`) and, with `normalize`,
    scaled to unit length; a row the encoder or `transform` turns to NaN/Inf, or (`normalize`) to the
    zero vector, is rejected. Rejected rows are NaN; rejects come back in row order, with their ids."""
    rejects = list(chunk.rejects)
    good = np.ones(chunk.rows, dtype=bool)
    good[[reject.row - chunk.row_start for reject in rejects]] = False
    if chunk.texts is not None:
        if encode is None:
            raise ValueError("a text corpus needs an encoder")
        vectors = np.full((chunk.rows, dim), np.nan, dtype=np.float32)
        if good.any():
            vectors[good] = encode([text for text, keep in zip(chunk.texts, good) if keep])
            rejects += rows.reject_non_finite(vectors, chunk.row_start, good, "the encoder returned NaN/Inf")
    else:
        vectors = chunk.vectors
    if good.all():
        out = np.array(calibrated(transform, vectors), dtype=np.float32)
    else:
        out = np.full((chunk.rows, output_dim or dim), np.nan, dtype=np.float32)
        if good.any():
            out[good] = calibrated(transform, vectors[good])
    rejects += [rows.Reject(reject.row, reject.reason, f"calibrated, it holds {reject.detail}")
                for reject in rows.reject_non_finite(out, chunk.row_start, good, reason=rows.NON_FINITE_OUTPUT)]
    if normalize:  # a zero row has no direction to scale to: rejected, made NaN and cleared in `good`
        zero = good & ~out.any(axis=1)
        out[zero] = np.nan
        good &= ~zero
        out[good] = unit_rows(out[good])
        rejects += [rows.Reject(chunk.row_start + int(offset), rows.ZERO_VECTOR, "calibrated, it is the zero vector, "
                                "which has no direction to scale to unit length") for offset in np.flatnonzero(zero)]
    if chunk.ids is not None:
        rejects = [reject if reject.id is not None else replace(reject, id=chunk.ids[reject.row - chunk.row_start])
                   for reject in rejects]
    return rows.CalibratedChunk(chunk.index, chunk.row_start, out, chunk.ids,
                                sorted(rejects, key=lambda reject: reject.row), chunk.end, chunk.meta)


def chunk_of_values(values, column: str, dim: int | None = None) -> rows.Chunk:
    """A column of a Ray batch as a chunk, checked by the readers' rules: texts when `dim` is None
    (`text_reject`), else `dim`-wide vectors (`vector_rejects`). A NaN value is a null (Ray's
    pandas conversions write None so)."""
    count = len(values)
    if dim is None:
        texts = [None if _nan(text) else text for text in values]
        rejects = [reject for row, text in enumerate(texts) if (reject := rows.text_reject(row, None, text, column))]
        for reject in rejects:
            texts[reject.row] = None
        return rows.Chunk(0, 0, count, rows.Position(count), rejects, texts=texts)
    vectors = np.full((count, dim), np.nan, dtype=np.float32)
    beyond = np.zeros(count, dtype=bool)
    if isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype.kind in "iuf":  # a tensor column
        lengths = np.full(count, values.shape[1])
        if values.shape[1] == dim:
            vectors[:], beyond[:] = rows.to_float32(values)
    else:
        lengths = np.empty(count, dtype=np.int64)
        for row, value in enumerate(values):
            numbers = _numbers(value)
            lengths[row] = numbers if isinstance(numbers, int) else len(numbers)
            if lengths[row] == dim:
                vectors[row], beyond[row] = (part[0] for part in rows.to_float32(numbers[None]))
    return rows.Chunk(0, 0, count, rows.Position(count), rows.vector_rejects(vectors, lengths, 0, beyond),
                      vectors=vectors)


def _numbers(value) -> np.ndarray | int:
    """A vector value as a 1-D float array (a null element as NaN), or `NULL` for None and
    `NOT_NUMBERS` for anything that is not a flat list of numbers."""
    if value is None or _nan(value):
        return rows.NULL
    if isinstance(value, (str, bytes)):
        return rows.NOT_NUMBERS
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # ragged
        return rows.NOT_NUMBERS
    if array.ndim != 1:
        return rows.NOT_NUMBERS
    if array.dtype.kind == "O":
        if not all(item is None or (isinstance(item, (int, float, np.integer, np.floating))
                                    and not isinstance(item, (bool, np.bool_))) for item in array):
            return rows.NOT_NUMBERS
        return np.array([np.nan if item is None else item for item in array], dtype=np.float64)
    return array if array.dtype.kind in "iuf" else rows.NOT_NUMBERS


def _nan(value) -> bool:
    return isinstance(value, (float, np.floating)) and value != value


def check_identity(recorded: dict, requested: dict, record: Path, input_name) -> None:
    """Refuse a job's record (`record`) that describes another job than the one requested, listing the
    differences: `InputChangedError` (naming `input_name`) when only its input differs, else `JobMismatchError`."""
    if recorded == requested:
        return
    changed = _differences(recorded, requested)
    if all(change.startswith("input") for change in changed):
        raise InputChangedError(f"{input_name} changed since the unfinished run that {record} records "
                                f"({'; '.join(changed)}): the rows done so far came from its old content; "
                                "restore it, or add --restart to start over")
    threads = recorded.get("threads")
    hint = f" (with --threads {threads})" if any(change.startswith("threads was") for change in changed) else ""
    raise JobMismatchError(f"{record} records an unfinished run of a different job ({'; '.join(changed)}); "
                           f"rerun the original command{hint} to finish it, or add --restart to start over")


def _differences(old, new, path: str = "") -> list[str]:
    if _files(old) and _files(new):  # input files: named by their paths (one added, removed or changed)
        old_files, new_files = ({file["path"]: file for file in files} for files in (old, new))
        return ([f"{path}: {name} was added" for name in new_files if name not in old_files]
                + [f"{path}: {name} was removed" for name in old_files if name not in new_files]
                + [change for name in old_files if name in new_files
                   for change in _differences(old_files[name], new_files[name], f"{path}[{name}]")])
    if isinstance(old, dict) and isinstance(new, dict):
        return [change for key in sorted(set(old) | set(new))
                for change in _differences(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [change for index, (a, b) in enumerate(zip(old, new))
                for change in _differences(a, b, f"{path}[{index}]")]
    return [] if old == new else [f"{path} was {old!r}, now {new!r}"]


def _files(value) -> bool:
    """Whether `value` lists input files' identities (each a dict with a path)."""
    return isinstance(value, list) and all(isinstance(item, dict) and "path" in item for item in value)


@dataclass
class CalibrationSummary:
    """What a finished job did: all rows and rejects, what this run added, and (Ray) its shards;
    `complete`: an earlier run had finished this very job, so this one did nothing."""

    rows: int
    rejects: dict[str, int]
    seconds: float
    rows_this_run: int
    resumed_from: int
    out: Path
    rejects_path: Path
    manifest_path: Path | None = None
    lock_taken_over: dict | None = None
    """The holder record of a killed job whose lock file this run took over, if any."""
    shards: int | None = None
    shards_written: int | None = None
    complete: bool = False

    @property
    def rejected(self) -> int:
        return sum(self.rejects.values())

    @property
    def rows_per_second(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else float("inf")

    def __str__(self) -> str:
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(self.rejects.items()))
        rejected = f"{self.rejected:,} rejected" + (f" ({reasons})" if reasons else "")
        run = f"{self.rows_this_run:,} rows in {self.seconds:.1f} s ({self.rows_per_second:,.0f} rows/s)"
        if self.complete:
            head = (f"already complete: an earlier run of this same job calibrated its {self.rows:,} rows "
                    f"({self.rows - self.rejected:,} ok, {rejected}); nothing to do (add --restart to calibrate "
                    "them again)")
        else:
            if self.shards is not None:
                run = f"{self.shards_written} of {self.shards} shards written by this run ({run})"
            elif self.resumed_from:
                rejected += f", resumed at row {self.resumed_from:,}"
            head = f"calibrated {self.rows:,} rows: {self.rows - self.rejected:,} ok, {rejected}; {run}"
        return (f"{head}\noutput: {self.out}\nrejects: {self.rejects_path}"
                + (f"\nmanifest: {self.manifest_path}" if self.manifest_path else "")
                + (f"\n{took_over(self.lock_taken_over)}" if self.lock_taken_over else ""))


def manifest(*, file: str, parquet: Path | None, rows: int, rejects: dict[str, int], rejects_file: str, dim: int,
             normalized: bool, vector_column: str | None, source: InputFiles, description: dict, threads: int | None,
             chunk_rows: int, versions: dict) -> dict:
    """A finished output's manifest. `parquet`: a part of parquet output, whose schema gives the
    columns (None: .npy output); `source`: the input; `versions`: the engine's record formats;
    `description`: `JobSpec.describe`'s."""
    import flowcore

    rejected, id_field = sum(rejects.values()), source.id_field
    if parquet is not None:
        import pyarrow.parquet as pq

        columns = [{"name": column.name, "type": arrow_type_name(column.type)} for column in pq.read_schema(parquet)]
        file_version = {"parquet": pq.ParquetFile(parquet).metadata.format_version}
    else:
        columns, file_version = None, {"npy": "1.0"}
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "flowcore_version": flowcore.__version__,
        "file": file, "file_format": "npy" if parquet is None else "parquet",
        "rows": rows, "ok": rows - rejected, "rejected": rejected, "rejects": dict(sorted(rejects.items())),
        "rejects_file": rejects_file,
        "dim": dim, "dtype": "float32", "normalized": normalized,
        "rejected_rows": "NaN row" if parquet is None else "null vector",
        "id_column": None if parquet is None else "id",
        "id_type": None if parquet is None else "string" if id_field is not None else "int64",
        "id_source": id_field if id_field is not None else
        "row number" if source.single else "row number (files in sorted order)",
        "vector_column": vector_column, "columns": columns, "kept_columns": list(source.keep_columns),
        "input": {"kind": source.kind, **source.identity()},
        **{key: value for key, value in description.items() if key != "format_versions"},
        "threads": threads, "chunk_rows": chunk_rows,
        "format_versions": {"manifest": MANIFEST_VERSION, **versions, **description.get("format_versions", {}),
                            **file_version},
    }


def arrow_type_name(kind) -> str:
    """A pyarrow type as the manifest names it: floats by width, lists without their child field's
    name (which parquet readers rename), e.g. `fixed_size_list<float32>[384]`."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(kind):
        return f"fixed_size_list<{arrow_type_name(kind.value_type)}>[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"{'large_' if pa.types.is_large_list(kind) else ''}list<{arrow_type_name(kind.value_type)}>"
    return {"halffloat": "float16", "float": "float32", "double": "float64"}.get(str(kind), str(kind))
