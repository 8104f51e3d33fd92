"""Stored embeddings as chunked, resumable sources (`EmbeddingFile`: a 2-D .npy or a parquet vector column), and
the one .npy reader (`NpyMatrix`, also behind `flowcore fit --embeddings`).

A .npy file is never loaded whole: it is read through a read-only memory map whose pages are released once copied.
"""
from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from tokenize import TokenError
from typing import Iterator, Sequence

import numpy as np

from flowcore import defaults
from flowcore.batch import rows
from flowcore.batch.rows import Chunk, Position

__all__ = ["EMBEDDING_FORMATS", "EmbeddingFile", "NpyMatrix"]

EMBEDDING_FORMATS = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet"}


class NpyMatrix:
    """A 2-D numeric .npy file, checked on construction (errors name the file) and read through a
    read-only memory map: `rows`, `dim`, `dtype` and `fortran_order` come from the header."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        rows.require_file(self.path)
        with open(self.path, "rb") as handle:
            try:
                version = np.lib.format.read_magic(handle)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ValueError(f"unsupported .npy version {version}")
                shape, self.fortran_order, self.dtype = read_header(handle)
            except (ValueError, SyntaxError, TokenError) as error:  # numpy parses the header as Python literals
                detail = rows.one_line(error)
                if not isinstance(error, ValueError):
                    detail = f"a damaged header: {type(error).__name__}: {detail}"
                raise ValueError(f"{self.path}: not a readable .npy file ({detail})") from None
            self.header_bytes = handle.tell()
        if any(size < 0 for size in shape):
            raise ValueError(f"{self.path}: not a readable .npy file (its header gives the negative shape {shape})")
        if len(shape) != 2:
            raise ValueError(f"{self.path}: expected a 2-D (rows, dim) array, got shape {shape}")
        if self.dtype.kind not in "iuf":
            raise ValueError(f"{self.path}: expected a numeric array, got dtype {self.dtype}")
        self.rows, self.dim = shape
        expected = self.header_bytes + self.rows * self.dim * self.dtype.itemsize
        size = os.path.getsize(self.path)
        if size < expected:
            raise ValueError(f"{self.path}: truncated .npy file ({size} bytes, header says {expected})")
        if size > expected:  # rows the header does not count would be silently dropped
            raise ValueError(f"{self.path}: {size - expected} bytes after the "
                             f"{self.rows} x {self.dim} rows its header describes (a damaged or appended file)")

    def check_streamable(self) -> None:
        """ValueError unless consecutive rows are consecutive bytes (not column-major order)."""
        if self.fortran_order and self.rows > 1 and self.dim > 1:
            raise ValueError(f"{self.path}: stored in Fortran (column-major) order; save it with "
                             "np.save(path, np.ascontiguousarray(x)) so rows can be streamed")

    def check_embeddings(self) -> None:
        """ValueError unless the file holds embeddings as every command reads them: floating-point rows,
        stored row by row, at least one value wide."""
        if self.dtype.kind != "f":
            raise ValueError(f"{self.path}: expected floating-point embeddings, got dtype {self.dtype}")
        if self.dim < 1:
            raise ValueError(f"{self.path}: its rows hold no values (shape {self.rows} x {self.dim})")
        self.check_streamable()

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[tuple[np.ndarray, mmap.mmap]]:
        """The whole matrix as an array over a read-only map of the file (valid inside the block)."""
        with open(self.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            matrix = np.ndarray((self.rows, self.dim), self.dtype, mapped, self.header_bytes,
                                order="F" if self.fortran_order else "C")
            try:
                yield matrix, mapped
            finally:
                del matrix  # the map cannot close while an array still points into it

    def read(self, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """The chosen rows as a copy in the file's dtype, or (`rows=None`) all as a read-only memory map."""
        if rows is None:
            return np.memmap(self.path, self.dtype, mode="r", offset=self.header_bytes, shape=(self.rows, self.dim),
                             order="F" if self.fortran_order else "C")
        with self._mapped() as (matrix, _):
            return np.array(matrix[np.asarray(rows, dtype=np.intp)])

    def blocks(self, block_rows: int, start_row: int = 0, dtype=np.float32) -> Iterator[tuple[int, np.ndarray]]:
        """(row_start, `dtype` copy of rows [row_start, row_start + block_rows)) from `start_row` on (None: in
        the file's dtype), dropping the pages copied so that resident memory stays flat (`check_streamable`)."""
        self.check_streamable()
        row_bytes = self.dim * self.dtype.itemsize
        with self._mapped() as (matrix, mapped):
            for row_start in range(start_row, self.rows, block_rows):
                row_end = min(row_start + block_rows, self.rows)
                with np.errstate(over="ignore"):  # values beyond float32 become Inf
                    block = np.array(matrix[row_start:row_end], dtype=dtype)
                _release(mapped, self.header_bytes + row_start * row_bytes, (row_end - row_start) * row_bytes)
                yield row_start, block


