"""The `Calibrator` protocol, the one registry of methods by name, and `load` / `create`. No torch
or numpy at import, so that the command line can list the names at start-up."""
from __future__ import annotations

import importlib
import inspect
import numbers
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import numpy as np

    from flowcore.calibration.file import EncoderProvenance

__all__ = ["NAMES", "Calibrator", "calibrator_class", "create", "fit_options", "load", "positive_int",
           "setting_names"]

_CLASSES = {
    "none": "flowcore.calibration.linear:Identity",
    "whitening": "flowcore.calibration.whitening:Whitening",
    "flow": "flowcore.calibration.flow:FlowCalibrator",
    "center": "flowcore.calibration.linear:MeanCentering",
    "abtt": "flowcore.calibration.linear:AllButTheTop",
    "zca": "flowcore.calibration.whitening:ZCAWhitening",
    "auto": "flowcore.calibration.auto:AutoCalibration",
}
NAMES = tuple(_CLASSES)
"""Every calibration method, by the one name it has everywhere (CLI, files, results, docs)."""
_RENAMED = {"pca-whitening": "whitening", "zca-whitening": "zca"}
"""Kinds that earlier versions wrote, and the method's name now (such files are refused)."""


class Calibrator(ABC):
    """What every calibration method offers: fit without labels (on an array, a stream of chunks or chosen rows),
    map vectors, say what the fit did, check an encoder, save, load, and run as a torch module.

    Attributes:
        name: the method's name (class attribute; see `NAMES`).
        provenance: the `EncoderProvenance` of the vectors it was fitted on; None if unknown.
        metadata: a dict of JSON-able values of your own, saved with it.
        source: the file it was loaded from (`load`), None when fitted here.

    Example:
        >>> calibrator = flowcore.calibration.create("whitening", power=0.3).fit(X, encoder=encoder)
        >>> calibrator.save("whitening.flow")
        >>> Z = flowcore.load("whitening.flow").transform(X)     # float32 (n, output_dim)
    """

    name: ClassVar[str] = ""
    _renamed_settings: ClassVar[dict[str, str]] = {}
    """Earlier names of settings, still accepted (with a DeprecationWarning) and read from older files."""
    _file_mismatch: ClassVar[str] = ("{kind} calibrator file whose header does not match its tensors: {error}; refit "
                                     "it with `flowcore fit`")
    """`load`'s message for a file whose contents do not fit its header."""

    def __init__(self):
        self.provenance: EncoderProvenance | None = None
        self.metadata: dict = {}
        self.source: Path | None = None

    @abstractmethod
    def fit(self, X, encoder=None) -> Calibrator:
        """Fit on the rows of X, recording `encoder` as `provenance`; returns self."""

    @abstractmethod
    def fit_chunks(self, chunks, encoder=None) -> Calibrator:
        """Fit on a stream of (rows, dim) arrays, recording `encoder`; returns self. The linear methods merge the
        chunks' moments in O(d²) memory; a method that trains over several epochs (the flow) holds the rows."""

    def fit_rows(self, X, rows=None, encoder=None) -> Calibrator:
        """Fit on the rows of X numbered in `rows` (all when None), never copying X (e.g. a memory-mapped corpus
        without its rejected rows): `fit_chunks` over blocks of them, unless the method reads X itself.
        A method whose fit takes more options (`fit_options`) takes them here too.

        Example:
            >>> create("whitening").fit_rows(np.load("big.npy", mmap_mode="r"), rows=np.flatnonzero(good))
        """
        from flowcore.calibration.moments import row_blocks

        return self.fit_chunks(row_blocks(X, rows), encoder=self._encoder_of(X, encoder))

    def report(self) -> dict:
        """What the fit did, JSON-able: "method", "dim", "output_dim", "settings" and "summary" (one line), and the
        method's own entries (auto: its "choice", "signals" and "reason"; the flow: its losses and held-out scores).

        Example:
            >>> flowcore.load("model.flow").report()["summary"]
            'auto: whitening, 199 directions (hubness 0.310 ≥ 0.265)'
        """
        settings = self.settings()
        defaults = {p.name: p.default for p in inspect.signature(type(self)).parameters.values()}
        shown = ", ".join(f"{key} {value}" for key, value in settings.items() if value != defaults.get(key))
        return {"method": self.name, "dim": self.dim, "output_dim": self.output_dim, "settings": settings,
                "summary": f"{self.name}{f' ({shown})' if shown else ''} to {self.output_dim} dims"}

    def fit_threads(self) -> int | None:
        """The CPU threads its fit trains on, for callers that fit several side by side; None: it does not train
        (a linear method's fit is a few matrix products)."""
        return None

    def check_encoder(self, encoder, requested: str | None = None, what: str | None = None) -> None:
        """A ValueError saying how to fix it unless vectors from `encoder` (an `Encoder`, or anything with its
        `model_id`, `pooling` and `dim`) fit this calibrator: the model and pooling it records (when it records
        them; `requested`, the model name asked for, also matches) and its width.

        Args:
            encoder: the encoder that would feed it.
            requested: the model name the encoder was asked for (e.g. "default"), when it differs from `model_id`.
            what: how messages name the calibrator (default: "the <method> calibrator").
        """
        what = what or f"the {self.name} calibrator"
        recorded = self.provenance
        if recorded is not None and recorded.model not in (str(encoder.model_id), requested):
            raise ValueError(f"{what} was fitted on embeddings from encoder {recorded.model!r}, not "
                             f"{encoder.model_id!r}; use the same encoder (--model {recorded.model}) or refit it")
        if recorded is not None and recorded.pooling != str(encoder.pooling):
            raise ValueError(f"{what} was fitted on {recorded.pooling!r} pooling, not {encoder.pooling!r}; "
                             f"use the same pooling (--pooling {recorded.pooling}) or refit it")
        if int(encoder.dim) != self.dim:
            raise ValueError(f"encoder {encoder.model_id!r} gives {encoder.dim}-wide vectors but {what} expects "
                             f"{self.dim}")

    @abstractmethod
    def transform(self, X) -> np.ndarray:
        """The calibrated rows of X, float32 (n, output_dim); a row with NaN/Inf is refused by number."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Width of the vectors taken."""

    @property
    def output_dim(self) -> int:
        """Width of the vectors returned (that of the vectors taken, unless a method changes it)."""
        return self.dim

    @abstractmethod
    def as_module(self):
        """The fitted map as a frozen, forward-only `torch.nn.Module`: float32 (batch, dim) -> (batch, output_dim)
        with matrix products and elementwise ops only (`flowcore.calibration.modules`), equal to `transform` to
        float32 rounding; it traces and exports (e.g. to ONNX) and runs inside other models.

        Example:
            >>> module = flowcore.load("model.flow").as_module()
            >>> Z = module(torch.from_numpy(X)).numpy()     # ≈ transform(X)
        """

    def save(self, path) -> None:
        """Write the fitted calibrator to one file (safetensors + JSON header, atomically)."""
        from flowcore.calibration.file import write_calibrator_file

        tensors, info = self._contents()
        encoder = self.provenance.to_json() if self.provenance is not None else None
        write_calibrator_file(path, tensors, {"kind": self.name, "encoder": encoder, "metadata": self.metadata, **info})

    @abstractmethod
    def _contents(self) -> tuple[dict, dict]:
        """(tensors, JSON header entries) that `save` writes besides the kind, encoder and metadata."""

    @classmethod
    @abstractmethod
    def _from_file(cls, path, tensors: dict, info: dict, device) -> Calibrator:
        """The calibrator held by the checked contents of a file of this class's kind (`load`)."""

    def settings(self) -> dict:
        """The constructor's settings, as saved in the file and accepted by `create`."""
        return {}

    def _map_chunks(self, X, map_chunk, chunk_rows: int, name: str = "X", output_dim: int | None = None) -> np.ndarray:
        """`map_chunk(rows, row_offset)`, which checks the rows, over X `chunk_rows` rows at a time, into
        float32 (n, output_dim, default `self.output_dim`); a finite row mapped to NaN/Inf is refused by number."""
        import numpy as np

        from flowcore.validation import check_output

        if np.ndim(X) != 2:
            map_chunk(np.asarray(X), 0)  # the shape error
        out = np.empty((len(X), output_dim or self.output_dim), dtype=np.float32)
        for start in range(0, len(X), chunk_rows):
            with np.errstate(over="ignore"):  # a result beyond float32 is Inf, refused below
                out[start:start + chunk_rows] = map_chunk(X[start:start + chunk_rows], start)
        return check_output(out, name)

    def fit_transform(self, X, encoder=None) -> np.ndarray:
        """`fit(X)`, then `transform(X)`."""
        return self.fit(X, encoder=encoder).transform(X)

    @classmethod
    def load(cls, path, device=None) -> Calibrator:
        """The calibrator saved at `path` (`flowcore.load`), refused unless it is of this class.

        Args:
            path: a file written by `save` (or `flowcore fit`).
            device: torch device for a flow (the linear calibrators compute in numpy).
        """
        calibrator = load(path, device=device)
        if not isinstance(calibrator, cls) or (cls.name and calibrator.name != cls.name):
            from flowcore.calibration.file import CalibratorFileError

            raise CalibratorFileError(f"{path}: holds the {calibrator.name} calibration, not "
                                      f"{cls.name or cls.__name__}; flowcore.load(path) reads a calibrator file of any "
                                      "kind")
        return calibrator

    @staticmethod
    def _encoder_of(X, encoder):
        """`encoder`, or when None the encoder `Encoder.encode` recorded for X (`flowcore._provenance`), if any."""
        from flowcore._provenance import made_by

        if encoder is None and (made := made_by(X)) is not None:
            from flowcore.calibration.file import EncoderProvenance

            return EncoderProvenance(*made)
        return encoder

    def _provenance_of(self, encoder) -> EncoderProvenance | None:
        """`encoder` (an `Encoder` or `EncoderProvenance`) as provenance; None keeps the current one."""
        from flowcore.calibration.file import EncoderProvenance

        if encoder is None:
            return self.provenance
        return encoder if isinstance(encoder, EncoderProvenance) else EncoderProvenance.of(encoder)


