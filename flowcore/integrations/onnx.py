"""ONNX deployment folders: the encoder, its pooling, the calibration and optionally L2 normalisation as one
graph from token ids to calibrated vectors (`model.onnx`), or the calibration alone (`calibrator.onnx`), with
the tokenizer files and `flowcore.json` beside it. onnxruntime runs them anywhere it runs, without Python,
torch or flowcore (docs/deploy.md). Every calibrator exports through its `as_module()`."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

import torch
from torch import nn

from flowcore import defaults
from flowcore._fs import atomic_write, atomic_write_json, file_sha256
from flowcore.calibration.base import Calibrator, load
from flowcore.calibration.modules import Passthrough
from flowcore.extras import require
from flowcore.integrations.recorded_encoder import choose_encoder
from flowcore.text import loading
from flowcore.text.encoder import Encoder
from flowcore.text.pooled_encoder import PooledEncoder, example_inputs, load_model_for_export
from flowcore.text.quantize import QUANTIZE_MODES, quantize_matmuls

__all__ = ["CALIBRATOR_GRAPH", "GRAPH", "MANIFEST", "OPSET", "QUANTIZE_MODES", "CalibratedEncoder",
           "CalibrationGraph", "export", "quantize_graph", "require_onnx", "write_graph"]

GRAPH = "model.onnx"
"""The graph from token ids to calibrated vectors: inputs `input_ids`, `attention_mask` [and `token_type_ids`],
int64 (batch, sequence); output `sentence_embedding`, float32 (batch, output_dim)."""
CALIBRATOR_GRAPH = "calibrator.onnx"
"""The calibration alone: input `embeddings`, float32 (batch, dim); output `calibrated`, (batch, output_dim)."""
MANIFEST = "flowcore.json"
"""What a folder holds and where it came from: encoder, pooling, calibrator digest, max length, opset."""
TOKENIZER = "tokenizer.json"
OPSET = 18
"""The ONNX opset every graph is written in (onnxruntime ≥ 1.14, onnxruntime-web and the Java and Node
bindings of those versions run it)."""
FORMAT = "flowcore-onnx"
FORMAT_VERSION = 1
_FEATURE = "ONNX export (flowcore export --format onnx)"


class CalibratedEncoder(nn.Module):
    """Token ids -> calibrated sentence vectors: a `PooledEncoder`, a calibrator's `as_module()`, [L2 norm].

    Args:
        encoder: the `PooledEncoder` (model and pooling).
        calibration: the calibrator's module (`Calibrator.as_module`).
        normalize: scale the vectors to unit length.
    """

    def __init__(self, encoder: nn.Module, calibration: nn.Module, normalize: bool = False):
        super().__init__()
        self.encoder, self.calibration, self.normalize = encoder, calibration, bool(normalize)

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        vectors = self.calibration(self.encoder(input_ids, attention_mask, token_type_ids))
        return nn.functional.normalize(vectors, dim=1) if self.normalize else vectors


class CalibrationGraph(nn.Module):
    """Vectors from elsewhere -> calibrated vectors: a calibrator's `as_module()`, [L2 norm]."""

    def __init__(self, calibration: nn.Module, normalize: bool = False):
        super().__init__()
        self.calibration, self.normalize = calibration, bool(normalize)

    def forward(self, embeddings) -> torch.Tensor:
        vectors = self.calibration(embeddings)
        return nn.functional.normalize(vectors, dim=1) if self.normalize else vectors


@contextlib.contextmanager
def _quiet_exporters():
    """No warnings or log lines from torch's exporter or onnxruntime's quantiser (advice for their developers)."""
    loggers = [logging.getLogger(), logging.getLogger("torch"), logging.getLogger("torch.onnx")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def require_onnx() -> None:
    """A `MissingExtraError` naming `pip install 'flowcore[onnx]'` unless onnx, onnxscript and onnxruntime import."""
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module, _FEATURE, "onnx")


def write_graph(module: nn.Module, path, example: dict, dynamic: dict, output: str, metadata: dict | None = None):
    """Export `module` (called with `example` as keyword arguments) to the ONNX file `path` in opset `OPSET`.

    Args:
        module: a frozen torch module.
        path: where the graph is written (atomically).
        example: {input name: example tensor}.
        dynamic: {input name: {axis: dimension name}}, e.g. {"input_ids": {0: "batch", 1: "sequence"}}.
        output: the output's name.
        metadata: strings recorded in the graph's metadata_props.

    Example:
        >>> write_graph(CalibrationGraph(calibrator.as_module()), "calibrator.onnx",
        ...             {"embeddings": torch.zeros(2, 384)}, {"embeddings": {0: "batch"}}, "calibrated")
    """
    import onnx

    require_onnx()
    dims = {}
    shapes = {name: {axis: dims.setdefault(label, torch.export.Dim(label, min=1)) for axis, label in axes.items()}
              for name, axes in dynamic.items()}
    with tempfile.TemporaryDirectory(prefix="flowcore-onnx-") as folder, torch.no_grad(), _quiet_exporters():
        exported = os.path.join(folder, "graph.onnx")
        torch.onnx.export(module.eval(), (), exported, kwargs=example, input_names=list(example),
                          output_names=[output], dynamic_shapes=shapes, opset_version=OPSET, dynamo=True,
                          external_data=False, verbose=False, report=False)
        graph = onnx.load(exported)
    for key, value in (metadata or {}).items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, str(value)
    data = graph.SerializeToString()
    atomic_write(path, lambda stream: stream.write(data))


