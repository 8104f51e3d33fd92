"""An MTEB (v2) model from a flowcore `Encoder` and, optionally, a calibration. mteb is imported only when first
needed. The model encodes text only and takes no prompts (queries and documents are encoded alike)."""
from __future__ import annotations

import functools
import hashlib
import os
import warnings
from typing import Any

import numpy as np

from flowcore._fs import file_sha256
from flowcore._vectors import unit_rows
from flowcore.calibration.base import Calibrator, load
from flowcore.extras import require
from flowcore.text.encoder import DEFAULT_MODEL_NAME, Encoder
from flowcore.text.loading import DEFAULT_MODEL, default_model_revision

__all__ = ["FlowcoreMTEBModel"]


class FlowcoreMTEBModel:
    """A flowcore `Encoder`, optionally calibrated, as an mteb encoder (`mteb.models.EncoderProtocol`).

    Args:
        encoder: a `flowcore.Encoder`, or anything with its `encode`, `model_id`, `pooling` and `dim`.
        calibrator: a fitted flowcore calibrator for this encoder, or anything with `transform(X)`; None: raw.
        normalize: scale the vectors to unit length (changes euclidean and k-means tasks, not cosine).
        dtype: of the returned vectors; float64 makes mteb score like `flowcore sts`, float32 halves memory.
        name: the `ModelMeta` name; default "flowcore/<model>-<pooling>[-<calibration>]".
        revision: the `ModelMeta` revision; default a fingerprint of all that sets the vectors (own result folders).
        meta_overrides: further `ModelMeta` fields (e.g. `languages`, `license`).

    Example:
        >>> model = FlowcoreMTEBModel.from_calibrator_file("model.flow")
        >>> results = mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))
    """

    def __init__(self, encoder, calibrator=None, normalize: bool = False, *, dtype="float64", name: str | None = None,
                 revision: str | None = None, meta_overrides: dict[str, Any] | None = None):
        for attribute in ("encode", "model_id", "pooling", "dim"):
            if not hasattr(encoder, attribute):
                raise TypeError(f"encoder must be a flowcore Encoder (with {attribute!r}), "
                                f"not {type(encoder).__name__}")
        if calibrator is not None and not callable(getattr(calibrator, "transform", None)):
            raise TypeError(f"calibrator must have transform(X), like every flowcore calibrator; got "
                            f"{type(calibrator).__name__}")
        self.encoder = encoder
        self.calibrator = calibrator
        self.normalize = bool(normalize)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        self.embed_dim = _check_calibrator(calibrator, encoder)
        self._name, self._revision = name, revision
        self._meta_overrides = dict(meta_overrides or {})

    @classmethod
    def from_calibrator_file(cls, path, encoder=None, normalize: bool = False, device=None,
                             **kwargs) -> "FlowcoreMTEBModel":
        """The model of a calibrator file: its calibrator on the encoder and pooling it records.

        Args:
            path: a calibrator file of any method (`flowcore fit`, a calibrator's `save`).
            encoder: the `Encoder` to use; default the one the file records (required when it records none).
            normalize: as in the constructor.
            device: where the flow (and a default encoder) run.
            kwargs: `dtype`, `name`, `revision`, `meta_overrides` as in the constructor.
        """
        calibrator = load(path, device=device)
        if encoder is None:
            recorded = calibrator.provenance
            if recorded is None:
                raise ValueError(f"{path} records no encoder (it was fitted on raw embeddings): pass encoder=, "
                                 "the Encoder that produced them")
            encoder = Encoder(model=recorded.model, pooling=recorded.pooling, device=device)
        model = cls(encoder, calibrator, normalize=normalize, **kwargs)
        if model._revision is None:
            model._revision = f"{file_sha256(path)[:12]}-{model._fingerprint()[:12]}"
        return model

    @classmethod
    def from_flow_file(cls, path, *args, **kwargs) -> "FlowcoreMTEBModel":
        """`from_calibrator_file`'s earlier name (with a DeprecationWarning) until 1.0."""
        warnings.warn("FlowcoreMTEBModel.from_flow_file is now from_calibrator_file; the old name goes at 1.0",
                      DeprecationWarning, stacklevel=2)
        return cls.from_calibrator_file(path, *args, **kwargs)

    @property
    def calibration(self) -> str:
        """The calibrator's method name, "none" without one, else its class name in lower case."""
        if self.calibrator is None:
            return "none"
        return getattr(self.calibrator, "name", None) or type(self.calibrator).__name__.lower()

    def encode(self, inputs, *, task_metadata=None, hf_split: str | None = None, hf_subset: str | None = None,
               prompt_type=None, **kwargs) -> np.ndarray:
        """(N, embed_dim) `dtype`: the (calibrated) vectors of every text in mteb's batches, in order.

        Args:
            inputs: mteb's DataLoader (any iterable of batches, each a mapping with a "text" list).
            task_metadata, hf_split, hf_subset, prompt_type: mteb's context; not used (no prompts).
            kwargs: mteb's encode_kwargs: `batch_size` (else flowcore's default), `show_progress_bar` (others ignored).
        """
        texts: list[str] = []
        for batch in inputs:
            if "text" not in batch:
                raise ValueError(f"flowcore encodes text only; this mteb batch has no 'text' field "
                                 f"(fields: {', '.join(map(str, batch)) or 'none'})")
            texts.extend(batch["text"])
        if not texts:
            return np.empty((0, self.embed_dim), dtype=self.dtype)
        options = {"show_progress_bar": kwargs.get("show_progress_bar")}
        if kwargs.get("batch_size") is not None:
            options["batch_size"] = int(kwargs["batch_size"])
        vectors = self.encoder.encode(texts, **options)
        if self.calibrator is not None:
            vectors = self.calibrator.transform(vectors)
        if self.normalize:
            return unit_rows(vectors, dtype=self.dtype)
        return np.asarray(vectors).astype(self.dtype, copy=False)

    def similarity(self, embeddings1, embeddings2):
        """Cosine similarity matrix (n1, n2) between two sets of vectors (mteb's `cos_sim`)."""
        from mteb.similarity_functions import cos_sim

        return cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """Cosine similarity of each row pair, shape (n,) (mteb's `pairwise_cos_sim`)."""
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(embeddings1, embeddings2)

    @functools.cached_property
    def mteb_model_meta(self):
        """The `mteb.ModelMeta` of this model (built once, on first use)."""
        from mteb.models import ModelMeta

        model_id = str(self.encoder.model_id)
        hub_name = model_id if model_id.count("/") == 1 and not os.path.isabs(model_id) else None  # not a folder
        if model_id == DEFAULT_MODEL:
            hub_name = DEFAULT_MODEL_NAME
        embeddings = getattr(_loaded_model(self.encoder), "get_input_embeddings", None)
        unknown = ("loader", "release_date", "languages", "memory_usage_mb", "license", "open_weights",
                   "public_training_code", "public_training_data", "training_datasets")
        fields: dict[str, Any] = dict.fromkeys(unknown) | {
            "name": self._name or self._default_name(), "revision": self._revision or self._fingerprint()[:16],
            "n_parameters": _n_parameters(self.encoder, self.calibrator),
            "n_embedding_parameters": _count_parameters(embeddings()) if embeddings else None,
            "max_tokens": getattr(self.encoder, "max_length", None), "embed_dim": self.embed_dim,
            "framework": ["PyTorch", "Transformers"], "similarity_fn_name": "cosine", "use_instructions": False,
            "adapted_from": hub_name, "modalities": ["text"], "model_type": ["dense"]}
        if hub_name is not None:
            fields.update(_registered_fields(hub_name))
        fields.update(self._meta_overrides)
        return ModelMeta(**fields)

    def __repr__(self) -> str:
        return (f"FlowcoreMTEBModel(encoder={self.encoder!r}, calibration={self.calibration!r}, "
                f"normalize={self.normalize}, dtype={self.dtype.name!r}, embed_dim={self.embed_dim})")

    def _default_name(self) -> str:
        model_id = str(self.encoder.model_id)
        base = DEFAULT_MODEL_NAME if model_id == DEFAULT_MODEL else model_id.rstrip("/\\").replace("\\", "/")
        base = base.rpartition("/")[2] or "model"
        name = f"flowcore/{base}-{self.encoder.pooling}"
        return name if self.calibrator is None else f"{name}-{self.calibration}"

    def _fingerprint(self) -> str:
        """Hex SHA-256 of what determines the vectors: encoder, pooling, calibration state, normalize."""
        sha = hashlib.sha256()
        for part in (self.encoder.model_id, self.encoder.pooling, getattr(self.encoder, "max_length", None),
                     _model_version(self.encoder), self.normalize, self.calibration, self.dtype.str):
            sha.update(repr(part).encode("utf-8") + b"\0")
        if self.calibrator is not None:
            _hash_state(sha, self.calibrator)
        return sha.hexdigest()