def positive_int(value, what: str) -> int:
    """`value` as an int, or a ValueError naming `what` unless it is a positive integer (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def calibrator_class(name: str) -> type[Calibrator]:
    """The class of the calibration method `name`; an unknown name is refused listing the known ones."""
    if name not in _CLASSES:
        raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(NAMES)}")
    module, _, attribute = _CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def setting_names(name: str) -> tuple[str, ...]:
    """The settings `create(name, ...)` accepts: the keyword arguments of the method's class."""
    cls = calibrator_class(name)
    parameters = inspect.signature(cls).parameters.values()
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                 and p.name not in cls._renamed_settings)


def fit_options(name: str) -> tuple[str, ...]:
    """The options besides X, rows and encoder that method `name`'s `fit_rows` takes (e.g. a trained method's
    checkpoint and threads): what a caller such as `flowcore fit` may pass it."""
    parameters = inspect.signature(calibrator_class(name).fit_rows).parameters.values()
    return tuple(p.name for p in parameters if p.name not in ("self", "X", "rows", "encoder")
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def create(name: str, **settings) -> Calibrator:
    """A fresh, unfitted calibrator of method `name` with `settings`.

    Args:
        name: one of `NAMES`.
        settings: the method's settings (`setting_names(name)`), e.g. `power` and `dim` for "whitening".

    Example:
        >>> create("whitening", power=0.3, dim=128).fit(X).transform(X)     # float32 (n, 128)
    """
    accepted = setting_names(name)
    unknown = [key for key in settings if key not in accepted and key not in calibrator_class(name)._renamed_settings]
    if unknown:
        raise ValueError(f"calibration {name!r} takes the settings {', '.join(accepted) or '(none)'}; "
                         f"not {', '.join(unknown)}")
    return calibrator_class(name)(**settings)


def load(path, device=None) -> Calibrator:
    """The fitted calibrator in any calibrator file, of the class its recorded kind names.

    Args:
        path: a file written by a calibrator's `save` or by `flowcore fit`.
        device: torch device for a flow (the linear calibrators compute in numpy).

    Raises:
        CalibratorFileError: naming the file, when it is missing, damaged or of an unknown kind.

    Example:
        >>> calibrator = flowcore.load("abtt.flow")      # an AllButTheTop, fitted
    """
    from flowcore.calibration.file import CalibratorFileError, EncoderProvenance, read_calibrator_file

    tensors, info = read_calibrator_file(path)
    kind = info.get("kind", "flow")  # flow files from before kinds were recorded have none
    if isinstance(kind, str) and kind in _RENAMED:
        raise CalibratorFileError(f"{path}: a {kind!r} calibrator from an earlier flowcore, which this one does not "
                                  f"read; the method is now {_RENAMED[kind]!r}: refit it "
                                  f"(`flowcore fit --calibration {_RENAMED[kind]}`)")
    if not isinstance(kind, str) or kind not in _CLASSES:
        raise CalibratorFileError(f"{path}: unknown calibrator kind {kind!r}; this flowcore reads {', '.join(NAMES)}")
    cls = calibrator_class(kind)
    try:
        calibrator = cls._from_file(path, tensors, info, device)
        encoder = info.get("encoder")
        calibrator.provenance = EncoderProvenance(**encoder) if encoder is not None else None
        calibrator.metadata = info.get("metadata", {})
    except CalibratorFileError:
        raise
    except KeyError as error:
        raise CalibratorFileError(f"{path}: " + cls._file_mismatch.format(
            kind=kind, error=f"its header has no {error.args[0]!r} entry")) from None
    except (TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CalibratorFileError(f"{path}: " + cls._file_mismatch.format(kind=kind, error=error)) from None
    calibrator.source = Path(path)
    return calibrator