def quantize_graph(source, target, keep_float: tuple[str, ...] = ()) -> str:
    """`source` quantised to int8 into `target` as `Encoder(quantize="int8")` quantises (`quantize_matmuls`),
    keeping also the MatMuls reading a weight named with a `keep_float` prefix float32; returns the weight type."""
    require("onnxruntime.quantization", _FEATURE, "onnx")
    with tempfile.TemporaryDirectory(prefix="flowcore-int8-") as folder, _quiet_exporters():
        quantized = os.path.join(folder, "int8.onnx")
        weights = quantize_matmuls(source, quantized, keep_float)
        with open(quantized, "rb") as handle:
            data = handle.read()
    atomic_write(target, lambda stream: stream.write(data))
    return weights


def _check_out(out) -> Path:
    out = Path(out)
    if out.is_symlink():
        raise ValueError(f"{out} is a symbolic link; give a new or empty folder for the ONNX model")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a folder; give a new or empty folder for the ONNX model")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; give a new folder for the ONNX model")
    if not out.absolute().parent.is_dir():
        raise FileNotFoundError(f"{out}: the folder {out.absolute().parent} does not exist")
    return out


def _calibrator_record(calibrator: Calibrator | None) -> dict | None:
    """The calibrator as flowcore.json records it; its digest is the SHA-256 of the file it was loaded from,
    or else of the file `save` writes (the same bytes for the same fitted state)."""
    if calibrator is None:
        return None
    source = calibrator.source if calibrator.source is not None and os.path.isfile(calibrator.source) else None
    if source is not None:
        digest = file_sha256(source)
    else:
        with tempfile.TemporaryDirectory(prefix="flowcore-calibrator-") as folder:
            calibrator.save(Path(folder) / "calibrator.flow")
            digest = file_sha256(Path(folder) / "calibrator.flow")
    record = {"method": calibrator.name, "settings": calibrator.settings(), "dim": calibrator.dim,
              "output_dim": calibrator.output_dim, "sha256": digest, "file": str(source) if source else None}
    if calibrator.name == "auto":
        record["choice"] = calibrator.choice
    return record


def _software() -> dict:
    found = {}
    for name in ("flowcore", "torch", "transformers", "onnx", "onnxruntime"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _write_tokenizer(tokenizer, folder: Path, max_length: int, pad_values: dict) -> dict:
    """The tokenizer's files in `folder`; its tokenizer.json truncates to `max_length` and pads each batch to
    its longest text, so that `tokenizers.Tokenizer.from_file` alone gives the graph's inputs."""
    from tokenizers import Tokenizer

    tokenizer.save_pretrained(str(folder))
    fast = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    pad_id = int(pad_values.get("input_ids", 0))
    pad_token = tokenizer.pad_token if tokenizer.pad_token is not None else fast.id_to_token(pad_id)
    fast.enable_truncation(max_length=max_length)
    fast.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_type_id=int(pad_values.get("token_type_ids") or 0))
    fast.save(str(folder / TOKENIZER))
    return {"file": TOKENIZER, "max_length": max_length, "pad_token_id": pad_id, "pad_token": pad_token}