def _check_calibrator(calibrator, encoder) -> int:
    """The width of the vectors the model returns; refuses a calibrator unfit for this encoder."""
    dim = int(encoder.dim)
    if calibrator is None:
        return dim
    if isinstance(calibrator, Calibrator):  # the protocol: its widths and recorded encoder
        try:
            width, out = int(calibrator.dim), int(calibrator.output_dim)
        except (ValueError, RuntimeError) as error:  # not fitted
            raise ValueError(str(error)) from None
        if width != dim:
            raise ValueError(f"the calibrator takes {width}-wide vectors but encoder {encoder.model_id!r} "
                             f"gives {dim}-wide ones")
        calibrator.check_encoder(encoder, what="the calibrator")
        return out
    probe = np.asarray(calibrator.transform(np.zeros((2, dim), dtype=np.float32)))  # one of your own
    if probe.ndim != 2 or probe.shape[0] != 2:
        raise ValueError(f"calibrator.transform must map (n, {dim}) to (n, k), got shape {probe.shape}")
    return int(probe.shape[1])


def _registered_fields(hub_name: str) -> dict[str, Any]:
    """What mteb's own registry says about the base model (no download); {} when it is not registered."""
    mteb = require("mteb", "the MTEB adapter", "mteb")
    try:
        registered = mteb.get_model_meta(hub_name, fetch_from_hf=False)
    except Exception:  # not in mteb's registry: keep the fields unknown
        return {}
    return {key: getattr(registered, key) for key in ("languages", "license", "open_weights", "reference",
                                                      "training_datasets", "public_training_code",
                                                      "public_training_data")}