class EmbeddingFile:
    """Precomputed embeddings: a 2-D floating-point .npy or a parquet file with a list-of-numbers
    column `vector_field` (and optionally `id_field` and `keep_columns`, passed through to the
    output). Rows with NaN/Inf, no vector or another width than the file's are rejected (NaN rows)."""

    kind = "embeddings"

    def __init__(self, path: str | os.PathLike, vector_field: str = defaults.VECTOR_COLUMN, id_field: str | None = None,
                 keep_columns=()):
        self.dim: int | None
        self.path = Path(path)
        rows.require_file(self.path)
        self.format = rows.detect_format(self.path, EMBEDDING_FORMATS)
        self.vector_field = vector_field
        self.id_field = id_field
        self.keep_columns: tuple[str, ...] = ()
        if self.format == "npy":
            if id_field is not None:
                raise ValueError(f"{self.path}: a .npy file has no id column; ids are row numbers")
            if keep_columns:
                raise ValueError(f"{self.path}: a .npy file has no columns to keep; --keep-columns needs parquet")
            self._npy = NpyMatrix(self.path)
            self._npy.check_embeddings()
            self.rows, self.dim = self._npy.rows, self._npy.dim
        else:
            self._schema = rows.parquet_schema(self.path, vector=vector_field, id=id_field)
            self.rows, self.dim = self._parquet_layout()
            self.keep_columns = rows.check_keep_columns(self.path, keep_columns, self._schema.names)

    def meta_types(self) -> list[tuple[str, object]]:
        """(name, pyarrow type) of each kept column, as stored."""
        return [(name, self._schema.field(name).type) for name in self.keep_columns]

    def _parquet_layout(self) -> tuple[int, int]:
        import pyarrow as pa

        parquet = rows.open_parquet(self.path)
        column_type = self._schema.field(self.vector_field).type
        is_list = any(check(column_type) for check in (pa.types.is_fixed_size_list, pa.types.is_list,
                                                          pa.types.is_large_list))
        value_type = column_type.value_type if is_list else None
        if not is_list or not (pa.types.is_floating(value_type) or pa.types.is_integer(value_type)):
            raise ValueError(f"{self.path}: column {self.vector_field!r} holds {column_type}, not vectors "
                             "(lists of numbers)")
        if pa.types.is_fixed_size_list(column_type):
            return parquet.metadata.num_rows, column_type.list_size
        # Variable-length lists: the width is the most common length among the first rows.
        for batch in parquet.iter_batches(batch_size=1024, columns=[self.vector_field]):
            lengths = batch.column(0).value_lengths().drop_null().to_numpy()
            if len(lengths):
                values, counts = np.unique(lengths, return_counts=True)
                return parquet.metadata.num_rows, int(values[np.argmax(counts)])
        return parquet.metadata.num_rows, None  # no vector to tell (no rows, or only nulls): `expect_width`

    def expect_width(self, dim: int) -> None:
        """Read vectors `dim` wide: a ValueError when the file's are another width; a file whose width no
        vector tells (no rows, only nulls) takes `dim`, its null rows being rejected as such."""
        if self.dim is None:
            self.dim = dim
        elif self.dim != dim:
            raise ValueError(f"{self.path} holds {self.dim}-wide vectors but the calibrator expects {dim}")

    def identity(self) -> dict:
        """What identifies this source in a job's manifest: the file and how it is read."""
        return {**rows.file_identity(self.path), "format": self.format, "vector_field": self.vector_field,
                "id_field": self.id_field, "keep_columns": list(self.keep_columns)}

    def chunks(self, chunk_rows: int, start: Position = Position()) -> Iterator[Chunk]:
        """Chunks of `chunk_rows` rows (the last may be shorter) from `start`, a chunk boundary."""
        if self.format == "parquet":
            yield from self._parquet_chunks(chunk_rows, start.row)
            return
        for row_start, block in self._npy.blocks(chunk_rows, start.row, dtype=None):
            vectors, beyond = rows.to_float32(block)
            rejects = rows.vector_rejects(vectors, np.full(len(vectors), self.dim), row_start, beyond)
            yield Chunk(row_start // chunk_rows, row_start, len(vectors), Position(row_start + len(vectors)),
                        rejects, vectors=vectors)

    def _parquet_chunks(self, chunk_rows: int, start_row: int) -> Iterator[Chunk]:
        import pyarrow as pa

        pending, row_start = [], start_row  # record batches re-cut into chunks
        for batch in rows.parquet_batches(self.path, [self.vector_field, self.id_field, *self.keep_columns], start_row):
            pending.append(batch)
            while sum(part.num_rows for part in pending) >= chunk_rows:
                table = pa.Table.from_batches(pending)
                yield self._parquet_chunk(table.slice(0, chunk_rows), row_start // chunk_rows, row_start)
                pending, row_start = table.slice(chunk_rows).to_batches(), row_start + chunk_rows
        if any(part.num_rows for part in pending):
            yield self._parquet_chunk(pa.Table.from_batches(pending), row_start // chunk_rows, row_start)

    def _parquet_chunk(self, table, index: int, row_start: int) -> Chunk:
        import pyarrow as pa
        import pyarrow.compute as pc

        column = table.column(self.vector_field).combine_chunks()
        vectors = np.full((len(column), self.dim), np.nan, dtype=np.float32)
        beyond = np.zeros(len(column), dtype=bool)
        lengths = pc.list_value_length(column).fill_null(rows.NULL).to_numpy(zero_copy_only=False)
        fits = lengths == self.dim
        if fits.any():
            values = column.filter(pa.array(fits)).flatten().to_numpy(zero_copy_only=False)
            vectors[fits], beyond[fits] = rows.to_float32(np.asarray(values).reshape(-1, self.dim))
        rejects = rows.vector_rejects(vectors, lengths, row_start, beyond)
        ids = None
        if self.id_field:
            ids, rejected = [], {reject.row for reject in rejects}
            for offset, value in enumerate(table.column(self.id_field).to_pylist()):
                record_id, problem = rows.id_reject(row_start + offset, None, value, self.id_field)
                ids.append(record_id)
                if problem is not None and problem.row not in rejected:
                    vectors[offset] = np.nan
                    rejects.append(problem)
            rejects.sort(key=lambda reject: reject.row)
        meta = {name: table.column(name).combine_chunks() for name in self.keep_columns} or None
        return Chunk(index, row_start, table.num_rows, Position(row_start + table.num_rows), rejects, ids,
                     vectors=vectors, meta=meta)


def _release(mapped: mmap.mmap, start: int, length: int) -> None:
    """Drop already-copied pages of a read-only map from this process (they stay in the page cache)."""
    page_start = start - start % mmap.PAGESIZE
    length += start - page_start
    if length > 0 and hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_DONTNEED, page_start, min(length, len(mapped) - page_start))
