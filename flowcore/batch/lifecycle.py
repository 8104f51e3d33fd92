"""The job lifecycle both engines share (`job.py` adds its chunk loop, `ray.py` its shards and actors):
`JobLifecycle` holds the output's lock and the stop signals, reads the job's record (`JobRecord`), finds a
finished run of the same job complete, reports progress, writes the manifest and gives the summary."""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from flowcore._fs import atomic_write_json, fsync, remove_temporaries, write_error
from flowcore._progress import ProgressReport
from flowcore.batch.core import CalibrationSummary, JobMismatchError, check_identity
from flowcore.batch.interrupts import StopSignals
from flowcore.batch.lock import OutputLock, took_over

__all__ = ["RESUME_ADVICE", "JobLifecycle", "JobRecord", "job_identity", "writing"]

RESUME_ADVICE = "the progress file records only the chunks completed before it; fix this and rerun the same command"


@contextlib.contextmanager
def writing(path: Path, needed: int | None = None, advice: str = RESUME_ADVICE):
    """An OSError inside the block, writing `path` (`needed` bytes), as a one-line `OutputWriteError`."""
    try:
        yield
    except OSError as error:
        raise write_error(error, path, needed, advice) from None


def job_identity(source, out: Path, output_format: str, vector_column: str | None, dim: int, output_dim: int,
                 chunk_rows: int, normalize: bool, threads: int | None, **more) -> dict:
    """What a job's record and manifest pin, so that only the same job is continued or found complete: the
    input's files, the output, the options and `more` (the calibrator's hash, the encoder).

    Example:
        >>> job_identity(InputFiles.of(EmbeddingFile("in.npy")), Path("out.npy"), "npy", None, 8, 8, 1024, False, 1)
    """
    return {"input": source.identity(),
            "output": {"path": str(out.resolve()), "format": output_format, "vector_column": vector_column},
            "dim": dim, **({"output_dim": output_dim} if output_dim != dim else {}), "chunk_rows": chunk_rows,
            "normalize": normalize, **more, **({"threads": threads} if threads is not None else {})}


class JobRecord:
    """The JSON file (`path`, named `name` in messages) that records a job (`job`: its identity) and what it
    has done, as `format` `version`; `kept`: it stays once the job is done (the Ray engine's `job.json`)."""

    def __init__(self, path: Path, format: str, version: int, name: str, kept: bool = False):
        self.path, self.format, self.version, self.name, self.kept = Path(path), format, version, name, kept

    def read(self) -> dict | None:
        """The record, or None when there is none; an unreadable one or another version's is refused."""
        if not self.path.exists():
            return None
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or record.get("format") != self.format:
                raise ValueError(f"not a {self.format} file")
            version = record.get("version")
            if version == self.version and not isinstance(record.get("job"), dict):
                raise ValueError("no job identity")
        except (OSError, ValueError) as error:
            raise self.unreadable(error) from None
        if version != self.version:
            which = "an earlier" if isinstance(version, int) and version < self.version else "another"
            raise JobMismatchError(f"{self.path} records a run of {which} flowcore ({self.name} version {version}, "
                                   f"this one writes {self.version}), which this version cannot continue; add "
                                   "--restart to start over")
        return record

    def unreadable(self, error: Exception) -> JobMismatchError:
        return JobMismatchError(f"{self.path}: unreadable {self.name} ({error}); rerun with --restart to start over")

    def write(self, identity: dict, **state) -> None:
        atomic_write_json(self.path, {"format": self.format, "version": self.version, "job": identity, **state},
                          indent=1, sort_keys=True)


class JobLifecycle:
    """A calibration job as a `with` block holding the output's `lock` and the stop signals (`stop`). On
    entry the `record` of an earlier run is read (`earlier`; not with `restart`) and refused unless it is
    this job (`identity`; `input_name` names the input). `out`, `rejects_path` and `manifest_path` are
    what the summary names.

    Example:
        >>> with JobLifecycle(out, OutputLock(out), record, identity, "in.npy", False, rejects, manifest) as job:
        ...     ...  # the engine's work, stopping once job.stop.requested
        ...     job.finish(manifest_entries)
        ...     summary = job.summary(rows, rejects, rows_this_run=rows)
    """

    def __init__(self, out: Path, lock: OutputLock, record: JobRecord, identity: dict, input_name, restart: bool,
                 rejects_path: Path, manifest_path: Path):
        self.out, self.lock, self.record, self.identity = Path(out), lock, record, identity
        self.input_name, self.restart = input_name, restart
        self.rejects_path, self.manifest_path = Path(rejects_path), Path(manifest_path)

    def __enter__(self) -> JobLifecycle:
        self.started = time.perf_counter()
        with contextlib.ExitStack() as held:
            with writing(self.lock.path, advice="choose a writable output folder"):
                self.lock.acquire()
            held.callback(self.lock.release)
            self.stop = held.enter_context(StopSignals())
            self.earlier = None if self.restart else self.record.read()
            if self.earlier is not None:
                check_identity(self.earlier["job"], self.identity, self.record.path, self.input_name)
            self._held = held.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        self._held.close()

    def complete(self, output_present: bool, **more) -> CalibrationSummary | None:
        """The summary (with `more` of its fields) of a finished run of this very job (its output present, its
        manifest naming this job), which a rerun does not do again; None otherwise."""
        if self.restart or not output_present:
            return None
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("job") != self.identity:
            return None
        return self.summary(manifest["rows"], manifest["rejects"], 0, complete=True, **more)

    def report(self, total: int, done: int, show_progress_bar: bool | None, resumed: str | None = None,
               what: str = "calibrate") -> ProgressReport:
        """The job's `ProgressReport` (its lines begin with `what`), which first says whose lock the job took
        over and (`resumed`) where it resumes."""
        report = ProgressReport(what, total, done, show_progress_bar)
        if self.lock.took_over is not None:
            report.note(took_over(self.lock.took_over))
        if resumed is not None:
            report.note(resumed)
        return report

    def commit(self, **state) -> None:
        """Record the job and what it has done (`state`)."""
        self.record.write(self.identity, **state)

    def finish(self, manifest: dict) -> None:
        """Write the manifest with the job's identity (`job`), then drop the record unless kept."""
        with writing(self.manifest_path):
            atomic_write_json(self.manifest_path, {**manifest, "job": self.identity}, indent=1)
            remove_temporaries(self.manifest_path)
            if not self.record.kept:
                self.record.path.unlink(missing_ok=True)
                remove_temporaries(self.record.path)
            fsync(self.manifest_path.parent)

    def summary(self, rows: int, rejects: dict[str, int], rows_this_run: int, **more) -> CalibrationSummary:
        return CalibrationSummary(rows, dict(rejects), time.perf_counter() - self.started, rows_this_run,
                                  rows - rows_this_run, self.out, self.rejects_path, self.manifest_path,
                                  self.lock.took_over, **more)
