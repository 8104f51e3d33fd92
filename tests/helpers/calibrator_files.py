"""Calibrator files as a stranger edits them: the header's info changed, the tensors kept."""
from __future__ import annotations

import json
from pathlib import Path


def rewritten(source: Path, target: Path, edit, version: str = "4", rehash: bool = True) -> Path:
    """`source` with its info edited by `edit(info)` and its format version set to `version`, saved at `target`;
    `rehash`: with the checksum a writer of that version gives it (version 3's covers the tensors only, as a
    stranger who edited the header and recomputed the checksum would), else the old one."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from flowcore.calibration import file as calibrator_file

    with safe_open(str(source), framework="pt") as reader:
        metadata, tensors = dict(reader.metadata()), {name: reader.get_tensor(name) for name in reader.keys()}
    info = json.loads(metadata["info"])
    edit(info)
    metadata.update(format_version=version, info=json.dumps(info, sort_keys=True))
    if rehash:
        metadata["sha256"] = calibrator_file._digest(tensors, None if version == "3" else info)
    save_file(tensors, str(target), metadata=metadata)
    return target
