"""sentence-transformers model folders with flowcore's calibrations and poolings inside: `export` (CLI: `flowcore
export`) writes a `SentenceTransformer` folder (transformer, tokenizer, pooling, calibration, optional `Normalize`)
whose `encode` matches `Encoder.encode` + the calibrator's `transform` to float32 rounding. A linear calibration
with `mean`/`cls` pooling uses stock modules only; the flow (`FlowModule`) and the other poolings (`LayerPooling`)
need `load_model(out)`, which checks the folder before setting `trust_remote_code`. No code is copied into the
folder, and an encoder with an `auto_map` is refused. With the `onnx` extra the folder also holds
`onnx/model.onnx`, which sentence-transformers' `backend="onnx"` runs."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path

import numpy as np
import torch

from flowcore.extras import require

require("sentence_transformers", "the sentence-transformers integration (flowcore export)", "st")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Dense, Module, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling as STPooling  # noqa: E402

from flowcore import defaults  # noqa: E402
from flowcore.calibration.base import Calibrator, load  # noqa: E402
from flowcore.calibration.linear import LinearCalibrator  # noqa: E402
from flowcore.calibration.modules import LinearMap, Passthrough  # noqa: E402
from flowcore.integrations.onnx import require_onnx, write_graph  # noqa: E402
from flowcore.integrations.recorded_encoder import choose_encoder, read_json, refuse_auto_map  # noqa: E402
from flowcore.text.loading import quiet_transformers, token_limit  # noqa: E402
from flowcore.text.pooled_encoder import PooledTokenStates, example_inputs, load_model_for_export  # noqa: E402
from flowcore.text.pooling import Pooling  # noqa: E402

__all__ = ["FLOW_FILE", "ONNX_GRAPH", "FlowModule", "LayerPooling", "build_model", "export", "linear_dense",
           "load_model"]

FLOW_FILE = "flow.safetensors"
"""The calibrator's flow file inside the `FlowModule` module folder."""
ONNX_GRAPH = "onnx/model.onnx"
"""The transformer's ONNX graph in the model folder, where `backend="onnx"` finds it."""
_STOCK_POOLINGS = ("mean", "cls")  # flowcore poolings that sentence-transformers' Pooling has, by the same name
_OWN_CLASSES = ("FlowModule", "LayerPooling")
_IDENTITY_ACTIVATIONS = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")


class FlowModule(Module):
    """A fitted calibrator whose map is not linear (the flow) as a frozen sentence-transformers module after the
    pooling: its `as_module()`, saved as its calibrator file.

    Args:
        calibrator: a fitted calibrator, or the path of a calibrator file.
    """

    config_keys: list[str] = ["embedding_dimension", "flow_config", "encoder"]

    def __init__(self, calibrator: Calibrator | str | os.PathLike):
        super().__init__()
        if isinstance(calibrator, (str, os.PathLike)):
            calibrator = load(calibrator)
        if not isinstance(calibrator, Calibrator):
            raise TypeError(f"FlowModule takes a fitted calibrator or a calibrator file path, not "
                            f"{type(calibrator).__name__}")
        self.calibrator = calibrator
        self.embedding_dimension = calibrator.dim  # raises if the calibrator is not fitted
        self.flow_config = calibrator.settings().get("config")
        self.encoder = calibrator.provenance.to_json() if calibrator.provenance is not None else None
        # registered, so that SentenceTransformer.to(device) moves it; plain ops: gradients pass to the encoder
        self.flow = calibrator.as_module()

    def forward(self, features: dict, **kwargs) -> dict:
        x = features["sentence_embedding"]
        features["sentence_embedding"] = self.flow(x.float()).to(x.dtype)
        return features

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.calibrator.save(os.path.join(output_path, FLOW_FILE))
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, **kwargs) -> "FlowModule":
        path = cls.load_file_path(model_name_or_path, FLOW_FILE, subfolder=subfolder, token=token,
                                  cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        if path is None:
            raise FileNotFoundError(f"{os.path.join(model_name_or_path, subfolder)}: no {FLOW_FILE}; this "
                                    "FlowModule module folder is incomplete (re-export it with `flowcore export`)")
        return cls(path)


class LayerPooling(Module):
    """flowcore's poolings as a sentence-transformers module, pooling exactly as `flowcore.Encoder`.

    Reads `features["all_layer_embeddings"]` (the transformer runs with `output_hidden_states`); under
    `backend="onnx"`, which returns no hidden states, `features["token_embeddings"]`, which the folder's
    onnx/model.onnx computes as the mean of the pooled hidden states per token (`export` writes it).

    Args:
        pooling: the canonical pooling name (`flowcore.text.pooling`), e.g. "first-last-avg".
        hidden_states: the non-negative hidden-state indices it averages (0 = embeddings).
        embedding_dimension: the width of the vectors.
        first_token: pool the first token of `hidden_states[0]` (the `cls` pooling) instead of the mean.
    """

    config_keys: list[str] = ["pooling", "hidden_states", "embedding_dimension", "first_token"]

    def __init__(self, pooling: str, hidden_states: list[int], embedding_dimension: int, first_token: bool = False):
        super().__init__()
        self.pooling = str(pooling)
        self.hidden_states = [int(index) for index in hidden_states]
        self.embedding_dimension = int(embedding_dimension)
        self.first_token = bool(first_token)
        self._pool = Pooling(name=self.pooling, hidden_states=tuple(self.hidden_states), first_token=self.first_token)

    def forward(self, features: dict, **kwargs) -> dict:
        states = features.get("all_layer_embeddings")
        if states is None:  # backend="onnx": the folder's onnx/model.onnx returns the states' mean per token
            averaged = Pooling(name="token-states", hidden_states=(0,), first_token=self.first_token)
            pooled = averaged([features["token_embeddings"]], features["attention_mask"])
        elif max(self.hidden_states) >= len(states):
            raise ValueError(f"LayerPooling({self.pooling!r}) needs hidden state {max(self.hidden_states)}, "
                             f"but the transformer gives {len(states)} (0..{len(states) - 1})")
        else:
            pooled = self._pool([states[index] for index in self.hidden_states], features["attention_mask"])
        features["sentence_embedding"] = pooled
        return features

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)  # Module.load rebuilds it from this config