def _loaded_model(encoder):
    return getattr(getattr(encoder, "_loaded", None), "model", None)


def _model_version(encoder) -> str | None:
    """The model's revision where it is known: the default wheel's version, or a hub commit hash."""
    if str(encoder.model_id) == DEFAULT_MODEL:
        return default_model_revision()
    config = getattr(_loaded_model(encoder), "config", None)
    return getattr(config, "_commit_hash", None)


def _count_parameters(module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def _n_parameters(encoder, calibrator) -> int | None:
    model = _loaded_model(encoder)
    if model is None:
        return None
    count = _count_parameters(model)
    if isinstance(calibrator, Calibrator):  # the numbers its map holds
        count += sum(tensor.numel() for tensor in calibrator.as_module().state_dict().values())
    return count


def _hash_state(sha, value, depth: int = 0) -> None:
    """Feed the fitted state of a calibrator (arrays, tensors, modules, scalars) into `sha`."""
    if depth > 3:
        return
    if isinstance(value, np.ndarray):
        sha.update(repr((value.dtype.str, value.shape)).encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (str, int, float, bool, type(None))):
        sha.update(repr(value).encode("utf-8") + b"\0")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _hash_state(sha, item, depth + 1)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            sha.update(repr(key).encode("utf-8"))
            _hash_state(sha, value[key], depth + 1)
    elif callable(getattr(value, "state_dict", None)):  # a torch module
        for key, tensor in value.state_dict().items():
            sha.update(key.encode("utf-8"))
            _hash_state(sha, tensor.detach().cpu().numpy(), depth + 1)
    elif hasattr(value, "detach"):  # a torch tensor
        _hash_state(sha, value.detach().cpu().numpy(), depth + 1)
    elif hasattr(value, "__dict__"):
        for key, item in sorted(vars(value).items()):  # attribute names are unique: items never compared
            if key in ("losses", "device", "metadata", "source") or key.startswith("_"):
                continue  # training history, placement and the file it came from do not change the vectors
            sha.update(key.encode("utf-8"))
            _hash_state(sha, item, depth + 1)
