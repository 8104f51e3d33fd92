"""Flow files: one safetensors file, tensors plus JSON metadata; never pickle.

The header metadata holds the format name and version, a JSON `info` document (for a
`FlowCalibrator`: the Glow configuration, the training settings, the encoder and pooling the
flow was fitted for, and free-form user metadata), and a SHA-256 of the tensor bytes so that a
corrupted file is caught, not silently used.

Version 2 records the encoder as `info["encoder"] = {"model", "pooling"}`. Version 1 files kept
it as `info["metadata"]["encoder"/"pooling"] strings; they are read and migrated on load.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from flowcore._fs import atomic_write

__all__ = ["FORMAT", "FORMAT_VERSION", "EncoderProvenance", "FlowFileError", "check_encoder_fits", "load_flow",
           "save_flow"]

FORMAT = "flowcore-flow"
FORMAT_VERSION = 2
READABLE_VERSIONS = ("1", "2")


@dataclass(frozen=True)
class EncoderProvenance:
    """The encoder (`model`: "default", a folder path or a hub name) and canonical pooling name
    that produced the vectors a flow was fitted on."""

    model: str
    pooling: str

    @classmethod
    def of(cls, encoder) -> "EncoderProvenance":
        """The provenance of an `Encoder` (anything with `model_id` and `pooling`)."""
        return cls(str(encoder.model_id), str(encoder.pooling))

    def to_json(self) -> dict:
        return asdict(self)


def check_encoder_fits(provenance: EncoderProvenance | None, dim: int, encoder, requested_model: str | None = None,
                       what: str = "the flow") -> None:
    """The one check that vectors from `encoder` fit a calibration fitted on `dim`-wide vectors
    from the encoder and pooling of `provenance` (None: unknown, only the width is checked);
    `requested_model` is the name the encoder was asked for, which matches when it is the
    recorded one. Raises ValueError saying how to fix it."""
    if provenance is not None and provenance.model not in (str(encoder.model_id), requested_model):
        raise ValueError(f"{what} was fitted on embeddings from encoder {provenance.model!r}, not "
                         f"{encoder.model_id!r}; use the same encoder (--model {provenance.model}) or refit it")
    if provenance is not None and provenance.pooling != str(encoder.pooling):
        raise ValueError(f"{what} was fitted on {provenance.pooling!r} pooling, not {encoder.pooling!r}; "
                         f"use the same pooling (--pooling {provenance.pooling}) or refit it")
    if int(encoder.dim) != dim:
        raise ValueError(f"encoder {encoder.model_id!r} gives {encoder.dim}-wide vectors but {what} expects {dim}")


class FlowFileError(ValueError):
    """A flow file that is missing, truncated, corrupted or does not match what it claims."""


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        sha.update(name.encode())
        sha.update(str(tensor.dtype).encode())
        sha.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return sha.hexdigest()


def save_flow(path, tensors: dict[str, torch.Tensor], info: dict) -> None:
    """Write `tensors` and the JSON-able `info` to `path` atomically (`flowcore._fs.atomic_write`)."""
    path = Path(path)
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "info": json.dumps(info, sort_keys=True),
        "sha256": _digest(tensors),
    }
    data = safetensors_bytes(tensors, metadata=metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: stream.write(data))


def load_flow(path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read and verify a flow file; returns (tensors, info)."""
    path = Path(path)
    if not path.is_file():
        raise FlowFileError(f"{path}: no such flow file")
    try:
        with safe_open(str(path), framework="pt") as reader:
            metadata = reader.metadata() or {}
            tensors = {name: reader.get_tensor(name) for name in reader.keys()}
    except Exception as error:  # safetensors raises its own error types for damaged headers
        raise FlowFileError(f"{path}: not a readable flow file (truncated or corrupted?): {error}") from None
    if metadata.get("format") != FORMAT:
        raise FlowFileError(f"{path}: not a flowcore flow file (no '{FORMAT}' format tag in its metadata)")
    version = metadata.get("format_version", "?")
    if version not in READABLE_VERSIONS:
        raise FlowFileError(f"{path}: flow file format version {version}; this flowcore reads versions "
                            f"{', '.join(READABLE_VERSIONS)}. Refit the flow with this flowcore (`flowcore fit`)")
    if metadata.get("sha256") != _digest(tensors):
        raise FlowFileError(f"{path}: corrupted flow file (the weights do not match their recorded checksum)")
    try:
        info = json.loads(metadata["info"])
    except (KeyError, json.JSONDecodeError) as error:
        raise FlowFileError(f"{path}: flow file metadata is damaged: {error}") from None
    if version == "1":
        info = _migrated_v1(info)
    return tensors, info


def _migrated_v1(info: dict) -> dict:
    """A version 1 calibrator header in version 2 form: the encoder and pooling strings that the
    CLI kept in the free-form metadata become the typed `encoder` field."""
    metadata = info.get("metadata")
    if "glow" not in info or not isinstance(metadata, dict):
        return info
    if not ("encoder" in metadata and "pooling" in metadata):
        return {**info, "encoder": None}
    metadata = dict(metadata)
    encoder = {"model": metadata.pop("encoder"), "pooling": metadata.pop("pooling")}
    return {**info, "metadata": metadata, "encoder": encoder}