def linear_dense(calibrator) -> Dense:
    """A fitted linear calibrator x -> (x − μ)·W (its `as_module()` is a `LinearMap`) as a stock float32 `Dense`:
    weight Wᵀ, bias −μ·W, computed in float64 from its mean and matrix."""
    if not isinstance(calibrator, LinearCalibrator):
        raise TypeError(f"a {getattr(calibrator, 'name', type(calibrator).__name__)} calibrator is not linear "
                        "(x -> (x - mean) W), so it has no Dense form")
    calibrator.as_module()  # a ValueError unless fitted
    matrix = np.asarray(calibrator.matrix, dtype=np.float64)
    bias = -(np.asarray(calibrator.mean, dtype=np.float64) @ matrix)
    dim, output_dim = matrix.shape
    return Dense(dim, output_dim, bias=True, activation_function=torch.nn.Identity(),
                 init_weight=torch.tensor(matrix.T, dtype=torch.float32),
                 init_bias=torch.tensor(bias, dtype=torch.float32))


def build_model(calibrator=None, *, model: str | None = None, pooling: str | None = None, layers=None,
                normalize: bool = False, max_length: int = defaults.MAX_LENGTH,
                device: str = "cpu") -> SentenceTransformer:
    """A `SentenceTransformer`: the encoder's transformer, the pooling, the calibration, [Normalize].

    Args:
        calibrator: a fitted calibrator or calibrator file (its encoder and pooling are required); None: none.
        model: "default", a local folder or a cached Hugging Face name; needed if none is recorded.
        pooling: a flowcore pooling (default: the calibrator's, else "first-last-avg").
        layers: hidden-state indices to average, instead of `pooling`.
        normalize: append `Normalize` (unit-length vectors).
        max_length: texts are truncated to this many tokens (capped by the model's limit).
        device: where the model is built.

    Example:
        >>> build_model("whitening.flow", normalize=True).encode(["a sentence"])
    """
    if isinstance(calibrator, (str, os.PathLike)):
        calibrator = load(calibrator)
    chosen = choose_encoder(calibrator, model, pooling, layers)
    bound, dim, source = chosen.pooling, chosen.dim, chosen.source
    needs_layers = bound.name not in _STOCK_POOLINGS
    calibration = []  # a stock Dense for a linear map, FlowModule for another (the flow), nothing for the identity
    module = calibrator.as_module() if calibrator is not None else None
    if isinstance(module, LinearMap):
        calibration.append(linear_dense(calibrator))
    elif module is not None and not isinstance(module, Passthrough):
        calibration.append(FlowModule(calibrator))
    local = {"local_files_only": True}
    with quiet_transformers():
        transformer = Transformer(source, model_kwargs=dict(local), processor_kwargs=dict(local),
                                  config_kwargs={**local, **({"output_hidden_states": True} if needs_layers else {})})
    transformer.max_seq_length = token_limit(chosen.config, transformer.tokenizer, max_length)
    pooler = (LayerPooling(bound.name, list(bound.hidden_states), dim, bound.first_token) if needs_layers
              else STPooling(dim, pooling_mode=bound.name))
    modules = [transformer, pooler, *calibration, *([Normalize()] if normalize else [])]
    return SentenceTransformer(modules=modules, device=device)


