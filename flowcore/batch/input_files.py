"""A job's input as one source: a file, or the files a folder holds or a glob matches (`InputFiles`).

The files are read in sorted order as one corpus: row numbers, chunk numbers and rejects count
across them, a chunk never spans two files (so both engines cut the same chunks), and a rerun
names the file that was added, removed or changed. One format per job.
"""
from __future__ import annotations

import fnmatch
import functools
import glob
import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from flowcore.batch.rows import Chunk, Position, file_changed, require_file
from flowcore.batch.text_sources import TextCorpus
from flowcore.batch.vector_sources import EmbeddingFile

__all__ = ["InputFiles", "input_files"]


def input_files(pattern: str | os.PathLike, formats: dict[str, str]) -> list[Path]:
    """The files an input names, sorted: a file, a folder (its files with a suffix in `formats`, at any
    depth) or a glob (`**` for any depth).

    Example:
        >>> input_files("corpus/", TEXT_FORMATS)
        [PosixPath('corpus/part-0.jsonl'), PosixPath('corpus/part-1.jsonl')]
    """
    path = Path(pattern)
    if path.exists() and not path.is_dir():
        require_file(path)  # a pipe or a device, named as such
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in formats)
        if not files:
            raise FileNotFoundError(f"{pattern} is a folder without {', '.join(sorted(formats))} files")
        return files
    files = sorted(Path(p) for p in glob.glob(str(pattern), recursive=True) if Path(p).is_file())
    if not files:
        raise FileNotFoundError(f"no input files match {pattern} (expected {', '.join(sorted(formats))} files)")
    return files


class InputFiles:
    """Sources (each a `TextCorpus` or an `EmbeddingFile`) read one after the other as one source,
    with the interface of each (`kind`, `rows`, `chunks`, `identity`, ...).

    Args:
        sources: the sources, in reading order, all of one format, keeping the same columns.
        path: the input as given (a file, a folder or a glob), for messages.
        single: the input named one file: identity, rejects and manifest are that file's alone.

    Example:
        >>> source = InputFiles.open("corpus/*.jsonl", lambda path: TextCorpus(path, id_field="id"), TEXT_FORMATS)
        >>> source.rows, [chunk.row_start for chunk in source.chunks(1024)][:3]
    """

    def __init__(self, sources: list[TextCorpus | EmbeddingFile], path: str | os.PathLike, single: bool):
        self.sources, self.path, self.single = list(sources), Path(path), single
        first = self.sources[0]
        formats: dict[str, Path] = {}
        for source in self.sources:
            formats.setdefault(source.format, source.path)
        if len(formats) > 1:
            (one, one_path), (other, other_path) = list(formats.items())[:2]
            raise ValueError(f"{path} holds {one} and {other} files ({one_path}, {other_path}); a job reads one "
                             "format: name one kind of file, e.g. with a glob")
        for source in self.sources[1:]:
            if source.meta_types() != first.meta_types():
                raise ValueError(f"{source.path} keeps its columns as {_types(source)}, but {first.path} as "
                                 f"{_types(first)}; the files of one job keep the same columns")
        self.kind, self.format, self.id_field = first.kind, first.format, first.id_field
        self.keep_columns = first.keep_columns

    @classmethod
    def open(cls, pattern: str | os.PathLike, open_file: Callable[[Path], TextCorpus | EmbeddingFile],
             formats: dict[str, str]) -> InputFiles:
        """The files `pattern` names (`input_files`, `formats` their suffixes), each opened by `open_file`."""
        return cls([open_file(path) for path in input_files(pattern, formats)], pattern, Path(pattern).is_file())

    @classmethod
    def of(cls, source: TextCorpus | EmbeddingFile | InputFiles) -> InputFiles:
        """`source` itself when it is an `InputFiles`, else the one file it reads."""
        return source if isinstance(source, InputFiles) else cls([source], source.path, single=True)

    @functools.cached_property
    def rows(self) -> int:
        return self.starts[-1]

    @functools.cached_property
    def starts(self) -> list[int]:
        """The row each file starts at, and the total last."""
        return [0, *itertools.accumulate(source.rows for source in self.sources)]

    def meta_types(self) -> list[tuple[str, object]]:
        return self.sources[0].meta_types()

    def expect_width(self, dim: int) -> None:
        for source in self.sources:
            source.expect_width(dim)

    def identity(self) -> dict:
        """The one file's identity, or each file's (`files`)."""
        if self.single:
            return self.sources[0].identity()
        return {"files": [source.identity() for source in self.sources]}

    def chunk_count(self, chunk_rows: int) -> int:
        """How many chunks of at most `chunk_rows` rows `chunks` yields (a chunk never spans two files)."""
        return sum(-(-source.rows // chunk_rows) for source in self.sources)

    def changed(self, identity: dict) -> str | None:
        """How the input `identity` (`identity()`) describes changed since, naming the file; None if it did not."""
        for file in identity.get("files", [identity]):
            change = file_changed(file)
            if change is not None:
                return change if self.single else f"{file['path']}: {change}"
        return None

    def reaches(self, path: Path) -> bool:
        """Whether `path` is, or would be once written, one of the input's files: the file itself, inside the
        folder, or matched by the glob."""
        path, given = path.absolute(), self.path.absolute()
        if self.single:
            return path == given
        if self.path.is_dir():
            return given in path.parents
        return _glob_matches(given.parts, path.parts)

    def chunks(self, chunk_rows: int, start: Position = Position()) -> Iterator[Chunk]:
        """Chunks of `chunk_rows` rows from `start` (a chunk boundary), a file's last chunk being shorter."""
        if self.single:
            yield from self.sources[0].chunks(chunk_rows, start)
            return
        chunks_before = 0
        for number, (source, offset) in enumerate(zip(self.sources, self.starts)):
            if number == len(self.sources) - 1 or start.row < self.starts[number + 1]:  # not wholly before `start`
                here = Position(start.row - offset, start.offset, start.line) if start.row > offset else Position()
                name = str(source.path.resolve())
                for chunk in source.chunks(chunk_rows, here):
                    yield replace(chunk, index=chunks_before + chunk.index, row_start=offset + chunk.row_start,
                                  end=replace(chunk.end, row=offset + chunk.end.row),
                                  rejects=[replace(reject, row=offset + reject.row, file=name)
                                           for reject in chunk.rejects])
            chunks_before += -(-source.rows // chunk_rows)


def _types(source) -> str:
    return ", ".join(f"{name}: {kind}" for name, kind in source.meta_types()) or "none"


def _glob_matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether `glob.glob(pattern, recursive=True)` would list the path `parts` (both split absolute paths)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], parts[skip:]) for skip in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_matches(pattern[1:], parts[1:])
