"""Calibrator files, every calibrator's one file format: safetensors (never pickle) with JSON metadata and a
SHA-256 of the tensors and the header's info. `read_calibrator_file` checks the header before safetensors
reads any data, then the checksum and that the weights are finite: nothing here can run code from the file.
(The `.flow` suffix and the "flowcore-flow" format tag are the format's names for every method.)"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from flowcore._fs import atomic_write
from flowcore._json import JSONProblem, parse_json
from flowcore._lines import require_file

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_HEADER_BYTES", "READ_VERSIONS", "CalibratorFileError", "EncoderProvenance",
           "check_layout", "read_calibrator_file", "write_calibrator_file"]

FORMAT = "flowcore-flow"
FORMAT_VERSION = 4
"""Version 4: the checksum covers the header's info (kind, settings, encoder, shape) as well as the tensors."""
READ_VERSIONS = ("3", "4")
"""Versions this flowcore reads; a version 3 file's info is outside its checksum, and is checked against its
tensors by each calibrator's loader."""
MAX_HEADER_BYTES = 16 << 20
"""The largest safetensors JSON header accepted; flowcore's own are a few kB."""
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_PICKLE_MAGIC = {b"\x80": "a Python pickle", b"PK\x03\x04": "a zip archive (torch.save writes these)"}


@dataclass(frozen=True)
class EncoderProvenance:
    """The encoder (`model`) and canonical pooling name that produced the vectors a flow was fitted on."""

    model: str
    pooling: str

    @classmethod
    def of(cls, encoder) -> "EncoderProvenance":
        """The provenance of an `Encoder` (anything with `model_id` and `pooling`)."""
        return cls(str(encoder.model_id), str(encoder.pooling))

    def to_json(self) -> dict:
        return asdict(self)


class CalibratorFileError(ValueError):
    """A calibrator file that is missing, truncated, corrupted or does not match what it claims."""


def _digest(tensors: dict[str, torch.Tensor], info: dict | None) -> str:
    """SHA-256 of the tensors (names, dtypes, bytes) and, unless None, of the info's canonical JSON."""
    sha = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):  # CPU and contiguous: as saved, or as safetensors reads them
        sha.update(name.encode())
        sha.update(str(tensor.dtype).encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    if info is not None:
        sha.update(b"\0info\0" + json.dumps(info, sort_keys=True, separators=(",", ":")).encode())
    return sha.hexdigest()


def write_calibrator_file(path, tensors: dict[str, torch.Tensor], info: dict) -> None:
    """Write `tensors` and the JSON-able `info` to `path` atomically (`flowcore._fs.atomic_write`)."""
    path = Path(path)
    tensors = {name: t.detach().cpu().clone(memory_format=torch.contiguous_format) for name, t in tensors.items()}
    info = json.loads(json.dumps(info))  # as it will be read back (tuples become lists)
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "info": json.dumps(info, sort_keys=True),
                "sha256": _digest(tensors, info)}
    data = safetensors_bytes(tensors, metadata=metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: stream.write(data))