def export(out, calibrator=None, *, model: str | None = None, pooling: str | None = None, layers=None,
           normalize: bool = False, max_length: int = defaults.MAX_LENGTH, onnx: bool | None = None) -> str:
    """Write `build_model(...)` (same arguments) as a model folder at `out`; returns its path.

    Load it with `load_model(out)` (or `SentenceTransformer(out)` when it names only stock classes); the
    folder's `onnx/model.onnx` lets either load it with `backend="onnx"`, the calibration applied after the
    pooling as with the torch backend.

    Args:
        onnx: write `onnx/model.onnx` (the transformer up to the pooled states, `flowcore.integrations.onnx`);
            None: when the `onnx` extra is installed.

    Example:
        >>> export("st-model", "model.flow", normalize=True)
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; give a new folder for the model")
    if onnx:
        require_onnx()
    elif onnx is None:
        onnx = all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxscript", "onnxruntime"))
    if isinstance(calibrator, (str, os.PathLike)):
        calibrator = load(calibrator)
    st_model = build_model(calibrator, model=model, pooling=pooling, layers=layers, normalize=normalize,
                           max_length=max_length)
    with quiet_transformers():
        st_model.save(str(out), create_model_card=False)
    if onnx:
        _write_transformer_graph(out / ONNX_GRAPH, choose_encoder(calibrator, model, pooling, layers),
                                 st_model[0].tokenizer)
    return str(out)


def _write_transformer_graph(path: Path, chosen, tokenizer) -> None:
    """The graph sentence-transformers' ONNX backend runs (optimum's layout): input_ids, attention_mask
    [, token_type_ids] -> last_hidden_state, the states the pooling averages (`PooledTokenStates`)."""
    model, num_layers = load_model_for_export(chosen.source, chosen.pooling)
    accepted = inspect.signature(model.forward).parameters
    names = [name for name in tokenizer.model_input_names if name in accepted]
    path.parent.mkdir(exist_ok=True)
    write_graph(PooledTokenStates(model, chosen.pooling, num_layers), path, example_inputs(names),
                {name: {0: "batch_size", 1: "sequence_length"} for name in names}, "last_hidden_state",
                {"flowcore.pooling": chosen.pooling.name,
                 "flowcore.hidden_states": ",".join(map(str, chosen.pooling.hidden_states))})


def needs_trust_remote_code(folder) -> bool:
    """True when the model folder's `modules.json` names a class outside `sentence_transformers.*`."""
    return any(not entry["type"].startswith("sentence_transformers.") for entry in _module_entries(folder))


def load_model(folder, **kwargs) -> SentenceTransformer:
    """`SentenceTransformer(folder, **kwargs)` for a folder written by `export`.

    `trust_remote_code` is set only when needed, and only after checking that `modules.json` names no
    classes but sentence-transformers' and this module's, that no JSON file has an `auto_map` key at any
    depth, and that every `Dense` activation is `Identity`: the flag would load any other code.
    """
    entries = _module_entries(folder)
    foreign = [entry["type"] for entry in entries
               if not entry["type"].startswith("sentence_transformers.")
               and entry["type"] not in {f"{__name__}.{name}" for name in _OWN_CLASSES}]
    if foreign:
        raise ValueError(f"{folder}: modules.json names classes that are neither sentence-transformers' nor "
                         f"flowcore's: {', '.join(foreign)}; load it with SentenceTransformer(..., "
                         "trust_remote_code=True) only if you trust that code")
    _check_no_remote_code(Path(folder), entries)
    if needs_trust_remote_code(folder):
        kwargs.setdefault("trust_remote_code", True)
    return SentenceTransformer(str(folder), **kwargs)


def _module_entries(folder) -> list[dict]:
    path = Path(folder) / "modules.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no modules.json; not a sentence-transformers model folder")
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def _check_no_remote_code(folder: Path, entries: list[dict]) -> None:
    """Refuse a folder whose files would run code under `trust_remote_code=True` (see `load_model`)."""
    refusal = ("; load_model refuses it (use SentenceTransformer(..., trust_remote_code=True) only if you trust "
               "every file in the folder)")
    for path in sorted(folder.rglob("*.json")):
        if path.is_file():
            refuse_auto_map(path, str(folder), refusal)
    for entry in entries:
        config_path = folder / entry.get("path", "") / Dense.config_file_name
        if entry["type"].rsplit(".", 1)[-1] != "Dense" or not config_path.is_file():
            continue  # not a Dense, or an incomplete one (sentence-transformers itself reports it)
        config = read_json(config_path, str(folder))
        activation = config.get("activation_function") if isinstance(config, dict) else None
        if activation is not None and activation not in _IDENTITY_ACTIVATIONS:
            raise ValueError(f"{folder}: {config_path} has 'activation_function' {activation!r}, not torch's "
                             f"Identity (what flowcore export writes){refusal}")