def export(out, calibrator=None, *, model: str | None = None, pooling: str | None = None, layers=None,
           normalize: bool = False, max_length: int = defaults.MAX_LENGTH, quantize: str | None = None,
           calibrator_only: bool = False) -> str:
    """Write an ONNX deployment folder at `out` (new or empty); returns its path.

    `out/model.onnx` maps token ids to calibrated vectors, equal to `Encoder(model, pooling).encode(texts)`
    followed by the calibrator's `transform` (and unit length with `normalize`) to float32 rounding; the
    tokenizer files and `flowcore.json` lie beside it. With `calibrator_only`, `out/calibrator.onnx` maps
    vectors from elsewhere, `embeddings` (batch, dim), to `calibrated` (batch, output_dim).

    Args:
        out: the folder to write.
        calibrator: a fitted calibrator or a calibrator file; None exports the encoder and pooling alone.
        model: "default", a local folder or a cached Hugging Face name (default: the calibrator's encoder).
        pooling: a flowcore pooling (default: the calibrator's); layers: hidden-state indices instead.
        normalize: L2-normalise the output vectors in the graph.
        max_length: texts are truncated to this many tokens (capped by the model's limit).
        quantize: None (float32) or "int8": onnxruntime's dynamic quantisation of the encoder's matrix products.
        calibrator_only: write the calibration's graph alone (no encoder, no tokenizer).

    Example:
        >>> export("onnx-model", "model.flow", normalize=True)
    """
    require_onnx()
    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    out = _check_out(out)
    if isinstance(calibrator, (str, os.PathLike)):
        calibrator = load(calibrator)
    if calibrator_only:
        if calibrator is None:
            raise ValueError("calibrator_only exports a calibrator's graph: give a calibrator")
        if quantize is not None:
            raise ValueError("quantize int8 quantises the encoder's matrix products and keeps the calibration "
                             "float32: a calibrator-only graph has nothing to quantise")
    else:
        chosen = choose_encoder(calibrator, model, pooling, layers)
    with tempfile.TemporaryDirectory(prefix="flowcore-export-") as folder:
        staged = Path(folder) / "staged"
        staged.mkdir()
        if calibrator_only:
            manifest = _write_calibrator(staged, calibrator, normalize)
        else:
            manifest = _write_encoder(staged, calibrator, chosen, normalize, max_length, quantize)
        out.mkdir(exist_ok=True)  # the staged files are moved in atomically one by one, flowcore.json last
        for path in sorted(staged.iterdir()):
            def copy(stream, path=path):
                with open(path, "rb") as source:
                    shutil.copyfileobj(source, stream)
            atomic_write(out / path.name, copy, sync_dir=False)
        atomic_write_json(out / MANIFEST, manifest, indent=2)
    return str(out)


def _manifest(graph: str, inputs: dict, output: dict, calibrator, normalize: bool, quantize, weights) -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "graph": graph, "opset": OPSET, "inputs": inputs,
            "output": output, "normalize": bool(normalize), "quantize": quantize,
            "quantized_weights": weights, "calibrator": _calibrator_record(calibrator), "software": _software()}


def _write_calibrator(staged: Path, calibrator: Calibrator, normalize: bool) -> dict:
    """calibrator.onnx in `staged`; returns the manifest."""
    dim, output_dim = calibrator.dim, calibrator.output_dim
    write_graph(CalibrationGraph(calibrator.as_module(), normalize), staged / CALIBRATOR_GRAPH,
                {"embeddings": torch.zeros(2, dim)}, {"embeddings": {0: "batch"}}, "calibrated",
                {"flowcore.calibrator": calibrator.name})
    manifest = _manifest(CALIBRATOR_GRAPH, {"embeddings": {"dtype": "float32", "shape": ["batch", dim]}},
                         {"name": "calibrated", "dtype": "float32", "shape": ["batch", output_dim]},
                         calibrator, normalize, None, None)
    manifest["encoder"] = calibrator.provenance.to_json() if calibrator.provenance is not None else None
    return manifest


def _write_encoder(staged: Path, calibrator, chosen, normalize: bool, max_length: int, quantize) -> dict:
    """model.onnx and the tokenizer files in `staged` (a float32 graph to quantise beside it); returns the manifest."""
    encoder = Encoder(chosen.model_id, pooling=chosen.pooling.name, max_length=max_length, device="cpu")
    loaded = loading.load(chosen.source, torch.device("cpu"), None)  # the encoder's (shared) tokenizer
    model, num_layers = load_model_for_export(chosen.source, chosen.pooling)
    calibration = calibrator.as_module() if calibrator is not None else Passthrough(encoder.dim)
    module = CalibratedEncoder(PooledEncoder(model, chosen.pooling, num_layers), calibration, normalize)
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids")
             if name in loaded.input_names or name == "attention_mask"]
    output_dim = calibrator.output_dim if calibrator is not None else encoder.dim
    graph, weights = staged / GRAPH, None
    target = staged.parent / "float.onnx" if quantize else graph
    write_graph(module, target, example_inputs(names), {name: {0: "batch", 1: "sequence"} for name in names},
                "sentence_embedding", {"flowcore.pooling": encoder.pooling, "flowcore.normalize": normalize})
    if quantize:
        weights = quantize_graph(target, graph, keep_float=("calibration.",))
    tokenizer = _write_tokenizer(loaded.tokenizer, staged, encoder.max_length, loaded.pad_values)
    described = encoder.describe()
    manifest = _manifest(GRAPH, {name: {"dtype": "int64", "shape": ["batch", "sequence"]} for name in names},
                         {"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", output_dim]},
                         calibrator, normalize, quantize, weights)
    manifest.update({
        "encoder": {key: described[key] for key in ("model", "name", "revision", "config_sha256", "weights_sha256")},
        "pooling": encoder.pooling, "max_length": encoder.max_length, "tokenizer": tokenizer})
    return manifest
