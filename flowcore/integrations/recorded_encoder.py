"""Which encoder and pooling an export writes: those the calibrator records unless others are asked for
(and then only if they fit it), checked from the model's configuration before any weights load."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from flowcore import defaults
from flowcore.text.loading import own_pooling, resolve_model
from flowcore.text.pooling import Pooling, bind_pooling, parse_pooling

__all__ = ["ChosenEncoder", "choose_encoder", "find_json_key", "read_json", "refuse_auto_map"]


@dataclass(frozen=True)
class ChosenEncoder:
    """The encoder an export writes: its id, what to load, its Hugging Face config and the bound pooling."""

    model_id: str
    source: str
    config: object
    pooling: Pooling

    @property
    def dim(self) -> int:
        return int(self.config.hidden_size)


def choose_encoder(calibrator=None, model: str | None = None, pooling: str | None = None,
                   layers=None) -> ChosenEncoder:
    """The encoder and pooling for `calibrator` (a fitted one, or None), refused with a one-line ValueError
    when they do not fit it, when none is recorded or given, or when the model asks for remote code.

    Args:
        calibrator: a fitted calibrator; its recorded encoder and pooling are the defaults.
        model: "default", a local folder or a cached Hugging Face name.
        pooling: a flowcore pooling name; layers: hidden-state indices to average instead.

    Example:
        >>> choose_encoder(flowcore.load("model.flow")).pooling.name
        'first-last-avg'
    """
    from transformers import AutoConfig

    recorded = calibrator.provenance if calibrator is not None else None
    requested_model = model
    if model is None:
        if calibrator is not None and recorded is None:
            raise ValueError(f"the {calibrator.name} calibrator records no encoder (it was fitted on raw "
                             "embeddings); pass the model and pooling of the encoder that produced them")
        model = recorded.model if recorded is not None else defaults.MODEL
    model_id, source = resolve_model(model)
    if pooling is None and layers is None:
        pooling = recorded.pooling if recorded is not None else own_pooling(source) or defaults.POOLING
    kind, requested = parse_pooling(pooling, layers)  # checked before any model is loaded
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as error:
        raise FileNotFoundError(f"could not read the configuration of model {model_id!r} (flowcore never downloads "
                                f"models; pass a local folder or a name in the Hugging Face cache): {error}") from None
    if getattr(config, "auto_map", None):
        raise ValueError(f"encoder {model_id!r}: its config.json has an 'auto_map' (remote code); flowcore never "
                         "runs remote code, so it does not export such a model")
    if os.path.isdir(source):
        for path in sorted(Path(source).glob("*.json")):
            refuse_auto_map(path, f"encoder {model_id!r}", "; flowcore never runs remote code, so it does not "
                            "export such a model")
    bound = bind_pooling(kind, requested, int(config.num_hidden_layers))
    chosen = ChosenEncoder(model_id, source, config, bound)
    if calibrator is not None:
        calibrator.check_encoder(SimpleNamespace(model_id=model_id, pooling=bound.name, dim=chosen.dim),
                                 requested_model)
    return chosen


def find_json_key(value, key: str, where: str = "") -> str | None:
    """The path (e.g. "a.b[0]") of the first `key` in the JSON value at any depth, or None."""
    if isinstance(value, dict):
        for name, item in value.items():
            here = f"{where}.{name}" if where else str(name)
            if name == key:
                return here
            if (found := find_json_key(item, key, here)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := find_json_key(item, key, f"{where}[{index}]")) is not None:
                return found
    return None


def read_json(path: Path, what: str):
    """The JSON value in `path`, or a ValueError naming `what` and the file."""
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{what}: {path} is not a readable JSON file ({error}); refusing to load it") from None


def refuse_auto_map(path: Path, what: str, consequence: str) -> None:
    """A ValueError unless the JSON file at `path` is free of 'auto_map' keys (remote code) at any depth."""
    if (found := find_json_key(read_json(path, what), "auto_map")) is not None:
        raise ValueError(f"{what}: {path} has an 'auto_map' key ({found}), which makes transformers run code from "
                         f"the folder{consequence}")
