"""The durable outputs of a calibration job: `NpyOutput`, `ParquetOutput` and `RejectsLog`. Each writes
temporaries beside its target, makes every chunk durable (`sync`) before the job records it, and renames
the result into place at `finish`."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from flowcore import defaults
from flowcore._fs import atomic_write, check_replaceable, fresh_folder, fsync, open_existing, open_new
from flowcore.batch.core import JobMismatchError
from flowcore.batch.rows import CalibratedChunk, Reject

__all__ = ["JobMismatchError", "NpyOutput", "ParquetOutput", "RejectsLog"]


def _require_partial(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        raise JobMismatchError(f"{path} is missing, so the unfinished run recorded beside it cannot be "
                               "resumed; rerun with --restart to start over")


class _PartialFile:
    """An output written as `PATH.partial` (through `handle`, if open), renamed into place at `finish`."""

    def __init__(self, path: Path):
        self.path, self.partial, self.handle = path, path.with_name(path.name + ".partial"), None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def finish(self, chunks: int | None = None) -> None:
        """Close and rename the partial file into place (`chunks`: as `ParquetOutput.finish` takes it)."""
        self.close()
        if self.partial.exists():
            fsync(self.partial)
            check_replaceable(self.path)
            os.replace(self.partial, self.path)

    def discard(self) -> None:
        self.close()
        self.partial.unlink(missing_ok=True)


_NPY_HEADER_BYTES = 128  # a version 1.0 header padded to 64-byte alignment, as numpy writes it for 2-D float32


class NpyOutput(_PartialFile):
    """One float32 .npy written in place: header first, each chunk at its row's offset."""

    def __init__(self, path: Path, rows: int, dim: int):
        super().__init__(path)
        self.rows, self.dim, self._bytes = rows, dim, rows * dim * 4  # the float32 rows, after the header

    def chunk_path(self, index: int) -> Path:
        """The file a chunk's rows are written to (for error messages)."""
        return self.partial

    def bytes_needed(self) -> int:
        """The size of the whole file: header and float32 rows."""
        return _NPY_HEADER_BYTES + self._bytes

    def open(self, resume: bool) -> None:
        if resume:
            _require_partial(self.partial)
            self.handle = open_existing(self.partial)
            np.lib.format.read_magic(self.handle)
            shape, _, _ = np.lib.format.read_array_header_1_0(self.handle)
            self.data_offset = self.handle.tell()
            if shape != (self.rows, self.dim) or os.path.getsize(self.partial) != self.data_offset + self._bytes:
                raise JobMismatchError(f"{self.partial} does not match its progress file; "
                                       "rerun with --restart to start over")
            return
        self.handle = open_new(self.partial)
        np.lib.format.write_array_header_1_0(self.handle, {"descr": np.dtype(np.float32).str, "fortran_order": False,
                                                           "shape": (self.rows, self.dim)})
        self.data_offset = self.handle.tell()
        self.handle.truncate(self.data_offset + self._bytes)
        self.handle.flush()

    def write(self, chunk: CalibratedChunk) -> None:
        data = memoryview(np.ascontiguousarray(chunk.vectors, dtype=np.float32)).cast("B")
        position = self.data_offset + chunk.row_start * self.dim * 4
        while data:
            written = os.pwrite(self.handle.fileno(), data, position)
            data, position = data[written:], position + written

    def sync(self) -> None:
        os.fsync(self.handle.fileno())


