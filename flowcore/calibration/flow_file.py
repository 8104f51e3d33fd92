"""Flow files: one safetensors file, tensors plus JSON metadata; never pickle.

The header metadata holds the format name and version, the Glow configuration, the training
settings, free-form user metadata (e.g. the encoder and pooling the flow was fitted for), and a
SHA-256 of the tensor bytes so that a corrupted file is caught, not silently used.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "flowcore-flow"
FORMAT_VERSION = 1


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
    """Write atomically: a temporary file beside `path`, fsync, rename."""
    path = Path(path)
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "info": json.dumps(info, sort_keys=True),
        "sha256": _digest(tensors),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata=metadata)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would hide the model from other users
        os.replace(temporary, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
    if version != str(FORMAT_VERSION):
        raise FlowFileError(f"{path}: flow file format version {version}; this flowcore reads version {FORMAT_VERSION}")
    if metadata.get("sha256") != _digest(tensors):
        raise FlowFileError(f"{path}: corrupted flow file (the weights do not match their recorded checksum)")
    try:
        info = json.loads(metadata["info"])
    except (KeyError, json.JSONDecodeError) as error:
        raise FlowFileError(f"{path}: flow file metadata is damaged: {error}") from None
    return tensors, info