def check_layout(path) -> None:
    """`CalibratorFileError` naming the problem unless, by its header alone, the file is well-formed
    safetensors whose tensors all lie inside it.

    Args:
        path: the file to check.

    Example:
        >>> check_layout("model.flow")   # returns None, or raises CalibratorFileError
    """
    path = Path(path)
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start = handle.read(8)
        header_bytes = int.from_bytes(start, "little")
        if len(start) < 8 or header_bytes > MAX_HEADER_BYTES:
            for magic, what in _PICKLE_MAGIC.items():  # (a plausible header length may start with these bytes)
                if start.startswith(magic):
                    raise CalibratorFileError(f"{path}: this is {what}, not a calibrator file; flowcore never "
                                              "unpickles files (unpickling can run code). Calibrator files are "
                                              "safetensors written by `flowcore fit` or a calibrator's save")
        if len(start) < 8:
            raise CalibratorFileError(f"{path}: not a calibrator file (only {size} bytes; truncated?)")
        if header_bytes > min(size - 8, MAX_HEADER_BYTES):
            raise CalibratorFileError(f"{path}: not a readable calibrator file: its header claims {header_bytes:,} "
                                      f"bytes but the file holds {size - 8:,} after the length (truncated or not "
                                      "safetensors?)")
        try:
            header = parse_json(handle.read(header_bytes).decode("utf-8"))
        except (UnicodeDecodeError, JSONProblem) as problem:
            raise CalibratorFileError(f"{path}: not a readable calibrator file (its header is not usable JSON: "
                                      f"{problem})") from None
    if not isinstance(header, dict):
        raise CalibratorFileError(f"{path}: not a readable calibrator file (its header is not a JSON object)")
    data_bytes = size - 8 - header_bytes
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CalibratorFileError(f"{path}: not a readable calibrator file (its metadata is not a map of "
                                          "strings)")
            continue
        problem = _tensor_problem(entry, data_bytes)
        if problem:
            raise CalibratorFileError(f"{path}: not a readable calibrator file: tensor {name!r} {problem}")


def _tensor_problem(entry, data_bytes: int) -> str | None:
    """What is wrong with one tensor's header entry (None: it lies inside the file)."""
    if not isinstance(entry, dict):
        return "has no dtype, shape and offsets"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
        return f"has an unknown dtype {dtype!r}"
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        return f"has an invalid shape {shape!r}"
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)):
        return f"has invalid data offsets {offsets!r}"
    begin, end = offsets
    claimed = math.prod(shape) * _DTYPE_BYTES[dtype]
    if not 0 <= begin <= end <= data_bytes:
        return f"claims bytes {begin:,}..{end:,} but the file holds {data_bytes:,} bytes of data (truncated?)"
    if end - begin != claimed:
        return f"of shape {shape} needs {claimed:,} bytes but is given {end - begin:,}"
    return None


def read_calibrator_file(path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read and verify a calibrator file (layout, format, checksum, finite weights); returns (tensors, info)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise CalibratorFileError(f"{path}: no such calibrator file")
    require_file(path, CalibratorFileError)  # a folder, a pipe or a link loop, named as such
    check_layout(path)
    try:
        with safe_open(str(path), framework="pt") as reader:
            metadata = reader.metadata() or {}
            tensors = {name: reader.get_tensor(name) for name in reader.keys()}
    except Exception as error:  # safetensors raises its own error types for damaged headers
        raise CalibratorFileError(f"{path}: not a readable calibrator file (truncated or corrupted?): "
                                  f"{error}") from None
    if metadata.get("format") != FORMAT:
        raise CalibratorFileError(f"{path}: not a flowcore calibrator file (no '{FORMAT}' format tag in its metadata)")
    version = metadata.get("format_version", "?")
    if version not in READ_VERSIONS:
        raise CalibratorFileError(f"{path}: calibrator file format version {version}; this flowcore reads versions "
                                  f"{', '.join(READ_VERSIONS)}. Refit it with this flowcore (`flowcore fit`)")
    if "info" not in metadata:
        raise CalibratorFileError(f"{path}: calibrator file metadata is damaged: it has no info")
    try:
        info = parse_json(metadata["info"])
    except JSONProblem as problem:
        raise CalibratorFileError(f"{path}: calibrator file metadata is damaged (its info is not usable JSON: "
                                  f"{problem})") from None
    if not isinstance(info, dict):
        raise CalibratorFileError(f"{path}: calibrator file metadata is damaged: its info is not a JSON object")
    if metadata.get("sha256") != _digest(tensors, info if version != "3" else None):
        raise CalibratorFileError(f"{path}: corrupted calibrator file (its weights or header do not match their "
                                  "recorded checksum)")
    for name, tensor in sorted(tensors.items()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CalibratorFileError(f"{path}: the weights hold NaN/Inf (tensor {name!r}): a diverged or damaged fit "
                                      "would turn every vector into NaN; refit it")
    return tensors, info