class ParquetOutput(_PartialFile):
    """`id` (string ids, or the int64 row number), the vector column (`fixed_size_list<float32>[dim]`,
    null for rejected rows) and the kept columns (`meta_types`). Each chunk is a part file in
    `parts` (default `OUT.parts/`; the Ray engine's shards); `finish` joins them, a row group each.
    Written with `options`: zstd, and the vector column's floats byte-stream-split, never dictionary-encoded."""

    def __init__(self, path: Path, rows: int, dim: int, with_ids: bool, vector_column: str = defaults.VECTOR_COLUMN,
                 meta_types=(), parts: Path | None = None):
        import pyarrow as pa

        super().__init__(path)
        self.rows, self.dim, self.with_ids, self.vector_column = rows, dim, with_ids, vector_column
        self.parts = parts if parts is not None else path.with_name(path.name + ".parts")
        self.meta_types = list(meta_types)
        names = ["id", vector_column, *(name for name, _ in self.meta_types)]
        clash = sorted({name for name in names if names.count(name) > 1})
        if clash:
            raise ValueError(f"{path}: two output columns would be named {clash[0]!r} (the id column is 'id', "
                             f"the vector column {vector_column!r}); choose another --vector-column or drop it "
                             "from --keep-columns")
        self.schema = pa.schema([("id", pa.string() if with_ids else pa.int64()),
                                 (vector_column, pa.list_(pa.float32(), dim)), *self.meta_types])
        # Floats barely repeat: a dictionary of them costs more than the floats (+40 % for 384 of them), while
        # their bytes split into streams (all first bytes, all second bytes, ...) compress a little.
        self.options = {"compression": "zstd", "compression_level": 1, "use_compliant_nested_type": True,
                        "use_dictionary": [name for name in names if name != vector_column],
                        "column_encoding": {f"{vector_column}.list.element": "BYTE_STREAM_SPLIT"}}

    def chunk_path(self, index: int) -> Path:
        """The part file a chunk's rows are written to."""
        return self.parts / f"part-{index:08d}.parquet"

    def bytes_needed(self) -> None:
        """Unknown in advance (parquet compresses): None."""
        return None

    def open(self, resume: bool) -> None:
        if not resume:
            fresh_folder(self.parts)
            return
        _require_partial(self.parts)
        if self.parts.is_symlink() or not self.parts.is_dir():
            raise JobMismatchError(f"{self.parts} is not a folder flowcore made (a link or a file), so the unfinished "
                                   "run recorded beside it cannot be resumed; rerun with --restart to start over")

    def write(self, chunk: CalibratedChunk) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = len(chunk.vectors)
        rejected = np.zeros(rows, dtype=bool)
        rejected[[reject.row - chunk.row_start for reject in chunk.rejects]] = True
        ids = chunk.ids if self.with_ids else np.arange(chunk.row_start, chunk.row_start + rows, dtype=np.int64)
        vectors = np.ascontiguousarray(chunk.vectors, dtype=np.float32).reshape(-1)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors), self.dim, mask=pa.array(rejected))
        columns = [pa.array(ids, type=self.schema.field("id").type), embedding]
        for name, kind in self.meta_types:
            values = chunk.meta[name]
            columns.append(values.cast(kind) if isinstance(values, pa.Array) else pa.array(values, type=kind))
        table = pa.Table.from_arrays(columns, schema=self.schema)
        # the folder is fsynced once per chunk by `sync`
        atomic_write(self.chunk_path(chunk.index), lambda stream: pq.write_table(table, stream, **self.options),
                     sync_dir=False)

    def sync(self) -> None:
        fsync(self.parts)

    def finish(self, chunks: int) -> None:
        import pyarrow.parquet as pq

        if not self.parts.exists():
            return  # joined and renamed by an earlier run that stopped before cleaning up
        # written as OUT.partial (not a hidden temporary) so that `discard` finds it after a kill
        with open_new(self.partial, "wb") as handle, pq.ParquetWriter(handle, self.schema, **self.options) as writer:
            for index in range(chunks):
                writer.write_table(pq.read_table(self.chunk_path(index)), row_group_size=max(1, self.rows))
        super().finish()

    def discard(self) -> None:
        if self.parts.is_symlink():
            self.parts.unlink()
        shutil.rmtree(self.parts, ignore_errors=True)
        super().discard()


class RejectsLog(_PartialFile):
    """`OUT.rejects.jsonl`, appended chunk by chunk to a partial file truncated on resume."""

    def open(self, resume_bytes: int | None) -> None:
        if resume_bytes is not None:
            _require_partial(self.partial)
            self.handle = open_existing(self.partial)
            self.handle.truncate(resume_bytes)
            self.handle.seek(resume_bytes)
        else:
            self.handle = open_new(self.partial, "wb")

    def append(self, rejects: list[Reject]) -> int:
        """Write `rejects` durably; returns the file's length after them (where a resume cuts it)."""
        for reject in rejects:
            self.handle.write(json.dumps(reject.to_json(), ensure_ascii=False).encode("utf-8") + b"\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return self.handle.tell()
